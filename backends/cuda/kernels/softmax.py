"""Triton softmax and log_softmax over the last dim, forward and backward (imports Triton).

Rows up to :data:`MAX_BLOCK` elements are read once and written once (one program per row, the row
in registers); longer rows take the looped kernel, which keeps a running max and sum per lane
(online softmax) in one read pass and writes in a second. The backward likewise holds a row of ``dy``
and ``y`` in registers up to :data:`BWD_SINGLE_MAX` elements (read once each, ``dx`` written once:
the fewest bytes); longer rows take two passes in tiles of :data:`BWD_TILE` (:func:`bwd_plan`).
Compute is float32 whatever the storage dtype; NaN and Inf propagate as in torch (a row holding NaN
or +Inf comes out NaN; -Inf entries give 0, or -Inf for log_softmax). The public wrappers take every call: what the kernels do not take,
or what :mod:`routing` sends to torch, goes to ``torch.softmax`` / ``torch.log_softmax``.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from hal.backends.cuda.kernels import routing, supports_softmax
from hal.backends.cuda.kernels._rows import MAX_BLOCK, as_rows, next_power_of_2, num_warps_for, self_checking
from hal.backends.cuda.kernels.launcher import Launcher, aligned

#: the backward keeps rows up to this many elements (a power of two) of dy and y in registers
BWD_SINGLE_MAX = 32768
#: column tile of the two-pass backward (rows longer than BWD_SINGLE_MAX)
BWD_TILE = 4096
#: warps of the single-pass backward per row block, measured on the H200 (benchmarks/tune_softmax_bwd.py,
#: reports/cuda/tune_softmax_bwd.json: 1024, 4096, 8192, 16384 and 32768 wide; the others interpolated)
BWD_WARPS = {256: 1, 512: 2, 1024: 2, 2048: 4, 4096: 8, 8192: 16, 16384: 16, 32768: 16}


@triton.jit
def _softmax_fwd(X, Y, stride_x, stride_y, N, BLOCK: tl.constexpr, LOG: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=-float("inf")).to(tl.float32)
    z = x - tl.max(x, 0)
    e = tl.exp(z)
    s = tl.sum(e, 0)
    if LOG:
        y = z - tl.log(s)
    else:
        y = e / s
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _online_max_sum(X, row_ptr_off, N, BLOCK: tl.constexpr):
    """Row max and sum(exp(x - max)) in one pass over ``N`` elements, ``BLOCK`` at a time
    (one exp per element: the running max is rescaled once per block, not per element)."""
    m = tl.max(tl.full([BLOCK], -float("inf"), tl.float32), 0)
    s = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(X + row_ptr_off + cols, mask=cols < N, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        empty = m_new == -float("inf")  # everything so far is -inf: nothing to add yet
        alpha = tl.where(empty, 0.0, tl.exp(m - m_new))
        s = s * alpha + tl.where(empty, 0.0, tl.sum(tl.exp(x - m_new), 0))
        m = m_new
    return m, s


@triton.jit
def _softmax_fwd_loop(X, Y, stride_x, stride_y, N, BLOCK: tl.constexpr, LOG: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_max, total = _online_max_sum(X, row * stride_x, N, BLOCK)
    log_total = tl.log(total)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(X + row * stride_x + cols, mask=mask, other=-float("inf")).to(tl.float32)
        z = x - row_max
        if LOG:
            y = z - log_total
        else:
            y = tl.exp(z) / total
        tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_row(DY, Y, DX, stride_dy, stride_y, stride_dx, N, BLOCK: tl.constexpr, LOG: tl.constexpr):
    # one pass: the row of dy and y in registers (formulas as in _softmax_bwd)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(Y + row * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
    if LOG:
        dx = dy - tl.exp(y) * tl.sum(dy, 0)
    else:
        dx = y * (dy - tl.sum(dy * y, 0))
    tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd(DY, Y, DX, stride_dy, stride_y, stride_dx, N, BLOCK: tl.constexpr, LOG: tl.constexpr):
    # softmax:     dx = y * (dy - sum(dy * y))
    # log_softmax: dx = dy - exp(y) * sum(dy)
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        if LOG:
            acc += dy
        else:
            y = tl.load(Y + row * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
            acc += dy * y
    dot = tl.sum(acc, 0)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(Y + row * stride_y + cols, mask=mask, other=0.0).to(tl.float32)
        if LOG:
            dx = dy - tl.exp(y) * dot
        else:
            dx = y * (dy - dot)
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)


_FWD, _FWD_LOOP = Launcher(_softmax_fwd), Launcher(_softmax_fwd_loop)
_BWD_ROW, _BWD = Launcher(_softmax_bwd_row), Launcher(_softmax_bwd)


def bwd_plan(n: int) -> tuple[bool, int, int]:
    """``(single pass, block, warps)`` of the backward for rows of ``n`` elements."""
    block = next_power_of_2(n)
    if block <= BWD_SINGLE_MAX:
        return True, block, BWD_WARPS.get(block, 1)
    return False, BWD_TILE, num_warps_for(BWD_TILE)


def softmax_forward(x: torch.Tensor, log: bool, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Softmax (or log_softmax) of ``x`` over its last dim, stored as ``out_dtype`` (default x's)."""
    x2 = as_rows(x)
    rows, n = x2.shape
    # [rows, n] contiguous (_rows.as_rows); empty_like: one argument for torch to parse instead of three
    y = torch.empty_like(x2) if out_dtype is None or out_dtype == x2.dtype else torch.empty_like(x2, dtype=out_dtype)
    block = next_power_of_2(n)
    args = (x2, y, x2.stride(0), y.stride(0), n)
    # the launch key (launcher's contract): device, dtypes, int arguments, LOG (the block follows from n)
    key = (x2.get_device(), x2.dtype, y.dtype, log) + args[2:] if aligned(x2) else None  # y: ours, aligned
    if block <= MAX_BLOCK:
        _FWD((rows, 1, 1), key, args, dict(BLOCK=block, LOG=log, num_warps=num_warps_for(block)))
    else:
        _FWD_LOOP((rows, 1, 1), key, args, dict(BLOCK=8192, LOG=log, num_warps=16))
    return y if x.dim() == 2 else y.view(x.shape)


def softmax_backward(dy: torch.Tensor, y: torch.Tensor, log: bool, in_dtype: torch.dtype,
                     plan: Optional[tuple[bool, int, int]] = None) -> torch.Tensor:
    """The input gradient of softmax (``log``: log_softmax) from the output ``y`` and its gradient ``dy``,
    stored as ``in_dtype``; ``plan`` (default :func:`bwd_plan`'s) as ``(single pass, block, warps)``."""
    dy2, y2 = as_rows(dy), as_rows(y)
    rows, n = y2.shape
    dx = torch.empty_like(y2) if in_dtype == y2.dtype else torch.empty_like(y2, dtype=in_dtype)
    single, block, warps = plan or bwd_plan(n)
    args = (dy2, y2, dx, dy2.stride(0), y2.stride(0), dx.stride(0), n)
    # the launch key (launcher's contract): device, dtypes, LOG, block and warps, the int arguments
    key = (y2.get_device(), dy2.dtype, y2.dtype, dx.dtype, log, block, warps) + args[3:] \
        if aligned(dy2, y2) else None
    (_BWD_ROW if single else _BWD)((rows, 1, 1), key, args, dict(BLOCK=block, LOG=log, num_warps=warps))
    return dx if y.dim() == 2 else dx.view(y.shape)


class SoftmaxFunction(torch.autograd.Function):
    """Autograd wrapper: saves the output (not the input) for the backward kernel."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, log: bool, out_dtype: Optional[torch.dtype]):  # type: ignore[override]
        y = softmax_forward(x, log, out_dtype)
        ctx.save_for_backward(y)
        ctx.log = log
        ctx.in_dtype = x.dtype
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # type: ignore[override]
        (y,) = ctx.saved_tensors
        return softmax_backward(dy, y, ctx.log, ctx.in_dtype), None, None


def _softmax_call(op: str, log: bool, input: torch.Tensor, dim: int, dtype: Optional[torch.dtype]):
    """The full path: the predicate, :func:`routing.mode` and :func:`routing.decide`."""
    if supports_softmax(input, dim, dtype) is None:
        mode = routing.mode(input)
        if routing.decide(op, input.dtype, mode, input.numel()):
            if mode == "train":
                return SoftmaxFunction.apply(input, log, dtype)
            return softmax_forward(input, log, dtype)
    fn = torch.log_softmax if log else torch.softmax
    return fn(input, dim) if dtype is None else fn(input, dim, dtype=dtype)


#: routing's per-op floors (routing.floors): the public wrappers compare the input's size with the op's
#: first; below it the call is torch's whatever the dtype, the mode and the predicate, so it goes there
#: with one tensor query and a dict lookup. (``dtype=None`` is not passed on to torch: the keyword costs
#: torch's argument parser time and selects the same overload.)
_FLOORS = routing.floors()


@self_checking
def softmax(input: torch.Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``torch.softmax(input, dim, dtype=dtype)`` for every call: the kernel over the last dim where
    :func:`~hal.backends.cuda.kernels.supports_softmax` and :mod:`routing` allow, else torch's."""
    try:
        small = input.numel() < _FLOORS["softmax"]  # below: torch, any dtype and mode
    except AttributeError:  # not a tensor: the predicate says so
        small = False
    if small:
        return torch.softmax(input, dim) if dtype is None else torch.softmax(input, dim, dtype=dtype)
    return _softmax_call("softmax", False, input, dim, dtype)


@self_checking
def log_softmax(input: torch.Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``torch.log_softmax(input, dim, dtype=dtype)`` for every call (as :func:`softmax`)."""
    try:
        small = input.numel() < _FLOORS["log_softmax"]  # below: torch, any dtype and mode
    except AttributeError:  # not a tensor: the predicate says so
        small = False
    if small:
        return torch.log_softmax(input, dim) if dtype is None else torch.log_softmax(input, dim, dtype=dtype)
    return _softmax_call("log_softmax", True, input, dim, dtype)
