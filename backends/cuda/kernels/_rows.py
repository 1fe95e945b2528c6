"""Shape plumbing shared by the row-wise Triton kernels (no Triton import: usable and testable anywhere).

Every kernel in this package works on a 2-D view ``[rows, N]`` whose last dim is contiguous; the
row stride may be anything (a column slice of a wider matrix stays a view). :func:`as_rows` makes
that view, copying only when the input cannot be viewed so (a non-contiguous last dim).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from hal.ops import SELF_CHECKING, SIZE_ROUTE

#: dtypes the Triton kernels take (compute is always float32 inside the kernel)
KERNEL_DTYPES = frozenset({"float32", "float16", "bfloat16"})
#: the same as torch dtypes (a set lookup on the hot path, no name conversion)
KERNEL_TORCH_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})
#: longest row the single-block kernels keep in registers (norms); softmax/cross-entropy loop past it
MAX_BLOCK = 32768
#: device type whose tensors the kernel wrappers take; Triton's CPU interpreter tests set it to "cpu"
KERNEL_DEVICE = "cuda"
#: SM count used for tensors not on a CUDA device (the CPU interpreter) unless :func:`set_sm_count` says otherwise
CPU_SM_COUNT = 4

_sm_counts: dict = {}


def sm_count(device: torch.device) -> int:
    """Multiprocessor count of ``device``, queried once per device and cached (the query costs
    host time); :data:`CPU_SM_COUNT` for a non-CUDA device. :func:`set_sm_count` overrides it."""
    n = _sm_counts.get(device)
    if n is None:
        if device.type == "cuda":
            n = torch.cuda.get_device_properties(device).multi_processor_count
        else:
            n = CPU_SM_COUNT
        _sm_counts[device] = n
    return n


def set_sm_count(device: torch.device, n: "int | None") -> None:
    """Pretend ``device`` has ``n`` multiprocessors (None: forget, query again); for tests."""
    if n is None:
        _sm_counts.pop(device, None)
    else:
        _sm_counts[device] = int(n)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``[rows, x.shape[-1]]`` with ``stride(-1) == 1`` (a view when possible)."""
    n = x.shape[-1]
    if x.dim() == 2 and x.stride(-1) == 1:
        return x
    if x.stride(-1) != 1:
        x = x.contiguous()
    x2 = x.reshape(-1, n)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def num_warps_for(block: int) -> int:
    """Warps per program for a row of ``block`` elements (enough lanes, few registers per lane)."""
    if block >= 16384:
        return 16
    if block >= 4096:
        return 8
    if block >= 1024:
        return 4
    return 2 if block >= 256 else 1


def self_checking(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark the kernel wrapper ``fn`` (named as its HAL op) as taking every call of its op: it checks its
    own arguments and calls torch's kernel for what it does not compute (:data:`hal.ops.SELF_CHECKING`:
    the dispatcher then runs no predicate chain per call). Below the routing floor of the call's dtype and
    grad mode (:func:`routing.dispatch_floors`) the wrapper's answer is the op's torch reference
    (``hal.ops.torch_impl``) called with the same arguments, so the dispatcher makes those calls itself
    (:data:`hal.ops.SIZE_ROUTE`), through the cheapest torch callable for them (``torch_impl.direct``).
    Returns ``fn``."""
    from hal.backends.cuda.kernels import routing
    from hal.ops import torch_impl

    setattr(fn, SELF_CHECKING, True)
    setattr(fn, SIZE_ROUTE, (routing.dispatch_floors(), torch_impl.direct(fn.__name__)))
    return fn
