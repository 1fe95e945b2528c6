"""Launching the Triton kernels with less host time: a cache of each kernel's compiled form.

``launch(kernel, grid, *args, **meta)`` does what ``kernel[grid](*args, **meta)`` does. Triton's own
launch (``JITFunction.run``) binds the arguments, computes their specialisation and the cache key,
checks the kernel's globals and only then launches the compiled kernel, on every call; that Python
work is most of the 45-90 us of host time a norm forward cost on the H200 (reports/cuda/README.md)
against torch's 14 us. Here the first call of a kernel with a given *launch key* goes through
Triton (compiling when needed) and keeps the ``CompiledKernel`` it returns; later calls with the
same key launch that compiled kernel directly (``CompiledKernel[grid](*all_args, stream=...)``,
the same final call ``JITFunction.run`` makes).

The launch key is at least as fine as Triton's specialisation: the kernel, the current device, per
tensor argument its dtype and whether its address is 16-byte aligned, per int argument whether it is
1, divisible by 16 and inside the int32 range, per other argument its type (and value for bools and
anything not a number), and every keyword (constexprs and launch options such as ``num_warps``) by
value. The kernel's globals are not re-checked (these kernels read none that change).

``HAL_TRITON_LAUNCH=triton`` (read at import) turns the cache off: every launch is Triton's own.
Under Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors) nothing is cached. Thread-safety: the cache is a dict (atomic get and set); two threads may both launch
through Triton the first time, which is harmless.
"""
from __future__ import annotations

import inspect
import os
from typing import Any, Optional

import torch

ENV = "HAL_TRITON_LAUNCH"
#: "cached" (default) or "triton"
MODE = os.environ.get(ENV, "cached")
_INT32 = range(-(1 << 31), 1 << 31)

_compiled: dict = {}
#: the current device and its current stream's handle (what Triton's own launch asks the driver for)
current_device = torch.cuda.current_device


def current_stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def on_device(first: Any) -> bool:
    """Whether a launch whose first argument is ``first`` runs on a CUDA device (the interpreter's CPU
    tensors are launched by Triton every time)."""
    return getattr(first, "is_cuda", False)


def _spec(a: Any):
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    t = type(a)
    if t is int:
        return (int, a == 1, a % 16 == 0, a in _INT32)
    if t is float:
        return float
    return (t, a)


def _tail(kernel: Any, n_positional: int, meta: dict) -> Optional[tuple]:
    """The values of the kernel's parameters after the positional ones, in signature order (from
    ``meta`` or the parameter's default); None when that cannot be told (then nothing is cached)."""
    params = getattr(kernel, "params", None)
    if params is None:
        return None
    tail = []
    for p in params[n_positional:]:
        name = getattr(p, "name", None)
        if name in meta:
            tail.append(meta[name])
            continue
        default = getattr(getattr(p, "_param", None), "default", inspect.Parameter.empty)
        if default is inspect.Parameter.empty:
            return None
        tail.append(default)
    return tuple(tail)


def launch(kernel: Any, grid: tuple, *args: Any, **meta: Any) -> None:
    """``kernel[grid](*args, **meta)`` with the compiled kernel cached per launch key (module docstring).

    ``grid`` is a tuple of 1 to 3 ints. Raises whatever Triton's launch raises."""
    if MODE != "cached" or not on_device(args[0]):
        kernel[grid](*args, **meta)
        return
    key = (kernel, current_device(), tuple(map(_spec, args)), tuple(meta.items()))
    hit = _compiled.get(key)
    if hit is None:
        compiled = kernel[grid](*args, **meta)
        tail = _tail(kernel, len(args), meta)
        if compiled is not None and tail is not None and hasattr(compiled, "run"):
            _compiled[key] = (compiled, tail)
        return
    compiled, tail = hit
    g = tuple(grid) + (1,) * (3 - len(grid))
    compiled[g](*args, *tail, stream=current_stream())


def cached() -> int:
    """How many launch keys have a cached compiled kernel (for tests and benchmarks)."""
    return len(_compiled)
