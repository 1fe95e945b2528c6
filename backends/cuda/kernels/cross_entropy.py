"""Triton cross-entropy: fused log_softmax + nll_loss over class logits, with backward.

Forward: one program per row reads the logits once (a running max and sum per lane, the online
softmax), gathers the target logit, and writes the row's loss and log-sum-exp (two floats per
row); the ``[rows, classes]`` probabilities are never materialised. Backward reads the logits
once more and writes ``(softmax - onehot) * grad`` directly. Rows whose target equals
``ignore_index`` contribute 0 and are left out of the mean (all ignored: NaN, as torch); a target
outside ``[0, classes)`` gives a NaN loss (torch raises a device-side assert instead).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from hal.backends.cuda.kernels._rows import as_rows, next_power_of_2, num_warps_for
from hal.backends.cuda.kernels.softmax import _online_max_sum

_BLOCK = 16384


@triton.jit
def _ce_fwd(X, T, Loss, Lse, stride_x, V, ignore_index, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(T + row).to(tl.int64)
    row_max, total = _online_max_sum(X, row * stride_x, V, BLOCK)
    lse = row_max + tl.log(total)
    valid = t != ignore_index
    in_range = (t >= 0) & (t < V)
    xt = tl.load(X + row * stride_x + tl.where(in_range, t, 0)).to(tl.float32)
    loss = tl.where(valid, tl.where(in_range, lse - xt, float("nan")), 0.0)
    tl.store(Loss + row, loss)
    tl.store(Lse + row, lse)


@triton.jit
def _ce_bwd(X, T, Lse, G, DX, stride_x, stride_dx, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(T + row).to(tl.int64)
    lse = tl.load(Lse + row)
    g = tl.load(G + row)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < V
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        p = tl.exp(x - lse)
        dx = (p - tl.where(cols == t, 1.0, 0.0)) * g
        dx = tl.where(g == 0.0, 0.0, dx)
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)


def _block(v: int) -> int:
    return min(_BLOCK, next_power_of_2(v))


def ce_forward(logits: torch.Tensor, target: torch.Tensor, ignore_index: int):
    """Per-row float32 ``(loss, lse)`` for 2-D ``logits`` ``[rows, classes]`` and ``target`` ``[rows]``."""
    x2 = as_rows(logits)
    rows, v = x2.shape
    t = target.contiguous()
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
    block = _block(v)
    if rows:
        _ce_fwd[(rows,)](x2, t, loss, lse, x2.stride(0), v, int(ignore_index), BLOCK=block,
                         num_warps=num_warps_for(block))
    return x2, t, loss, lse


def _reduce(loss: torch.Tensor, valid: torch.Tensor, reduction: str, dtype: torch.dtype) -> torch.Tensor:
    if reduction == "none":
        return loss.to(dtype)
    if reduction == "sum":
        return loss.sum().to(dtype)
    return (loss.sum() / valid.sum()).to(dtype)


class CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, ignore_index, reduction):  # type: ignore[override]
        x2, t, loss, lse = ce_forward(logits, target, ignore_index)
        valid = t != ignore_index
        ctx.save_for_backward(x2, t, lse, valid)
        ctx.reduction = reduction
        ctx.shape = logits.shape
        return _reduce(loss, valid, reduction, logits.dtype)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        x2, t, lse, valid = ctx.saved_tensors
        g = grad.float()
        if ctx.reduction == "none":
            per_row = g.expand(t.shape[0])
        elif ctx.reduction == "sum":
            per_row = g.expand(t.shape[0])
        else:
            per_row = (g / valid.sum()).expand(t.shape[0])
        per_row = torch.where(valid, per_row, torch.zeros((), device=g.device)).contiguous()
        rows, v = x2.shape
        dx = torch.empty((rows, v), dtype=x2.dtype, device=x2.device)
        block = min(_block(v), 8192)
        if rows:
            _ce_bwd[(rows,)](x2, t, lse, per_row, dx, x2.stride(0), dx.stride(0), v, BLOCK=block,
                             num_warps=num_warps_for(block))
        return dx.view(ctx.shape), None, None, None


def cross_entropy(input: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor] = None,
                  ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor:
    """``F.cross_entropy`` for ``input [rows, classes]``, class-index ``target [rows]``, no weight
    and no label smoothing (the registry's predicate sends other calls to torch)."""
    return CrossEntropyFunction.apply(input, target, ignore_index, reduction)
