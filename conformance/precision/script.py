"""Precision of a whole program (script, ``-m`` module, notebook, ``file.py:func``) with no code change.

Runs inside the audit's child (:mod:`hal.conformance.runtime.child`) as a hook: the child installs a
:class:`ProgramPrecision` before it starts the program and merges :meth:`ProgramPrecision.result`
into its result file. The parent (:mod:`hal.conformance.workload_audit`) runs the program twice:

1. **reference** child (``role="reference"``, on the CPU, CUDA redirected there): seeded, dropout off;
   at each top-level module's first forward its parameters and buffers become float64 (in place: the
   optimizer keeps the same ``Parameter`` objects), and from then on every floating op runs in
   float64 (explicit casts such as ``x.half()`` and autocast casts are widened, lower-precision
   tensor arguments upcast; seeded random ops are left as they are, so the random streams of both
   runs stay identical). During the *window* (below) it stores a fixed sample of every op output
   keyed by ``(phase, module, op, occurrence, output)``, the gradients at the first optimizer step and
   the parameters after it, and a fingerprint of the initial weights and of every top-level input.
2. **target** child (``role="target"``, on the run device): the same seeds and dropout patch; during
   the window every floating-point op is shadowed in float64 on its actual inputs (its *local*,
   introduced error) and, where the reference's fingerprints match (same initial weights, same
   inputs in the same order), compared with the reference sample of the same key (the *total*
   error). Blame (:func:`hal.conformance.precision.compare.classify`): the first op over its
   threshold whose inputs were within tolerance and whose float64 shadow confirms the error is its
   own ("introduced"); ops after it on the data path are "inherited".

Window (``precision_warm_steps`` = 0, what the audit does): from the first top-level forward to the
first optimizer step (pre-hook) — evaluation
forwards before it included —, or, for an optimizer that runs the program's forward and backward inside
``step(closure)`` (LBFGS), to the end of the closure's first backward (the parameters are then sampled at the
closure's next forward, after one update), or to a step the GradScaler skipped (``GradScaler.step`` returned without
the optimizer's step: Inf/NaN in the scaled gradients; the backward outputs that overflowed are status ``overflow``,
not divergences), or, in a program that built no optimizer, to the next grad-enabled top-level forward after a
backward, or, with no backward either, to the end of the first top-level forward. Where an optimizer exists and a
top-level model with parameters runs a second training forward after a backward before the step (gradient
accumulation's next micro-step, a GAN's second loss on its discriminator), the *ops* stop there (shadowing every
micro-step would cost them all) and the gradients are still sampled at the optimizer step. A tensor the window's
ops computed and the program detached (a GAN's fake batch) is not data: it is left out of the data-order check. With ``precision_warm_steps`` = N > 0 (the
overhead benchmark's warmed-up window) both runs let N optimizer steps pass first and open it at the
next top-level forward; with ``precision_prime`` the target also shadows those N steps (every comparison
computed, then thrown away), so the window is a steady-state shadowed step: float64 kernels loaded,
batched calls traced, caches warm. Losses (the tensor handed to ``backward``, or
the loss ``GradScaler.scale`` was given) are recorded over the whole bounded run for drift. A GradScaler's own
ops (``scale``, ``unscale_``, ``update``) are recorded in neither run, so the program's ops after them keep
their keys in both; what they write in place is guarded like any write (queued comparisons keep their values).

Everything that could not be compared is listed in ``not_compared`` with the reason (never skipped
silently). Not thread-safe: one instance per child process, driven from the program's thread.
"""
from __future__ import annotations

import collections
import math
import os
import random
import sys
import types
import weakref
from typing import Any, Dict, List, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_flatten, tree_map

from hal.conformance.runtime.sections import take_back

from .argtree import local_tensor, map_leaves, named_arguments, plain_values, strided_parts
from .metrics import host_to, sample_flat_index_on, take_samples, warm_statistics
from .shadow import Shadow, _widen, float64_home
from .tracer import _SKIP, StepTracer, _op_info, by_op, module_to, real_view

#: elements sampled per op output (both runs pick the same positions: the sample depends on the shape only)
SCRIPT_MAX_ELEMENTS = 4096
#: op outputs recorded per window; beyond this the stream is cut (and the report says so)
MAX_RECORDS = 20000
#: bytes of reference samples kept; beyond this the reference stops storing (the report says so)
MAX_SAMPLE_BYTES = 256 << 20
SEED = 0
#: a file path: the target's compared window (open to close, its end-of-step shadows and statistics included) runs
#: under cProfile, whose stats are written to that path plus ``.<pid>`` (``pstats`` format) when it closes: where the
#: window's host time goes, in the audit's own child (a developer's diagnostic; ``bench_program_sections --cprofile``)
ENV_CPROFILE = "HAL_PRECISION_CPROFILE"
_DROPOUT_FNS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")


def seed_everything(seed: int = SEED) -> None:
    """Seed Python's, numpy's (when importable) and torch's generators."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
        np.random.seed(seed)
    except ImportError:  # pragma: no cover - numpy is a torch dependency in practice
        pass


#: seeded ops that draw only for an internal dropout (attention kernels, recurrent layers, the fused attention
#: backend choice): they draw random numbers only when their ``dropout_p`` / ``dropout`` argument is over 0 (and,
#: where they have one, ``train`` is set). With the audit's dropout patch (SDPA's ``dropout_p`` forced to 0) an
#: attention kernel computes deterministically, so it runs where the program put it and is compared like any op.
#: Rerouting every one of them to the CPU generator, as the tag alone would, sent a device attention kernel's
#: inputs to the host on every call (a synchronising copy, then the CPU attempt failing back to the device) and kept
#: them out of the tracers' records. A recurrent layer with a dropout between its layers (``nn.LSTM(dropout=...)``,
#: which the patch does not reach) still draws, from the CPU generator in both runs as before.
_DROPOUT_ONLY = ("attention", "rnn", "lstm", "gru", "_fused_sdp_choice")
#: per overload: True (draws), False (does not), or :data:`_IF_DROPOUT` (draws when its dropout is on in the call)
_DRAWS: Dict[Any, Any] = {}
_IF_DROPOUT = "if its dropout is on"


def _draws_random(func, args: tuple = (), kwargs: Optional[dict] = None) -> bool:
    """Whether this call of aten overload ``func`` draws random numbers (``torch.Tag.nondeterministic_seeded``:
    ``randint``, ``normal_``, ``bernoulli``, dropout ...); an op of :data:`_DROPOUT_ONLY` only when its dropout is
    on in this call. The overload's kind is decided once and cached (every op of the run asks: reading
    ``func.tags`` each time cost microseconds a call); thread-safe (idempotent cache writes)."""
    hit = _DRAWS.get(func)
    if hit is None:
        tag = getattr(torch.Tag, "nondeterministic_seeded", None)
        hit = tag is not None and tag in getattr(func, "tags", ())
        if hit and any(s in func.overloadpacket.__name__ for s in _DROPOUT_ONLY):
            hit = _IF_DROPOUT
        _DRAWS[func] = hit
    if hit is not _IF_DROPOUT:
        return hit
    named = named_arguments(func, args, kwargs)
    p = named.get("dropout_p", named.get("dropout"))
    return isinstance(p, (int, float)) and p > 0 and bool(named.get("train", True))


def _upcast(x):
    """A floating tensor as float64, a complex one as complex128 (:func:`shadow._widen` of its dtype), a dtype
    argument likewise; anything else as it is."""
    if isinstance(x, torch.Tensor):
        wide = _widen(x.dtype)
        return x if wide == x.dtype else x.to(wide)
    return _widen(x)


#: the ops that only sample (no other computation): drawn in float64 in both runs (:class:`CpuRandomMode`)
_SAMPLERS = frozenset({"normal", "normal_", "uniform_", "rand", "rand_like", "randn", "randn_like", "bernoulli",
                       "bernoulli_", "exponential_", "geometric_", "log_normal_", "cauchy_", "multinomial", "poisson",
                       "binomial", "_standard_gamma", "_sample_dirichlet"})


def _on_cpu_in_float64(x):
    """``x`` for a draw on the CPU in float64: a floating tensor moved and widened in one copy, else
    :func:`_to_cpu` and :func:`_widen` (a device or a floating dtype replaced; anything else as it is)."""
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64:
        return x.to("cpu", torch.float64)
    return _widen(_to_cpu(x))


def _to_cpu(x):
    if isinstance(x, torch.Tensor) and x.device.type != "cpu":
        return x.to("cpu")
    if isinstance(x, torch.device) and x.type != "cpu":
        return torch.device("cpu")
    return x


class CpuRandomMode(TorchDispatchMode):
    """Seeded random ops draw the same numbers in the target run and in the float64 reference run.

    On an accelerator they draw from the CPU generator (then move there), so a target on a device and the
    reference on the CPU share one stream (``torch.randint(..., device="cuda")`` batches, ``normal_`` on a device
    tensor). An op that only samples (:data:`_SAMPLERS`: ``randn_like``, ``normal_``, ``bernoulli`` ...) draws in
    float64 in both runs, and the target gets the draw rounded to its dtype: drawn in float32 and in float64, the
    CPU generator gives different numbers and advances differently. A VAE's ``mu + randn_like(std) * std`` then
    diverged in the first op after the draw (pytorch/examples vae, cosine 0.09). Anything it cannot reroute runs as
    the program asked (never raises for that reason)."""

    #: set in a process the program forked (:meth:`ProgramPrecision.disown`): every op passes through
    inert = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.inert or not _draws_random(func, args, kwargs):
            return func(*args, **kwargs)
        flat = tree_flatten((args, kwargs))[0]
        devs = [x.device for x in flat if isinstance(x, torch.Tensor) and x.device.type != "cpu"]
        devs += [x for x in flat if isinstance(x, torch.device) and x.type != "cpu"]
        if "device" in kwargs and kwargs["device"] is not None and torch.device(kwargs["device"]).type != "cpu":
            devs.append(torch.device(kwargs["device"]))
        name = func.overloadpacket.__name__
        floats = [x for x in flat if isinstance(x, torch.Tensor) and x.is_floating_point()]
        widen = name in _SAMPLERS and (any(x.dtype != torch.float64 for x in floats)
                                       or kwargs.get("dtype") not in (None, torch.float64)
                                       or not floats and torch.get_default_dtype() != torch.float64)
        if not devs and not widen:
            return func(*args, **kwargs)
        try:
            # the dtype the program gets: asked for, else its first floating tensor's, else torch's default
            want = kwargs.get("dtype") or (floats[0].dtype if floats else torch.get_default_dtype())
            cargs, ckw = tree_map(_on_cpu_in_float64 if widen else _to_cpu, (args, kwargs))
            if "device" in ckw and ckw["device"] is not None:
                ckw["device"] = torch.device("cpu")
            if widen and not floats and "dtype" not in ckw and any(a.name == "dtype" for a in func._schema.arguments):
                ckw["dtype"] = torch.float64  # a factory (randn(shape)) that would take torch's default dtype
            out = func(*cargs, **ckw)
        except Exception:
            return func(*args, **kwargs)
        if name.endswith("_") and args and isinstance(args[0], torch.Tensor):  # in place on the program's tensor
            args[0].copy_(out if isinstance(out, torch.Tensor) else cargs[0])
            return args[0]

        def home(t):
            if not isinstance(t, torch.Tensor):
                return t
            if widen and (t.is_floating_point() or t.is_complex()):  # complex draws are made in complex128
                t = t.to(want)
            return host_to(t, devs[0]) if devs else t
        return tree_map(home, out)


class _SampledShadow(Shadow):
    """A :class:`Shadow` whose full-size results are cut to the fixed sample of ``max_elements``
    positions before they are compared: the statistics then cost the same for every op (on a
    small program the comparison of whole 100k-element outputs cost more than the float64 ops)."""

    def cuts(self, job):
        return job.how == "full" and job.target.numel() > self.max_elements

    def finish(self, jobs, targets, *more):
        if not self.cuts(jobs[0]):  # the jobs of one key: one shape, one sampling
            return (targets, *more)
        n = targets.numel() // len(jobs)
        shape = tuple(targets.shape[1:])
        if any(tuple(x.shape[1:]) != shape for x in more):
            return (targets, *more)
        # the sample's flat positions in each job's row: one index_select, not an advanced index over every dim
        g = len(jobs)
        cut = [x.detach().reshape(g, n).index_select(1, sample_flat_index_on(shape, self.max_elements, x.device))
               for x in (targets, *more)]
        for j in jobs:
            j.how = f"elements {self.max_elements}/{n} (shadowed whole, compared on a sample)"
        return tuple(cut)


#: files whose frames lie between the autograd engine and a dispatch mode's handler: torch's dispatch wrappers and
#: this package's modes (:func:`autograd_engine_cast` looks past them)
_DISPATCH_FILES = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
                   os.path.join("torch", "_dynamo", "eval_frame.py"),
                   os.path.join("torch", "_compile.py"), os.path.join("torch", "utils", "_python_dispatch.py"),
                   os.path.join("torch", "_ops.py"))


def autograd_engine_cast(func, args: tuple, kwargs: dict) -> bool:
    """Whether this call is a cast the autograd engine itself makes in a backward pass: ``_to_copy`` of a float64
    tensor to a narrower floating dtype whose nearest Python caller, past the dispatch machinery, is the engine
    (``_engine_run_backward``): a gradient matched to the dtype of the forward tensor it belongs to (ToCopyBackward,
    or the engine's check of each node's gradients). The float64 reference leaves it narrow: widened, the gradient of
    a tensor that is float32 in that run (a parameter it had not converted: a layer whose ``forward`` the program
    calls directly, as pytorch/examples mnist_forward_forward does; a value computed before its float64 mode began)
    stays float64, and autograd refuses it ("invalid gradient ... expected dtype Float but got double"). A cast in
    Python code (the program's own, a custom backward's, a DDP communication hook's) is not one. Cheap for every other
    call (a frame walk only for a narrowing cast of a float64 tensor)."""
    if func is not torch.ops.aten._to_copy.default or not args or not isinstance(args[0], torch.Tensor) \
            or args[0].dtype != torch.float64:
        return False
    dtype = kwargs.get("dtype")
    if dtype is None or not dtype.is_floating_point or dtype == torch.float64:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_engine_run_backward":
            return True
        if not frame.f_code.co_filename.endswith(_DISPATCH_FILES[1:]) \
                and not frame.f_code.co_filename.startswith(_DISPATCH_FILES[0]):
            return False
        frame = frame.f_back
    return False


_current_node = getattr(torch._C, "_current_autograd_node", lambda: None)


def accumulated_dtype() -> Optional[torch.dtype]:
    """The dtype of the parameter whose gradient the autograd engine is accumulating now (the running node is its
    ``AccumulateGrad``), when that is not float64; else None. The float64 reference keeps such a gradient in its
    parameter's dtype: the sum of two float32 gradients of a parameter it had not converted (a layer's weight used by
    two forwards) would otherwise be float64, and the optimizer refuses it beside its float32 state ("expected dtype
    float for `end` but got dtype double", Adam's ``lerp_``)."""
    node = _current_node()
    if node is None or type(node).__name__ != "AccumulateGrad":
        return None
    dtype = getattr(getattr(node, "variable", None), "dtype", None)
    return dtype if dtype is not None and dtype.is_floating_point and dtype != torch.float64 else None


class _ProgramTracer(StepTracer):
    """A :class:`StepTracer` fed by global module hooks (any module the program runs), that leaves
    seeded random ops alone and, as the reference, upcasts lower-precision tensor arguments."""

    def __init__(self, owner: "ProgramPrecision", role: str, **kw):
        super().__init__(torch.nn.Module(), role, **kw)
        if self.shadow is not None:
            self.shadow = _SampledShadow(self.shadow.max_elements, sample=self.shadow.sample)
        self.owner = owner
        self.recording = True

    def __enter__(self):  # no per-model hooks: the owner's global hooks call _pre/_post (exit: StepTracer's)
        out = super(StepTracer, self).__enter__()
        # the mode below is the audit's random-stream mode, a pass-through for every op that draws nothing (this
        # tracer sends it the draws): the program's other ops skip it (StepTracer.direct_below), unless the program
        # entered a mode of its own first
        below = _get_current_dispatch_mode_stack()[:-1]
        self.direct_below = all(isinstance(m, CpuRandomMode) for m in below)
        return out

    #: set in a process the program forked (:meth:`ProgramPrecision.disown`): every op passes through
    inert = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.inert:
            return func(*args, **kwargs)
        accumulating = accumulated_dtype() if self.role == "reference" else None
        if accumulating is not None or self.role == "reference" and autograd_engine_cast(func, args, kwargs):
            # the autograd engine's own bookkeeping in the float64 run, around a tensor the run kept narrower: in that
            # dtype, unrecorded (the target makes no such cast, and compares no gradient's accumulation)
            if self._held:
                self._guard(_op_info(func), args, kwargs)
            if accumulating is not None:
                args, kwargs = map_leaves(lambda x: x.to(accumulating) if isinstance(x, torch.Tensor)
                                          and x.dtype == torch.float64 else x, (args, kwargs))
            return func(*args, **kwargs)
        if self._internal or _draws_random(func, args, kwargs):
            # a seeded normal_/bernoulli_, or an unrecorded op of the program's (GradScaler.unscale_ multiplies the
            # gradients in place), may write a held output: the queued comparison keeps the value it had
            return self._unrecorded(func, args, kwargs)
        if (self.role == "reference" and func is torch.ops.aten.full.default and "dtype" not in kwargs
                and len(args) > 1 and isinstance(args[1], float)):
            # a float fill without a dtype (torch.full(shape, torch.finfo(x.dtype).min), as transformers'
            # masks are) is float64 here: x is float64 in this run, and its min overflows a float32 tensor
            kwargs = {**kwargs, "dtype": torch.float64}
        if not self.recording:
            if self.role == "reference":
                name = func.overloadpacket.__name__
                if not (func.is_view or name.endswith("_") or name in _SKIP):
                    args, kwargs = map_leaves(_upcast, args), map_leaves(_upcast, kwargs)
                else:
                    args, kwargs = map_leaves(_widen, args), map_leaves(_widen, kwargs)
            return func(*args, **kwargs)
        if self.role == "reference":
            name = func.overloadpacket.__name__
            if not (func.is_view or name.endswith("_") or name in _SKIP):
                args, kwargs = map_leaves(_upcast, args), map_leaves(_upcast, kwargs)
        if len(self.records) + len(self.samples) >= MAX_RECORDS:
            self.owner.truncated = True
        return self._dispatch(func, types, args, kwargs)

    def _observe(self, phase, module, op, t, out_index, **kw):
        if self.owner.truncated:
            return
        if self.role == "reference":
            if self.owner.sample_bytes > MAX_SAMPLE_BYTES:
                self.owner.truncated = True
                return
            self.owner.sample_bytes += min(t.numel(), self.max_elements) * 8
        super()._observe(phase, module, op, t, out_index, **kw)
        if self.role == "target" and len(self.records) >= MAX_RECORDS:
            self.owner.truncated = True


#: why an op's outputs may have no counterpart in the float64 run, for the report's reason
_ONEDNN_RNN = (" (oneDNN's recurrent layer, what ATen runs for a float32 LSTM/GRU on the CPU; the float64 run's "
               "takes ATen's own cell-by-cell ops)")
_UNMATCHED_WHY = {"_to_copy": " (casts, autocast's or the program's: the float64 run, every floating tensor float64 "
                              "there, makes none)",
                  "mkldnn_rnn_layer": _ONEDNN_RNN, "mkldnn_rnn_layer_backward": _ONEDNN_RNN}


def _transform_level() -> Optional[int]:
    """The torch.func transform level the caller runs at (``vmap``, ``grad`` ...), None outside every transform."""
    level = getattr(getattr(torch._C, "_functorch", None), "maybe_current_level", None)
    return level() if level is not None else None


#: the period of :func:`_fingerprint`'s weights: element ``j`` of a tensor weighs ``(j + 1) mod 97``
FINGERPRINT_PERIOD = 97


def _fingerprint(ts: List[torch.Tensor]) -> List[float]:
    """Order-sensitive checksum of tensors: ``[count, sum, weighted sum]`` in float64, the weighted sum
    ``sum_i (i + 1) sum_j v_ij ((j + 1) mod 97)`` over tensor ``i``'s flat values ``v_i`` (a sparse tensor's indices and
    values: :func:`argtree.strided_parts`). Computed on each tensor's :func:`shadow.float64_home` (its device when that
    computes float64, so a GPU's parameters are not copied to the host) from the column sums of its values as rows of
    97: one pass over them, where a weight vector as long as a model's parameters made the first one's checksum 0.5 s
    per 10M parameters on the CPU. Two calls on equal values agree to float64's rounding (summation orders differ
    between devices: compare with :func:`same_fingerprint`)."""
    # per device: the weights (j + 1) mod 97 for j < 97, made once, and the running sum and weighted sum, read once at
    # the end (one host read per device and call, not two per tensor: on a GPU each read waits for the queue)
    acc: Dict[torch.device, list] = {}
    for i, t in enumerate(ts):
        for part in strided_parts(plain_values(t).detach()):  # a DTensor: this rank's shard; under vmap: the batch
            v = part.reshape(-1)
            n = v.numel()
            if n == 0:
                continue
            v = v.to(float64_home(v.device), torch.float64)
            whole = n - n % FINGERPRINT_PERIOD
            cols = v[:whole].view(-1, FINGERPRINT_PERIOD).sum(0)
            cols[:n - whole] += v[whole:]  # the tail's element j sits where j mod 97 says
            a = acc.get(v.device)
            if a is None:
                a = acc[v.device] = [torch.arange(1, FINGERPRINT_PERIOD + 1, dtype=torch.float64,
                                                  device=v.device).remainder_(FINGERPRINT_PERIOD), 0.0, 0.0]
            a[1] = cols.sum() + a[1]
            a[2] = cols.dot(a[0]) * (i + 1) + a[2]
    # float() each: under torch.func's grad, torch 2.4's tolist() of a stacked pair failed (no storage)
    return [float(len(ts)), sum(float(a[1]) for a in acc.values()), sum(float(a[2]) for a in acc.values())]


#: top-level forwards whose inputs are fingerprinted (the data-order checks), from the program's first
MAX_INPUT_FPS = 256
#: the largest sparse gradient or parameter sampled (made dense for it: 256 MiB of float32)
SPARSE_DENSE_MAX = 1 << 26


def _storage_ptr(t: torch.Tensor) -> Optional[int]:
    """The address of ``t``'s storage (views and ``detach()`` share it), or None for a tensor without one."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def same_fingerprint(a, b, rel: float = 1e-6) -> bool:
    """Whether two :func:`_fingerprint` lists agree within ``rel`` (False when either is missing): the same data, up
    to the rounding of a float32 value computed in float64."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(abs(x - y) <= rel * max(1.0, abs(x), abs(y)) for x, y in zip(a, b))


class ProgramPrecision:
    """The precision hook of one audit child (see the module docstring).

    ``spec`` keys: ``precision_role`` (``reference`` | ``target``), ``precision_samples`` (the
    reference's sample file: written by the reference, read by the target). ``modules``: the
    child's :class:`~hal.conformance.runtime.capture.ModuleTracker` (module paths); ``limiter``: its
    :class:`~hal.conformance.runtime.stepping.StepLimiter` (has the program built an optimizer)."""

    def __init__(self, spec: dict, modules: Any, limiter: Any = None) -> None:
        self.spec = spec
        self.limiter = limiter
        self.role = spec["precision_role"]
        self.warm_steps = int(spec.get("precision_warm_steps") or 0)
        self.prime = bool(spec.get("precision_prime")) and self.role == "target"
        self._primer: Optional[_ProgramTracer] = None  # shadows a warm-up step, results thrown away
        self.primed_steps = 0
        self.samples_path = spec.get("precision_samples")
        self.modules = modules
        self.truncated = False
        self.sample_bytes = 0
        #: optimizer steps in progress (a step(closure) runs the program's forward and backward inside it), and the
        #: optimizer of the latest
        self._stepping = 0
        self._stepping_opt: Any = None
        #: gradients were sampled at the window's close; the parameters are, after the update that follows
        self._pending_params = False
        self.window = "not started"  # -> open -> closed
        self.closed_by: Optional[str] = None
        #: the op window closed before the optimizer step (a model's next training forward after a backward:
        #: gradient accumulation, a GAN's second loss): the gradients are still sampled at that step
        self._awaiting_grads = False
        #: when the gradients were sampled (None: not yet), and whether the GradScaler skipped the step instead
        self.grads_at: Optional[str] = None
        self.skipped_step = False
        #: the top-level modules with parameters that ran a training forward inside the window, by id
        self._forwarded: Dict[int, weakref.ref] = {}
        self.reasons: List[str] = []
        self.losses: List[float] = []
        self.scaled_losses = False
        self.backwards = 0
        self.optimizers = weakref.WeakSet()
        self.optimizer_steps = 0
        self.dropout_calls = 0
        #: the reference's optimizer parameters it had not converted to float64, by name: their dtype
        self.narrow_params: Dict[str, str] = {}
        self.converted: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()
        self.param_names: Dict[int, str] = {}
        self.init_fp: Optional[list] = None
        self.input_fps: List[list] = []
        #: for each loss in :attr:`losses`, how many top-level forwards had run when it was recorded (the parent
        #: compares the loss curve up to the first forward whose inputs differ between the runs)
        self.loss_forwards: List[int] = []
        #: for each loss, the optimizer steps completed before it (its own step is the next)
        self.loss_steps: List[int] = []
        #: top-level forwards so far, and the latest top-level outputs with their storages (after the window, an
        #: input sharing the storage of one still alive, ``fake.detach()``, was computed by the program, not given
        #: it: not fingerprinted; a dead one's address may be a new batch's by now)
        self.top_forwards = 0
        self._top_outputs: "collections.deque[tuple]" = collections.deque(maxlen=64)
        self.grads: Dict[str, torch.Tensor] = {}
        #: parameter name -> the tracer's record index of its gradient (:meth:`StepTracer.producer`), in the target
        self.grad_producers: Dict[str, Optional[int]] = {}
        self.params: Dict[str, torch.Tensor] = {}
        self.grads_at_backward: Optional[int] = None
        self.lr = 0.0  # the largest learning rate of the optimizer that made the compared update (0: none known)
        self.ref: Optional[dict] = None
        self.ref_usable = self.role == "target"
        self.tracer: Optional[_ProgramTracer] = None
        self.mode_active = False
        self._handles: list = []
        self._saved: list = []
        self._random_mode: Optional[CpuRandomMode] = None
        self._scaler_pending = False
        self._depth = 0
        self._backwards_at_open = 0
        self.t_open = self.t_last = None
        self._cprofile: Any = None  # the window's cProfile.Profile, with $HAL_PRECISION_CPROFILE
        self.window_ms: Optional[float] = None
        self.after_ms: List[float] = []  # steps after the window (optimizer step to optimizer step)
        if self.role == "target":
            self._load_reference()

    # -- reference file -----------------------------------------------------------------------
    def _load_reference(self) -> None:
        if not self.samples_path or not os.path.exists(self.samples_path):
            self.ref_usable = False
            self.reasons.append(self.spec.get("reference_missing")
                                or "no float64 reference run: totals not compared (local errors only)")
            return
        try:
            self.ref = torch.load(self.samples_path, weights_only=False)
        except Exception as exc:
            self.ref_usable = False
            self.reasons.append(f"the reference samples could not be read ({type(exc).__name__}: {exc})")

    def _prepare_statistics(self, module: torch.nn.Module, args: Any) -> None:
        """Target, at the first top-level forward (the program has picked its device by then), for the float64
        home of the device the module computes on (its first parameter's, else its first tensor input's):
        the statistics' kernels are used once there (:func:`warm_statistics`), the sample positions of every
        shape the reference sampled are put on the module's device (a first use inside the window was a copy
        there), and the reference samples move there in one copy (a packed buffer, split into views), so that no
        step's statistics move them.
        On the H200 the first total comparisons of a process cost 205 ms of host time once (1-2 ms afterwards),
        inside the compared window; with the samples on the device a window's statistics replayed in 7.4 ms
        instead of 12-13 (5 buckets instead of 9). Samples stay on the CPU where float64 does (an MLU, the CPU
        itself). The float64 reference computes no statistics: nothing to do there."""
        if self.role != "target":
            return
        first = next((t for t in module.parameters()), None)
        if first is None:
            first = next((t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)), None)
        if first is None:
            return
        home = float64_home(first.device)
        samples = (self.ref or {}).get("samples") if self.ref_usable else None
        keys = [k for k, v in (samples or {}).items() if v.device != home and v.dtype == torch.float64]
        with self._internal():
            warm_statistics(home)
            # the shapes of the outputs the reference sampled (more elements than a sample): their sample positions
            for shape in sorted({s for s in ((self.ref or {}).get("shapes") or {}).values()
                                 if math.prod(s) > SCRIPT_MAX_ELEMENTS}) if samples else ():
                sample_flat_index_on(tuple(shape), SCRIPT_MAX_ELEMENTS, first.device)
            if home.type == "cpu" or not keys:
                return
            packed = torch.cat([samples[k].reshape(-1) for k in keys]).to(home)
            for k, part in zip(keys, packed.split([samples[k].numel() for k in keys])):
                samples[k] = part.view(samples[k].shape)

    def _drop_reference(self, why: str) -> None:
        if self.ref_usable:
            self.ref_usable = False
            self.reasons.append(why)
            if self.tracer is not None:
                self.tracer.samples = {}

    # -- install / remove ---------------------------------------------------------------------
    def install(self) -> None:
        from torch.nn.modules import module as m
        from torch.optim import optimizer as o
        seed_everything()
        self._random_mode = CpuRandomMode()  # for the whole run, below every other mode we enter
        self._random_mode.__enter__()
        self._handles = [m.register_module_forward_pre_hook(self._pre),
                         m.register_module_forward_hook(self._post),
                         o.register_optimizer_step_pre_hook(self._opt_pre),
                         o.register_optimizer_step_post_hook(self._opt_post)]
        import torch.nn.functional as F
        owner = self
        for name in _DROPOUT_FNS:
            real = getattr(F, name, None)
            if real is None:
                continue

            def off(input, *a, _real=real, **k):  # noqa: A002 - F.dropout's own parameter name
                p = a[0] if a else k.get("p", 0.5)
                training = a[1] if len(a) > 1 else k.get("training", True)
                if p and training:  # counted only where dropout would have changed something
                    owner.dropout_calls += 1
                return input
            off.__wrapped__ = real  # type: ignore[attr-defined]
            self._patch(F, name, off)
        real_sdpa = getattr(F, "scaled_dot_product_attention", None)
        if real_sdpa is not None:
            def sdpa(*a, **k):
                if k.get("dropout_p") or (len(a) > 4 and a[4]):
                    owner.dropout_calls += 1
                    a = a[:4] + (0.0,) + tuple(a[5:]) if len(a) > 4 else a
                    if "dropout_p" in k:
                        k["dropout_p"] = 0.0
                return real_sdpa(*a, **k)
            sdpa.__wrapped__ = real_sdpa  # type: ignore[attr-defined]
            self._patch(F, "scaled_dot_product_attention", sdpa)
        if self.role == "reference":
            # float64 before DistributedDataParallel lays out its reducer's buckets: converted at its first forward,
            # the model kept float32 buckets, so the reference averaged its gradients in float32 (a copy into the
            # bucket where the target's reducer scales them with a `mul`: two outputs a step compared with nothing)
            from torch.nn.parallel import DistributedDataParallel
            real_ddp_init = DistributedDataParallel.__init__

            def ddp_init(ddp, module, *a, **k):
                owner._convert(module)
                real_ddp_init(ddp, module, *a, **k)
            ddp_init.__wrapped__ = real_ddp_init  # type: ignore[attr-defined]
            self._patch(DistributedDataParallel, "__init__", ddp_init)
        real_backward = torch.autograd.backward

        def backward(tensors, *a, **k):
            owner._record_loss(tensors)
            out = real_backward(tensors, *a, **k)
            owner.backwards += 1
            owner._after_backward()
            return out
        backward.__wrapped__ = real_backward  # type: ignore[attr-defined]
        self._patch(torch.autograd, "backward", backward)
        try:
            from torch.amp.grad_scaler import GradScaler
        except ImportError:  # pragma: no cover - torch < 2.3
            GradScaler = None
        if GradScaler is not None:
            real_scale = GradScaler.scale
            real_step = GradScaler.step

            def step(scaler, optimizer, *a, **k):
                done = owner.optimizer_steps  # counted by the optimizer's post-hook, inside real_step
                out = real_step(scaler, optimizer, *a, **k)
                if owner.optimizer_steps == done:  # inf or NaN in the gradients: the optimizer's step never ran
                    owner._skipped_step()
                return out
            step.__wrapped__ = real_step  # type: ignore[attr-defined]
            self._patch(GradScaler, "step", step)

            def scale(scaler, outputs):
                if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
                    owner.scaled_losses = True
                    owner._record_loss(outputs)
                    owner._scaler_pending = True
                return real_scale(scaler, outputs)
            # The scaler's bookkeeping (the loss times the scale, unscale_'s reciprocal and multiply, update) is
            # internal in both runs: in the reference it stays float32 (its kernels refuse float64), and were it
            # recorded in the target only, its ops would shift the occurrence keys of the program's own ops after
            # it (an HF-style loop's clip_grad_norm_ after scaler.unscale_: its `mul` was compared with the
            # loss-scale `mul`, a false first divergence of 8.6e5 relative error at the root)
            scale = self._as_internal(scale)
            for name in ("unscale_", "update"):
                self._patch(GradScaler, name, self._as_internal(getattr(GradScaler, name)))
            self._patch(GradScaler, "scale", scale)

    def _as_internal(self, fn: Any) -> Any:
        owner = self

        def run(*a, **k):
            with owner._internal():
                return fn(*a, **k)
        run.__wrapped__ = fn  # type: ignore[attr-defined]
        return run

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def remove(self) -> None:
        self._end_primer()
        self._close("the program ended")
        take_back(self._handles, self._saved)
        if self.mode_active and self.tracer is not None:
            self.mode_active = False
            try:
                self.tracer.__exit__(None, None, None)
            except Exception:
                pass
        self._exit_random_mode()

    def _exit_random_mode(self) -> None:
        """The random-stream mode goes inert and leaves the stack if it is on top (entered first, it is the last of
        ours there when the program ends); under a mode the program left above it, it stays, passing every op
        through. Without this, a process that installed the hooks and went on (a test) kept it on every op."""
        mode, self._random_mode = self._random_mode, None
        if mode is None:
            return
        mode.inert = True
        stack = _get_current_dispatch_mode_stack()
        if stack and stack[-1] is mode:
            mode.__exit__(None, None, None)

    def disown(self) -> None:
        """Called in a process the program forked from this one (a DataLoader worker, a fork-started
        ``multiprocessing`` process; see :func:`~hal.conformance.runtime.sections.install_hooks`): the hook stops
        acting there. Its global hooks and patches are taken back and its modes pass every op through, so the forked
        process computes what the program asked, as without the audit, and never writes the samples file. Without
        this, a DataLoader worker the float64 run forked after its first forward made float64 images, and
        collating the float32 labels into the worker's shared buffer failed ("Trying to resize storage that is not
        resizable", pytorch/examples siamese_network's evaluation): the reference run ended early. Only the forked
        process's copy of this object changes."""
        take_back(self._handles, self._saved)
        for mode in (self._random_mode, self.tracer, self._primer):
            if mode is not None:
                mode.inert = True

    # -- hooks ----------------------------------------------------------------------------------
    def _record_loss(self, tensors: Any) -> None:
        if self._scaler_pending:  # GradScaler.scale(loss).backward(): the unscaled loss is recorded
            self._scaler_pending = False
            return
        t = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
        if isinstance(t, torch.Tensor) and t.numel() == 1:
            prev = self.tracer._internal if self.tracer is not None else False
            if self.tracer is not None:
                self.tracer._internal = True
            try:
                self.losses.append(float(t.detach().to("cpu", torch.float64)))
                self.loss_forwards.append(self.top_forwards)
                self.loss_steps.append(self.optimizer_steps)
            finally:
                if self.tracer is not None:
                    self.tracer._internal = prev

    def _internal(self):
        tr = self.tracer

        class _Ctx:
            def __enter__(s):
                s.prev = tr._internal if tr is not None else False
                if tr is not None:
                    tr._internal = True

            def __exit__(s, *e):
                if tr is not None:
                    tr._internal = s.prev
        return _Ctx()

    def _pre(self, module: torch.nn.Module, args: Any) -> Any:
        top = self._depth == 0
        self._depth += 1
        if top:
            self._top_pre(module, args)
            if self.window == "open" and torch.is_grad_enabled() and next(iter(module.parameters()), None) is not None:
                self._forwarded.setdefault(id(module), weakref.ref(module))
        if self.window == "open" and self.tracer is not None:
            self.tracer._pre(self.modules._name(module))(module, args)
        if self.role == "reference" and any(isinstance(t, torch.Tensor) and t.is_floating_point()
                                            and t.dtype != torch.float64 for t in tree_flatten(args)[0]):
            # the module's own Python may check its input's dtype against its (float64) weights before any op
            # runs (nn.LSTM: "RNN input dtype (torch.float32) does not match weight dtype"): float64 inputs, as
            # every op of this run gets them anyway
            with self._internal():
                return map_leaves(_upcast, args)
        return None

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._depth:
            self._depth -= 1
        if self._depth == 0:
            self._top_outputs.extend((_storage_ptr(t), weakref.ref(t)) for t in tree_flatten(output)[0]
                                     if isinstance(t, torch.Tensor))
        if self.window == "open" and self.tracer is not None:
            self.tracer._post(self.modules._name(module))(module, args, output)
        if self._depth == 0 and self.window == "open" and not torch.is_grad_enabled() \
                and not self.backwards and not self._optimizer_built():
            self._close("the first inference forward ended (no optimizer, no backward)")

    def _optimizer_built(self) -> bool:
        return bool(getattr(self.limiter, "optimizers_built", 0) or len(self.optimizers))

    def _top_pre(self, module: torch.nn.Module, args: Any) -> None:
        self.top_forwards += 1
        if self.window == "open" and self.backwards > self._backwards_at_open and torch.is_grad_enabled():
            if not self._optimizer_built():  # the gradients were sampled at the first backward's end
                self._close("the next training forward began after a backward (the program built no optimizer; "
                            "parameters sampled here, after its own update)")
            elif id(module) in self._forwarded:
                # the same model again after a backward, before the optimizer step: the next micro-step of gradient
                # accumulation, or a GAN's second loss on its discriminator. Shadowing on would cover every
                # micro-step (nanoGPT accumulates 40); the ops stop here, the gradients are sampled at the step (their
                # sum)
                self._close(f"{self.modules._name(module)}'s next training forward began after a backward, before "
                            "the optimizer step (gradient accumulation, or a second loss on the same model): ops "
                            "compared up to there")
                self._awaiting_grads = True
        if self.window == "closed":
            if self._pending_params and self._stepping:  # a closure's next evaluation: one update since the window
                self._take_params(self._named(self._stepping_opt), self._stepping_opt)
            elif self._pending_params and not self._optimizer_built():  # after the program's own update
                self._take_params(self._root_params())
            if self.role == "reference" and module not in self.converted:
                self._convert(module)
            if len(self.input_fps) < MAX_INPUT_FPS:  # the loss curve's data-order check (the parent compares them)
                outputs = {ptr for ptr, ref in self._top_outputs if ref() is not None}
                with self._internal():
                    self.input_fps.append(_fingerprint([
                        t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor) and t.grad_fn is None
                        and _storage_ptr(t) not in outputs]))
            return
        with self._internal():
            root = type(module).__name__
            for name, p in module.named_parameters(prefix=root):
                self.param_names.setdefault(id(p), name)
            if self.window == "not started" and self.init_fp is None:
                self.init_fp = _fingerprint([p for p in module.parameters()] + [b for b in module.buffers()
                                                                                 if b.is_floating_point()])
                self._prepare_statistics(module, args)
            # the data a top-level module gets, not what another top-level module computed for it (an LSTM's output
            # fed to a separate head differs between the runs by the target's rounding: not a data-order change)
            # nor what the window's ops computed and the program detached (a GAN's generated batch, fake.detach())
            made = self.tracer.produced if self.tracer is not None and self.tracer.recording else lambda t: False
            fp = _fingerprint([t for t in tree_flatten(args)[0]
                               if isinstance(t, torch.Tensor) and t.grad_fn is None and not made(t)])
            if len(self.input_fps) < MAX_INPUT_FPS:
                self.input_fps.append(fp)
            if self.role == "target" and self.ref is not None and self.ref_usable:
                if self.window == "not started" and not same_fingerprint(self.init_fp, self.ref.get("init_fp")):
                    self._drop_reference("initial weights differ between the target and the float64 reference run "
                                         "(initialisation not reproducible under a fixed seed): totals not compared")
                i = len(self.input_fps) - 1
                ref_fps = self.ref.get("input_fps") or []
                if self.ref_usable and (i >= len(ref_fps) or not same_fingerprint(fp, ref_fps[i])):
                    self._drop_reference(f"the inputs of top-level forward {i + 1} differ from the float64 reference "
                                         "run's (data order not reproducible): totals not compared")
            if self.role == "reference" and module not in self.converted:
                self._convert(module)
        if self.window == "not started":
            if self.optimizer_steps >= self.warm_steps:
                self._end_primer()
                self._open()
            elif self.role == "reference":
                self._start_tracer(recording=False)  # the float64 run needs its mode from the first forward on
            elif self.prime and self._primer is None:
                # its own bookkeeping owner: a primer that reaches the record cap must not cut the real window
                scratch = types.SimpleNamespace(truncated=False, sample_bytes=0)
                self._primer = _ProgramTracer(scratch, "target", shadow=True, max_elements=SCRIPT_MAX_ELEMENTS)
                self._primer.__enter__()

    def _end_primer(self) -> None:
        if self._primer is not None:
            primer, self._primer = self._primer, None
            primer.__exit__(None, None, None)  # computes and judges its shadows, which nobody reads
            self.primed_steps += 1

    def _convert(self, module: torch.nn.Module) -> None:
        """Widen ``module``'s floating parameters and buffers to float64 (complex ones to complex128), at its first
        forward in the float64 run. Raises RuntimeError, naming the cause, when that forward runs inside a torch.func
        transform (``vmap(grad(...))`` of a ``functional_call``, as per-sample gradients are taken): there a
        parameter's ``.data`` cannot be replaced, and the float64 run ends."""
        with self._internal():
            try:
                module_to(module, dtype=torch.float64, complex_dtype=torch.complex128)
            except RuntimeError as exc:
                if _transform_level() is None:
                    raise
                raise RuntimeError(f"the float64 run converts a module's parameters at its first forward, and "
                                   f"{type(module).__name__}'s first ran inside a torch.func transform (vmap, grad), "
                                   f"where they cannot be replaced ({str(exc).splitlines()[0][:120]})") from exc
            self.converted.add(module)

    def _start_tracer(self, recording: bool) -> None:
        """Enter the run's tracer (once); ``recording`` says whether it records from now on."""
        if self.tracer is None:
            samples = (self.ref or {}).get("samples") if self.role == "target" and self.ref_usable else None
            shapes = (self.ref or {}).get("shapes") if samples is not None else None
            self.tracer = _ProgramTracer(self, self.role, reference_samples=samples, reference_shapes=shapes,
                                         shadow=self.role == "target", max_elements=SCRIPT_MAX_ELEMENTS)
            self.tracer.__enter__()
            self.mode_active = True
        self.tracer.recording = recording

    def _open(self) -> None:
        import time
        if self.role == "target" and os.environ.get(ENV_CPROFILE):
            import cProfile
            self._cprofile = cProfile.Profile()
            self._cprofile.enable()
        self.t_open = time.perf_counter()
        self._backwards_at_open = self.backwards
        self.window = "open"
        self._start_tracer(recording=True)

    def _close(self, why: str) -> None:
        if self.window != "open":
            return
        import time
        self.window = "closed"
        self.closed_by = why
        if self.tracer is not None:
            self.tracer.recording = False
            if self.role == "target" and self.mode_active:
                self.mode_active = False
                self.tracer.__exit__(None, None, None)  # judges the window's queued comparisons
        # the window's cost includes the end-of-step shadows and statistics (shadow_ms, statistics_ms of it)
        self.window_ms = (time.perf_counter() - self.t_open) * 1e3 if self.t_open is not None else None
        if self._cprofile is not None:
            self._cprofile.disable()
            self._cprofile.dump_stats(f"{os.environ[ENV_CPROFILE]}.{os.getpid()}")
            self._cprofile = None
        if self.tracer is not None and self.role == "reference":
            self._save()

    def _named(self, opt: torch.optim.Optimizer) -> List[tuple]:
        out = []
        for gi, g in enumerate(opt.param_groups):
            for pi, p in enumerate(g["params"]):
                out.append((self.param_names.get(id(p), f"param_group{gi}.{pi}"), p))
        return out

    def _samples(self, named: List[tuple]) -> Dict[str, torch.Tensor]:
        """``{name: fixed sample of t on the CPU}`` for ``(name, t)`` pairs, one transfer per device and dtype
        (:func:`take_samples`): float64 for the reference, ``t``'s own dtype for the target (the values are exact
        either way; the dtype selects the target's tolerance). A sparse tensor (an ``nn.Embedding(sparse=True)``'s
        gradient) is sampled dense, up to :data:`SPARSE_DENSE_MAX` elements; a larger one is left out, with a
        reason."""
        out, kept = {}, []
        for name, t in named:
            t = local_tensor(t)  # a DTensor's: this rank's shard
            if t.layout != torch.strided:
                if t.numel() > SPARSE_DENSE_MAX:
                    self.reasons.append(f"{name}: a sparse tensor of {t.numel()} elements, more than the "
                                        f"{SPARSE_DENSE_MAX} sampled dense: not compared")
                    continue
                t = t.to_dense()
            # a complex tensor (an FNO's spectral weights) as its real and imaginary parts: float32 pairs of a complex64
            kept.append((name, real_view(t)))
        named = kept
        for (name, t), s in zip(named, take_samples([t for _, t in named], SCRIPT_MAX_ELEMENTS)):
            out[name] = s if self.role == "reference" or not t.is_floating_point() else s.to(t.dtype)
        return out

    def _opt_pre(self, opt: Any, _a: Any, _k: Any) -> None:
        if self.role == "reference":
            self._amp_args_float32(opt)
            for name, p in self._named(opt):  # not converted: in no module the program called (module(x))
                if p.is_floating_point() and p.dtype != torch.float64:
                    self.narrow_params.setdefault(name, str(p.dtype).replace("torch.", ""))
        self._stepping += 1
        self._stepping_opt = opt
        self.optimizers.add(opt)
        self._end_primer()
        if self.window == "open" or self._awaiting_grads:
            self._take_grads(self._named(opt), "the first optimizer step" if not self.warm_steps else
                             f"optimizer step {self.optimizer_steps + 1} (the first {self.warm_steps} not compared)")

    def _amp_args_float32(self, opt: Any) -> None:
        """The loss scale and inf flag GradScaler.step hands a fused optimizer (``opt.grad_scale``,
        ``opt.found_inf``: it computes them outside the scaler's internal calls, so in float64 here) back in
        float32: the fused kernels (``_fused_adamw_``, nanoGPT's AdamW on CUDA) refuse float64 ones, even beside
        float64 parameters, and the reference run ended there."""
        with self._internal():
            for name in ("grad_scale", "found_inf"):
                t = getattr(opt, name, None)
                if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
                    setattr(opt, name, t.to(torch.float32))

    def _after_backward(self) -> None:
        """A backward inside an optimizer step (``step(closure)``, as LBFGS runs the program's forward and backward)
        ends the window there: the closure's next evaluation zeroes the gradients first. In a program that built no
        optimizer (it updates its parameters itself: pytorch/examples word_language_model, regression) the gradients
        of the window's models are sampled at the end of its first backward; the window goes on (its gradient
        clipping, its update) to the next training forward, where the parameters are sampled (:meth:`_top_pre`)."""
        if self.window == "open" and self._stepping and self._stepping_opt is not None:
            self._take_grads(self._named(self._stepping_opt), "the first evaluation of the optimizer's closure inside "
                             "step(closure), as LBFGS runs it (parameters after its first update)")
        elif self.window == "open" and not self._optimizer_built() and self.grads_at_backward is None:
            self._take_grads(self._root_params(), "the end of the first backward", close=False)

    def _root_params(self) -> List[tuple]:
        """``(name, parameter)`` of the top-level models that trained inside the window (for a program with no
        optimizer to name them), each parameter once."""
        out, seen = [], set()
        for ref in self._forwarded.values():
            module = ref()
            for p in module.parameters() if module is not None else ():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append((self.param_names.get(id(p), f"param{len(out)}"), p))
        return out

    def _take_grads(self, named: List[tuple], why: str, close: bool = True) -> None:
        """Sample the gradients of ``named`` (``(name, parameter)`` pairs: an optimizer's, :meth:`_named`) and, with
        ``close``, close the window with ``why`` (if it is still open); the parameters follow after the update."""
        with self._internal():
            self.grads.update(self._samples([(name, p.grad) for name, p in named if p.grad is not None]))
            if self.tracer is not None:
                self.grad_producers.update((name, self.tracer.producer(p.grad)) for name, p in named)
            self.grads_at_backward = self.backwards
        self._pending_params = True
        self._awaiting_grads = False
        self.grads_at = why
        if close:
            self._close(why)

    def _skipped_step(self) -> None:
        """GradScaler.step returned without running the optimizer's step (inf or NaN in the scaled gradients): the
        window closes with no gradients sampled (the update they were for never happened)."""
        if self.window != "open" and not self._awaiting_grads:
            return
        self.skipped_step = True
        self._awaiting_grads = False
        self.grads_at = "the GradScaler skipped the first optimizer step (inf or NaN in the scaled gradients)"
        if self.window == "open":
            self._close(self.grads_at)
        elif self.role == "reference":
            self._save()

    def _take_params(self, named: List[tuple], opt: Any = None) -> None:
        """Sample the parameters of ``named`` (after the update that follows the compared gradients), once; ``opt``:
        the optimizer that updated them (its largest learning rate bounds an update's rounding)."""
        self._pending_params = False
        with self._internal():
            self.params.update(self._samples([(name, p.detach()) for name, p in named]))
            if opt is not None:
                self.lr = max((float(g.get("lr", 0.0)) for g in opt.param_groups), default=0.0)
        if self.role == "reference":
            self._save()

    def _opt_post(self, opt: Any, _a: Any, _k: Any) -> None:
        self._stepping = max(0, self._stepping - 1)
        import time
        now = time.perf_counter()
        if self.window == "closed" and self.t_last is not None:
            self.after_ms.append((now - self.t_last) * 1e3)
        self.optimizer_steps += 1
        if self._pending_params:
            self._take_params(self._named(opt), opt)
        if self.window == "closed":
            self.t_last = time.perf_counter()

    # -- output ---------------------------------------------------------------------------------
    def _save(self) -> None:
        if not self.samples_path:
            return
        tmp = self.samples_path + ".tmp"
        with self._internal():
            torch.save({"samples": self.tracer.samples if self.tracer is not None else {},
                        "shapes": self.tracer.sample_shapes if self.tracer is not None else {},
                        "grads": self.grads, "params": self.params, "grads_at_backward": self.grads_at_backward,
                        "init_fp": self.init_fp, "input_fps": self.input_fps, "truncated": self.truncated,
                        "closed_by": self.closed_by, "skipped_step": self.skipped_step}, tmp)
        os.replace(tmp, self.samples_path)

    def result(self) -> dict:
        """JSON-ready ``{"precision_run": ...}`` for the child's result file (see :func:`section`)."""
        self._close("the program ended")
        window = self.closed_by
        if self.grads_at is not None and self.grads_at != self.closed_by:
            window = f"ops: {self.closed_by}; gradients: {self.grads_at}"
        out: Dict[str, Any] = {"role": self.role, "window_closed_by": window, "window": self.window,
                               "losses": self.losses, "scaled_losses": self.scaled_losses,
                               "loss_forwards": self.loss_forwards, "loss_steps": self.loss_steps,
                               "input_fps": self.input_fps, "dropout_calls_disabled": self.dropout_calls,
                               "truncated": self.truncated,
                               "reasons": list(self.reasons), "optimizer_steps": self.optimizer_steps,
                               "backwards": self.backwards, "seed": SEED,
                               "timing": {"window_ms": self.window_ms, "after_window_step_ms": self.after_ms,
                                          "statistics_ms": self.tracer.statistics_ms if self.tracer else None,
                                          "shadows_ms": self.tracer.shadow_ms if self.tracer else None,
                                          "shadow_device": self._shadow_device(),
                                          "primed_steps": self.primed_steps,
                                          "what": "window_ms: first top-level forward to the window's close "
                                                  "(shadowed and compared: the float64 shadows, planned as the "
                                                  "ops ran and computed in batched calls, shadows_ms of it, and "
                                                  "the batched statistics, statistics_ms of it); "
                                                  "after_window_step_ms: each later optimizer step to the next "
                                                  "(the same run, no shadow); primed_steps: warm-up steps "
                                                  "shadowed before the window, results thrown away"}}
        if self.role == "reference":
            out["ops_recorded"] = len(self.tracer.samples) if self.tracer is not None else 0
            out["narrow_params"] = self.narrow_params
            return {"precision_run": out}
        out.update(self._compare())
        return {"precision_run": out}

    def _shadow_device(self) -> Optional[List[str]]:
        """The devices the float64 shadows ran on (None: no shadow in this run)."""
        sh = self.tracer.shadow if self.tracer is not None else None
        return sorted(sh.homes) if sh is not None else None

    def _compare(self) -> dict:
        from .compare import _record_row, _tensor_rows, classify, mark_cancelled_tensors
        tr = self.tracer
        records = tr.records if tr is not None else []
        status, fd = classify(records, scaled_overflow=self.skipped_step)
        rows = [_record_row(r, s) for r, s in zip(records, status)]
        not_compared: List[str] = []
        overflowed = [r for r, s in zip(records, status) if s == "overflow"]
        if overflowed:
            first = overflowed[0]
            not_compared.append(f"{len(overflowed)} backward op output(s) overflowed at the GradScaler's loss scale "
                                f"(first: {first.module}:{first.op}), status 'overflow': the scaler skipped the step, "
                                "as it is built to; their errors are not judged")
        ref = self.ref if self.ref_usable else None
        # gradients and parameters are judged at the least precise dtype the step computed in (autocast)
        from . import thresholds as th
        compute = th.loosest([r.eff_dtype for r in records if r.kind == "op"])
        if ref is not None:
            pairs = [(n, g, ref.get("grads", {}).get(n)) for n, g in self.grads.items()]
            if self.grads and ref.get("grads_at_backward") == self.grads_at_backward:
                if not self.params:
                    not_compared.append("parameters: the program ended before the update that follows the compared "
                                        "gradients was seen")
                rows += _tensor_rows("gradient", pairs, compute, SCRIPT_MAX_ELEMENTS)
                rows += _tensor_rows("parameter", [(n, p, ref.get("params", {}).get(n)) for n, p in self.params.items()],
                                     compute, SCRIPT_MAX_ELEMENTS, step_floor=self.lr)
                mark_cancelled_tensors(rows, self.grad_producers, records, status)
            elif self.skipped_step or ref.get("skipped_step"):
                who = ("the target's and the float64 reference's" if self.skipped_step and ref.get("skipped_step")
                       else "the target's (the float64 reference stepped)" if self.skipped_step
                       else "the float64 reference's (the target stepped)")
                not_compared.append(f"gradients and parameters: the GradScaler skipped {who} first optimizer step "
                                    "(inf or NaN in the scaled gradients: a loss scale too high for the format, which "
                                    "it lowers before the next step; not a fault of the program)")
            elif not self.grads:
                why = "the program ended before the optimizer step" if self._awaiting_grads else \
                    self.closed_by or "no forward ran"
                not_compared.append(f"gradients and parameters: no optimizer step ran inside the compared window ({why})")
            else:
                not_compared.append("gradients and parameters: the first optimizer step came after a different "
                                    "number of backward passes in the two runs (a step one run skipped on its own, "
                                    "or a reference run that ended early)")
            missing = collections.Counter(r.op for r in records if r.total is None and r.kind == "op")
            if missing:
                listed = ", ".join(f"{op} {n}" + (_UNMATCHED_WHY.get(op, "")) for op, n in missing.most_common(5))
                more = len(missing) - 5
                not_compared.append(f"{sum(missing.values())} op output(s) have no counterpart in the float64 "
                                    "reference run's op stream (keyed by phase, module, op, occurrence): local error "
                                    f"only; by op: {listed}" + (f" and {more} more op(s)" if more > 0 else ""))
            if ref.get("truncated"):
                not_compared.append("the reference run stopped storing samples (op or size cap reached)")
        subclass = tr.subclass_ops if tr is not None else {}
        if subclass:
            not_compared.append(f"{sum(subclass.values())} op output(s) on tensor subclasses with a dispatch of their "
                                "own ran unrecorded (DTensor's and the functional collectives' are recorded through "
                                "the plain ops they run; these subclasses' values are not plain memory to shadow or "
                                f"sample); by op: {by_op(subclass)}")
        sparse = tr.sparse_ops if tr is not None else {}
        if sparse:
            not_compared.append(f"{sum(sparse.values())} floating output(s) of a sparse layout (COO, CSR ...) ran "
                                "unrecorded (their values are no strided block to sample or shadow; the dense "
                                f"outputs of ops on sparse operands are compared); by op: {by_op(sparse)}")
        if self.truncated:
            not_compared.append(f"the op stream was cut after {MAX_RECORDS} recorded op outputs")
        if tr is None:
            not_compared.append("no module forward ran: no op was recorded")
        for r in rows:
            for k in ("local", "total"):
                if r.get(k):
                    r[k] = {kk: (v if not isinstance(v, float) or math.isfinite(v) else str(v))
                            for kk, v in r[k].items()}
        return {"rows": rows, "first_divergence": fd, "not_compared": not_compared,
                "compute_dtype": th.format_name(compute), "tf32": tr.tf32_note() if tr is not None else None,
                "cache": {"hits": tr.shadow.cache.hits, "misses": tr.shadow.cache.misses}
                if tr is not None and tr.shadow is not None else None}
