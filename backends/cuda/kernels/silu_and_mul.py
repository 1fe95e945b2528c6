"""Triton SiLU-and-mul (the SwiGLU gate): ``silu(a) * b`` for ``a, b = x.chunk(2, -1)``, with backward.

Elementwise over ``[rows, d]`` tiles of a ``[rows, 2d]`` input: one read of each half and one
write, float32 math, no intermediate ``silu(a)`` tensor (the unfused torch sequence writes and
re-reads it). The public wrapper takes every call: what the kernel does not take, or what
:mod:`routing` sends to torch, goes to the unfused torch sequence.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from hal.backends.cuda.kernels import routing, supports_silu_and_mul
from hal.backends.cuda.kernels._rows import as_rows, next_power_of_2, self_checking
from hal.backends.cuda.kernels.launcher import Launcher, aligned
from hal.ops import torch_impl

#: columns per program at most, and the warps per block: measured on an H100 (benchmarks/tune_silu_and_mul.py,
#: reports/cuda/h100/tune_silu_and_mul-fea2011.json): 8192 columns with 16 warps was the fastest plan over the forward
#: and backward cases (geometric mean), 1-4% faster than the 2048 x 8 warps used before (float32 16384 x 32768
#: backward 1808 against 1849 us, forward 1080 against 1099)
_BLOCK = 8192


@triton.jit
def _silu_mul_fwd(X, Y, stride_x, stride_y, D, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    a = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(X + row * stride_x + D + cols, mask=mask, other=0.0).to(tl.float32)
    y = a * tl.sigmoid(a) * b
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_bwd(DY, X, DX, stride_dy, stride_x, stride_dx, D, BLOCK: tl.constexpr):
    # da = dy * b * s * (1 + a * (1 - s)),  db = dy * a * s,  s = sigmoid(a)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(X + row * stride_x + D + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(a)
    da = dy * b * s * (1.0 + a * (1.0 - s))
    db = dy * a * s
    tl.store(DX + row * stride_dx + cols, da.to(DX.dtype.element_ty), mask=mask)
    tl.store(DX + row * stride_dx + D + cols, db.to(DX.dtype.element_ty), mask=mask)


def _block(d: int) -> int:
    return min(_BLOCK, next_power_of_2(d))


def _warps(block: int) -> int:
    return 16 if block >= 4096 else 8 if block >= 2048 else 4 if block >= 512 else 1


_plans: dict = {}


def _plan(d: int) -> tuple:
    """``(block, warps)`` for rows of ``2 d`` elements (cached per d)."""
    p = _plans.get(d)
    if p is None:
        block = _block(d)
        p = _plans[d] = (block, _warps(block))
    return p


_FWD, _BWD = Launcher(_silu_mul_fwd), Launcher(_silu_mul_bwd)


def silu_and_mul_forward(x: torch.Tensor, plan: Optional[tuple] = None) -> torch.Tensor:
    """``silu(a) * b`` of ``x [..., 2d]`` as a new ``[..., d]`` tensor. ``plan``: ``(block, warps)`` of the
    launch (default: :data:`_BLOCK` columns or fewer, :func:`_warps`; ``benchmarks/tune_silu_and_mul.py``
    tries others)."""
    x2 = as_rows(x)
    rows, two_d = x2.shape
    d = two_d // 2
    y = torch.empty((rows, d), dtype=x.dtype, device=x.device)
    block, warps = plan or _plan(d)
    if rows and d:
        args = (x2, y, x2.stride(0), y.stride(0), d)
        # the launch key (launcher's contract): device, dtype, int arguments, the plan
        key = (x2.get_device(), x2.dtype, block, warps) + args[2:] if aligned(x2) else None  # y: ours
        _FWD((rows, -(-d // block), 1), key, args, dict(BLOCK=block, num_warps=warps))
    return y.view(*x.shape[:-1], d)


def silu_and_mul_backward(dy: torch.Tensor, x: torch.Tensor, plan: Optional[tuple] = None) -> torch.Tensor:
    """The gradient of :func:`silu_and_mul_forward` over ``x`` for ``dy``; ``plan`` as there."""
    x2, dy2 = as_rows(x), as_rows(dy)
    rows, two_d = x2.shape
    d = two_d // 2
    dx = torch.empty_like(x2)  # [rows, 2d] contiguous (_rows.as_rows)
    block, warps = plan or _plan(d)
    if rows and d:
        args = (dy2, x2, dx, dy2.stride(0), x2.stride(0), dx.stride(0), d)
        key = (x2.get_device(), dy2.dtype, x2.dtype, block, warps) + args[3:] if aligned(dy2, x2) else None
        _BWD((rows, -(-d // block), 1), key, args, dict(BLOCK=block, num_warps=warps))  # dx: ours, aligned
    return dx.view(x.shape)


class SiluAndMulFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        ctx.save_for_backward(x)
        return silu_and_mul_forward(x)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        (x,) = ctx.saved_tensors
        return silu_and_mul_backward(dy, x)


#: routing's per-op floors: inputs below them go to torch without the predicate (routing.floors)
_FLOORS = routing.floors()


@self_checking
def silu_and_mul(input: torch.Tensor) -> torch.Tensor:
    """``F.silu(a) * b`` with ``a, b = input.chunk(2, dim=-1)``, for every call: the kernel where
    :func:`~hal.backends.cuda.kernels.supports_silu_and_mul` and :mod:`routing` allow, else torch."""
    try:
        small = input.numel() < _FLOORS["silu_and_mul"]  # below: torch, any dtype and mode
    except AttributeError:  # not a tensor: the predicate says so
        small = False
    if not small and supports_silu_and_mul(input) is None:
        mode = routing.mode(input)
        if routing.decide("silu_and_mul", input.dtype, mode, input.numel()):
            if mode == "train":
                return SiluAndMulFunction.apply(input)
            return silu_and_mul_forward(input)
    return torch_impl.silu_and_mul(input)
