"""Shape plumbing shared by the row-wise Triton kernels (no Triton import: usable and testable anywhere).

Every kernel in this package works on a 2-D view ``[rows, N]`` whose last dim is contiguous; the
row stride may be anything (a column slice of a wider matrix stays a view). :func:`as_rows` makes
that view, copying only when the input cannot be viewed so (a non-contiguous last dim).
"""
from __future__ import annotations

import torch

#: dtypes the Triton kernels take (compute is always float32 inside the kernel)
KERNEL_DTYPES = frozenset({"float32", "float16", "bfloat16"})
#: longest row the single-block kernels keep in registers (norms); softmax/cross-entropy loop past it
MAX_BLOCK = 32768


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
