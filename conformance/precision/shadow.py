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
* sampling giant outputs (planned by :mod:`sampled`; the places are :mod:`blocks`'), on views (only the float64
  copies of the sampled inputs cost a kernel, and the compared output is a view the tracer copies only if it is
  written): matrix products on a fixed run of output rows x a run of columns (only those rows of A and columns of
  B are upcast), point-wise ops and casts on a fixed block (one index of each leading dim, a run of the next, the
  rest whole), last-dim softmax (and its backward), layer norm (and its input gradient) and ``nll_loss_backward``
  on a run of rows, ``nll_loss_forward`` on the values it picks, ``select_backward``/``slice_backward`` on where
  the gradient lands, ``embedding`` on a block (its table rows gathered, never the whole table made float64) and
  its weight gradient on a run of table rows, attention on query rows and its backward on whole heads
  (:mod:`attention`), convolutions on images and channels, batch norms on channels, pooling on planes, row-wise
  ops (:data:`sampled.BATCHWISE`: cumulative sums, gathers, padding, upsampling, group norm ...) on a run of rows.
  Everything else is shadowed in full, except outputs over ``HUGE_FACTOR x max_elements`` with no sampled
  variant, which are left to the reference-run comparison (recorded as unshadowed with the reason).

Planning runs inside a tracer's ``__torch_dispatch__``, below autograd; the owner flushes under
``torch.no_grad()``: nothing here is recorded for the backward, so no tensor needs ``detach()``. Not
thread-safe: one :class:`Shadow` per tracer.
"""
from __future__ import annotations

import collections
import contextlib
import os
from typing import Any, Dict, List, Optional, Tuple

import torch

from .argtree import leaves, map_leaves
from .attention import (
    _DEVICE_ATTENTION,
    ATTENTION_BACKWARD,
    ATTENTION_FORWARD,
    GRADIENTS,
    attention_backward_call,
    attention_call,
    sampled_attention,
    sampled_attention_backward,
)
from .blocks import UnshadowedError
from .job import ShadowJob
from .metrics import DEFAULT_MAX_ELEMENTS, flatten_join, to_home
from .recurrent import lstm_layer_backward_call, lstm_layer_call
from .sampled import SampledPlans, is_pointwise

_F64 = torch.float64
_C128 = torch.complex128
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


def _widen(x):
    """A floating dtype as float64, a complex one as complex128 (the float64 side's: a complex input kept complex64,
    as an FFT's output read by ``irfft``, gave its shadow float32's precision); anything else as it is. Shared by the
    shadows and the float64 reference run (:mod:`.tracer`, :mod:`.script`)."""
    if isinstance(x, torch.dtype):
        if x.is_floating_point:
            return _F64
        if x.is_complex:
            return _C128
    return x


#: inputs of at most this many elements are upcast together (:meth:`UpcastCache.prefetch`); a larger one alone, its
#: cast's own time far above a call's
PREFETCH_MAX_ELEMENTS = 1 << 16
_unflatten_dense_tensors = torch._C._nn.unflatten_dense_tensors


class UpcastCache:
    """float64 copies of tensors on their :func:`float64_home`, LRU-bounded by ``max_bytes``."""

    def __init__(self, max_bytes: int = 1 << 30):
        self.max_bytes = max_bytes
        self._d: "collections.OrderedDict[tuple, Tuple[torch.Tensor, torch.Tensor]]" = collections.OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _key(t: torch.Tensor) -> tuple:
        """``t``'s cache key (raises RuntimeError or NotImplementedError for a tensor without data). data_ptr() is
        the storage's plus the offset; shape (a torch.Size) and stride() are tuples already."""
        return (t.data_ptr(), t.shape, t.stride(), t.dtype, t.device, t._version)

    def get(self, t: torch.Tensor) -> torch.Tensor:
        home = float64_home(t.device)
        if t.dtype == _F64 and t.device == home:
            return t
        try:
            key = self._key(t)
        except (RuntimeError, NotImplementedError):
            return to_home(t, home, _F64)
        hit = self._d.get(key)
        if hit is not None:
            self._d.move_to_end(key)
            self.hits += 1
            return hit[1]
        self.misses += 1
        up = to_home(t, home, _F64)
        self._put(key, t, up)
        return up

    def _put(self, key: tuple, t: torch.Tensor, up: torch.Tensor) -> None:
        nbytes = up.numel() * 8
        if nbytes <= self.max_bytes // 4:
            self._d[key] = (t, up)
            self._bytes += nbytes
            while self._bytes > self.max_bytes and self._d:
                _, (_, old) = self._d.popitem(last=False)
                self._bytes -= old.numel() * 8

    def prefetch(self, tensors) -> None:
        """Cache the float64 copies of the floating tensors among ``tensors`` that are not cached yet and have at
        most :data:`PREFETCH_MAX_ELEMENTS` elements, made together: per device and dtype one C++ flatten-and-join,
        one cast on their home, and views of it (a few calls for a step's hundred small inputs, not one cast each:
        on a device, one launch each). The views are contiguous copies of the values (a transposed input's too);
        they hold their shared buffer until all of them are dropped. A counted miss each, as :meth:`get`'s."""
        groups: Dict[tuple, Dict[tuple, torch.Tensor]] = {}
        for t in tensors:
            if not t.is_floating_point() or t.layout != torch.strided or not 0 < t.numel() <= PREFETCH_MAX_ELEMENTS:
                continue
            try:
                key = self._key(t)
            except (RuntimeError, NotImplementedError):
                continue
            if key not in self._d and not (t.dtype == _F64 and t.device == float64_home(t.device)):
                groups.setdefault((t.device, t.dtype), {})[key] = t
        for (device, _), by_key in groups.items():
            if len(by_key) < 2:  # get() makes it alone
                continue
            ts = list(by_key.values())
            flat = to_home(flatten_join(ts), float64_home(device), _F64)
            for key, t, up in zip(by_key, ts, _unflatten_dense_tensors(flat, ts)):
                self.misses += 1
                self._put(key, t, up)

    def clear(self) -> None:
        self._d.clear()
        self._bytes = 0


#: outputs this many times over ``max_elements`` with no sampled variant are not shadowed.
HUGE_FACTOR = 64

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
    if isinstance(o, torch.dtype):
        o = _widen(o)
    elif isinstance(o, torch.device):
        o = home
    sig.append(o)
    return o


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


class Shadow(SampledPlans):
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
            return self._attention_backward(func, name, args, kwargs, out, out_index, home)
        if name == "mkldnn_rnn_layer":  # oneDNN has no float64: a float64 call of it only raises
            return self._math_form(func, name, args, kwargs, out, out_index, home, lstm_layer_call)
        if name == "mkldnn_rnn_layer_backward":
            return self._math_form(func, name, args, kwargs, out, out_index, home, lstm_layer_backward_call)
        if name == "nll_loss_forward" and self.sample and not kwargs and args[0].numel() > self.max_elements:
            job = self._picked_log_probs(func, args, kwargs, out, out_index, home)
            if job is not None:
                return job
        big = self.sample and out.numel() > self.max_elements
        # a sparse operand (a graph network's adjacency matrix) has no rows or blocks to slice: shadowed whole
        strided = not big or all(x.layout == torch.strided for x in leaves(args) if isinstance(x, torch.Tensor))
        # the sampled variants slice real rows and positions: a complex output is shadowed whole
        if big and strided and not out.is_complex() and (out_index == 0 or name == "convolution_backward"):
            fast = self._sampled(func, name, args, kwargs, out, home, out_index)
            if fast is not None:
                return fast
        if big and out.numel() > HUGE_FACTOR * self.max_elements:
            raise UnshadowedError(f"output of {out.numel()} elements has no sampled shadow"
                                  f"{'' if strided else ' (a sparse operand)'}; compared against the reference run only")
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

    def _attention_backward(self, func, name, args, kwargs, out, out_index, home) -> ShadowJob:
        """The job of gradient ``out_index`` (0-2: query, key, value) of an attention kernel's backward, the CPU's
        too: the math attention's gradients and their magnitudes (:func:`attention.math_attention_grads`; the job's
        ``magnitude``), of a slab of heads when query, key or value is over ``max_elements``; one float64 call for
        the three. Raises :class:`UnshadowedError` for the bias gradient and what the samplers raise."""
        if out_index >= GRADIENTS:
            raise UnshadowedError(f"{name} output {out_index} (the bias gradient) is not shadowed")
        # grad_out, query, key, value lead every backward's arguments: one decision for the three gradients
        sampled = self.sample and any(isinstance(a, torch.Tensor) and a.numel() > self.max_elements for a in args[:4])
        if not sampled:
            return self._math_form(func, name, args, kwargs, out, out_index, home, attention_backward_call, GRADIENTS)
        sibling = self._sibling(func, args, kwargs, home, out_index, out)
        if sibling is not None:
            return sibling
        fn, a, k, heads, how = sampled_attention_backward(func, name, args, kwargs, self.max_elements)
        job = self._job(fn, a, k, home, out_index, out[heads], how, batch=False)
        job.magnitude_offset = GRADIENTS
        self._last_call = (func, args, kwargs, job, heads)
        return job

    def _math_form(self, func, name, args, kwargs, out, out_index, home, call, magnitude_offset: int = 0
                   ) -> ShadowJob:
        """The job of output ``out_index`` of a kernel whose float64 reference is a written-out math form
        (``call(func, name, args, kwargs)`` gives its ``(fn, args, kwargs)``, ``fn`` returning the compared outputs
        first, and ``magnitude_offset`` places later their magnitudes when it is not 0: :attr:`ShadowJob.magnitude`):
        one float64 call for all of a call's outputs (shared jobs). Raises :class:`UnshadowedError` for
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
        job.magnitude_offset = magnitude_offset
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
                         out if pick is None else out[pick], first.how, key, shared=True,
                         magnitude_offset=first.magnitude_offset)

    def _job(self, fn, args, kwargs, home, out_index, target, how, batch: bool = True) -> ShadowJob:
        inputs: List[torch.Tensor] = []
        sig: List[Any] = [fn, out_index, home]
        a = _template(args, inputs, sig, home)
        k = _template(kwargs, inputs, sig, home)
        key = None
        if batch and inputs and all(x.layout == torch.strided for x in inputs):  # sparse ones: no stacking
            try:
                key = tuple(sig)
                hash(key)
            except TypeError:  # an unhashable constant: on its own
                key = None
        return ShadowJob(fn, a, k, inputs, home, out_index, target, how, key)

    def finish(self, jobs: List[ShadowJob], targets: torch.Tensor, *more: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """What is compared of ``jobs`` (computed, of one key), given their target values stacked
        (``[len(jobs), ...]``) and, in ``more``, their reference values (and magnitudes) stacked alike: here all of
        it; a subclass may cut each the same way (and say so in ``how``)."""
        return (targets, *more)

    def cuts(self, job: ShadowJob) -> bool:
        """Whether :meth:`finish` may cut ``job``'s values (never here): a job computed on its own is passed
        to it only then, saving the stacking of one job."""
        return False

    def _finish(self, jobs: List[ShadowJob], targets: torch.Tensor, refs: torch.Tensor,
                magnitudes: Optional[torch.Tensor] = None) -> None:
        cut = self.finish(jobs, targets, refs, *(() if magnitudes is None else (magnitudes,)))
        # each job's row of each: one unbind (its views made in C++), not an index call per job and tensor
        rows = [c.unbind(0) for c in cut]
        for g, j in enumerate(jobs):
            j.target, j.ref = rows[0][g], rows[1][g]
            if magnitudes is not None:
                j.magnitude = rows[2][g]

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
        parts = []  # (jobs, their direct batched form or None, whether they may run as one call)
        for js in groups.values():
            per = max(1, BATCH_BYTES // max(1, 8 * sum(x.numel() for x in js[0].inputs)))
            for s in range(0, len(js), per):
                part = js[s:s + per]
                direct = _direct_form(part[0]) if len(part) > 1 else None
                parts.append((part, direct, len(part) > 1 and (direct is not None or len(part) >= VMAP_MIN_GROUP)))
        # the inputs of the jobs that run one by one, upcast together (a batched call stacks its own)
        self.cache.prefetch(x for part, _, one_call in parts if not one_call for j in part if not j.shared
                            for x in j.inputs)
        for part, direct, one_call in parts:
            refs = self._run_batched(part, direct) if one_call else None
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
            xs = [self.cache.get(x) if x.is_floating_point() else to_home(x, job.home, _widen(x.dtype)) for x in job.inputs]
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
        if job.magnitude_offset:
            job.magnitude = res[job.out_index + job.magnitude_offset]
        if self.cuts(job):
            self._finish([job], job.target.unsqueeze(0), job.ref.unsqueeze(0),
                         None if job.magnitude is None else job.magnitude.unsqueeze(0))

    def _run_batched(self, jobs: List[ShadowJob], direct) -> Optional[torch.Tensor]:
        """One float64 call for ``jobs`` (one key, at least two; ``direct``: their :func:`_direct_form`, else vmap,
        for groups of ``VMAP_MIN_GROUP`` or more): their references stacked, or None (nothing done) when the batched
        call fails."""
        j0 = jobs[0]
        try:
            stacked = [torch.stack([j.inputs[k] for j in jobs]) for k in range(len(j0.inputs))]
            stacked = [to_home(x, j0.home, _widen(x.dtype)) for x in stacked]
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
