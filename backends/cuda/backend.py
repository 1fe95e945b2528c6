"""The CUDA backend class: devices, memory through CuPy's pool, torch CUDA streams, NCCL, Triton ops.

See :class:`CudaBackend`. CuPy, Triton and ``torch.cuda`` device state are touched only in the
probe and at first use, never at import, so this module imports on a machine with no GPU.
"""
from __future__ import annotations

import os
import platform
import threading
from typing import Any, Sequence

import torch

from hal.backend import Availability, Backend, DeviceProperties
from hal.memory import MemoryStats
from hal.streams import TorchEvent, TorchStream

#: ceilings measured on an H200 (copy: read + write bytes; bf16: dense 8192^3 matmul, random data)
H200_PEAKS = {"copy_bytes_per_s": 4.3e12, "flops_per_s.bfloat16": 7.9e14}
H200_PEAKS_SOURCE = "measured on H200, 2026-11 (shared/reference/performance-anchors.md)"
#: environment the backend sets (without overriding the user's) before NCCL is initialised
NCCL_ENV_DEFAULTS = {
    # NVLink multicast (NVLS) off: required on the shared H200 hosts this project runs on.
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    # On a collective timeout the watchdog aborts the communicator (the process ends with an
    # error) instead of hanging forever. Blocking wait, which turns a timeout into an exception in
    # the caller, busy-waits the host on every collective; it is opt-in (HAL_NCCL_BLOCKING_WAIT=1).
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}
ENV_ROUTE_ATEN = "HAL_CUDA_ROUTE_ATEN"


def _index(device: Any) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, torch.device):
        return device.index if device.index is not None else torch.cuda.current_device()
    return int(device)


class CudaBackend(Backend):
    """NVIDIA GPUs through torch.cuda, CuPy (memory pool, DLPack, streams), Triton (ops) and NCCL.

    - Memory: :meth:`allocate` takes a block from CuPy's memory pool and returns a torch tensor
      over it (DLPack, zero copy); the block returns to the pool when the tensor is freed.
      :meth:`memory_stats` adds torch's caching allocator and CuPy's pool, so for work that
      allocates through torch ``peak == torch.cuda.max_memory_allocated()``.
    - Streams/events wrap ``torch.cuda.Stream``/``Event``; :mod:`hal.backends.cuda.interop`
      converts them to and from CuPy streams (same handle).
    - Collectives: torch.distributed with NCCL; :data:`NCCL_ENV_DEFAULTS` is applied (setdefault)
      when the backend is instantiated, before any process group exists.
    - Ops: Triton kernels (priority 10) where their predicates accept the call, torch's CUDA
      kernels for the rest; ``$HAL_CUDA_ROUTE_ATEN=1`` also routes ATen's softmax, log_softmax
      and layer_norm to the Triton kernels (:mod:`hal.backends.cuda.aten`).

    Thread-safety: instances are shared; the CuPy peak counter takes a lock.
    """

    name = "cuda"
    device_type = "cuda"
    priority = 200
    dist_backend = "nccl"
    profiler_activity = "CUDA"
    device_files = ("/dev/nvidia[0-9]*",)
    unsupported_reduce_ops = frozenset({"BAND", "BOR", "BXOR"})

    def __init__(self) -> None:
        for key, value in NCCL_ENV_DEFAULTS.items():
            os.environ.setdefault(key, value)
        if os.environ.get("HAL_NCCL_BLOCKING_WAIT") == "1":
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
        self._lock = threading.Lock()
        self._cupy_peak: dict[int, int] = {}
        self._measured_peaks: dict[int, dict[str, float]] = {}
        self.kernel_status = "not registered yet"

    # ---- discovery ------------------------------------------------------------------------------
    @classmethod
    def probe(cls) -> Availability:
        try:
            import cupy
        except Exception as exc:
            return Availability.no(f"cupy is not importable ({type(exc).__name__}: {exc})")
        try:
            if not torch.cuda.is_available():
                return Availability.no(f"torch.cuda.is_available() is False (torch {torch.__version__}, "
                                       f"built for CUDA {torch.version.cuda})")
            count = torch.cuda.device_count()
            ccount = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:
            return Availability.no(f"CUDA runtime error: {type(exc).__name__}: {exc}")
        if ccount != count:
            return Availability.no(f"torch sees {count} CUDA devices but cupy sees {ccount}")
        return Availability.ok(f"{count} CUDA device(s), torch {torch.__version__} (CUDA {torch.version.cuda}), "
                               f"cupy {cupy.__version__}")

    @classmethod
    def versions(cls) -> dict[str, str]:
        v = {"torch": torch.__version__, "python": platform.python_version(),
             "cuda_torch": str(torch.version.cuda)}
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

    # ---- devices ----------------------------------------------------------------------------------
    def device_count(self) -> int:
        return torch.cuda.device_count()

    def current_device(self) -> int:
        return torch.cuda.current_device()

    def set_device(self, index: int) -> None:
        torch.cuda.set_device(int(index))

    def synchronize(self, device: Any = None) -> None:
        torch.cuda.synchronize(None if device is None else _index(device))

    def device_properties(self, index: int = 0) -> DeviceProperties:
        if not 0 <= int(index) < self.device_count():
            raise IndexError(f"cuda has {self.device_count()} device(s); no device {index}")
        p = torch.cuda.get_device_properties(int(index))
        cap = (int(p.major), int(p.minor))
        dtypes = ["float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool",
                  "complex64", "complex128"]
        features = []
        if cap >= (8, 0):
            dtypes.insert(3, "bfloat16")
            features += ["bf16", "tf32"]
        if cap >= (8, 9):
            features.append("fp8")
        if cap >= (9, 0):
            features += ["tma", "wgmma"]
        if "H200" in p.name:
            peaks, source = dict(H200_PEAKS), H200_PEAKS_SOURCE
        elif int(index) in self._measured_peaks:
            peaks, source = dict(self._measured_peaks[int(index)]), "measured in this process (measure_copy_bandwidth)"
        else:
            peaks, source = {}, "not measured (call CudaBackend.measure_copy_bandwidth())"
        extra = {"multi_processor_count": int(p.multi_processor_count)}
        for attr in ("L2_cache_size", "warp_size", "uuid"):
            if hasattr(p, attr):
                extra[attr] = str(getattr(p, attr)) if attr == "uuid" else int(getattr(p, attr))
        return DeviceProperties(index=int(index), name=p.name, total_memory=int(p.total_memory), capability=cap,
                                dtypes=tuple(dtypes), features=tuple(features), peaks=peaks,
                                peaks_source=source, extra=extra)

    def measure_copy_bandwidth(self, index: int = 0, nbytes: int = 1 << 30, repeats: int = 10) -> float:
        """Device-to-device copy bandwidth in bytes/s (read + write counted; median of ``repeats``),
        remembered as this device's ``copy_bytes_per_s`` peak unless the device has published ones."""
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

    # ---- memory -----------------------------------------------------------------------------------
    def allocate(self, shape: Sequence[int], dtype: torch.dtype = torch.float32, device: Any = None) -> torch.Tensor:
        """Uninitialised tensor whose memory is a block of CuPy's pool (DLPack, zero copy)."""
        import cupy
        idx = _index(device)
        shape = tuple(int(s) for s in shape)
        numel = 1
        for s in shape:
            numel *= s
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
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
        idx = _index(device)
        stats = torch.cuda.memory_stats(idx)
        used, pooled = self._cupy_pool(idx)
        with self._lock:
            cupy_peak = max(self._cupy_peak.get(idx, 0), used)
            self._cupy_peak[idx] = cupy_peak
        free, total = torch.cuda.mem_get_info(idx)
        return MemoryStats(
            allocated=int(stats.get("allocated_bytes.all.current", 0)) + used,
            reserved=int(stats.get("reserved_bytes.all.current", 0)) + pooled,
            peak=int(torch.cuda.max_memory_allocated(idx)) + cupy_peak,
            total=int(total), free=int(free),
            source=(f"torch.cuda.memory_stats + cupy.MemoryPool (cupy used {used} B, pooled {pooled} B, "
                    f"peak used {cupy_peak} B)"))

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        idx = _index(device)
        torch.cuda.reset_peak_memory_stats(idx)
        used, _ = self._cupy_pool(idx)
        with self._lock:
            self._cupy_peak[idx] = used

    def empty_cache(self) -> None:
        torch.cuda.empty_cache()
        try:
            import cupy
            cupy.get_default_memory_pool().free_all_blocks()
        except Exception:
            pass

    # ---- streams and events -----------------------------------------------------------------------
    def create_stream(self, device: Any = None, priority: int = 0) -> TorchStream:
        return TorchStream(torch.cuda.Stream(device=_index(device), priority=priority), torch.cuda)

    def current_stream(self, device: Any = None) -> TorchStream:
        return TorchStream(torch.cuda.current_stream(_index(device)), torch.cuda)

    def create_event(self, enable_timing: bool = False) -> TorchEvent:
        return TorchEvent(torch.cuda.Event(enable_timing=enable_timing))

    # ---- ops --------------------------------------------------------------------------------------
    def register_ops(self, registry: Any) -> None:
        from hal.ops import register_torch_impls
        register_torch_impls(registry, "cuda")
        try:
            from hal.backends.cuda import kernels
            names = kernels.register(registry)
            self.kernel_status = "triton: " + ", ".join(names)
        except ImportError as exc:
            self.kernel_status = f"torch kernels only: triton is not importable ({exc})"
        if os.environ.get(ENV_ROUTE_ATEN) == "1":
            from hal.backends.cuda import aten
            aten.route_aten_ops()

    def describe(self) -> dict:
        d = super().describe()
        d["kernels"] = self.kernel_status
        return d


__all__ = ["CudaBackend", "H200_PEAKS", "NCCL_ENV_DEFAULTS"]
