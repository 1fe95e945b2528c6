"""Triton cross-entropy: fused log_softmax + nll_loss over class logits, with backward.

Forward: the logits are read once. Rows of up to 16384 classes, and longer rows when there are
enough rows to fill the GPU (``rows >= LOOP_ROWS_PER_SM * SMs``), take one program per row (an
online log-sum-exp over chunks of the row: one launch, no partial buffers); longer rows of a few-row
input are split into chunks, one program per (row, chunk) computing the chunk's max and sum of
exponentials, and a second small kernel combines them per row (log-sum-exp), gathers the target
logit and writes the row's loss and log-sum-exp (two floats per row): the ``[rows, classes]``
probabilities are never materialised. Backward reads the logits once more and writes
``(softmax - onehot) * grad`` directly, one program per (row, chunk).

Chunks are sized in bytes (:data:`_CHUNK_BYTES`: 8192 float32 or 16384 bfloat16/float16 classes),
so a 2-byte program moves as many bytes as a float32 one; issue 23 measured bf16 at 32000 classes
slower than float32 with equal element counts per program. This sizing and the one-program-per-row
choice for many rows are not measured yet on the H200. Rows whose target equals
``ignore_index`` contribute 0 and are left out of the mean (all ignored: NaN, as torch); a target
outside ``[0, classes)`` gives a NaN loss (torch raises a device-side assert instead).

Host time: the per-row results live in one float32 buffer ``stats`` of ``2 * rows + 1`` (the rows'
losses, their log-sum-exps, and the reduction's scale), the ``sum``/``mean`` reduction is one more
small kernel (:func:`ce_reduce`: the loss in the logits' dtype and the scale ``1 / valid rows``), and
the backward kernel reads the incoming gradient, the scale and the targets itself: a training call is
four launches and three allocations, where the torch ops around the kernels (count the valid rows, sum,
divide, cast; in the backward cast, divide, mask, copy) cost more host time than the kernels (issue 23).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from hal.backends.cuda.kernels import routing, supports_cross_entropy
from hal.backends.cuda.kernels._rows import as_rows, next_power_of_2, num_warps_for, self_checking, sm_count
from hal.backends.cuda.kernels.launcher import Launcher, aligned, int_class
from hal.backends.cuda.kernels.softmax import _online_max_sum
from hal.ops import torch_impl

#: rows up to this many classes take one program per row (one launch); longer rows are split into
#: chunks of _CHUNK_BYTES, one program per (row, chunk), then combined per row, unless there are
#: at least LOOP_ROWS_PER_SM rows per SM (then one program per row loops over its chunks)
_SINGLE = 16384
_CHUNK_BYTES = 32768
LOOP_ROWS_PER_SM = 4


def _chunk(x: torch.Tensor) -> int:
    """Classes per chunk for logits of ``x``'s dtype (a power of two)."""
    return _CHUNK_BYTES // x.element_size()


@triton.jit
def _ce_fwd(X, T, Stats, stride_x, V, M, ignore_index, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(T + row).to(tl.int64)
    row_max, total = _online_max_sum(X, row * stride_x, V, BLOCK)
    lse = row_max + tl.log(total)
    valid = t != ignore_index
    in_range = (t >= 0) & (t < V)
    xt = tl.load(X + row * stride_x + tl.where(in_range, t, 0)).to(tl.float32)
    loss = tl.where(valid, tl.where(in_range, lse - xt, float("nan")), 0.0)
    tl.store(Stats + row, loss)
    tl.store(Stats + M + row, lse)


@triton.jit
def _ce_partial(X, P, stride_x, V, M, NCH, BLOCK: tl.constexpr):
    """Max and sum(exp(x - max)) of one chunk of one row, into the ``[M, NCH]`` maxima at ``P`` and the sums
    after them."""
    Pm, Ps = P, P + M * NCH
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + row * stride_x + cols, mask=cols < V, other=-float("inf")).to(tl.float32)
    m = tl.max(x, 0)
    s = tl.where(m == -float("inf"), 0.0, tl.sum(tl.exp(x - m), 0))
    tl.store(Pm + row * NCH + chunk, m)
    tl.store(Ps + row * NCH + chunk, s)


@triton.jit
def _ce_combine(X, T, P, Stats, stride_x, V, M, NCH, ignore_index, CB: tl.constexpr):
    Pm, Ps = P, P + M * NCH
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, CB)
    pm = tl.load(Pm + row * NCH + k, mask=k < NCH, other=-float("inf"))
    ps = tl.load(Ps + row * NCH + k, mask=k < NCH, other=0.0)
    row_max = tl.max(pm, 0)
    total = tl.sum(tl.where(pm == -float("inf"), 0.0, ps * tl.exp(pm - row_max)), 0)
    lse = row_max + tl.log(total)
    t = tl.load(T + row).to(tl.int64)
    valid = t != ignore_index
    in_range = (t >= 0) & (t < V)
    xt = tl.load(X + row * stride_x + tl.where(in_range, t, 0)).to(tl.float32)
    loss = tl.where(valid, tl.where(in_range, lse - xt, float("nan")), 0.0)
    tl.store(Stats + row, loss)
    tl.store(Stats + M + row, lse)


@triton.jit
def _ce_reduce(Stats, T, Out, M, ignore_index, MEAN: tl.constexpr, BLOCK: tl.constexpr):
    """One program: the rows' losses summed (ignored rows hold 0), divided by the valid rows for the mean,
    into ``Out`` (the logits' dtype); the backward's scale (``1 / valid rows``, or 1) into ``Stats[2 M]``."""
    acc = tl.zeros([BLOCK], tl.float32)
    cnt = tl.zeros([BLOCK], tl.float32)
    for start in range(0, M, BLOCK):
        r = start + tl.arange(0, BLOCK)
        m = r < M
        acc += tl.load(Stats + r, mask=m, other=0.0)
        t = tl.load(T + r, mask=m, other=ignore_index).to(tl.int64)
        cnt += tl.where(t != ignore_index, 1.0, 0.0)
    total = tl.sum(acc, 0)
    if MEAN:
        n = tl.sum(cnt, 0)
        tl.store(Out, (total / n).to(Out.dtype.element_ty))
        tl.store(Stats + 2 * M, 1.0 / n)
    else:
        tl.store(Out, total.to(Out.dtype.element_ty))
        tl.store(Stats + 2 * M, 1.0)


@triton.jit
def _ce_bwd(X, T, Stats, G, DX, stride_x, stride_dx, stride_g, V, M, ignore_index, HAS_G: tl.constexpr,
            HAS_S: tl.constexpr, BLOCK: tl.constexpr):
    """dx = (softmax(x) - onehot(t)) * g for one chunk of one row: g = the row's incoming gradient (``G``,
    1 without it) times the reduction's scale (``Stats[2 M]``, with ``HAS_S``), 0 on ignored rows."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < V
    t = tl.load(T + row).to(tl.int64)
    lse = tl.load(Stats + M + row)
    if HAS_G:
        g = tl.load(G + row * stride_g).to(tl.float32)
    else:
        g = 1.0
    if HAS_S:
        g = g * tl.load(Stats + 2 * M)
    g = tl.where(t != ignore_index, g, 0.0)
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    dx = (tl.exp(x - lse) - tl.where(cols == t, 1.0, 0.0)) * g
    dx = tl.where(g == 0.0, 0.0, dx)
    tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)


_FWD, _PARTIAL, _COMBINE, _BWD = Launcher(_ce_fwd), Launcher(_ce_partial), Launcher(_ce_combine), Launcher(_ce_bwd)
_REDUCE = Launcher(_ce_reduce)
#: rows per step of the reduction's one program
_REDUCE_BLOCK = 1024


def ce_forward(logits: torch.Tensor, target: torch.Tensor, ignore_index: int):
    """``(x2, t, stats)`` for 2-D ``logits`` ``[rows, classes]`` and ``target`` ``[rows]``: ``x2`` and ``t``
    the views the kernels read, ``stats`` the float32 buffer of ``2 * rows + 1`` (module docstring): the
    rows' losses (0 on ignored rows), their log-sum-exps, and a slot :func:`ce_reduce` fills."""
    x2 = as_rows(logits)
    rows, v = x2.shape
    t = target.contiguous()
    stats = torch.empty(2 * rows + 1, dtype=torch.float32, device=logits.device)
    if not rows:
        return x2, t, stats
    chunk = _chunk(x2)
    ignore = int(ignore_index)
    # launch keys (launcher's contract): device, dtypes, the int arguments' values, the block (constexpr)
    base = (x2.get_device(), x2.dtype, t.dtype, x2.stride(0), v, int_class(rows), ignore) \
        if aligned(x2, t) else None  # stats, part: ours
    if v <= _SINGLE or rows >= LOOP_ROWS_PER_SM * sm_count(logits.device):
        block = next_power_of_2(v) if v <= _SINGLE else chunk
        _FWD((rows, 1, 1), None if base is None else base + (block,), (x2, t, stats, x2.stride(0), v, rows, ignore),
             dict(BLOCK=block, num_warps=num_warps_for(block)))
    else:
        nch = -(-v // chunk)
        part = torch.empty(2 * rows * nch, dtype=torch.float32, device=logits.device)  # the chunks' maxima, then sums
        key = None if base is None else base + (chunk, nch)
        _PARTIAL((rows, nch, 1), key, (x2, part, x2.stride(0), v, rows, nch),
                 dict(BLOCK=chunk, num_warps=num_warps_for(chunk)))
        _COMBINE((rows, 1, 1), key, (x2, t, part, stats, x2.stride(0), v, rows, nch, ignore),
                 dict(CB=max(16, next_power_of_2(nch)), num_warps=1))
    return x2, t, stats


def ce_reduce(stats: torch.Tensor, t: torch.Tensor, reduction: str, dtype: torch.dtype, ignore_index: int
              ) -> torch.Tensor:
    """The loss of :func:`ce_forward`'s ``stats`` under ``reduction`` in ``dtype``: ``"none"`` the rows'
    losses, ``"sum"`` and ``"mean"`` one kernel that also writes the backward's scale into ``stats``."""
    rows = t.shape[0]
    if reduction == "none":
        return stats[:rows].to(dtype)
    out = torch.empty((), dtype=dtype, device=stats.device)
    mean = reduction == "mean"
    ignore = int(ignore_index)
    key = (t.get_device(), t.dtype, dtype, mean, int_class(rows), ignore) if aligned(t) else None  # stats, out: ours
    _REDUCE((1, 1, 1), key, (stats, t, out, rows, ignore), dict(MEAN=mean, BLOCK=_REDUCE_BLOCK, num_warps=4))
    return out


def ce_backward(x2, t, stats, grad: Optional[torch.Tensor], scaled: bool, ignore_index: int,
                out: Optional[torch.Tensor] = None):
    """``(softmax(x2) - onehot(t)) * g`` in ``x2``'s dtype, into ``out`` when given (``out`` may be ``x2``
    itself: each element is read before it is written, by the same program). ``g`` per row: ``grad`` (a
    0-dim tensor, or one value per row; None: 1), times the scale :func:`ce_reduce` left in ``stats`` when
    ``scaled``, and 0 on rows whose target is ``ignore_index``."""
    rows, v = x2.shape
    dx = torch.empty_like(x2) if out is None else out  # x2: [rows, v], contiguous rows
    block = min(next_power_of_2(v), _chunk(x2))
    if rows:
        has_g = grad is not None
        g = grad if has_g else stats  # not read without HAS_G
        stride_g = g.stride(0) if has_g and g.dim() else 0
        ignore = int(ignore_index)
        args = (x2, t, stats, g, dx, x2.stride(0), dx.stride(0), stride_g, v, rows, ignore)
        key = (x2.get_device(), x2.dtype, t.dtype, g.dtype, dx.dtype, block, has_g, scaled) + args[5:9] \
            + (int_class(rows), ignore) if aligned(x2, t, g, dx) else None  # stats: ours
        _BWD((rows, -(-v // block), 1), key, args,
             dict(HAS_G=has_g, HAS_S=scaled, BLOCK=block, num_warps=num_warps_for(block)))
    return dx


class CrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, ignore_index, reduction):  # type: ignore[override]
        x2, t, stats = ce_forward(logits, target, ignore_index)
        out = ce_reduce(stats, t, reduction, logits.dtype, ignore_index)
        ctx.save_for_backward(x2, t, stats)
        ctx.scaled, ctx.ignore_index, ctx.shape = reduction == "mean", ignore_index, logits.shape
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        x2, t, stats = ctx.saved_tensors
        return ce_backward(x2, t, stats, grad, ctx.scaled, ctx.ignore_index).view(ctx.shape), None, None, None


#: routing's per-op floors: inputs below them go to torch without the predicate (routing.floors)
_FLOORS = routing.floors()
#: what a call the kernel does not take runs: ``F.cross_entropy``'s arguments and result, one frame fewer
_torch_cross_entropy = torch_impl.direct("cross_entropy")


@self_checking
def cross_entropy(input: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor] = None,
                  size_average: Optional[bool] = None, ignore_index: int = -100, reduce: Optional[bool] = None,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor:
    """``F.cross_entropy`` for every call, with its arguments in its order: the kernel for ``input [rows,
    classes]``, class-index ``target [rows]``, no weight, no label smoothing and no legacy
    ``size_average``/``reduce`` where :mod:`routing` allows, else torch's."""
    try:
        small = input.numel() < _FLOORS["cross_entropy"]  # below: torch, any dtype and mode
    except AttributeError:  # not a tensor: the predicate says so
        small = False
    if size_average is not None or reduce is not None:  # the legacy spelling of reduction: torch's own
        return F.cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)
    if not small and supports_cross_entropy(input, target, weight, ignore_index, reduction,
                                            label_smoothing) is None:
        mode = routing.mode(input)
        if routing.decide("cross_entropy", input.dtype, mode, input.numel()):
            if mode == "train":
                return CrossEntropyFunction.apply(input, target, ignore_index, reduction)
            _, t, stats = ce_forward(input, target, ignore_index)
            return ce_reduce(stats, t, reduction, input.dtype, ignore_index)
    return _torch_cross_entropy(input, target, weight, None, ignore_index, None, reduction, label_smoothing)
