"""The CUDA backend class: torch.cuda through :class:`hal.device_backend.TorchDeviceBackend`, plus what CUDA adds.

See :class:`CudaBackend`. Availability is torch's alone (``torch.cuda.is_available()``); CuPy and
Triton are optional additions, imported only at first use, never at module import, so this module
imports on a machine with no GPU and a CUDA torch without CuPy reports ``cuda`` available.
"""
from __future__ import annotations

import functools
import json
import os
import platform
import threading
from typing import Any, Optional, Sequence

import torch

from hal.backend import Availability
from hal.device_backend import TorchDeviceBackend
from hal.memory import MemoryStats

#: set (without overriding the user's) when the backend is instantiated, before NCCL is initialised:
#: on a collective timeout the watchdog aborts the communicator (the process ends with an error)
#: instead of hanging. Blocking wait busy-waits the host; it is opt-in (HAL_NCCL_BLOCKING_WAIT=1).
#: Site settings (e.g. NCCL_NVLS_ENABLE=0 on hosts whose NVLink multicast is unusable) are not
#: library defaults: the scripts that need them export them (benchmarks/*.sh).
NCCL_ENV_DEFAULTS = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
ENV_ROUTE_ATEN = "HAL_CUDA_ROUTE_ATEN"


def _optional(module: str) -> Availability:
    try:
        mod = __import__(module)
    except Exception as exc:
        return Availability.no(f"{module} is not importable ({type(exc).__name__}: {exc})")
    return Availability.ok(f"{module} {getattr(mod, '__version__', '?')}")


@functools.lru_cache(maxsize=1)
def _peak_table() -> dict:
    path = os.path.join(os.path.dirname(__file__), "peaks.json")
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)["devices"]


class CudaBackend(TorchDeviceBackend):
    """NVIDIA GPUs through torch.cuda and NCCL; CuPy (memory pool, interop) and Triton (kernels) when present.

    - Availability: ``torch.cuda`` alone. :meth:`extras` says which additions are usable and why not.
    - Memory: with CuPy, :meth:`allocate` takes a block of CuPy's pool (DLPack, zero copy) and
      :meth:`memory_stats` adds the pool to torch's caching allocator; without CuPy both are torch's.
    - Ops: Triton kernels (priority 10) where their predicates accept the call, torch's CUDA kernels
      for the rest (and for everything when Triton is absent, with the reason in ``kernel_status``);
      ``$HAL_CUDA_ROUTE_ATEN=1`` also routes ATen's softmax, log_softmax and layer_norm to them.
    - Peaks: from ``peaks.json`` (each row with its provenance) or :meth:`measure_copy_bandwidth`.

    Thread-safety: instances are shared; the CuPy peak counter takes a lock.
    """

    name = "cuda"
    device_type = "cuda"
    priority = 200
    dist_backend = "nccl"
    profiler_activity = "CUDA"
    device_files = ("/dev/nvidia[0-9]*",)
    unsupported_reduce_ops = frozenset({"BAND", "BOR", "BXOR"})
    visible_devices_env = "CUDA_VISIBLE_DEVICES"

    def __init__(self) -> None:
        for key, value in NCCL_ENV_DEFAULTS.items():
            os.environ.setdefault(key, value)
        if os.environ.get("HAL_NCCL_BLOCKING_WAIT") == "1":
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
        self._lock = threading.Lock()
        self._cupy_peak: dict[int, int] = {}
        self._measured_peaks: dict[int, dict[str, float]] = {}
        self.kernel_status = "not registered yet"

    # ---- what CUDA adds -----------------------------------------------------------------------------
    @classmethod
    def extras(cls) -> dict[str, Availability]:
        """``{"triton_kernels": ..., "cupy_pool_interop": ...}``: the optional additions, with reasons."""
        return {"triton_kernels": _optional("triton"), "cupy_pool_interop": _optional("cupy")}

    @classmethod
    def availability_detail(cls) -> str:
        return "; ".join(f"{k}: {'available' if a.available else 'unavailable'} ({a.reason})"
                         for k, a in cls.extras().items())

    @classmethod
    def versions(cls) -> dict[str, str]:
        v = {"torch": torch.__version__, "python": platform.python_version(), "cuda_torch": str(torch.version.cuda)}
        try:
            import cupy
            v["cupy"] = cupy.__version__
            v["cuda_runtime_cupy"] = str(cupy.cuda.runtime.runtimeGetVersion())
            v["cuda_driver"] = str(cupy.cuda.runtime.driverGetVersion())
        except Exception:
            pass
        try:
            import triton
            v["triton"] = triton.__version__
        except Exception:
            pass
        try:
            nccl = torch.cuda.nccl.version()
            v["nccl"] = ".".join(str(p) for p in nccl) if isinstance(nccl, tuple) else str(nccl)
        except Exception:
            pass
        return v

    # ---- devices: what differs from torch's defaults ------------------------------------------------
    def native_dtypes(self, capability: Optional[tuple[int, int]]) -> tuple[str, ...]:
        dtypes = ("float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool",
                  "complex64", "complex128")
        return dtypes[:3] + ("bfloat16",) + dtypes[3:] if capability and capability >= (8, 0) else dtypes

    def device_features(self, capability: Optional[tuple[int, int]]) -> tuple[str, ...]:
        cap = capability or (0, 0)
        return tuple(f for need, fs in (((8, 0), ("bf16", "tf32")), ((8, 9), ("fp8",)), ((9, 0), ("tma", "wgmma")))
                     if cap >= need for f in fs)

    def device_extra(self, props: Any) -> dict:
        extra = {"multi_processor_count": int(props.multi_processor_count)}
        for attr in ("L2_cache_size", "warp_size", "uuid"):
            if hasattr(props, attr):
                extra[attr] = str(getattr(props, attr)) if attr == "uuid" else int(getattr(props, attr))
        return extra

    def device_peaks(self, index: int, props: Any) -> tuple[dict, str]:
        if index in self._measured_peaks:
            return dict(self._measured_peaks[index]), "measured in this process (measure_copy_bandwidth)"
        for key, row in _peak_table().items():
            if key in str(props.name):
                return dict(row["peaks"]), row["source"]
        return {}, "not measured (call CudaBackend.measure_copy_bandwidth())"

    def measure_copy_bandwidth(self, index: int = 0, nbytes: int = 1 << 30, repeats: int = 10) -> float:
        """Device-to-device copy bandwidth in bytes/s (read + write counted; median of ``repeats``),
        remembered as this device's ``copy_bytes_per_s`` peak for the rest of the process."""
        dev = torch.device("cuda", int(index))
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device=dev).random_(0, 255)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        times.sort()
        bw = 2 * src.numel() / times[len(times) // 2]
        self._measured_peaks[int(index)] = {"copy_bytes_per_s": bw}
        return bw

    # ---- memory: CuPy's pool when CuPy is there ------------------------------------------------------
    def allocate(self, shape: Sequence[int], dtype: torch.dtype = torch.float32, device: Any = None) -> torch.Tensor:
        """Uninitialised tensor; its memory is a block of CuPy's pool (DLPack, zero copy) when CuPy is
        importable, else torch's caching allocator."""
        try:
            import cupy
        except ImportError:
            return super().allocate(shape, dtype, device)
        idx = self._index(device)
        shape = tuple(int(s) for s in shape)
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype, device=torch.device("cuda", idx))
        with cupy.cuda.Device(idx):
            raw = cupy.empty(nbytes, dtype=cupy.uint8)
            used = cupy.get_default_memory_pool().used_bytes()
        with self._lock:
            self._cupy_peak[idx] = max(self._cupy_peak.get(idx, 0), used)
        return torch.from_dlpack(raw).view(dtype).view(shape)

    def _cupy_pool(self, idx: int) -> tuple[int, int]:
        try:
            import cupy
            with cupy.cuda.Device(idx):
                pool = cupy.get_default_memory_pool()
                return int(pool.used_bytes()), int(pool.total_bytes())
        except Exception:
            return 0, 0

    def memory_stats(self, device: Any = None) -> MemoryStats:
        idx = self._index(device)
        base = super().memory_stats(idx)
        used, pooled = self._cupy_pool(idx)
        with self._lock:
            cupy_peak = self._cupy_peak[idx] = max(self._cupy_peak.get(idx, 0), used)
        return MemoryStats(allocated=base.allocated + used, reserved=base.reserved + pooled,
                           peak=base.peak + cupy_peak, total=base.total, free=base.free,
                           # CuPy's pool only grows until empty_cache(): its current size is its peak
                           peak_reserved=None if base.peak_reserved is None else base.peak_reserved + pooled,
                           source=(f"{base.source} + cupy.MemoryPool (cupy used {used} B, pooled {pooled} B, "
                                   f"peak used {cupy_peak} B)"))

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        idx = self._index(device)
        super().reset_peak_memory_stats(idx)
        used, _ = self._cupy_pool(idx)
        with self._lock:
            self._cupy_peak[idx] = used

    def empty_cache(self) -> None:
        super().empty_cache()
        try:
            import cupy
            cupy.get_default_memory_pool().free_all_blocks()
        except Exception:
            pass

    # ---- ops ----------------------------------------------------------------------------------------
    def register_ops(self, registry: Any) -> None:
        from hal.ops import register_torch_impls
        register_torch_impls(registry, "cuda")
        try:
            from hal.backends.cuda import kernels
            names = kernels.register(registry)
            self.kernel_status = "triton: " + ", ".join(names)
        except ImportError as exc:
            self.kernel_status = f"torch kernels only: triton kernels unavailable (triton is not importable: {exc})"
        if os.environ.get(ENV_ROUTE_ATEN) == "1":
            from hal.backends.cuda import aten
            aten.route_aten_ops()

    def describe(self) -> dict:
        d = super().describe()
        d["kernels"] = self.kernel_status
        d["extras"] = {k: {"available": a.available, "reason": a.reason} for k, a in self.extras().items()}
        return d


__all__ = ["CudaBackend", "NCCL_ENV_DEFAULTS"]
