"""Shadow execution: re-run one aten op in float64 on the target's actual inputs.

The shadow isolates the op's *own* error (DIPU autocompare style): its inputs are exactly the
target's inputs upcast, so any difference is introduced by this op. It runs where
:func:`float64_home` says: on the target device itself when its backend computes float64 natively
(an MLU computes float64 as float32, so a float64 shadow there would be no reference: the CPU then),
unless ``HAL_PRECISION_SHADOW_DEVICE=cpu`` keeps it on the CPU. Costs are kept down by

* planning shadows as the ops run and computing them later in batched calls (:meth:`Shadow.plan`
  makes a :class:`ShadowJob`, :meth:`Shadow.flush` computes many: the jobs of one op, argument
  shapes and constants in one float64 call, :func:`_direct_form` or ``torch.vmap``);
* an upcast cache (:class:`UpcastCache`) keyed by storage, offset, shape, stride, dtype and
  version, holding a strong reference to the source so the key cannot be recycled; bounded by
  bytes (LRU), cleared by the owner at the end of each step;
* sampling giant outputs, on views (the places are :mod:`blocks`'; only the float64 copies of the sampled
  inputs cost a kernel, and the compared output is a view the tracer copies only if it is written):
  matrix products are shadowed on a fixed run of output rows x a run of columns (only those rows of
  A and columns of B are upcast), point-wise ops and casts on a fixed block (one index of each leading dim, a
  run of the next, the rest whole), last-dim softmax (and its backward), layer norm (and its input gradient) and
  ``nll_loss_backward`` on a run of rows, ``select_backward``/``slice_backward`` on a block of where the gradient
  lands, ``embedding`` on a block (its table rows gathered, never the whole table made float64), attention on
  query rows and its backward on whole heads (:mod:`attention`), convolutions on images and channels, batch norms
  on channels, pooling on planes, row-wise ops (:data:`BATCHWISE`: cumulative sums, gathers, padding, upsampling,
  group norm ...) on a run of rows. Everything else is shadowed in full, except
  outputs over ``HUGE_FACTOR x max_elements`` with no sampled variant, which are left to the reference-run
  comparison (recorded as unshadowed with the reason).

Planning runs inside a tracer's ``__torch_dispatch__``, below autograd; the owner flushes under
``torch.no_grad()``: nothing here is recorded for the backward, so no tensor needs ``detach()``. Not
thread-safe: one :class:`Shadow` per tracer.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import os
from typing import Any, Dict, List, Optional, Tuple

import torch

from .argtree import map_leaves
from .attention import (ATTENTION_BACKWARD, ATTENTION_FORWARD, _DEVICE_ATTENTION, _DEVICE_ATTENTION_BACKWARD,
                        attention_backward_call, attention_call, sampled_attention, sampled_attention_backward)
from .blocks import UnshadowedError, block, block_of, broadcasts_to, grid, span
from .recurrent import lstm_layer_backward_call, lstm_layer_call
from .metrics import DEFAULT_MAX_ELEMENTS, to_home

_F64 = torch.float64
_CPU = torch.device("cpu")
#: ``device``: run float64 shadows on the op's device where its backend computes float64 natively;
#: ``cpu`` (the default, also when unset): on the CPU
ENV_SHADOW_DEVICE = "HAL_PRECISION_SHADOW_DEVICE"
_HOMES: Dict[torch.device, torch.device] = {}


def float64_home(device: torch.device) -> torch.device:
    """Where float64 shadows (and the statistics) of ops on ``device`` run: the device itself when its
    HAL backend computes float64 natively there (``supports_dtype``: a silent downcast is not native,
    so never an MLU), else the CPU; ``$HAL_PRECISION_SHADOW_DEVICE=cpu`` keeps them on the CPU. On the
    H200 the device was 2-15x cheaper in steady state (at a562d9a: gpt tiny 5.9x a plain step against 15.8x
    on the CPU, gpt2-small shapes 7.1-9.6x against 106-125x). Decided once per device and cached; a backend that cannot
    be asked means the CPU. Thread-safe (idempotent cache writes)."""
    if device.type == "cpu":
        return _CPU
    home = _HOMES.get(device)
    if home is None:
        home = _CPU
        if os.environ.get(ENV_SHADOW_DEVICE, "device").strip().lower() != "cpu":
            try:
                from hal.discovery import get_backend
                if get_backend(device.type).supports_dtype(_F64, device):
                    home = device
            except Exception:  # no backend for this device type, or it cannot say: the CPU is safe
                pass
        _HOMES[device] = home
    return home


class UpcastCache:
    """float64 copies of tensors on their :func:`float64_home`, LRU-bounded by ``max_bytes``."""

    def __init__(self, max_bytes: int = 1 << 30):
        self.max_bytes = max_bytes
        self._d: "collections.OrderedDict[tuple, Tuple[torch.Tensor, torch.Tensor]]" = collections.OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, t: torch.Tensor) -> torch.Tensor:
        home = float64_home(t.device)
        if t.dtype == _F64 and t.device == home:
            return t
        try:  # data_ptr() is the storage's plus the offset; shape (a torch.Size) and stride() are tuples already
            key = (t.data_ptr(), t.shape, t.stride(), t.dtype, t.device, t._version)
        except (RuntimeError, NotImplementedError):
            return to_home(t, home, _F64)
        hit = self._d.get(key)
        if hit is not None:
            self._d.move_to_end(key)
            self.hits += 1
            return hit[1]
        self.misses += 1
        up = to_home(t, home, _F64)
        nbytes = up.numel() * 8
        if nbytes <= self.max_bytes // 4:
            self._d[key] = (t, up)
            self._bytes += nbytes
            while self._bytes > self.max_bytes and self._d:
                _, (_, old) = self._d.popitem(last=False)
                self._bytes -= old.numel() * 8
        return up

    def clear(self) -> None:
        self._d.clear()
        self._bytes = 0


#: outputs this many times over ``max_elements`` with no sampled variant are not shadowed.
HUGE_FACTOR = 64

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


class _Slot:
    """Where input ``k`` of a :class:`ShadowJob` goes in its argument template."""

    __slots__ = ("k",)

    def __init__(self, k: int):
        self.k = k


def _template(o: Any, inputs: List[torch.Tensor], sig: List[Any], home: torch.device) -> Any:
    """``o`` (an op's arguments) with each tensor replaced by its :class:`_Slot` (the tensor appended to
    ``inputs``), floating dtypes by float64 and devices by ``home``; ``sig`` gets what identifies the call
    for batching, in one walk: each tensor's shape, dtype and device, each container's kind and length,
    each constant."""
    if isinstance(o, torch.Tensor):
        inputs.append(o)
        sig.append((o.shape, o.dtype, o.device))
        return _Slot(len(inputs) - 1)
    if isinstance(o, (tuple, list)):
        sig.append((type(o), len(o)))
        out = [_template(x, inputs, sig, home) for x in o]
        return tuple(out) if isinstance(o, tuple) else out
    if isinstance(o, dict):
        sig.append(tuple(o))
        return {k: _template(v, inputs, sig, home) for k, v in o.items()}
    if isinstance(o, torch.dtype) and o.is_floating_point:
        o = _F64
    elif isinstance(o, torch.device):
        o = home
    sig.append(o)
    return o


@dataclasses.dataclass(eq=False)
class ShadowJob:
    """One op's float64 shadow, planned while the step runs (:meth:`Shadow.plan`: nothing computed, the
    inputs are the program's tensors or views of them) and computed later (:meth:`Shadow.flush`), batched
    with the jobs of the same op, argument shapes and constants: all layers' copies of an op become one
    float64 call. Whoever holds a job keeps ``inputs`` and ``target`` unchanged until it is flushed (the
    tracer copies one when the program is about to write it); after the flush ``ref`` (or ``error``) is
    set and ``inputs`` is emptied."""

    fn: Any  #: called on the float64 arguments (an aten overload, or F.scaled_dot_product_attention)
    args: tuple  #: argument template: each input tensor replaced by its :class:`_Slot`
    kwargs: dict
    inputs: List[torch.Tensor]  #: in slot order; floating ones are made float64, the rest moved as they are
    home: torch.device  #: where the float64 call runs (:func:`float64_home`)
    out_index: int  #: which output of ``fn`` is compared (when it returns several)
    target: torch.Tensor  #: the target values compared with ``ref``
    how: str  #: the sampling, for the report
    key: Optional[tuple]  #: jobs of one key run as one batched call; None: on its own
    ref: Optional[torch.Tensor] = None
    #: True for a job planned for another output of the same op call as the job planned just before it: the two
    #: share ``inputs`` (one list), and run one by one they share one float64 call (:meth:`Shadow.flush`)
    shared: bool = False
    error: Optional[str] = None


#: ops whose batched (vmap) float64 call failed once: their jobs run one by one from then on
_UNBATCHABLE: set = set()
#: bytes of float64 inputs one batched call stacks at most (a larger group is split)
BATCH_BYTES = 1 << 28


@contextlib.contextmanager
def _quiet_vmap_fallback():
    """vmap runs an op without a batching rule as a loop in C++ (still one call for the group), and says so
    on stderr every time: not while shadows run (restored to torch's default, on, afterwards)."""
    toggle = getattr(torch._C._functorch, "_set_vmap_fallback_warning_enabled", None)
    if toggle is not None:
        toggle(False)
    try:
        yield
    finally:
        if toggle is not None:
            toggle(True)


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

#: groups of an op without a direct batched form (:func:`_direct_form`) smaller than this run one by one: a
#: vmap call costs about a millisecond of host time (H200 host, torch 2.11), ten single float64 calls' worth
VMAP_MIN_GROUP = 8
_ROW_DIM = {"_softmax": 1, "_log_softmax": 1, "_softmax_backward_data": 2, "_log_softmax_backward_data": 2}


def _direct_form(job: ShadowJob):
    """A function of the stacked float64 inputs (``[G, ...]`` each) that computes the group's references
    (``[G, ...]``) with one plain op, for the op families that have one: matrix products (``bmm`` /
    ``baddbmm``), sums over dims, casts to a floating dtype, last-dim softmax and its backward, and point-wise ops
    (each input viewed with the output's rank, so broadcasting works per job); None for the rest (vmap, or one by
    one)."""
    fn, a, kw = job.fn, job.args, job.kwargs
    slots = all(isinstance(x, _Slot) for x in a)
    if fn is torch.ops.aten.mm.default and len(a) == 2 and slots and not kw:
        return lambda xs: torch.bmm(xs[0], xs[1])
    if fn is torch.ops.aten.addmm.default and len(a) == 3 and slots and set(kw) <= {"beta", "alpha"}:
        def addmm(xs):
            bias = xs[0]
            while bias.dim() < 3:  # [G, c] -> [G, 1, c], [G] -> [G, 1, 1]
                bias = bias.unsqueeze(1)
            return torch.baddbmm(bias, xs[1], xs[2], beta=kw.get("beta", 1), alpha=kw.get("alpha", 1))
        return addmm
    if fn is torch.ops.aten.bmm.default and len(a) == 2 and slots and not kw:
        def bmm(xs):
            g, b = xs[0].shape[:2]
            return torch.bmm(xs[0].flatten(0, 1), xs[1].flatten(0, 1)).view(g, b, xs[0].shape[2], xs[1].shape[3])
        return bmm
    if fn is torch.ops.aten.sum.dim_IntList and isinstance(a[0], _Slot) and set(kw) <= {"dtype"} \
            and 2 <= len(a) <= 3 and not any(isinstance(x, _Slot) for x in a[1:]) and job.inputs[0].dim():
        # a sum over dims: the same dims one place further on (none listed: every dim but the group's)
        dims = a[1]
        shifted = [d + 1 if d >= 0 else d for d in dims] if dims else list(range(1, job.inputs[0].dim() + 1))
        keep = bool(a[2]) if len(a) == 3 else False
        return lambda xs: torch.sum(xs[0], shifted, keepdim=keep, dtype=kw.get("dtype"))
    if fn is torch.ops.aten._to_copy.default and len(a) == 1 and isinstance(a[0], _Slot) \
            and kw.get("dtype", _F64) is _F64 and job.target.is_floating_point():
        # a cast (autocast makes dozens a step): its float64 form is its input in float64, which the stacked
        # input already is (a non-floating input is cast here)
        return lambda xs: xs[0].to(_F64)
    name = getattr(getattr(fn, "overloadpacket", None), "__name__", None)
    pos = _ROW_DIM.get(name)
    if pos is not None and len(a) > pos and isinstance(a[pos], int) and a[pos] < 0 and not kw:
        return lambda xs: fn(*_fill(a, xs))
    if is_pointwise(fn) and not any(isinstance(v, _Slot) for v in kw.values()):  # constant keywords (gelu's)
        rank = job.target.dim()
        if any(x.dim() > rank for x in job.inputs):
            return None
        return lambda xs: fn(*_fill(a, [x.view(x.shape[0], *([1] * (rank + 1 - x.dim())), *x.shape[1:])
                                        for x in xs]), **kw)
    return None


def _fill(o: Any, xs: List[torch.Tensor]) -> Any:
    return map_leaves(lambda x: xs[x.k] if isinstance(x, _Slot) else x, o)


def _call(job: ShadowJob, xs: List[torch.Tensor]) -> torch.Tensor:
    """The compared output of ``job``'s op on the float64 arguments ``xs`` (its inputs, in slot order)."""
    res = job.fn(*_fill(job.args, xs), **_fill(job.kwargs, xs))
    return res[job.out_index] if isinstance(res, (tuple, list)) else res


def error_line(exc: BaseException) -> str:
    """``exc`` as one report line: its type and the first line of its message, at most 160 characters."""
    msg = str(exc)
    return f"{type(exc).__name__}: {msg.splitlines()[0][:160] if msg else ''}"


class Shadow:
    """Plans and runs float64 shadows of aten ops on :func:`float64_home` of the op's output device.
    :meth:`plan` picks what to compare (sampled variants read views) and :meth:`flush` computes many
    planned jobs at once; :meth:`run` does both for one op."""

    def __init__(self, max_elements: int = DEFAULT_MAX_ELEMENTS, cache_bytes: int = 1 << 30,
                 sample: bool = True):
        self.max_elements = max_elements
        self.sample = sample
        self.cache = UpcastCache(cache_bytes)
        #: the devices shadows ran on (``"cpu"``, ``"cuda:0"`` ...), for the report
        self.homes: set = set()
        #: jobs computed in batched calls, the calls, and how many of those were vmap calls
        self.batched_jobs = 0
        self.batched_calls = 0
        self.vmap_calls = 0
        #: jobs computed one by one whose reference came from a sibling's float64 call (:attr:`ShadowJob.shared`)
        self.shared_jobs = 0
        #: the last op call planned for all its outputs, ``(func, args, kwargs, its job, the index its sample takes
        #: of each output or None)``, so its other outputs' jobs share that job's template and inputs (:meth:`plan`);
        #: dropped at each flush
        self._last_call: Optional[tuple] = None

    def run(self, func, args, kwargs, out: torch.Tensor, out_index: int
            ) -> Tuple[torch.Tensor, torch.Tensor, str]:
        """Shadow of output ``out_index`` of ``func(*args, **kwargs)``, now.

        Returns (target values, float64 shadow values, sampling description). Raises whatever
        the op raises in float64, or :class:`UnshadowedError`.
        """
        job = self.plan(func, args, kwargs, out, out_index)
        self._run_one(job, raise_errors=True)
        return job.target, job.ref, job.how

    def plan(self, func, args, kwargs, out: torch.Tensor, out_index: int) -> ShadowJob:
        """The :class:`ShadowJob` of output ``out_index`` of ``func(*args, **kwargs)`` (nothing runs).
        Raises :class:`UnshadowedError` when the output is too large and has no sampled variant."""
        name = func.overloadpacket.__name__
        home = float64_home(out.device)
        self.homes.add(str(home))
        if name in ATTENTION_FORWARD:
            job = self._attention(func, name, args, kwargs, out, out_index, home)
            if job is not None:
                return job
        elif name in ATTENTION_BACKWARD:
            job = self._attention_backward(func, name, args, kwargs, out, out_index, home)
            if job is not None:
                return job
        if name == "mkldnn_rnn_layer":  # oneDNN has no float64: a float64 call of it only raises
            return self._math_form(func, name, args, kwargs, out, out_index, home, lstm_layer_call)
        if name == "mkldnn_rnn_layer_backward":
            return self._math_form(func, name, args, kwargs, out, out_index, home, lstm_layer_backward_call)
        if name == "nll_loss_forward" and self.sample and not kwargs and args[0].numel() > self.max_elements:
            job = self._picked_log_probs(func, args, kwargs, out, out_index, home)
            if job is not None:
                return job
        big = self.sample and out.numel() > self.max_elements
        if big and (out_index == 0 or name == "convolution_backward"):
            fast = self._sampled(func, name, args, kwargs, out, home, out_index)
            if fast is not None:
                return fast
        if big and out.numel() > HUGE_FACTOR * self.max_elements:
            raise UnshadowedError(f"output of {out.numel()} elements has no sampled shadow; "
                                  "compared against the reference run only")
        sibling = self._sibling(func, args, kwargs, home, out_index, out)
        if sibling is not None:
            return sibling
        job = self._job(func, args, kwargs, home, out_index, out, "full")
        self._last_call = (func, args, kwargs, job, None)
        return job

    def _attention(self, func, name, args, kwargs, out, out_index, home) -> Optional[ShadowJob]:
        """The job of an attention kernel's output (:mod:`attention`): a large one's sampled query rows, a device
        kernel's whole output (the float64 math attention); None for a small CPU kernel (a float64 call of it, the
        generic path). Raises :class:`UnshadowedError` for another output than 0 and what the samplers raise."""
        sampled = self.sample and out.numel() > self.max_elements
        if not sampled and name not in _DEVICE_ATTENTION:
            return None
        if out_index != 0:
            raise UnshadowedError(f"{name} output {out_index} has no float64 counterpart")
        if sampled:
            fn, a, k, target, how = sampled_attention(func, name, args, kwargs, out, self.max_elements)
        else:
            (fn, a, k), target, how = attention_call(func, name, args, kwargs), out, "full"
        return self._job(fn, a, k, home, 0, target, how, batch=False)

    def _attention_backward(self, func, name, args, kwargs, out, out_index, home) -> Optional[ShadowJob]:
        """The job of gradient ``out_index`` (0-2: query, key, value) of an attention kernel's backward: the math
        attention's gradients (:func:`attention.math_attention_grads`), of a slab of heads when query, key or value is
        over ``max_elements`` (one float64 call for the three); None for a small CPU kernel (a float64 call of it).
        Raises :class:`UnshadowedError` for the bias gradient and what the samplers raise."""
        if out_index > 2:
            raise UnshadowedError(f"{name} output {out_index} (the bias gradient) is not shadowed")
        # grad_out, query, key, value lead every backward's arguments: one decision for the three gradients
        sampled = self.sample and any(isinstance(a, torch.Tensor) and a.numel() > self.max_elements for a in args[:4])
        if not sampled:
            if name not in _DEVICE_ATTENTION_BACKWARD:
                return None
            return self._math_form(func, name, args, kwargs, out, out_index, home, attention_backward_call)
        sibling = self._sibling(func, args, kwargs, home, out_index, out)
        if sibling is not None:
            return sibling
        fn, a, k, heads, how = sampled_attention_backward(func, name, args, kwargs, self.max_elements)
        job = self._job(fn, a, k, home, out_index, out[heads], how, batch=False)
        self._last_call = (func, args, kwargs, job, heads)
        return job

    def _math_form(self, func, name, args, kwargs, out, out_index, home, call) -> ShadowJob:
        """The job of output ``out_index`` of a kernel whose float64 reference is a written-out math form
        (``call(func, name, args, kwargs)`` gives its ``(fn, args, kwargs)``, ``fn`` returning the compared outputs
        first): one float64 call for all of a call's outputs (shared jobs). Raises :class:`UnshadowedError` for
        outputs over ``HUGE_FACTOR x max_elements`` (the math forms keep whole intermediates in float64) and
        whatever ``call`` raises."""
        if self.sample and out.numel() > HUGE_FACTOR * self.max_elements:
            raise UnshadowedError(f"output of {out.numel()} elements has no sampled shadow; "
                                  "compared against the reference run only")
        sibling = self._sibling(func, args, kwargs, home, out_index, out)
        if sibling is not None:
            return sibling
        fn, a, k = call(func, name, args, kwargs)
        job = self._job(fn, a, k, home, out_index, out, "full", batch=False)
        self._last_call = (func, args, kwargs, job, None)
        return job

    def _sibling(self, func, args, kwargs, home, out_index, out) -> Optional[ShadowJob]:
        """The job of another output of the op call planned just before (native_layer_norm's mean and rstd, a
        backward's three gradients), sharing its float64 call, template and inputs (run one by one, the siblings
        make one call), and its sample (the same index of ``out``); None when the last call planned is another."""
        last = self._last_call
        if last is None or last[0] is not func or last[1] is not args or last[2] is not kwargs or last[3].home != home:
            return None
        first, pick = last[3], last[4]
        key = None if first.key is None else (first.fn, out_index, home) + first.key[3:]
        return ShadowJob(first.fn, first.args, first.kwargs, first.inputs, home, out_index,
                         out if pick is None else out[pick], first.how, key, shared=True)

    def _job(self, fn, args, kwargs, home, out_index, target, how, batch: bool = True) -> ShadowJob:
        inputs: List[torch.Tensor] = []
        sig: List[Any] = [fn, out_index, home]
        a = _template(args, inputs, sig, home)
        k = _template(kwargs, inputs, sig, home)
        key = None
        if batch and inputs:
            try:
                key = tuple(sig)
                hash(key)
            except TypeError:  # an unhashable constant: on its own
                key = None
        return ShadowJob(fn, a, k, inputs, home, out_index, target, how, key)

    def finish(self, jobs: List[ShadowJob], targets: torch.Tensor, refs: torch.Tensor
               ) -> Tuple[torch.Tensor, torch.Tensor]:
        """What is compared of ``jobs`` (computed, of one key), given their target and reference values
        stacked (``[len(jobs), ...]``): here all of it; a subclass may cut both (and say so in ``how``)."""
        return targets, refs

    def cuts(self, job: ShadowJob) -> bool:
        """Whether :meth:`finish` may cut ``job``'s values (never here): a job computed on its own is passed
        to it only then, saving the stacking of one job."""
        return False

    def _finish(self, jobs: List[ShadowJob], targets: torch.Tensor, refs: torch.Tensor) -> None:
        targets, refs = self.finish(jobs, targets, refs)
        for g, j in enumerate(jobs):
            j.target, j.ref = targets[g], refs[g]

    # -- computing planned jobs -------------------------------------------------------------------
    def flush(self, jobs: List[ShadowJob], batched: bool = True) -> None:
        """Compute every job (``ref``, or ``error`` saying why not): jobs of one key in one batched float64
        call over their stacked inputs (:meth:`_run_batched`; an op whose batched call fails once runs job by
        job from then on), the rest one by one; then :meth:`finish` each. ``batched=False``: all one
        by one (vmap cannot run inside a ``__torch_dispatch__``). Never raises for a job's sake. Releases the
        jobs' inputs."""
        self._last_call = None
        calls: Dict[int, Any] = {}  # id(inputs) -> the float64 call's result, for jobs that share a call
        groups: Dict[Any, List[ShadowJob]] = {}
        for j in jobs:
            batchable = batched and j.key is not None and j.key[0] not in _UNBATCHABLE
            groups.setdefault(j.key if batchable else id(j), []).append(j)
        for js in groups.values():
            per = max(1, BATCH_BYTES // max(1, 8 * sum(x.numel() for x in js[0].inputs)))
            for s in range(0, len(js), per):
                part = js[s:s + per]
                refs = self._run_batched(part) if len(part) > 1 else None
                if refs is not None:
                    self._finish(part, torch.stack([j.target for j in part]), refs)
                    continue
                for j in part:
                    self._run_one(j, calls=calls)
        for j in jobs:
            j.inputs = []

    def _run_one(self, job: ShadowJob, raise_errors: bool = False, calls: Optional[Dict[int, Any]] = None) -> None:
        """Compute ``job`` on its own (upcasts through the cache) and :meth:`finish` it; a failure sets
        ``error`` (or raises, with ``raise_errors``). ``calls``: results of float64 calls by ``id(inputs)``, read
        and written for jobs that share their call (``shared``, or the first job whose inputs a later one shares)."""
        res = calls.get(id(job.inputs)) if calls is not None and job.shared else None
        if res is not None:
            self.shared_jobs += 1
        else:
            xs = [self.cache.get(x) if x.is_floating_point() else to_home(x, job.home) for x in job.inputs]
            try:
                res = job.fn(*_fill(job.args, xs), **_fill(job.kwargs, xs))
            except Exception as exc:
                if raise_errors:
                    raise
                job.error = error_line(exc)
                return
            if calls is not None and isinstance(res, (tuple, list)):  # only a multi-output call has siblings
                calls[id(job.inputs)] = res
        job.ref = res[job.out_index] if isinstance(res, (tuple, list)) else res
        if self.cuts(job):
            self._finish([job], job.target.unsqueeze(0), job.ref.unsqueeze(0))

    def _run_batched(self, jobs: List[ShadowJob]) -> Optional[torch.Tensor]:
        """One float64 call for ``jobs`` (one key): their references stacked, or None (nothing done) when the
        op has no batched form here (:func:`_direct_form`, else vmap for groups of ``VMAP_MIN_GROUP`` or
        more) or the batched call fails."""
        j0 = jobs[0]
        direct = _direct_form(j0)
        if direct is None and len(jobs) < VMAP_MIN_GROUP:
            return None
        try:
            stacked = [torch.stack([j.inputs[k] for j in jobs]) for k in range(len(j0.inputs))]
            stacked = [to_home(x, j0.home, _F64 if x.is_floating_point() else None) for x in stacked]
            if direct is not None:
                res = direct(stacked)
                if isinstance(res, (tuple, list)):  # a point-wise op with several outputs (frexp)
                    res = res[j0.out_index]
            else:
                with _quiet_vmap_fallback():
                    res = torch.vmap(lambda *xs: _call(j0, list(xs)))(*stacked)
                self.vmap_calls += 1
        except Exception:
            _UNBATCHABLE.add(j0.key[0])
            return None
        self.batched_jobs += len(jobs)
        self.batched_calls += 1
        return res

    # -- sampled variants: views of the inputs and of the output, so only the float64 copies cost a kernel --
    def _sampled_rows(self, out: torch.Tensor) -> Optional[Tuple[slice, int, int]]:
        """A run of rows of ``out`` viewed as [n_rows, last] to compare: ``(rows, n_rows, last)``, or None when
        ``out`` is small enough to compare whole."""
        last = out.shape[-1]
        n_rows = out.numel() // max(1, last)
        if n_rows * last <= self.max_elements or n_rows <= 1:
            return None
        return span(n_rows, self.max_elements // max(1, last)), n_rows, last

    def _sampled(self, func, name, args, kwargs, out, home, out_index: int = 0) -> Optional[ShadowJob]:
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
        # point-wise, or a cast (autocast makes dozens a step, some of 500K elements; its dtype is a keyword): each
        # element from its own
        if name in BATCHWISE:
            return self._batch_rows(func, name, args, kwargs, out, home)
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
        d, fixed, run = block(lead + (unit,), max(self.max_elements, unit))
        idx = tuple(slice(fixed[g], fixed[g] + 1) if g < d else (run if g == d else slice(None)) for g in range(n))
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
        return self._job(torch.ops.aten._to_copy.default, (block_of(grad, shape, where),), {"dtype": _F64}, home, 0,
                         tv, f"block {tv.numel()}/{out.numel()} where the gradient lands")

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
                return self._job(torch.ops.aten._to_copy.default, (t[rs.start - start:rs.stop - start],),
                                 {"dtype": _F64}, home, 0, out[rs], f"rows {rs.stop - rs.start}/{out.shape[0]}")
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
        return self._job(torch.ops.aten._to_copy.default, (rows,), {"dtype": _F64}, home, 0, tv,
                         f"block {tv.numel()}/{out.numel()} (table rows by index_select)")

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
