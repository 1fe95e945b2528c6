"""Triton layer_norm, rms_norm and fused add + rms_norm over the trailing dims, forward and backward.

One program normalises one row held in registers (rows up to :data:`MAX_BLOCK` elements; the
registry's predicate sends longer rows to torch). Statistics are float32; the forward saves the
per-row mean and 1/std (float32) for the backward. The backward computes the input gradient row
by row and the weight/bias gradients as per-program partial sums over a strip of rows, added up
by one ``sum(0)``; no normalised activations are stored.

``add_rms_norm(x, residual)`` returns ``(rms_norm(h), h)`` with ``h = x + residual`` rounded to the
storage dtype first, exactly what the unfused torch sequence computes; its backward adds the
gradient flowing into ``h`` to the normalisation's.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

from hal.backends.cuda.kernels._rows import as_rows, next_power_of_2, num_warps_for


@triton.jit
def _norm_fwd(X, R, Y, H, W, B, Mean, Rstd, stride_x, stride_r, stride_y, stride_h, N, eps,
              BLOCK: tl.constexpr, IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr,
              HAS_B: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        h = (x + r).to(H.dtype.element_ty)
        tl.store(H + row * stride_h + cols, h, mask=mask)
        x = h.to(tl.float32)
    if IS_RMS:
        xc = x
    else:
        mean = tl.sum(x, 0) / N
        xc = tl.where(mask, x - mean, 0.0)
        tl.store(Mean + row, mean)
    var = tl.sum(xc * xc, 0) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    tl.store(Rstd + row, rstd)
    y = xc * rstd
    if HAS_W:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _norm_bwd(DY, X, W, Mean, Rstd, DH, DX, DW, DB, stride_dy, stride_x, stride_dh, stride_dx, M, N,
              rows_per_prog, BLOCK: tl.constexpr, IS_RMS: tl.constexpr, HAS_W: tl.constexpr,
              HAS_B: tl.constexpr, HAS_DH: tl.constexpr):
    # xhat = (x - mean) * rstd ; g = dy * w
    # layer_norm: dx = rstd * (g - mean(g * xhat) * xhat - mean(g))
    # rms_norm:   dx = rstd * (g - mean(g * xhat) * xhat)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    if HAS_W:
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK], tl.float32)
    db_acc = tl.zeros([BLOCK], tl.float32)
    first = pid.to(tl.int64) * rows_per_prog
    last = tl.minimum(first + rows_per_prog, M)
    for row64 in range(first, last):
        x = tl.load(X + row64 * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row64 * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(Rstd + row64)
        if IS_RMS:
            xhat = x * rstd
        else:
            xhat = tl.where(mask, (x - tl.load(Mean + row64)) * rstd, 0.0)
        if HAS_W:
            g = dy * w
        else:
            g = dy
        c1 = tl.sum(g * xhat, 0) / N
        if IS_RMS:
            dx = (g - xhat * c1) * rstd
        else:
            c2 = tl.sum(g, 0) / N
            dx = (g - xhat * c1 - c2) * rstd
        if HAS_DH:
            dx += tl.load(DH + row64 * stride_dh + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + row64 * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        if HAS_W:
            dw_acc += dy * xhat
        if HAS_B:
            db_acc += dy
    if HAS_W:
        tl.store(DW + pid * N + cols, dw_acc, mask=mask)
    if HAS_B:
        tl.store(DB + pid * N + cols, db_acc, mask=mask)


def _programs(rows: int, device: torch.device) -> int:
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(rows, 4 * sms))


def norm_forward(x, residual, weight, bias, eps: float, is_rms: bool, n: int):
    """Returns ``(y, h, mean, rstd)``; ``h`` is None without a residual, ``mean`` None for RMS."""
    x2 = as_rows(x if x.shape[-1] == n else x.reshape(-1, n))
    rows = x2.shape[0]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    r2 = None if residual is None else as_rows(residual if residual.shape[-1] == n else residual.reshape(-1, n))
    h = torch.empty((rows, n), dtype=x.dtype, device=x.device) if residual is not None else None
    mean = None if is_rms else torch.empty(rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    block = next_power_of_2(n)
    w = weight.reshape(-1).contiguous() if weight is not None else None
    b = bias.reshape(-1).contiguous() if bias is not None else None
    if rows:
        _norm_fwd[(rows,)](x2, r2 if r2 is not None else x2, y, h if h is not None else y, w if w is not None else x2,
                           b if b is not None else x2, mean if mean is not None else rstd, rstd,
                           x2.stride(0), r2.stride(0) if r2 is not None else 0, y.stride(0),
                           h.stride(0) if h is not None else 0, n, float(eps), BLOCK=block, IS_RMS=is_rms,
                           HAS_RES=residual is not None, HAS_W=w is not None, HAS_B=b is not None,
                           num_warps=num_warps_for(block))
    return y.view(x.shape), (h.view(x.shape) if h is not None else None), mean, rstd


def norm_backward(dy, x, weight, has_bias: bool, mean, rstd, dh, is_rms: bool, n: int):
    """Returns ``(dx, dw, db)`` (dw/db None when absent); ``dh`` is the extra gradient into ``h``."""
    dy2 = as_rows(dy.reshape(-1, n))
    x2 = as_rows(x.reshape(-1, n))
    dh2 = as_rows(dh.reshape(-1, n)) if dh is not None else None
    rows = x2.shape[0]
    dx = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    block = next_power_of_2(n)
    progs = _programs(rows, x.device) if rows else 1
    rows_per_prog = -(-rows // progs) if rows else 0
    has_w = weight is not None
    dw_part = torch.empty((progs, n), dtype=torch.float32, device=x.device) if has_w else None
    db_part = torch.empty((progs, n), dtype=torch.float32, device=x.device) if has_bias else None
    w = weight.reshape(-1).contiguous() if has_w else None
    if rows:
        _norm_bwd[(progs,)](dy2, x2, w if has_w else x2, mean if mean is not None else rstd, rstd,
                            dh2 if dh2 is not None else dy2, dx, dw_part if has_w else rstd,
                            db_part if has_bias else rstd, dy2.stride(0), x2.stride(0),
                            dh2.stride(0) if dh2 is not None else 0, dx.stride(0), rows, n, rows_per_prog,
                            BLOCK=block, IS_RMS=is_rms, HAS_W=has_w, HAS_B=has_bias, HAS_DH=dh2 is not None,
                            num_warps=num_warps_for(block))
    dw = dw_part.sum(0).to(weight.dtype).view(weight.shape) if has_w else None
    db = db_part.sum(0).to(weight.dtype if has_w else x.dtype) if has_bias else None
    return dx.view(x.shape), dw, db


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, n):  # type: ignore[override]
        y, _, mean, rstd = norm_forward(x, None, weight, bias, eps, False, n)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.n, ctx.has_bias, ctx.bias_shape = n, bias is not None, None if bias is None else bias.shape
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = norm_backward(dy, x, weight, ctx.has_bias, mean, rstd, None, False, ctx.n)
        if db is not None:
            db = db.to(ctx.bias_dtype).view(ctx.bias_shape)
        return dx, dw, db, None, None


class RmsNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps, n):  # type: ignore[override]
        y, h, _, rstd = norm_forward(x, residual, weight, None, eps, True, n)
        ctx.save_for_backward(h if h is not None else x, weight, rstd)
        ctx.n, ctx.has_res = n, residual is not None
        if h is not None:
            return y, h
        return y

    @staticmethod
    def backward(ctx, dy, dh=None):  # type: ignore[override]
        h, weight, rstd = ctx.saved_tensors
        dx, dw, _ = norm_backward(dy, h, weight, False, None, rstd, dh if ctx.has_res else None, True, ctx.n)
        return dx, (dx if ctx.has_res else None), dw, None, None


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _n(normalized_shape: Sequence[int]) -> int:
    n = 1
    for s in normalized_shape:
        n *= int(s)
    return n


def layer_norm(input: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    """``F.layer_norm`` over the trailing ``normalized_shape`` dims."""
    if _needs_grad(input, weight, bias):
        return LayerNormFunction.apply(input, weight, bias, eps, _n(normalized_shape))
    return norm_forward(input, None, weight, bias, eps, False, _n(normalized_shape))[0]


def _eps(input: torch.Tensor, eps: Optional[float]) -> float:
    return torch.finfo(input.dtype).eps if eps is None else float(eps)


def rms_norm(input: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor] = None,
             eps: Optional[float] = None) -> torch.Tensor:
    """``F.rms_norm`` over the trailing ``normalized_shape`` dims (eps None: the dtype's machine eps)."""
    if _needs_grad(input, weight):
        return RmsNormFunction.apply(input, None, weight, _eps(input, eps), _n(normalized_shape))
    return norm_forward(input, None, weight, None, _eps(input, eps), True, _n(normalized_shape))[0]


def add_rms_norm(input: torch.Tensor, residual: torch.Tensor, normalized_shape: Sequence[int],
                 weight: Optional[torch.Tensor] = None, eps: Optional[float] = None):
    """``h = input + residual``; returns ``(rms_norm(h), h)`` in one pass."""
    if _needs_grad(input, residual, weight):
        y, h = RmsNormFunction.apply(input, residual, weight, _eps(input, eps), _n(normalized_shape))
        return y, h
    y, h, _, _ = norm_forward(input, residual, weight, None, _eps(input, eps), True, _n(normalized_shape))
    return y, h
