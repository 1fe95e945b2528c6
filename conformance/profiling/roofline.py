"""Roofline per op: device peaks (from the backend, completed by a quick measurement) and the
fraction of the roofline each op reaches.

Definitions (also written into every profile's ``definitions``):

- ``intensity`` = FLOPs / bytes of the op per step (bytes = its input + output tensor bytes).
- roofline time = max(FLOPs / peak FLOP/s of the op's dtype, bytes / peak copy bandwidth).
- ``roofline_pct`` = roofline time / measured time of the op x 100, where the measured time is its
  device self time when the profiler recorded device activity, else its host self time. 100% means
  the op runs at the roofline; small values mean launch/dispatch overhead or a poor kernel.

Peaks: :meth:`hal.backend.Backend.device_properties` ``.peaks`` first (``copy_bytes_per_s``,
``flops_per_s.<dtype>``; the CUDA backend records the H200's measured 4.3 TB/s and ~790 TFLOP/s
bf16). A peak the backend lacks is measured now when ``measure`` is true: copy bandwidth as
``dst.copy_(src)`` of 64 MiB (read + written bytes / median time of 5), a dtype's FLOP rate as an
n x n x n matmul (n = 1024 on the CPU, 4096 elsewhere; median of 3), timed with the backend's
events after a warm-up. Measured-now peaks are a floor of the true peak, so ``roofline_pct`` on
them is an upper bound; ``peaks_source`` says which figure came from where.
"""
from __future__ import annotations

import statistics
from typing import Any, Iterable, Optional

import torch

from hal.backend import Backend


def _timed_ms(backend: Backend, fn: Any, repeats: int) -> float:
    fn()
    backend.synchronize()
    times = []
    for _ in range(repeats):
        start, end = backend.create_event(enable_timing=True), backend.create_event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        backend.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure_copy_bandwidth(backend: Backend, nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """Bytes/s of an on-device copy (read + write counted)."""
    src = backend.allocate((nbytes // 4,), torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    ms = _timed_ms(backend, lambda: dst.copy_(src), repeats)
    return 2.0 * nbytes / (ms / 1e3)


def measure_matmul_rate(backend: Backend, dtype: torch.dtype, n: Optional[int] = None, repeats: int = 3) -> float:
    """FLOP/s of an n x n x n matmul in ``dtype`` (2 n^3 FLOPs)."""
    n = n or (1024 if backend.device_type == "cpu" else 4096)
    a = backend.allocate((n, n), dtype).normal_()
    b = backend.allocate((n, n), dtype).normal_()
    ms = _timed_ms(backend, lambda: a @ b, repeats)
    return 2.0 * n ** 3 / (ms / 1e3)


def resolve_peaks(backend: Backend, dtypes: Iterable[str], measure: bool = True) -> tuple[dict, str]:
    """``(peaks, peaks_source)`` for ``dtypes`` (names such as ``"float32"``)."""
    props = backend.device_properties(0)
    peaks = dict(props.peaks)
    sources = [f"backend: {props.peaks_source or 'none recorded'}"] if props.peaks else \
        [f"backend records no peaks ({props.peaks_source or 'none'})"]
    measured = []
    if measure:
        try:
            if "copy_bytes_per_s" not in peaks:
                peaks["copy_bytes_per_s"] = measure_copy_bandwidth(backend)
                measured.append("copy_bytes_per_s (64 MiB copy_, median of 5)")
            for name in sorted(set(dtypes)):
                key = f"flops_per_s.{name}"
                dt = getattr(torch, name, None)
                if key in peaks or not isinstance(dt, torch.dtype) or not dt.is_floating_point:
                    continue
                peaks[key] = measure_matmul_rate(backend, dt)
                measured.append(f"{key} (square matmul, median of 3)")
        except Exception as exc:  # a dtype the device rejects: keep what we have
            measured.append(f"measurement stopped: {type(exc).__name__}: {exc}")
    if measured:
        sources.append("measured now on this device (a floor of the true peak): " + "; ".join(measured))
    return peaks, " | ".join(sources)


def roofline_row(flops: Optional[int], nbytes: Optional[int], dtype: Optional[str], time_ms: Optional[float],
                 peaks: dict) -> tuple[Optional[float], Optional[float]]:
    """``(intensity, roofline_pct)`` of one op per step; None where undefined or a peak is missing."""
    if not nbytes:
        return None, None
    intensity = (flops or 0) / nbytes
    bw = peaks.get("copy_bytes_per_s")
    if not bw or not time_ms or time_ms <= 0:
        return intensity, None
    t = nbytes / bw
    if flops:
        peak = peaks.get(f"flops_per_s.{dtype}") if dtype else None
        if not peak:
            return intensity, None
        t = max(t, flops / peak)
    return intensity, 100.0 * t / (time_ms / 1e3)
