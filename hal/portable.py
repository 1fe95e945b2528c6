"""Device-neutral stand-ins for CUDA calls: what ``hal-audit --fix-to hal`` rewrites code to.

A stable, documented part of the core that migrated production code may depend on (it imports
nothing from the audit suite). A patched program does ``import hal.portable as hal_portable`` and calls
these instead of ``torch.cuda.*``; each call goes to the backend :func:`hal.get_backend` selects
(``$HAL_BACKEND`` or the best available one), so the same program runs on CUDA, MLU or the CPU.

Contract: every function has the meaning of its ``torch.cuda`` namesake on the selected backend.
Where the device module (``torch.cuda``, ``torch.mlu``, ``torch.cpu``) lacks a call, it raises
:class:`hal.errors.NotSupportedError` naming the call and backend, never silently does nothing.
Thread-safe: only reads the shared backend instance.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Optional

import torch

import hal
from hal.errors import NotSupportedError


def backend() -> "hal.Backend":
    """The backend the program runs on (``$HAL_BACKEND`` or the best available)."""
    return hal.get_backend()


def device_type() -> str:
    """The torch device type of the backend: "cuda", "mlu", "cpu"."""
    return backend().device_type


#: what :func:`accelerator_type` returns on the CPU: equal to no device type and contained in no device string
NO_ACCELERATOR = "<no accelerator>"


def accelerator_type() -> str:
    """The device type a CUDA program's ``"cuda"`` *comparisons* mean: the backend's accelerator type,
    or :data:`NO_ACCELERATOR` on the CPU backend, so ``device_type == "cuda"`` stays False there (the
    program takes its non-accelerator branch, as it would on a machine without CUDA)."""
    dt = device_type()
    return NO_ACCELERATOR if dt == "cpu" else dt


def device(index: Optional[int] = None) -> torch.device:
    """``torch.device`` for device ``index`` (None: the current device; ignored on the CPU)."""
    dt = device_type()
    if dt == "cpu":
        return torch.device("cpu")
    return torch.device(dt, index) if index is not None else backend().torch_device()


def device_name(index: Optional[int] = None) -> str:
    """``"mlu:1"`` style device string (just the type on the CPU)."""
    return str(device(index))


def on_device(tensor: Any) -> bool:
    """What ``tensor.is_cuda`` means, for the backend's device type."""
    return tensor.device.type == device_type()


def dist_backend() -> str:
    """The torch.distributed backend name for the device ("nccl", "cncl", "gloo")."""
    return backend().dist_backend


def profiler_activity() -> Any:
    """The ``torch.profiler.ProfilerActivity`` recording device time (CPU on the CPU backend)."""
    name = type(backend()).profiler_activity or "CPU"
    return getattr(torch.profiler.ProfilerActivity, name)


def env_name(cuda_name: str) -> str:
    """The backend's name for CUDA/NCCL environment variable ``cuda_name`` (itself when unmapped)."""
    return type(backend()).env_map().get(cuda_name) or cuda_name


def device_module() -> Any:
    """``torch.cuda`` / ``torch.mlu`` / ``torch.cpu``: the module mirroring torch.cuda's API."""
    dt = device_type()
    mod = getattr(torch, dt, None)
    if mod is None:
        raise NotSupportedError(f"torch.{dt}", backend().name, ["torch has no such device module"])
    return mod


def _call(name: str, *args: Any, **kwargs: Any) -> Any:
    fn = getattr(device_module(), name, None)
    if fn is None:
        raise NotSupportedError(f"torch.{device_type()}.{name}", backend().name, ["the device module has no such call"])
    return fn(*args, **kwargs)


def is_available() -> bool:
    return backend().device_count() > 0


def device_count() -> int:
    return backend().device_count()


def current_device() -> int:
    return backend().current_device()


def set_device(index: Any) -> None:
    if isinstance(index, torch.device):
        index = index.index or 0
    backend().set_device(int(index))


def synchronize(device: Any = None) -> None:
    backend().synchronize(device)


def manual_seed(seed: int) -> None:
    """Seed the device's generators (``torch.manual_seed`` seeds CPU and every accelerator)."""
    torch.manual_seed(seed)


manual_seed_all = manual_seed


def memory_allocated(device: Any = None) -> int:
    return backend().memory_stats(device).allocated


def max_memory_allocated(device: Any = None) -> int:
    return backend().memory_stats(device).peak


def memory_reserved(device: Any = None) -> int:
    return backend().memory_stats(device).reserved


def max_memory_reserved(device: Any = None) -> int:
    """The highest reservation since the last reset where the backend tracks it
    (``MemoryStats.peak_reserved``); otherwise the current reservation, a lower bound of that peak."""
    stats = backend().memory_stats(device)
    return stats.reserved if stats.peak_reserved is None else stats.peak_reserved


def reset_peak_memory_stats(device: Any = None) -> None:
    backend().reset_peak_memory_stats(device)


def empty_cache() -> None:
    backend().empty_cache()


def Stream(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - mirrors torch.cuda.Stream
    return _call("Stream", *args, **kwargs)


def Event(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - mirrors torch.cuda.Event
    return _call("Event", *args, **kwargs)


def current_stream(*args: Any, **kwargs: Any) -> Any:
    return _call("current_stream", *args, **kwargs)


def stream(s: Any) -> Any:
    return _call("stream", s)


def get_device_name(index: Optional[int] = None) -> str:
    return backend().device_properties(index or 0).name


def get_device_capability(index: Optional[int] = None) -> tuple:
    """The vendor's own architecture version; (0, 0) where the backend has none (the CPU)."""
    cap = backend().device_properties(index or 0).capability
    return tuple(cap) if cap is not None else (0, 0)


def is_bf16_supported() -> bool:
    return backend().supports_dtype(torch.bfloat16)


def autocast(enabled: bool = True, dtype: Optional[torch.dtype] = None, cache_enabled: bool = True) -> Any:
    """``torch.cuda.amp.autocast`` on the backend's device: float16 by default (bfloat16 on the CPU)."""
    dt = device_type()
    if dtype is None:
        dtype = torch.bfloat16 if dt == "cpu" else torch.float16
    return torch.autocast(dt, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


def GradScaler(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - mirrors torch.cuda.amp.GradScaler
    """``torch.amp.GradScaler`` for the backend's device (torch >= 2.3; older torch: CUDA only)."""
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(device_type(), *args, **kwargs)
    if device_type() == "cuda":  # pragma: no cover - torch < 2.3
        return torch.cuda.amp.GradScaler(*args, **kwargs)
    raise NotSupportedError("GradScaler", backend().name, ["a non-CUDA GradScaler needs torch >= 2.3"])


_RANGES = threading.local()


def range_push(msg: str) -> None:
    """Open a named range in the torch profiler (per thread, like NVTX ranges)."""
    ctx = torch.autograd.profiler.record_function(msg)
    ctx.__enter__()
    stack = getattr(_RANGES, "stack", None)
    if stack is None:
        stack = _RANGES.stack = []
    stack.append(ctx)


def range_pop() -> None:
    """Close the innermost range this thread opened (no-op when none is open)."""
    stack = getattr(_RANGES, "stack", None)
    if stack:
        stack.pop().__exit__(None, None, None)


@contextlib.contextmanager
def range(msg: str, *args: Any, **kwargs: Any):  # noqa: A001 - mirrors torch.cuda.nvtx.range
    with torch.autograd.profiler.record_function(msg.format(*args, **kwargs) if args or kwargs else msg):
        yield


def mark(msg: str) -> None:
    with torch.autograd.profiler.record_function(msg):
        pass


def get_device_properties(index: Optional[int] = None) -> Any:
    """The fields CUDA code reads from ``torch.cuda.get_device_properties`` (name, total_memory,
    major, minor), from the backend's :class:`hal.DeviceProperties`; major/minor are the vendor's
    own architecture version ((0, 0) on the CPU): never compare them across vendors."""
    import types
    props = backend().device_properties(index or 0)
    major, minor = tuple(props.capability) if props.capability is not None else (0, 0)
    return types.SimpleNamespace(name=props.name, total_memory=props.total_memory, major=major, minor=minor,
                                 properties=props)


def Graph(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - mirrors torch.cuda.CUDAGraph
    """The device's graph-capture class (``torch.cuda.CUDAGraph``, ``torch.mlu.MLUGraph``)."""
    return _call(f"{device_type().upper()}Graph", *args, **kwargs)


def graph(g: Any, *args: Any, **kwargs: Any) -> Any:
    """The device's graph-capture context (``torch.cuda.graph``, ``torch.mlu.graph``)."""
    return _call("graph", g, *args, **kwargs)
