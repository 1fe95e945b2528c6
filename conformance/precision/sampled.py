"""The sampled variants of float64 shadows: which part of a large op output is compared, and the op call that
computes exactly that part from the matching parts of its arguments (views; only their float64 copies cost a
kernel, and the compared output is a view the tracer copies only if the program writes it).

:class:`SampledPlans` is the part of :class:`shadow.Shadow` that plans them (a mixin: it needs the host's
``max_elements``, ``sample``, ``_job``, ``_sibling`` and ``_last_call``, and returns its :class:`shadow.ShadowJob`
or None when the op has no sampled variant for these arguments). The places are :mod:`blocks`': an op of one
shape is always compared at the same place. What is sampled, and how, is listed in :mod:`shadow`'s docstring
and in docs/precision.md. Not thread-safe (one planner per tracer, as :class:`shadow.Shadow`).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import torch

from .blocks import block, block_of, block_slices, broadcasts_to, grid, span
from .job import ShadowJob

_F64 = torch.float64


#: element-wise ATen ops (every tensor operand of the output's shape, the rest scalars) that torch does not tag
#: ``pointwise`` (torch 2.4-2.13): mostly activation backwards. pytorch/examples' GAT left its LeakyReLU backward
#: (32 M elements) unshadowed before they were listed; ReLU6 (hardtanh), ELU, Softplus, Hardswish and Mish layers
#: would have too. ``log_sigmoid_backward`` is not here: its buffer operand is empty on CUDA.
UNTAGGED_POINTWISE = frozenset({"leaky_relu_backward", "hardtanh_backward", "elu_backward", "softplus_backward",
                                "hardswish", "hardswish_backward", "hardsigmoid_backward", "mish_backward",
                                "hardshrink_backward", "softshrink_backward"})


def is_pointwise(fn: Any) -> bool:
    """Whether the ATen overload ``fn`` computes each output element from the same element of its (broadcast)
    tensor operands alone: torch's ``pointwise`` tag, or :data:`UNTAGGED_POINTWISE`."""
    if torch.Tag.pointwise in getattr(fn, "tags", ()):
        return True
    return getattr(getattr(fn, "overloadpacket", None), "__name__", None) in UNTAGGED_POINTWISE


def embedding_rows_backward(grad_output, indices, padding_idx, scale_grad_by_freq, start, stop):
    """Rows ``start:stop`` of ``embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
    scale_grad_by_freq)`` for any ``num_weights`` >= ``stop``: the same op on a table of those rows and one more,
    where every index outside them lands (then cut). The row counts ``scale_grad_by_freq`` divides by are those of the
    indices themselves, so unchanged."""
    n = stop - start
    local = indices - start
    local = torch.where((local < 0) | (local >= n), torch.full_like(local, n), local)
    pad = padding_idx - start if start <= padding_idx < stop else -1
    return torch.ops.aten.embedding_dense_backward.default(grad_output, local, n + 1, pad, scale_grad_by_freq)[:n]


#: ops that compute each plane of their output (the last 2 or 3 dims, one per leading index: image and channel) from
#: the same plane of each tensor argument alone, every tensor argument of the output's rank: pooling and its backward
PLANEWISE = {"max_pool2d_with_indices": 2, "max_pool2d_with_indices_backward": 2, "avg_pool2d": 2,
             "avg_pool2d_backward": 2, "_adaptive_avg_pool2d": 2, "_adaptive_avg_pool2d_backward": 2,
             "max_pool3d_with_indices": 3, "max_pool3d_with_indices_backward": 3, "avg_pool3d": 3,
             "avg_pool3d_backward": 3, "_adaptive_avg_pool3d": 3, "_adaptive_avg_pool3d_backward": 3}
#: batch norms (their output, or their backward's input gradient): each channel (dim 1) from that channel of the
#: input (and output gradient) and of the per-channel vectors alone, training or not
_BATCH_NORMS = {"native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
                "native_batch_norm_backward"}

#: ops whose output's rows (dim 0: the batch) are each computed from the same rows of some arguments alone, given their
#: other arguments: name -> (positions of those arguments (a list argument: each of its tensors), where the row count is
#: given (an int argument's position, or ``(position, index)`` in a size list; None: nowhere), and when the op is
#: row-wise, from its arguments and the output's rank)
BATCHWISE = {
    "cumsum": ((0,), None, lambda a, nd: a[1] % nd != 0),
    "sum": ((0,), None, lambda a, nd: len(a) > 1 and bool(a[1]) and 0 not in [d % a[0].dim() for d in a[1]]),
    "flip": ((0,), None, lambda a, nd: 0 not in [d % nd for d in a[1]]),
    "gather": ((0, 2), None, lambda a, nd: a[1] % nd != 0),
    "scatter_add": ((0, 2, 3), None, lambda a, nd: a[1] % nd != 0),
    "constant_pad_nd": ((0,), None, lambda a, nd: len(a[1]) <= 2 * (nd - 1)),
    "cat": ((0,), None, lambda a, nd: (a[1] if len(a) > 1 else 0) % nd != 0),
    "stack": ((0,), None, lambda a, nd: (a[1] if len(a) > 1 else 0) % nd != 0),
    "upsample_nearest1d": ((0,), None, lambda a, nd: True), "upsample_nearest2d": ((0,), None, lambda a, nd: True),
    "upsample_nearest3d": ((0,), None, lambda a, nd: True), "upsample_linear1d": ((0,), None, lambda a, nd: True),
    "upsample_bilinear2d": ((0,), None, lambda a, nd: True), "upsample_bicubic2d": ((0,), None, lambda a, nd: True),
    "upsample_trilinear3d": ((0,), None, lambda a, nd: True),
    "native_group_norm": ((0,), 3, lambda a, nd: True),
    "native_group_norm_backward": ((0, 1, 2, 3), 5, lambda a, nd: True),
    **{f"upsample_{m}_backward": ((0,), (2, 0), lambda a, nd: True)
       for m in ("nearest1d", "nearest2d", "nearest3d", "linear1d", "bilinear2d", "bicubic2d", "trilinear3d")},
}


class SampledPlans:
    """Plans a large output's sampled shadow (see the module docstring); mixed into :class:`shadow.Shadow`."""

    def _sampled_rows(self, out: torch.Tensor) -> Optional[Tuple[slice, int, int]]:
        """A run of rows of ``out`` viewed as [n_rows, last] to compare: ``(rows, n_rows, last)``, or None when
        ``out`` is small enough to compare whole."""
        last = out.shape[-1]
        n_rows = out.numel() // max(1, last)
        if n_rows * last <= self.max_elements or n_rows <= 1:
            return None
        return span(n_rows, self.max_elements // max(1, last)), n_rows, last

    def _sampled(self, func, name, args, kwargs, out, home, out_index: int = 0) -> Optional[ShadowJob]:
        """The sampled job of output ``out_index`` of a large op call (only a convolution's backward is sampled for
        another output than 0), or None when the op has none for these arguments."""
        aten = torch.ops.aten
        if name in ("convolution", "convolution_backward") and not kwargs:
            return self._convolution_part(func, name, args, out, home, out_index)
        if name in PLANEWISE and not kwargs:
            return self._planes(func, name, args, out, home)
        if name in _BATCH_NORMS and not kwargs:
            return self._batch_norm_channels(func, name, args, out, home)
        if name in ("mm", "addmm") and out.dim() == 2 and not kwargs.get("out_dtype", None):
            a = args[0] if name == "mm" else args[1]
            b = args[1] if name == "mm" else args[2]
            rs, cs = grid(out.shape[0], out.shape[1], self.max_elements)
            how = f"grid {rs.stop - rs.start}x{cs.stop - cs.start}/{out.shape[0]}x{out.shape[1]}"
            if name == "addmm":
                bias = args[0]
                if bias.dim() == 2 and bias.shape[0] == out.shape[0]:
                    bias = bias[rs]
                if bias.dim() >= 1 and bias.shape[-1] == out.shape[1]:
                    bias = bias[..., cs]
                return self._job(aten.addmm.default, (bias, a[rs], b[:, cs]),
                                 {"beta": kwargs.get("beta", 1), "alpha": kwargs.get("alpha", 1)},
                                 home, 0, out[rs, cs], how)
            return self._job(aten.mm.default, (a[rs], b[:, cs]), {}, home, 0, out[rs, cs], how)
        if name == "bmm" and out.dim() == 3:
            a, b = args[0], args[1]
            rs, cs = grid(out.shape[1], out.shape[2], max(1, self.max_elements // out.shape[0]))
            how = f"grid {rs.stop - rs.start}x{cs.stop - cs.start}/{out.shape[1]}x{out.shape[2]}"
            return self._job(aten.bmm.default, (a[:, rs], b[:, :, cs]), {}, home, 0, out[:, rs, cs], how)
        if name in ("_softmax_backward_data", "_log_softmax_backward_data") and args[2] in (-1, out.dim() - 1):
            sel = self._sampled_rows(out)
            if sel is None:
                return None
            rs, n_rows, last = sel
            g, o = args[0].reshape(n_rows, last)[rs], args[1].reshape(n_rows, last)[rs]
            return self._job(func, (g, o, -1, _F64), {}, home, 0, out.reshape(n_rows, last)[rs],
                             f"rows {rs.stop - rs.start}/{n_rows}")
        if name in ("_softmax", "_log_softmax") and args[1] in (-1, out.dim() - 1):
            sel = self._sampled_rows(out)
            if sel is None:
                return None
            rs, n_rows, last = sel
            return self._job(func, (args[0].reshape(n_rows, last)[rs], -1, False), {}, home, 0,
                             out.reshape(n_rows, last)[rs], f"rows {rs.stop - rs.start}/{n_rows}")
        if name in ("native_layer_norm", "native_layer_norm_backward") and not kwargs:
            return self._layer_norm_rows(func, name, args, out, home)
        if name in ("select_backward", "slice_backward") and not kwargs:
            return self._where_the_gradient_lands(name, args, out, home)
        if name == "embedding" and not kwargs:
            return self._embedding_rows(args, out, home)
        if name == "embedding_dense_backward" and not kwargs and out.dim() == 2:
            rs = span(out.shape[0], max(1, self.max_elements // max(1, out.shape[1])))
            return self._job(embedding_rows_backward, (args[0], args[1], int(args[3]), bool(args[4]), rs.start,
                                                       rs.stop), {}, home, 0, out[rs],
                             f"rows {rs.stop - rs.start}/{out.shape[0]}")
        if name == "cat" and not kwargs and (args[1] if len(args) > 1 else 0) % out.dim() == 0:
            return self._where_the_rows_land(args[0], out, home)
        if name == "nll_loss_backward" and not kwargs and args[1].dim() == 2:
            sel = self._sampled_rows(out)
            if sel is None:
                return None
            rs, n_rows, _ = sel
            grad = args[0][rs] if args[0].dim() else args[0]  # per-row gradients with reduction="none"
            return self._job(func, (grad, args[1][rs], args[2][rs], *args[3:]), {}, home, 0, out[rs],
                             f"rows {rs.stop - rs.start}/{n_rows}")
        if name in BATCHWISE:
            return self._batch_rows(func, name, args, kwargs, out, home)
        # point-wise, or a cast (autocast makes dozens a step, some of 500K elements; its dtype is a keyword): each
        # element from its own
        constants = not any(isinstance(v, torch.Tensor) for v in kwargs.values())  # gelu's approximate, add's alpha
        if (is_pointwise(func) and constants) or (name == "_to_copy" and len(args) == 1 and out.is_floating_point()):
            shape = tuple(out.shape)
            if not all(broadcasts_to(a.shape, shape) for a in args if isinstance(a, torch.Tensor)):
                return None
            where = block(shape, self.max_elements)
            picked = [block_of(a, shape, where) if isinstance(a, torch.Tensor) and a.dim() else a for a in args]
            tv = block_of(out, shape, where)
            return self._job(func, tuple(picked), kwargs, home, 0, tv, f"block {tv.numel()}/{out.numel()}")
        return None

    def _convolution_part(self, func, name, args, out, home, out_index: int) -> Optional[ShadowJob]:
        """A convolution, or one gradient of its backward, on a part computed from the matching parts of its
        arguments alone (the op called on them, with ``groups`` 1 inside one group):

        * the output and the input gradient (output 0): a run of images (batch entries); when one image is more than
          ``max_elements``, one image and a run of channels of one group (output channels: the weight's rows; input
          channels: the weight's columns of that group's rows). A transposed convolution: images only.
        * the weight gradient (output 1): a run of the weight's rows of one group (output channels; a transposed
          convolution's input channels), from every image: those channels of the output gradient (or input), the
          group's channels of the other.

        None for anything else (the bias gradient is a sum of the whole output gradient: compared whole)."""
        if name == "convolution":
            inp, weight, bias, stride, padding, dilation, transposed, output_padding, groups = args[:9]
            grad = None
        else:
            grad, inp, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups = args[:10]
        groups, n_img = int(groups), out.shape[0]
        rows, per_group = weight.shape[0], weight.shape[0] // groups  # the weight's dim 0 and its part in one group
        g = span(groups, 1).start
        mine = slice(g * per_group, (g + 1) * per_group)  # the group's rows of the weight
        # the other side's channels of that group: input channels (normal), output channels (transposed)
        other = slice(g * weight.shape[1], (g + 1) * weight.shape[1])
        if out_index == 1:  # the weight gradient: a run of the group's rows, every image
            run = span(per_group, max(1, self.max_elements // max(1, out[0].numel())))
            cs = slice(mine.start + run.start, mine.start + run.stop)
            go, x = (grad[:, cs], inp[:, other]) if not transposed else (grad[:, other], inp[:, cs])
            call = (go, x, weight[cs], None, stride, padding, dilation, transposed, output_padding, 1,
                    [False, True, False])
            return self._job(func, call, {}, home, 1, out[cs], f"channels {run.stop - run.start}/{rows}")
        if out_index != 0:
            return None
        per_image = out[0].numel()
        if per_image <= self.max_elements or transposed:
            ims = span(n_img, max(1, self.max_elements // per_image))
            how = f"images {ims.stop - ims.start}/{n_img}"
            if grad is None:
                return self._job(func, (inp[ims], *args[1:]), {}, home, 0, out[ims], how)
            return self._job(func, (grad[ims], inp[ims], *args[2:10], [True, False, False]), {}, home, 0, out[ims], how)
        im = span(n_img, 1)
        per_channel = per_image // max(1, out.shape[1])
        if grad is None:  # output channels of one group: rows of the weight
            run = span(per_group, max(1, self.max_elements // max(1, per_channel)))
            cs = slice(mine.start + run.start, mine.start + run.stop)
            call = (inp[im, other], weight[cs], None if bias is None else bias[cs], stride, padding, dilation, False,
                    output_padding, 1)
            return self._job(func, call, {}, home, 0, out[im, cs], f"image 1/{n_img}, channels {run.stop - run.start}"
                             f"/{out.shape[1]}")
        # input channels of one group: columns of the group's rows of the weight
        run = span(weight.shape[1], max(1, self.max_elements // max(1, per_channel)))
        cs = slice(other.start + run.start, other.start + run.stop)
        call = (grad[im, mine], inp[im, cs], weight[mine, run], None, stride, padding, dilation, False, output_padding,
                1, [True, False, False])
        return self._job(func, call, {}, home, 0, out[im, cs], f"image 1/{n_img}, channels {run.stop - run.start}"
                         f"/{out.shape[1]}")

    def _planes(self, func, name, args, out, home) -> Optional[ShadowJob]:
        """A plane-wise op (:data:`PLANEWISE`: pooling) on a block of whole planes (one index of the leading dims but a
        run of one of them), the same planes of every tensor argument."""
        n = out.dim() - PLANEWISE[name]
        lead = tuple(out.shape[:n])
        if n < 1 or any(isinstance(a, torch.Tensor) and (a.dim() != out.dim() or tuple(a.shape[:n]) != lead)
                        for a in args):
            return None
        unit = out[(0,) * n].numel()
        idx = block_slices(block(lead + (unit,), max(self.max_elements, unit)), n)
        tv = out[idx]
        call = tuple(a[idx] if isinstance(a, torch.Tensor) else a for a in args)
        return self._job(func, call, {}, home, 0, tv, f"planes {tv.numel() // max(1, unit)}/{math.prod(lead)}")

    def _batch_norm_channels(self, func, name, args, out, home) -> Optional[ShadowJob]:
        """A batch norm's output, or its backward's input gradient, on a run of channels: every image and position of
        those channels, and those entries of the per-channel vectors (weight, bias, running and saved statistics;
        a running statistic the op updates is written in the shadow's float64 copy, never the program's)."""
        if out.dim() < 2:
            return None
        c = out.shape[1]
        run = span(c, max(1, self.max_elements // max(1, out.numel() // c)))
        n_tensors = 2 if name == "native_batch_norm_backward" else 1  # grad_out and input; input

        def part(k, a):
            if not isinstance(a, torch.Tensor):
                return a
            if k < n_tensors:
                return a[:, run]
            a = a[run] if a.dim() == 1 and a.shape[0] == c else a
            # the running statistics a training forward updates: a copy (a float64 one would be the program's own)
            return a.clone() if k in (3, 4) and n_tensors == 1 else a

        call = tuple(part(k, a) for k, a in enumerate(args))
        if name == "native_batch_norm_backward":
            call = call[:-1] + ([True, False, False],)
        return self._job(func, call, {}, home, 0, out[:, run], f"channels {run.stop - run.start}/{c}")

    def _batch_rows(self, func, name, args, kwargs, out, home) -> Optional[ShadowJob]:
        """A row-wise op (:data:`BATCHWISE`) on a run of its output's rows (dim 0), from the same rows of its row-wise
        arguments (the row count argument, where it has one, set to the run's); None where the op works across rows
        (a cumulative sum over dim 0, a concatenation along it) or an argument does not have the output's rows."""
        rowwise, count, applies = BATCHWISE[name]
        n, nd = out.shape[0], out.dim()
        if nd < 2 or any(isinstance(v, torch.Tensor) for v in kwargs.values()) or not applies(args, nd):
            return None
        rs = span(n, max(1, self.max_elements // max(1, out[0].numel())))
        call = list(args)
        for k in rowwise:
            x = args[k]
            parts = list(x) if isinstance(x, (list, tuple)) else [x]
            if not parts or any(not isinstance(t, torch.Tensor) or t.dim() < 1 or t.shape[0] != n for t in parts):
                return None
            call[k] = [t[rs] for t in parts] if isinstance(x, (list, tuple)) else x[rs]
        if isinstance(count, tuple):  # the row count inside a size list (an upsampling backward's input_size)
            sizes = list(args[count[0]])
            sizes[count[1]] = rs.stop - rs.start
            call[count[0]] = sizes
        elif count is not None:
            call[count] = rs.stop - rs.start
        return self._job(func, tuple(call), kwargs, home, 0, out[rs], f"rows {rs.stop - rs.start}/{n}")

    def _exact_copy(self, src: torch.Tensor, target: torch.Tensor, home, how: str) -> ShadowJob:
        """The job of a data-movement op's sample whose exact result is ``src`` itself: its float64 cast (batched with
        the casts'), compared with ``target``."""
        return self._job(torch.ops.aten._to_copy.default, (src,), {"dtype": _F64}, home, 0, target, how)

    def _where_the_gradient_lands(self, name, args, out, home) -> Optional[ShadowJob]:
        """``select_backward`` / ``slice_backward`` (zeros of the input's shape, the incoming gradient written where the
        forward's view read) on a block of the positions the gradient lands on: there the exact result is the
        gradient itself (a float64 cast of its block). The zeros around are not compared."""
        grad, dim = args[0], int(args[2]) % out.dim()
        if name == "select_backward":
            dest = out.select(dim, int(args[3]))
        else:
            dest = out[(slice(None),) * dim + (slice(int(args[3]), int(args[4]), int(args[5])),)]
        shape = tuple(grad.shape)
        if tuple(dest.shape) != shape:
            return None
        where = block(shape, self.max_elements)
        tv = block_of(dest, shape, where)
        return self._exact_copy(block_of(grad, shape, where), tv, home,
                                f"block {tv.numel()}/{out.numel()} where the gradient lands")

    def _picked_log_probs(self, func, args, kwargs, out, out_index, home) -> Optional[ShadowJob]:
        """``nll_loss_forward`` (the loss and the count of its rows) over a large input (a language model's
        tokens x vocabulary log-probabilities): the loss reads one value a row, the target's, so its float64 shadow is
        the same op on those values alone (gathered here, an exact copy, into one column; an ignored row keeps its
        place as ignored), not the whole input made float64. None with class weights (the whole op then)."""
        sibling = self._sibling(func, args, kwargs, home, out_index, out)
        if sibling is not None:
            return sibling
        x, target, weight, reduction, ignore = args[:5]
        if weight is not None or x.dim() != 2 or target.dim() != 1:
            return None
        ignored = target == ignore
        picked = x.gather(1, torch.where(ignored, torch.zeros_like(target), target).unsqueeze(1))
        call = (picked, ignored.long(), None, reduction, 1)  # column 0 the target's; 1 (out of range) ignored
        job = self._job(func, call, {}, home, out_index, out, f"picked {x.shape[0]}/{x.numel()}")
        self._last_call = (func, args, kwargs, job, None)
        return job

    def _where_the_rows_land(self, tensors, out, home) -> Optional[ShadowJob]:
        """``cat`` along the rows on a run of output rows that one of its tensors fills: there the exact result is
        that tensor's rows (a float64 cast of them). None when the run would span two tensors."""
        rs = span(out.shape[0], max(1, self.max_elements // max(1, out[0].numel())))
        start = 0
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.dim() != out.dim():
                return None  # an empty legacy placeholder (shape [0]) or a scalar: positions shift
            stop = start + t.shape[0]
            if start <= rs.start and rs.stop <= stop:
                return self._exact_copy(t[rs.start - start:rs.stop - start], out[rs], home,
                                        f"rows {rs.stop - rs.start}/{out.shape[0]}")
            start = stop
        return None

    def _embedding_rows(self, args, out, home) -> Optional[ShadowJob]:
        """``embedding`` on a block of its output (:func:`blocks.block`): the table rows of the block's indices,
        gathered here with ``index_select`` (an exact copy: the whole table is never made float64), are its exact
        result."""
        weight, indices = args[0], args[1]
        if weight.dim() != 2 or tuple(out.shape) != tuple(indices.shape) + (weight.shape[1],):
            return None
        d, fixed, run = block(tuple(out.shape), self.max_elements)
        n = indices.dim()
        idx = tuple(fixed[g] if g < d else (run if g == d else slice(None)) for g in range(n))
        cols = run if d == n else slice(None)
        picked = indices[idx]
        rows = weight.index_select(0, picked.reshape(-1)).view(*picked.shape, weight.shape[1])[..., cols]
        tv = out[idx + (cols,)]
        return self._exact_copy(rows, tv, home, f"block {tv.numel()}/{out.numel()} (table rows by index_select)")

    def _layer_norm_rows(self, func, name, args, out, home) -> Optional[ShadowJob]:
        """A run of rows of ``native_layer_norm``'s output, or of its backward's input gradient (output 0): a row
        is normalised over the ``normalized_shape`` dims from that row's input (and, backward, its output gradient,
        mean and rstd) alone, so the rows' float64 call on those rows computes them. None when ``out`` is small
        enough to compare whole."""
        if len(args) != (5 if name == "native_layer_norm" else 8):
            return None
        normalized = [int(n) for n in (args[1] if name == "native_layer_norm" else args[2])]
        d = math.prod(normalized)
        n_rows = out.numel() // max(1, d)
        if n_rows * d <= self.max_elements or n_rows <= 1:
            return None
        rs = span(n_rows, max(1, self.max_elements // d))
        k = rs.stop - rs.start

        def rows(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(n_rows, d)[rs].reshape(k, *normalized)

        if name == "native_layer_norm":  # (input, normalized_shape, weight, bias, eps)
            call = (rows(args[0]), normalized, *args[2:5])
        else:  # (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask): the input gradient only
            def stat(t: torch.Tensor) -> torch.Tensor:
                return t.reshape(n_rows, 1)[rs].reshape(k, *([1] * len(normalized)))
            call = (rows(args[0]), rows(args[1]), normalized, stat(args[3]), stat(args[4]), args[5], args[6],
                    [True, False, False])
        return self._job(func, call, {}, home, 0, rows(out), f"rows {k}/{n_rows}")
