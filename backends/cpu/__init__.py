"""The CPU backend: host memory, host streams/events, gloo collectives, torch kernels for every op.

Always available. Memory statistics come from the process (resident set size as ``allocated``,
its high-water mark as ``peak``) because torch's CPU allocator keeps no statistics by default;
``total``/``free`` are the machine's. Thread-safe.
"""
from __future__ import annotations

import os
import platform
import threading
from typing import Any

import torch

from hal.backend import Availability, Backend, DeviceProperties
from hal.environment import cpu_name
from hal.memory import MemoryStats
from hal.streams import HostEvent, HostStream, current_host_stream

_CPU_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
               "complex64", "complex128")


def _rss_peak_bytes() -> int:
    try:
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak) * (1 if platform.system() == "Darwin" else 1024)
    except Exception:  # pragma: no cover - non-POSIX
        return 0


class CpuBackend(Backend):
    """See the module docstring."""

    name = "cpu"
    device_type = "cpu"
    priority = 0
    dist_backend = "gloo"
    profiler_activity = None

    _peak_lock = threading.Lock()
    _peak_base = 0

    @classmethod
    def probe(cls) -> Availability:
        return Availability.ok(f"host CPU, {os.cpu_count()} logical cores, torch {torch.__version__}")

    @classmethod
    def versions(cls) -> dict[str, str]:
        import numpy
        v = {"torch": torch.__version__, "numpy": numpy.__version__, "python": platform.python_version()}
        try:
            v["gloo"] = "available" if torch.distributed.is_gloo_available() else "missing"
        except Exception:  # pragma: no cover
            pass
        return v

    def device_count(self) -> int:
        return 1

    def device_properties(self, index: int = 0) -> DeviceProperties:
        if index != 0:
            raise IndexError(f"cpu has one device, not {index + 1}")
        import psutil
        return DeviceProperties(
            index=0, name=cpu_name(),
            total_memory=int(psutil.virtual_memory().total), capability=None, dtypes=_CPU_DTYPES,
            features=tuple(sorted(f for f in ("avx2", "avx512", "neon") if self._cpu_has(f))),
            extra={"threads": torch.get_num_threads(), "logical_cores": os.cpu_count()})

    @staticmethod
    def _cpu_has(flag: str) -> bool:
        try:
            return torch.backends.cpu.get_cpu_capability().lower().startswith(flag)
        except Exception:
            return False

    # memory
    def memory_stats(self, device: Any = None) -> MemoryStats:
        import psutil
        proc = psutil.Process()
        rss = int(proc.memory_info().rss)
        vm = psutil.virtual_memory()
        with self._peak_lock:
            if CpuBackend._peak_base:  # after a reset: the high-water mark of the RSS sampled since
                CpuBackend._peak_base = peak = max(CpuBackend._peak_base, rss)
            else:
                peak = max(_rss_peak_bytes(), rss)
        return MemoryStats(allocated=rss, reserved=rss, peak=peak, peak_reserved=peak,
                           total=int(vm.total), free=int(vm.available),
                           source="process RSS (psutil); peak from getrusage until reset, then sampled")

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        import psutil
        with self._peak_lock:
            CpuBackend._peak_base = int(psutil.Process().memory_info().rss)

    # streams
    def create_stream(self, device: Any = None, priority: int = 0) -> HostStream:
        return HostStream(priority)

    def current_stream(self, device: Any = None) -> HostStream:
        return current_host_stream()

    def create_event(self, enable_timing: bool = False) -> HostEvent:
        return HostEvent(enable_timing)

    # ops
    def register_ops(self, registry: Any) -> None:
        from hal.ops import register_torch_impls
        register_torch_impls(registry, "cpu")
