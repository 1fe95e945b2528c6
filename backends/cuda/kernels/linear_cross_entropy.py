"""Fused linear + cross-entropy (the LM head and its loss) that never materialises the full logits.

``linear_cross_entropy(input, weight, target, bias=None, ignore_index=-100, reduction="mean")``
equals ``F.cross_entropy(input @ weight.T + bias, target, ignore_index=..., reduction=...)``
(``input [..., hidden]``, ``weight [vocab, hidden]``, ``target [...]`` class indices). The rows are
processed in chunks of :func:`chunk_rows` rows; per chunk the logits ``[chunk, vocab]`` are
computed in the input dtype, the softmax in float32, and, when a gradient is wanted, the logits
gradient ``(softmax - onehot) * scale`` is formed in place and immediately turned into
``grad_input[chunk] = dlogits @ weight`` and accumulated into ``grad_weight += dlogits.T @ x_chunk``
and ``grad_bias += dlogits.sum(0)`` -- all during the forward (as Liger-Kernel does), so the
backward only multiplies the stored gradients by the scalar ``grad_output``. The largest
temporaries are one chunk's logits (input dtype + float32) plus ``grad_weight`` and
``grad_input``; the full ``[rows, vocab]`` logits never exist.

The matmuls are torch's (cuBLAS on CUDA). The per-chunk softmax and logits gradient are the Triton
cross-entropy kernels (:mod:`.cross_entropy`) when the input is on CUDA and Triton imports: one
pass computes each row's loss and log-sum-exp from the input-dtype logits, a second overwrites those
logits with their gradient, so no float32 copy of a chunk exists and a chunk may hold about twice
the rows. Elsewhere (the CPU, where it is tested without Triton) the same steps are torch ops over a
float32 copy. The module imports Triton only through that first CUDA call. ``grad_weight`` accumulates in float32 for float32 inputs and
in the input dtype otherwise (like Liger; one rounding per chunk). ``reduction="none"`` cannot be
precomputed this way (the weight gradient depends on the per-row grad_output): :func:`supports`
rejects it and the dispatcher falls back to the reference.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

#: default byte budget of one chunk's logits (input-dtype copy + float32 copy)
CHUNK_BYTES = 256 << 20
#: on the Triton path the vocabulary is padded with zero rows to a multiple of this: for an odd class count
#: (GPT-2's 50257) cuBLAS picks alignment-1 kernels, and on the H200 the head's three matmuls then took
#: 15.5 of a 32 ms gpt2-small training step (reports/cuda/README.md)
PAD_VOCAB_TO = 64


#: ``(input dtype, "infer" | "train") -> rows``: the row count from which the Triton path pads the vocabulary
#: (None: never; a pair not listed: always), measured by ``benchmarks/tune_lce.py`` on the H200 at hidden 768 and
#: 50257 classes (reports/cuda/tune_lce.json, 8-8192 rows; tune_lce-rows.json, 128-512 again): float32 never
#: gained (its matmuls ran 0.2-1% faster unpadded at 1024-8192 rows, the copy spared); bfloat16 gained from 256
#: rows forward-only and 384 in training (1.04-4.9x and 1.5-3.4x the unpadded head; below, the call is host-bound and the copy
#: is what shows). float16 is not measured and follows bfloat16 (the same element size).
PAD_FROM_ROWS: dict = {(torch.float32, "infer"): None, (torch.float32, "train"): None,
                       (torch.bfloat16, "infer"): 256, (torch.bfloat16, "train"): 384,
                       (torch.float16, "infer"): 256, (torch.float16, "train"): 384}


def padded_vocab(vocab: int) -> int:
    """The class count the matmuls see: ``vocab`` rounded up to :data:`PAD_VOCAB_TO`."""
    return -(-vocab // PAD_VOCAB_TO) * PAD_VOCAB_TO


def chunk_rows(n_rows: int, vocab: int, elem_bytes: int, budget_bytes: int = CHUNK_BYTES,
               float32_copy: bool = True) -> int:
    """Rows per chunk so one chunk's logits (``elem_bytes`` per element, + 4 for their float32 softmax
    copy when ``float32_copy`` and the input is not float32) fit ``budget_bytes``; at least 1, at most
    ``n_rows``. The rows are spread evenly over the fewest chunks that fit (4096 rows that fit 1328 per chunk
    make 4 chunks of 1024, not 3 of 1328 and one of 112: a thin last chunk runs its matmuls far below the
    others' rate), rounded up to a multiple of 8 when more than 8 rows fit (friendlier matmul shapes; still
    within the budget)."""
    per_row = max(1, vocab) * (elem_bytes + (4 if float32_copy and elem_bytes != 4 else 0))
    fit = max(1, budget_bytes // per_row)
    if fit > 8:
        fit -= fit % 8
    if n_rows <= fit:
        return int(max(1, n_rows))
    chunks = -(-n_rows // fit)
    rows = -(-n_rows // chunks)
    if fit > 8:
        rows = min(fit, -(-rows // 8) * 8)
    return int(rows)


def pads_vocab(n_rows: int, classes: int, dtype: torch.dtype, train: bool) -> bool:
    """Whether the Triton path pads ``classes`` (:func:`padded_vocab`) for a call of ``n_rows`` rows of ``dtype``
    that computes gradients (``train``) or not: the copy of the weight (and in training the cut of its gradient)
    costs passes over ``[vocab, hidden]`` per call, which pay off only when the matmuls they align are long enough
    (:data:`PAD_FROM_ROWS`)."""
    if padded_vocab(classes) == classes:
        return False
    start = PAD_FROM_ROWS.get((dtype, "train" if train else "infer"), 0)
    return start is not None and n_rows >= start


def device_ce(x: torch.Tensor) -> Any:
    """The Triton cross-entropy kernels' module for ``x`` on the kernels' device (CUDA; the CPU under Triton's
    interpreter tests, ``_rows.KERNEL_DEVICE``) when Triton imports, else None."""
    from hal.backends.cuda.kernels import _on_kernel_device
    if not _on_kernel_device(x):
        return None
    try:
        from hal.backends.cuda.kernels import cross_entropy
    except ImportError:
        return None
    return cross_entropy


def _torch_chunk(logits: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, scale: Optional[torch.Tensor],
                 grads: bool) -> tuple:
    """The torch-ops chunk step (no Triton): ``(sum of the chunk's row losses in float32, dlogits or None)``; with
    ``grads``, dlogits = ``(softmax - onehot) * scale`` on valid rows (``scale`` None: 1), 0 on ignored ones, float32,
    computed in place over the float32 logits (which are ``logits`` itself for float32 logits)."""
    lf = logits.float()  # the same tensor for float32 logits
    lse = torch.logsumexp(lf, dim=-1)
    safe = torch.where(valid, target, torch.zeros_like(target)).long()
    picked = lf.gather(1, safe[:, None]).squeeze(1)
    loss = ((lse - picked) * valid).sum()
    if not grads:
        return loss, None
    p = lf.sub_(lse[:, None]).exp_()  # softmax, in place over the float32 logits
    p[torch.arange(p.shape[0], device=p.device), safe] -= valid.to(p.dtype)
    p.mul_((valid.to(p.dtype) if scale is None else valid.to(p.dtype) * scale)[:, None])
    return loss, p


def _one_chunk(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
               ignore_index: int, reduction: str, ce: Any, classes: int, grads: bool) -> tuple:
    """``(loss in x's dtype, dlogits or None)`` of the head over all of ``x`` as one chunk. With ``grads``, dlogits is
    the gradient of the loss (``grad_output`` 1) over the logits, ``[rows, padded classes]`` in x's dtype (the padded
    columns 0). On the Triton path (``ce``) the cross-entropy kernels' own reduction computes the loss (and leaves the
    mean's scale in stats for the backward kernel; about a third of the host time of :func:`_chunked`'s loop, which is
    what a call of a few hundred rows costs, tune_lce.json) and dlogits is written over the logits; else
    :func:`_torch_chunk`."""
    logits = torch.nn.functional.linear(x, weight, bias)
    if ce is None:
        valid = target != ignore_index
        n_valid = valid.sum().to(torch.float32)
        scale = 1.0 / n_valid.clamp(min=1) if reduction == "mean" and grads else None
        loss, p = _torch_chunk(logits, target, valid, scale, grads)
        loss = (loss / n_valid if reduction == "mean" else loss).to(x.dtype)
        return loss, None if p is None else p.to(x.dtype)
    real = logits if classes == logits.shape[1] else logits[:, :classes]  # padded columns: 0
    _, t, stats = ce.ce_forward(real, target, ignore_index)
    loss = ce.ce_reduce(stats, t, reduction, x.dtype, ignore_index)
    if not grads:
        return loss, None
    ce.ce_backward(real, t, stats, None, reduction == "mean", ignore_index, out=real)
    return loss, logits


def _chunked(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
             ignore_index: int, reduction: str, rows_per_chunk: int, want: tuple, ce: Any, classes: int) -> tuple:
    """``(loss in x's dtype, grad_x, grad_w, grad_b)`` of the head over ``x [rows, hidden]`` in chunks of
    ``rows_per_chunk`` rows, the gradients (of the loss itself, ``grad_output`` 1) computed where ``want``
    (``(x, weight, bias)`` flags) asks, else None. ``ce``: :func:`device_ce`'s module (the Triton chunk step) or
    None (torch ops over a float32 copy, :func:`_torch_chunk`). With ``ce``, ``weight`` (and ``bias``) may carry
    zero rows past the ``classes`` real ones (:func:`padded_vocab`): the padded logits are exactly 0, the loss and
    its gradient read the first ``classes`` columns only, and the padded rows' gradients are 0."""
    want_x, want_w, want_b = want
    n = x.shape[0]
    if ce is not None and n <= rows_per_chunk:
        loss, logits = _one_chunk(x, weight, target, bias, ignore_index, reduction, ce, classes,
                                  want_x or want_w or want_b)
        if logits is None:
            return loss, None, None, None
        return (loss, torch.mm(logits, weight) if want_x else None, torch.mm(logits.t(), x) if want_w else None,
                logits.float().sum(0) if want_b else None)
    grads = want_x or want_w or want_b
    valid_all = target != ignore_index
    n_valid = valid_all.sum()
    # mean: 1/valid rows (torch returns nan for 0 valid rows; the gradient is kept finite)
    scale = (1.0 / n_valid.clamp(min=1).to(torch.float32)) if reduction == "mean" and grads else None
    grad_x = torch.empty_like(x) if want_x else None
    grad_w = torch.zeros_like(weight) if want_w else None  # in the weight's (= the input's) dtype
    grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if want_b else None
    loss = torch.zeros((), dtype=torch.float32, device=x.device)
    for start in range(0, n, rows_per_chunk):
        end = min(n, start + rows_per_chunk)
        xc, tc, vc = x[start:end], target[start:end], valid_all[start:end]
        logits = torch.nn.functional.linear(xc, weight, bias)
        if ce is not None:  # Triton: loss and lse in one pass, then the gradient over the logits in place
            real = logits if classes == logits.shape[1] else logits[:, :classes]  # padded columns: 0
            _, tcc, stats = ce.ce_forward(real, tc, ignore_index)
            loss += stats[: end - start].sum()
            if grads:  # the kernel masks ignored rows itself
                ce.ce_backward(real, tcc, stats, scale, False, ignore_index, out=real)
                dl = logits
                if want_x:
                    torch.mm(dl, weight, out=grad_x[start:end])
                if want_w:
                    grad_w.addmm_(dl.t(), xc)
                if want_b:
                    grad_b += dl.float().sum(0)
            del logits
            continue
        chunk_loss, p = _torch_chunk(logits, tc, vc, scale, grads)
        loss += chunk_loss
        if not grads:
            continue
        dl = p if p.dtype == x.dtype else p.to(x.dtype)
        if want_x:
            torch.mm(dl, weight, out=grad_x[start:end])
        if want_w:
            grad_w.addmm_(dl.t(), xc)
        if want_b:
            grad_b += p.sum(0)
        del logits, p, dl
    if reduction == "mean":
        loss = loss / n_valid.to(torch.float32)
    return loss.to(x.dtype), grad_x, grad_w, grad_b


class LinearCrossEntropyFunction(torch.autograd.Function):
    """:func:`_chunked` with the gradients the graph needs computed in the forward; the backward scales them by
    grad_output (a 0-dim tensor of the loss's dtype, which the gradients share: no cast).

    Except for a call of no more rows than ``hidden`` that is one chunk: its forward keeps the
    logits' gradient (``[rows, classes]``, no larger than the ``[classes, hidden]`` weight gradient it would
    otherwise keep) and the backward scales that by grad_output and runs the two matmuls, as torch's unfused
    backward does, where scaling a finished ``[classes, hidden]`` weight gradient would be one more pass over it.
    (Through ``hal.ops`` on CUDA such calls reach this only from ``kernels.TORCH_BELOW_LOGITS`` logits up, e.g. 334 to
    768 rows of a 50257-class head at hidden 768; its GPU time there is not measured.)"""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Optional[torch.Tensor],
                ignore_index: int, reduction: str, rows_per_chunk: int, ce: Any, classes: int) -> torch.Tensor:
        want = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[3])
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.want = want
        n, hidden = x.shape
        if n <= rows_per_chunk and n <= hidden and any(want):
            loss, dlogits = _one_chunk(x, weight, target, bias, ignore_index, reduction, ce, classes, True)
            ctx.save_for_backward(x, weight, dlogits)
            ctx.deferred = True
            return loss
        loss, grad_x, grad_w, grad_b = _chunked(x, weight, target, bias, ignore_index, reduction, rows_per_chunk,
                                                want, ce, classes)
        ctx.save_for_backward(grad_x, grad_w, grad_b)
        ctx.deferred = False
        return loss

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor):
        if ctx.deferred:
            x, weight, dlogits = ctx.saved_tensors
            want_x, want_w, want_b = ctx.want
            g = dlogits * grad_out
            dx = torch.mm(g, weight) if want_x else None
            dw = torch.mm(g.t(), x) if want_w else None
            db = g.float().sum(0).to(ctx.bias_dtype) if want_b else None
            return dx, dw, None, db, None, None, None, None, None
        grad_x, grad_w, grad_b = ctx.saved_tensors
        dx = None if grad_x is None else grad_x * grad_out
        dw = None if grad_w is None else grad_w * grad_out
        db = None if grad_b is None else (grad_b * grad_out).to(ctx.bias_dtype)
        return dx, dw, None, db, None, None, None, None, None


def supports(input: Any, weight: Any = None, target: Any = None, bias: Any = None, ignore_index: int = -100,
             reduction: str = "mean", **kwargs: Any) -> Optional[str]:
    """None when :func:`linear_cross_entropy` takes the call, else the reason it does not."""
    if kwargs:
        return f"unsupported arguments {sorted(kwargs)}"
    if not isinstance(input, torch.Tensor) or not isinstance(weight, torch.Tensor) or not isinstance(target, torch.Tensor):
        return "input, weight and target must be tensors"
    if not input.is_floating_point() or input.numel() == 0:
        return "input is not a non-empty floating-point tensor"
    if weight.dim() != 2 or input.shape[-1] != weight.shape[1] or weight.dtype != input.dtype \
            or weight.device != input.device:
        return "weight is not [vocab, hidden] of the input's dtype and device"
    if target.numel() != input.numel() // input.shape[-1] or target.dtype not in (torch.int64, torch.int32) \
            or target.device != input.device:
        return "target is not one class index (int64/int32) per input row on the input's device"
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (weight.shape[0],)
                             or bias.dtype != input.dtype or bias.device != input.device):
        return "bias is not [vocab] of the input's dtype and device"
    if reduction not in ("mean", "sum"):
        return f"reduction {reduction!r}: only 'mean' and 'sum' (the gradients are computed in the forward)"
    return None


def linear_cross_entropy(input: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         bias: Optional[torch.Tensor] = None, ignore_index: int = -100, reduction: str = "mean",
                         chunk_size: Optional[int] = None, pad_vocab: Optional[bool] = None) -> torch.Tensor:
    """``F.cross_entropy(input @ weight.T + bias, target, ignore_index=, reduction=)`` in row chunks.

    ``input [..., hidden]``, ``weight [vocab, hidden]``, ``bias [vocab]`` or None, ``target [...]``;
    ``reduction`` 'mean' or 'sum' (ValueError otherwise, see :func:`supports`); ``chunk_size`` rows
    per chunk (default :func:`chunk_rows`); ``pad_vocab`` pads the vocabulary on the Triton path (default
    :func:`pads_vocab`; ignored elsewhere). Returns a 0-d loss in the input dtype; differentiable
    in input, weight and bias (gradients are computed during the forward when grad is enabled)."""
    why = supports(input, weight, target, bias, ignore_index, reduction)
    if why:
        raise ValueError(f"linear_cross_entropy: {why}")
    x = input.reshape(-1, input.shape[-1])
    t = target.reshape(-1)
    ce = device_ce(x)
    classes = weight.shape[0]
    need_grad = torch.is_grad_enabled() and any(
        p is not None and p.requires_grad for p in (input, weight, bias))
    pad = pads_vocab(x.shape[0], classes, x.dtype, need_grad) if pad_vocab is None else pad_vocab
    padded = padded_vocab(classes) if ce is not None and pad else classes
    rows = chunk_size or chunk_rows(x.shape[0], padded, x.element_size(), float32_copy=ce is None)
    if padded != classes:  # zero rows, differentiably: autograd cuts the gradient back to the real rows
        weight = torch.nn.functional.pad(weight, (0, 0, 0, padded - classes))
        bias = None if bias is None else torch.nn.functional.pad(bias, (0, padded - classes))
    if not need_grad:  # no graph to record: no autograd Function (its apply is host time a small call feels)
        return _chunked(x, weight, t, bias, int(ignore_index), reduction, int(rows), (False, False, False), ce,
                        classes)[0]
    return LinearCrossEntropyFunction.apply(x, weight, t, bias, int(ignore_index), reduction, int(rows), ce, classes)
