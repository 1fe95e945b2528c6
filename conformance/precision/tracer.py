"""Op-by-op and module-by-module recording of one training step (a TorchDispatchMode).

A :class:`StepTracer` is entered around the forward and backward of one model. For every aten op
whose output is a floating-point tensor (views, copies and factories excluded) it knows

* the **key** ``(phase, module path, op, occurrence, output index)``: ``phase`` is ``forward``
  or ``backward``; backward ops are attributed to the module whose forward created their autograd
  node: the module hooks note where the autograd sequence counter stood as each module's forward
  began and ended, and a node's sequence number finds the innermost module around it;
* in the ``reference`` role: every floating dtype argument is widened to float64 (so explicit
  casts in user code, ``x.half()``, do not lower the reference's precision), and a fixed sample of the float64 output (:func:`metrics.take_sample`);
* in the ``target`` role: the *total* error against the reference sample with the same key
  (inherited + introduced), and with ``shadow=True`` the *local* error against a float64 shadow
  of the op on its actual inputs (introduced only), plus which earlier records produced its
  inputs (for first-divergence blame). While the step runs, each op only queues its comparisons
  and plans its float64 shadow (:meth:`shadow.Shadow.plan`: the program's tensors held, copied only
  if the program is about to write them); :meth:`StepTracer.finalize`, called on exit, computes the
  shadows in batched calls on :func:`shadow.float64_home` (:meth:`shadow.Shadow.flush`), judges every
  comparison at once (:func:`metrics.error_stats_many`) and fills ``local``/``total``.

Module outputs are recorded the same way by forward hooks (``kind="module"``). Not thread-safe;
use one tracer per model and step. Hooks are removed on exit.
"""
from __future__ import annotations

import bisect
import collections
import contextlib
import dataclasses
import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from hal.capabilities.tf32 import tf32_switch

from . import thresholds as th
from .argtree import (is_dispatch_subclass, is_fake_class, is_pending_collective_class, is_sharded_class, leaves,
                      map_leaves, plain_values)
from .metrics import DEFAULT_MAX_ELEMENTS, StatsRequest, error_stats_many, sampled_values, take_sample
from .shadow import Shadow, ShadowJob, _widen, error_line, float64_home

_SKIP = {
    "detach", "copy_", "_to_copy_", "empty", "empty_like", "empty_strided", "new_empty",
    "new_empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "new_zeros", "new_ones", "new_full", "fill_", "zero_", "clone", "contiguous", "lift_fresh",
    "_local_scalar_dense", "scalar_tensor", "arange", "randn", "rand", "normal_", "uniform_",
    "bernoulli_", "set_", "resize_", "_unsafe_view", "alias", "lift_fresh_copy",
}
#: (input dtype, output dtype) of the casts that are exact: every value of the input is a value of the output
_WIDENING = {(torch.float16, torch.float32), (torch.bfloat16, torch.float32), (torch.float16, torch.float64),
             (torch.bfloat16, torch.float64), (torch.float32, torch.float64)}
#: the sampling of an exact cast's record: its float64 value is its own, so no shadow runs (see :func:`exact_cast`)
EXACT_CAST = "exact cast (its float64 value is its own: no shadow)"


def exact_cast(func, args, out: torch.Tensor) -> bool:
    """Whether ``func(*args)`` is a cast (``_to_copy``) that keeps every value: a float widened (float16 or bfloat16
    to float32, any narrower float to float64) or copied in its own dtype (another device or layout). Its local
    error is exactly 0 and its float64 reference is the output itself: autocast makes dozens a step (the gradients
    of float16 computations going back to float32 parameters), and a float64 shadow of each would be planned, held,
    stacked and compared for nothing."""
    if func is not torch.ops.aten._to_copy.default or len(args) != 1 or not isinstance(args[0], torch.Tensor):
        return False
    src = args[0].dtype
    return (src == out.dtype and args[0].is_floating_point()) or (src, out.dtype) in _WIDENING


#: the real dtype of each complex one (its real and imaginary parts')
_REAL = {torch.complex32: torch.float16, torch.complex64: torch.float32, torch.complex128: torch.float64}


def real_view(t: torch.Tensor) -> torch.Tensor:
    """A complex tensor as the real tensor of its real and imaginary parts (``torch.view_as_real``: a view, one more
    dimension of 2; a conjugate view resolved first, a copy), any other tensor as it is."""
    if not t.is_complex():
        return t
    return torch.view_as_real(t.resolve_conj() if t.is_conj() else t)


#: ops whose integer outputs (indices) decide data flow; compared exactly (a routing flip shows).
_INDEX_OPS = {"topk", "sort", "argsort", "argmax", "argmin", "max", "min"}
#: device-specific attention kernels share one name so the target (e.g. CUDA flash) aligns with
#: the CPU reference; value: (canonical name, how many leading outputs are comparable: a kernel's workspace or
#: random-state outputs are not results).
_CANONICAL = {
    "_scaled_dot_product_flash_attention_for_cpu": ("scaled_dot_product_attention", 1),
    "_scaled_dot_product_flash_attention": ("scaled_dot_product_attention", 1),
    "_scaled_dot_product_efficient_attention": ("scaled_dot_product_attention", 1),
    "_scaled_dot_product_cudnn_attention": ("scaled_dot_product_attention", 1),
    "_scaled_dot_product_flash_attention_for_cpu_backward": ("scaled_dot_product_attention_backward", 3),
    "_scaled_dot_product_flash_attention_backward": ("scaled_dot_product_attention_backward", 3),
    "_scaled_dot_product_efficient_attention_backward": ("scaled_dot_product_attention_backward", 3),
    "_scaled_dot_product_cudnn_attention_backward": ("scaled_dot_product_attention_backward", 3),
    # oneDNN's LSTM layer on the CPU: output, h, c (its fourth output is a workspace, not a result)
    "mkldnn_rnn_layer": ("mkldnn_rnn_layer", 3),
    # cuDNN's and MIOpen's batch norm on a GPU, the CPU reference's native_batch_norm: output, saved mean, saved
    # inverse standard deviation, then a reserve space (PyTorch's own decomposition of cudnn_batch_norm returns
    # native_batch_norm's three outputs, and of its backward native_batch_norm_backward's); under their own names a
    # CNN's batch norms had no counterpart in the reference run (36 outputs of the cnn model on an H100)
    "cudnn_batch_norm": ("native_batch_norm", 3),
    "miopen_batch_norm": ("native_batch_norm", 3),
    "cudnn_batch_norm_backward": ("native_batch_norm_backward", 3),
    "miopen_batch_norm_backward": ("native_batch_norm_backward", 3),
}


@dataclasses.dataclass(frozen=True)
class _OpInfo:
    """What the tracer needs to know of one aten overload, worked out once (:func:`_op_info`)."""

    name: str  #: the name records use (device attention kernels share the canonical one)
    passthrough: bool  #: a view, copy, factory, in-place or collective op: not compared, carries its source's producer
    n_out: Optional[int]  #: how many leading outputs are compared (None: all)
    writes: Tuple[Any, ...]  #: the arguments the op writes: positions, or names of keyword-only ones
    #: a collective (:data:`_COLLECTIVE_NAMESPACES`): its result lands later, from the process group's own thread,
    #: which no mode sees
    collective: bool = False


_OP_INFO: Dict[Any, _OpInfo] = {}
#: the namespaces of collective ops: ``c10d`` (``allreduce_`` ...: the process group's) and the functional collectives
#: (``_c10d_functional.all_reduce`` ... and ``wait_tensor``: DTensor's redistributions, the tensor-parallel styles).
#: Never compared: a float64 shadow of one on this rank's values alone is not the collective's result
_COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd"})
#: namespaces of ops that only copy values into or out of a communication buffer, never compared: FSDP2's
#: (``fsdp.all_gather_copy_in``: the buffer's padding is never written, and compared it was a false divergence of
#: 1e38 on pytorch/examples fsdp_tp_example; ``split_with_sizes_copy`` out of it)
_COPY_NAMESPACES = frozenset({"fsdp"})


def _op_info(func) -> _OpInfo:
    """The :class:`_OpInfo` of an aten overload, from its name and schema (cached; thread-safe: the
    writes are idempotent)."""
    info = _OP_INFO.get(func)
    if info is None:
        name = func.overloadpacket.__name__
        canonical, n_out = _CANONICAL.get(name, (name, None))
        writes = []
        for i, a in enumerate(getattr(getattr(func, "_schema", None), "arguments", ())):
            if a.alias_info is not None and a.alias_info.is_write:
                writes.append(a.name if a.kwarg_only else i)
        namespace = getattr(func, "namespace", "")
        collective = namespace in _COLLECTIVE_NAMESPACES
        info = _OP_INFO[func] = _OpInfo(canonical, name in _SKIP or func.is_view or name.endswith("_") or collective
                                        or namespace in _COPY_NAMESPACES, n_out, tuple(writes), collective)
    return info


@dataclasses.dataclass
class OpRecord:
    """One compared op output (or module output). ``local``/``total`` are metric dicts or None."""

    phase: str
    module: str
    op: str
    occurrence: int
    out_index: int
    dtype: str
    shape: Tuple[int, ...]
    kind: str = "op"
    threshold: Optional[Dict[str, float]] = None
    local: Optional[Dict[str, Any]] = None
    total: Optional[Dict[str, Any]] = None
    sampling: str = "full"
    shadow_error: Optional[str] = None
    inputs: Tuple[int, ...] = ()
    eff_dtype: th.Format = torch.float64
    total_threshold: Optional[Dict[str, float]] = None

    @property
    def key(self):
        return (self.phase, self.module, self.op, self.occurrence, self.out_index)


def default_defer_bytes(device: torch.device) -> int:
    """How much of the step's results (activations, gradients) planned shadows may keep alive on ``device``
    before they are computed early, one by one: a quarter of the memory free there now, where the device
    module can say (``torch.cuda.mem_get_info``; ``torch.mlu`` has it too), at least 1 GiB; 1 GiB on the
    CPU and elsewhere."""
    floor = 1 << 30
    info = getattr(getattr(torch, device.type, None), "mem_get_info", None) if device.type != "cpu" else None
    if info is None:
        return floor
    try:
        return max(floor, int(info(device)[0]) // 4)
    except Exception:  # a device module that cannot say
        return floor


def _copy_held(holder: Any, slot: Any) -> None:
    """Replace the tensor in ``holder``'s ``slot`` (attribute name or list index) by a copy of it (a list
    emptied since, by a flushed job, has nothing left to copy)."""
    if isinstance(slot, str):
        setattr(holder, slot, getattr(holder, slot).clone())
    elif slot < len(holder):
        holder[slot] = holder[slot].clone()


def _seq_probe() -> int:
    """The sequence number the next autograd node made on this thread will get: nodes made from here on
    have this number or more. Read from the counter where torch exposes it, else from a throwaway node."""
    peek = getattr(torch._C._autograd, "_get_sequence_nr", None)
    if peek is not None:
        return peek()
    with torch.enable_grad():  # pragma: no cover - torch without the counter
        return (torch.zeros((), requires_grad=True) * 1.0).grad_fn._sequence_nr()


def modes_set_aside() -> contextlib.AbstractContextManager:
    """A context in which torch calls reach no Python mode: the dispatch modes below the caller (the audit's
    random-stream mode in a script's child, the program's own) are set aside, and so is ``__torch_function__``
    (the audit's CUDA-to-CPU redirect mode: its Python handler cost ~10 us on each of the statistics' and
    shadows' calls in a redirected child). For the tracer's own work, never the program's ops. Cheap when no
    mode is active (a null context: this runs for every recorded op)."""
    dispatch, function = torch._C._len_torch_dispatch_stack(), torch._C._len_torch_function_stack()
    if not (dispatch or function):
        return contextlib.nullcontext()
    aside = contextlib.ExitStack()
    if dispatch:
        aside.enter_context(_disable_current_modes())
    if function:
        aside.enter_context(torch._C.DisableTorchFunction())
    return aside


#: the two C++ guards under which no Python mode, no tensor subclass's ``__torch_dispatch__`` and no
#: ``__torch_function__`` runs (where :func:`modes_set_aside` pops and pushes the mode stack in Python, ~10 us on
#: the H200's host); only for calls whose tensors are plain ``torch.Tensor`` (a subclass would lose its own
#: dispatch) made from a mode whose modes below may be skipped (``StepTracer.direct_below``)
_NO_PYTHON_DISPATCH = torch._C._DisableTorchDispatch
_get_dispatch_mode = torch._C._get_dispatch_mode
_FAKE_MODE = torch._C._TorchDispatchModeKey.FAKE
_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction


def module_to(module: torch.nn.Module, device=None, dtype: Optional[torch.dtype] = None,
              complex_dtype: Optional[torch.dtype] = None) -> torch.nn.Module:
    """``module.to(device, dtype)`` in place (returned), except that a complex parameter or buffer gets
    ``complex_dtype`` (None: keeps its own). ``Module.to(torch.float64)`` casts a complex buffer to a real one,
    dropping its imaginary part: a Llama-style model's rotary table (``freqs_cis``, complex64) became its real part in
    the float64 reference, whose attention was then wrong (pytorch/examples fsdp_tp_example: a false first divergence,
    "amplified", at the first attention). Subclass parameters (DTensor) are handled as ``Module.to`` handles them."""
    def convert(t: torch.Tensor) -> torch.Tensor:
        return t.to(device, dtype if t.is_floating_point() else complex_dtype if t.is_complex() else None)
    return module._apply(convert)


class Widen64Mode(TorchDispatchMode):
    """Runs every op with floating dtype arguments widened to float64 (the reference's untraced
    steps: explicit casts such as ``x.half()`` in user code stay float64), and with float64 as
    torch's default dtype while entered (restored on exit), so a float tensor made without a dtype
    (``torch.full(shape, torch.finfo(x.dtype).min)``, as transformers' attention masks are) is
    float64 like everything else, not a float32 that the float64 value overflows. The default dtype
    is process-global (``torch.set_default_dtype``): not thread-safe."""

    def __enter__(self):
        self._saved_default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            torch.set_default_dtype(self._saved_default)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*map_leaves(_widen, args), **map_leaves(_widen, kwargs or {}))


def by_op(counts: Dict[str, int], most: int = 6) -> str:
    """``"op n, op n ..."``: the ``most`` most frequent ops of ``counts``, and `` ...`` when there are more."""
    shown = ", ".join(f"{op} {n}" for op, n in collections.Counter(counts).most_common(most))
    return shown + (" ..." if len(counts) > most else "")


class StepTracer(TorchDispatchMode):
    """Records one model's ops (see module docstring).

    ``role``: ``"reference"`` stores samples; ``"target"`` compares with ``reference_samples``
    (the reference tracer's :attr:`samples`) and, if ``shadow``, shadows each op in float64.
    """

    def __init__(self, model: torch.nn.Module, role: str, *, reference_samples=None, reference_shapes=None,
                 shadow: bool = True, max_elements: int = DEFAULT_MAX_ELEMENTS,
                 sample: bool = True, record_module_outputs: bool = True,
                 compute_dtype: Optional[torch.dtype] = None, cache_bytes: int = 1 << 30,
                 defer_bytes: Optional[int] = None):
        super().__init__()
        if role not in ("reference", "target"):
            raise ValueError(f"role must be 'reference' or 'target', not {role!r}")
        self.model = model
        self.role = role
        self.samples: Dict[tuple, torch.Tensor] = {} if reference_samples is None else reference_samples
        #: the shape of the output each sample came from, by key (the reference records it; the target compares an
        #: output only with a sample of its own shape: two outputs of one key can differ in shape when the runs take
        #: different kernels, and a large one's sample has as many elements as a small one's whole)
        self.sample_shapes: Dict[tuple, Tuple[int, ...]] = {} if reference_shapes is None else reference_shapes
        self.do_shadow = shadow and role == "target"
        self.shadow = Shadow(max_elements, cache_bytes=cache_bytes, sample=sample) if self.do_shadow else None
        self.max_elements = max_elements if sample else 1 << 62
        self.records: List[OpRecord] = []
        #: op outputs on tensor subclasses (DTensor ...) run but not recorded, by op (:meth:`_on_subclass`)
        self.subclass_ops: Dict[str, int] = collections.Counter()
        #: floating op and module outputs of a sparse layout (COO, CSR ...) run but not recorded, by op: their values
        #: are no strided block to sample or shadow
        self.sparse_ops: Dict[str, int] = collections.Counter()
        #: float32 op outputs the target device computed in TF32 (judged in :data:`thresholds.TF32`), by op, and the
        #: switches that had it on, in the order first seen (a dict as an ordered set)
        self.tf32_ops: Dict[str, int] = collections.Counter()
        self.tf32_switches: Dict[str, None] = {}
        self._counts: Dict[tuple, int] = collections.defaultdict(int)
        self._stack: List[str] = []
        #: autograd sequence numbers where the innermost module changed, ascending, and that module's path
        #: from there on (None: outside every module); :meth:`current_module` looks backward nodes up here
        self._seq_start: List[int] = []
        self._seq_path: List[Optional[str]] = []
        self._producer: Dict[int, Tuple[weakref.ref, int]] = {}
        self._handles = []
        self._record_modules = record_module_outputs
        self._internal = False
        self.compute_dtype = compute_dtype
        #: comparisons queued by the step, judged by :meth:`finalize`: (record, "local" | "total", request)
        self._pending: List[Tuple[OpRecord, str, StatsRequest]] = []
        #: float64 shadows planned by the step, computed (batched) by :meth:`finalize` or when they hold too
        #: much memory (:attr:`defer_bytes`): (record, job)
        self._jobs: List[Tuple[OpRecord, ShadowJob]] = []
        #: the storages the planned jobs keep alive, and their bytes
        self._job_storages: Dict[tuple, int] = {}
        self._job_bytes = 0
        #: bytes of the step's results the planned shadows may keep alive before they are computed early
        #: (None: :func:`default_defer_bytes` of the first shadowed op's device)
        self.defer_bytes = defer_bytes
        #: queued values that are still the program's own memory, by (storage, device): ``(holder, slot)``
        #: (a request's ``"target"``, a job's ``"target"`` or input ``k`` of a job's inputs); copied only
        #: when an op is about to write that storage (:meth:`_guard_writes`), not every time
        self._held: Dict[tuple, List[Tuple[Any, Any]]] = {}
        #: milliseconds :meth:`finalize` has taken, all calls together (the deferred shadows and statistics)
        self.finalize_ms = 0.0
        #: milliseconds the planned float64 shadows took to compute, all flushes together (at the step's end
        #: part of :attr:`finalize_ms`, earlier ones not), and the statistics took (part of it)
        self.shadow_ms = 0.0
        self.statistics_ms = 0.0
        #: whether every dispatch mode below this one may be skipped for the program's ops on plain tensors (a
        #: subclass sets it when those modes are its own pass-throughs; False: each op reaches them, in Python)
        self.direct_below = False

    # -- module hooks ---------------------------------------------------------------------
    def __enter__(self):
        for name, mod in self.model.named_modules():
            path = name or "<root>"
            self._handles.append(mod.register_forward_pre_hook(self._pre(path)))
            self._handles.append(mod.register_forward_hook(self._post(path)))
        return super().__enter__()

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()
        try:
            return super().__exit__(*exc)
        finally:
            self.finalize()

    def _flush_jobs(self, early: bool = False) -> None:
        """Compute every planned shadow now (:meth:`Shadow.flush`) and queue its comparison. ``early``: from
        inside ``__torch_dispatch__`` while the step goes on, so one by one (vmap cannot run there), and the
        compared outputs are held (the program may still write them)."""
        jobs, self._jobs = self._jobs, []
        self._job_storages.clear()
        self._job_bytes = 0
        if not jobs:
            return
        import time
        t0 = time.perf_counter()
        prev = self._internal
        self._internal = True  # the shadows' own ops are not the program's
        try:
            with torch.no_grad(), modes_set_aside():  # not the program's ops: no mode of it sees them
                self.shadow.flush([j for _, j in jobs], batched=not early)
        finally:
            self._internal = prev
            self.shadow_ms += (time.perf_counter() - t0) * 1e3
        for rec, job in jobs:
            if job.error is not None:
                rec.shadow_error = job.error
                continue
            if job.target.numel() != job.ref.numel():
                rec.shadow_error = (f"ValueError: the float64 shadow has {job.ref.numel()} elements, "
                                    f"the output {job.target.numel()}")
                continue
            rec.sampling = job.how
            thr = rec.threshold
            target, ref = real_view(job.target), real_view(job.ref)  # a complex op's shadow is complex128
            q = StatsRequest(target, ref, target.dtype, thr["rtol_eff"], thr["atol"], thr["class"] == "reduction",
                             magnitude=job.magnitude)
            self._pending.append((rec, "local", q))
            if early:
                self._hold(q, "target")

    def tf32_note(self) -> Optional[str]:
        """The report's line on the op outputs judged in TF32 (:attr:`tf32_ops`), None when there were none."""
        if not self.tf32_ops:
            return None
        switches = ", ".join(f"{s} = True" for s in self.tf32_switches)
        rtol = th.base_tolerance(th.TF32)[0]
        return (f"{sum(self.tf32_ops.values())} float32 op output(s) the device computed in TF32 ({switches}) are "
                f"judged at TF32's tolerance (rtol {rtol:g}, float32's is {th.base_tolerance(torch.float32)[0]:g}), "
                f"and so is what they feed; by op: {by_op(self.tf32_ops)}. Switch it off to have them judged as "
                "float32")

    def finalize(self) -> None:
        """Compute the planned float64 shadows and judge every comparison queued since the last call,
        filling ``local``/``total`` of the records (called on exit; records read before it have neither).
        One batched pass where the queued values are (their device when all are on one float64-capable
        device, else the CPU); a comparison that cannot be computed leaves its metric None (local:
        ``shadow_error`` says why). Runs with every Python mode set aside (:func:`modes_set_aside`: a mode
        would see each of these ops, in Python; in a script's child the audit's random-stream mode made the
        statistics 380 ms instead of 5 on the H200)."""
        with modes_set_aside():
            self._finalize()

    def _finalize(self) -> None:
        import time
        t0 = time.perf_counter()
        self._flush_jobs()
        t1 = time.perf_counter()
        try:
            self._judge()
        finally:
            t2 = time.perf_counter()
            self.statistics_ms += (t2 - t1) * 1e3
            self.finalize_ms += (t2 - t0) * 1e3

    def _judge(self) -> None:
        """The statistics of every queued comparison, into the records (:meth:`finalize`'s second half)."""
        if self.shadow is not None:
            self.shadow.cache.clear()
        self._held.clear()  # judged now: the program may write those tensors again
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        devices = {q.target.device for _, _, q in pending}
        dev = float64_home(devices.pop()) if len(devices) == 1 else torch.device("cpu")
        reqs = [q for _, _, q in pending]
        prev = self._internal
        self._internal = True  # the statistics' own ops are not the program's
        try:
            stats = error_stats_many(reqs, dev)
        except Exception as exc:
            why = error_line(exc)
            stats = [None] * len(reqs)
            for rec, which, _ in pending:
                if which == "local":
                    rec.shadow_error = f"statistics failed: {why}"
        finally:
            self._internal = prev
        for (rec, which, _), st in zip(pending, stats):
            setattr(rec, which, st)

    def _boundary(self) -> None:
        """The innermost module changes here: nodes numbered from now on belong to the top of the stack."""
        self._internal = True  # the probe's fallback makes a node: not the program's op
        try:
            seq = _seq_probe()
        finally:
            self._internal = False
        path = self._stack[-1] if self._stack else None
        if self._seq_start and self._seq_start[-1] == seq:
            self._seq_path[-1] = path  # no node was made since the last boundary
        else:
            self._seq_start.append(seq)
            self._seq_path.append(path)

    def _pre(self, path):
        def hook(mod, args):
            self._stack.append(path)
            self._boundary()
        return hook

    def _post(self, path):
        def hook(mod, args, output):
            if self._stack:
                self._stack.pop()
            self._boundary()
            if self._record_modules:
                self._internal = True
                try:
                    for i, t in enumerate(plain_values(x) for x in leaves(output) if isinstance(x, torch.Tensor)):
                        if is_dispatch_subclass(type(t)):
                            self.subclass_ops["<module>"] += 1
                        elif (t.is_floating_point() or t.is_complex()) and t.numel() > 0:
                            if t.layout != torch.strided:
                                self.sparse_ops["<module>"] += 1
                            else:
                                self._observe("forward", path, "<module>", t, i, kind="module")
                finally:
                    self._internal = False
        return hook

    def current_module(self) -> Tuple[str, str]:
        """``("forward", innermost module running)`` or, inside the backward, ``("backward", module whose
        forward made the running autograd node)`` (``<unattributed>``: made outside every module)."""
        node = torch._C._current_autograd_node() if hasattr(torch._C, "_current_autograd_node") else None
        if node is not None:
            try:
                k = bisect.bisect_right(self._seq_start, node._sequence_nr()) - 1
            except (AttributeError, RuntimeError):
                k = -1
            path = self._seq_path[k] if k >= 0 else None
            return "backward", path or "<unattributed>"
        return "forward", (self._stack[-1] if self._stack else "<root>")

    def produced(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is an output of a recorded op, or a view or copy of one (``detach``): computed by the
        traced step, not data it was given."""
        p = self._producer.get(id(t))
        return p is not None and p[0]() is t

    def producer(self, t: Optional[torch.Tensor]) -> Optional[int]:
        """The index in :attr:`records` of the op output ``t`` is (or a view or copy of: a parameter's ``.grad``,
        which autograd's accumulation takes as it is), None when it is none or that output was not compared."""
        p = self._producer.get(id(t)) if t is not None else None
        return p[1] if p is not None and p[0]() is t and p[1] >= 0 else None

    # -- dispatch ---------------------------------------------------------------------------
    def _hold(self, holder: Any, slot: Any) -> None:
        """Queue-side of copy-on-write: ``holder``'s ``slot`` (an attribute name, or an index of a list) is
        a program tensor or a view of one; it is copied only if an op writes that storage before it is used
        (a tensor without a storage is copied now)."""
        t = getattr(holder, slot) if isinstance(slot, str) else holder[slot]
        try:
            key = (t.untyped_storage().data_ptr(), t.device)
        except (RuntimeError, NotImplementedError):
            _copy_held(holder, slot)
            return
        self._held.setdefault(key, []).append((holder, slot))

    def _guard(self, info: "_OpInfo", args, kwargs) -> None:
        """Before an op runs with values held (:meth:`_hold`): copy those it may overwrite (a collective: all of
        them, :meth:`_guard_collective`; else those of the storages it writes, :meth:`_guard_writes`)."""
        if info.collective:
            self._guard_collective()
        elif info.writes:
            self._guard_writes(info.writes, args, kwargs)

    def _guard_collective(self) -> None:
        """Before a collective runs: copy every held value. What it writes, and what the program's callbacks on its
        result write (DDP's reducer copies the reduced bucket back into the gradients its hooks scaled), is written
        from the process group's thread, where no mode sees the writes and :meth:`_guard_writes` cannot copy first."""
        held, self._held = self._held, {}
        for entries in held.values():
            for holder, slot in entries:
                _copy_held(holder, slot)

    def _guard_writes(self, writes, args, kwargs) -> None:
        """Before an op runs: copy the held values (:meth:`_hold`) of every storage it will write (``writes``,
        its :class:`_OpInfo`'s mutable arguments: in-place ops, ``out=``, foreach lists), so a queued
        comparison keeps the values the op produced."""
        for w in writes:
            x = kwargs.get(w) if isinstance(w, str) else (args[w] if w < len(args) else None)
            for t in (x if isinstance(x, (list, tuple)) else (x,)):
                if isinstance(t, torch.Tensor):
                    try:
                        held = self._held.pop((t.untyped_storage().data_ptr(), t.device), None)
                    except (RuntimeError, NotImplementedError):
                        continue
                    for holder, slot in held or ():
                        _copy_held(holder, slot)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self._dispatch(func, types, args, kwargs or {})

    def _dispatch(self, func, types, args, kwargs):
        """The body of :meth:`__torch_dispatch__` (a subclass calls it from its own: torch wraps every
        ``__torch_dispatch__`` in a dynamo-disabling frame, a few microseconds a call, so ``super()`` would pay it
        twice). With :attr:`direct_below` set and plain tensors only, the op and the bookkeeping run with Python
        dispatch off (:data:`_NO_PYTHON_DISPATCH`), not through the modes below in Python. Under a FakeTensorMode
        (DTensor's sharding propagation runs each new op once on fake tensors: shapes, no values) the op goes on to it
        unrecorded (that mode is an infra mode, consulted after this one, and the direct path would bypass it)."""
        if _get_dispatch_mode(_FAKE_MODE) is not None:
            return func(*args, **kwargs)
        if self.direct_below and (not types or all(t is torch.Tensor for t in types)):
            with _NO_PYTHON_DISPATCH(), _NO_TORCH_FUNCTION():
                return self._record(func, args, kwargs, aside=False)
        if types and any(is_dispatch_subclass(t) for t in types):
            return self._on_subclass(func, types, args, kwargs)
        return self._record(func, args, kwargs, aside=True)

    def _on_subclass(self, func, types, args, kwargs):
        """An op on tensor subclasses with a dispatch of their own.

        A wrapper's op that computes on plain tensors is handed back (``NotImplemented``): the subclass's own
        dispatch then runs with this mode still on the stack, so what it does on this rank comes here as plain ops
        and is recorded like any other op, in the module that runs it. A sharded tensor's (DTensor: tensor
        parallelism): its redistributions (functional collectives, never compared) and its local computation on
        the shards (shadowed in float64 on those, and compared with the float64 run's, which holds the same
        shards); a float64 shadow of the DTensor op itself on this rank's arguments would not be that op, which may
        redistribute them first. An AsyncCollectiveTensor's (a collective's result, as a DTensor's row-wise layer
        returns it): the wait, then the op on the result.

        Any other subclass's op runs as it is, unrecorded: a FakeTensor's (shapes, no values) silently, others
        counted by op in :attr:`subclass_ops` (the report says so)."""
        if not self._internal and any(is_sharded_class(t) or is_pending_collective_class(t) for t in types):
            return NotImplemented
        info = _op_info(func)
        out = self._unrecorded(func, args, kwargs, info)
        if not (self._internal or info.passthrough or any(is_fake_class(t) for t in types)):
            self.subclass_ops[info.name] += 1
        return out

    def _unrecorded(self, func, args, kwargs, info: Optional["_OpInfo"] = None):
        """``func(*args, **kwargs)``, not recorded, after copying the held values (:meth:`_hold`) it may overwrite
        (``info``: its :class:`_OpInfo`, looked up when not given)."""
        if self._held:
            self._guard(info or _op_info(func), args, kwargs)
        return func(*args, **kwargs)

    def _record(self, func, args, kwargs, aside: bool):
        if self.role == "reference" and not self._internal:
            # the reference runs *every* floating computation in float64, explicit casts included
            args, kwargs = map_leaves(_widen, args), map_leaves(_widen, kwargs)
        info = _op_info(func)
        if self._held:
            self._guard(info, args, kwargs)
        out = func(*args, **kwargs)
        if self._internal:
            return out
        if info.passthrough:
            # views and copies carry their source's producer (blame follows the data).
            if isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor):
                p = self._producer.get(id(args[0]))
                if p is not None and p[0]() is args[0]:
                    self._producer[id(out)] = (weakref.ref(out), p[1])
            return out
        name = info.name
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if info.n_out is not None:
            outs = outs[:info.n_out]
        phase, module = self.current_module()
        inputs = [a for a in leaves(args, kwargs) if isinstance(a, torch.Tensor)]
        # the bookkeeping's own ops (views, samples) are not the program's: no other mode (the audit's random-stream
        # and redirect modes in a script's child) need see them
        with modes_set_aside() if aside else contextlib.nullcontext():
            for i, o in enumerate(outs):
                if type(o) is not torch.Tensor and is_dispatch_subclass(type(o)):
                    # made from plain tensors (the functional collectives' AsyncCollectiveTensor): no plain memory
                    self.subclass_ops[name] += 1
                elif isinstance(o, torch.Tensor) and o.numel() > 0 and (
                        o.is_floating_point() or o.is_complex() or name in _INDEX_OPS):
                    if o.layout != torch.strided:
                        self.sparse_ops[name] += 1
                    else:
                        self._observe(phase, module, name, o, i, func=func, args=args, kwargs=kwargs,
                                      inputs=inputs)
        return out

    def _observe(self, phase, module, op, t, out_index, *, kind="op", func=None, args=(),
                 kwargs=None, inputs=()):
        ckey = (phase, module, op, out_index)
        occ = self._counts[ckey]
        self._counts[ckey] = occ + 1
        key = (phase, module, op, occ, out_index)
        vals = real_view(t)  # what is compared: a complex output's real and imaginary parts
        if self.role == "reference":
            self.samples[key] = take_sample(vals, self.max_elements)
            self.sample_shapes[key] = tuple(vals.shape)
            self._producer[id(t)] = (weakref.ref(t), -1)  # for produced(); no record to blame here
            return
        # K only means something for a reduction (an embedding's "K" was its table over its output)
        k = th.reduction_length(op, args, tuple(t.shape), out_index) if func is not None and op in th.REDUCTION_OPS \
            else 1
        in_dtypes = [_REAL.get(a.dtype, a.dtype) for a in inputs if a.is_floating_point() or a.is_complex()] \
            if func is not None else []
        # an op is judged at the precision of its least precise operand, or at TF32's where the device computed its
        # float32 math in TF32
        fmt = th.loosest([vals.dtype] + in_dtypes)
        if fmt == torch.float32 and func is not None:
            switch = tf32_switch(t.device, op)
            if switch is not None:
                fmt = th.TF32
                self.tf32_ops[op] += 1
                self.tf32_switches[switch] = None
        thr = th.threshold_for(op, fmt, k)
        prods = []
        for tid in ([id(a) for a in inputs] if func is not None else (id(t),)):
            p = self._producer.get(tid)
            if p is not None and p[0]() is not None:
                prods.append(p[1])
        # the loosest format on the data path bounds the total error (inherited tolerance)
        eff = [vals.dtype, fmt] + [self.records[p].eff_dtype for p in prods]
        eff += in_dtypes
        if self.compute_dtype is not None:
            eff.append(self.compute_dtype)
        eff_dtype = th.loosest(eff)
        tthr = th.threshold_for(op, eff_dtype, k)
        if not vals.is_floating_point():  # indices: exact
            eff_dtype = t.dtype
            thr = tthr = th.threshold_for(op, t.dtype, 1)
        rec = OpRecord(phase, module, op, occ, out_index, str(t.dtype).replace("torch.", ""),
                       tuple(vals.shape), kind=kind, threshold=thr, eff_dtype=eff_dtype,
                       total_threshold=tthr)
        ref = self.samples.get(key)
        if ref is not None and self.sample_shapes.get(key, rec.shape) == rec.shape:
            tv, is_view = sampled_values(vals, self.max_elements)
            if tv.numel() == ref.numel():
                q = StatsRequest(tv, ref, vals.dtype, tthr["rtol_eff"], tthr["atol"], True, "aggregate")
                self._pending.append((rec, "total", q))
                if is_view:
                    self._hold(q, "target")
        if func is not None and self.do_shadow and exact_cast(func, args, t):
            # the local comparison of the output with itself: zero error, with its own scale and count
            rec.sampling = EXACT_CAST
            tv, is_view = sampled_values(vals, self.max_elements)
            q = StatsRequest(tv, tv, vals.dtype, thr["rtol_eff"], thr["atol"], thr["class"] == "reduction")
            self._pending.append((rec, "local", q))
            if is_view:  # both sides alias the output: copied if the program writes it before the judging
                self._hold(q, "target")
                self._hold(q, "ref")
        elif func is not None and self.do_shadow:
            try:
                job = self.shadow.plan(func, args, kwargs, t, out_index)
            except Exception as exc:  # too large, and no sampled variant; record why
                rec.shadow_error = error_line(exc)
            else:
                rec.sampling = job.how
                self._jobs.append((rec, job))
                # the output and the inputs as they are now: copied only if the program writes them first
                self._hold(job, "target")
                for slot in range(0 if job.shared else len(job.inputs)):  # shared: held with the first job's
                    self._hold(job.inputs, slot)
                # what the planned shadows may keep alive that the program would free: the storages of the
                # step's own results among the inputs (activations, gradients; not parameters or data)
                for a in inputs:
                    p = self._producer.get(id(a))
                    if p is None or p[0]() is not a:
                        continue
                    try:
                        storage = (a.untyped_storage().data_ptr(), a.device)
                    except (RuntimeError, NotImplementedError):
                        continue
                    if storage not in self._job_storages:
                        self._job_storages[storage] = a.untyped_storage().nbytes()
                        self._job_bytes += self._job_storages[storage]
                if self.defer_bytes is None:
                    self.defer_bytes = default_defer_bytes(t.device)
                if self._job_bytes > self.defer_bytes:
                    # inside the dispatch, where vmap cannot run (its batched tensors' dispatch keys are
                    # excluded here): one by one
                    self._flush_jobs(early=True)
        if func is not None:
            rec.inputs = tuple(prods)
            self._producer[id(t)] = (weakref.ref(t), len(self.records))
        self.records.append(rec)
