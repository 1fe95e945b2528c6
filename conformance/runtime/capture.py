"""Op capture: every ATen op overload a program dispatches, with counts, dtypes, shapes, phase and module.

:class:`OpCapture` is a ``TorchDispatchMode`` (so it sees the ops *after* autograd, autocast and
composite decomposition: the ops a backend must really implement). Its hot path is one dict
increment keyed by ``(op, phase, dtypes, module path, device type)`` plus a byte count; shapes are
sampled (the first :data:`SHAPE_SAMPLES` distinct ones per op) and everything else is derived when
:meth:`OpCapture.records` is called.

Phase of each op: ``optimizer`` inside ``Optimizer.step`` (global step pre/post hooks),
``backward`` while the autograd engine runs a node (``torch._C._current_autograd_node()``),
``inference`` when grad mode is off, else ``forward``.

Module path: global forward pre/post hooks keep a stack of the modules being run; a module's path
is its root's class name plus its qualified name inside that root (``GPT.blocks.0.attn``).

Thread-safety: one capture per process, used from the thread that entered it (the autograd
engine's CPU work runs on that thread too); not meant to be shared across threads.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SHAPE_SAMPLES = 3
SHAPE_TRIES = 64          # stop looking for new distinct shapes of an op after this many calls
MAX_MODULES_PER_OP = 8
IGNORED_NAMESPACES = ("profiler::",)  # record_function markers, not computation
_current_node = getattr(torch._C, "_current_autograd_node", None)


def aten_name(func: Any) -> str:
    """``aten.addmm.default`` -> ``aten::addmm``; ``aten.add.Tensor`` -> ``aten::add.Tensor``."""
    text = str(func)
    ns, _, rest = text.partition(".")
    name, _, overload = rest.partition(".")
    if not rest:
        return text
    return f"{ns}::{name}" + ("" if overload in ("", "default") else f".{overload}")


def _leaves(obj: Any, out: list) -> None:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            if isinstance(o, torch.Tensor):
                out.append(o)
            elif isinstance(o, (list, tuple)):
                _leaves(o, out)


_DTYPE_NAMES: dict = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


def _nbytes(ts: list) -> int:
    n = 0
    for t in ts:
        try:
            n += t.numel() * t.element_size()
        except Exception:  # sparse/meta oddities: count nothing rather than fail the program
            pass
    return n


class ModuleTracker:
    """Which module is running now, through global forward pre/post hooks (see module docstring)."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self._names: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()
        self._handles: list = []
        self.top_level_forwards = 0
        self.on_top_level_forward = None  # callable(module) -> None, called before a top-level forward

    def _name(self, module: torch.nn.Module) -> str:
        name = self._names.get(module)
        if name is None:
            root = type(module).__name__
            for qual, sub in module.named_modules(prefix=root):
                self._names.setdefault(sub, qual)
            name = self._names.get(module, root)
        return name

    def _pre(self, module: torch.nn.Module, _inputs: Any) -> None:
        if not self.stack:
            self.top_level_forwards += 1
            if self.on_top_level_forward is not None:
                self.on_top_level_forward(module)
        self.stack.append(self._name(module))

    def _post(self, module: torch.nn.Module, _inputs: Any, _output: Any) -> None:
        if self.stack:
            self.stack.pop()

    def install(self) -> None:
        from torch.nn.modules import module as m
        self._handles = [m.register_module_forward_pre_hook(self._pre),
                         m.register_module_forward_hook(self._post, always_call=True)
                         if _accepts_always_call() else m.register_module_forward_hook(self._post)]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    @property
    def current(self) -> str:
        return self.stack[-1] if self.stack else ""


def _accepts_always_call() -> bool:
    import inspect
    from torch.nn.modules import module as m
    try:
        return "always_call" in inspect.signature(m.register_module_forward_hook).parameters
    except (TypeError, ValueError):
        return False


class OpCapture(TorchDispatchMode):
    """Counts every op dispatched while active. ``optimizer_depth`` > 0 marks the optimizer phase
    (set by :mod:`hal.conformance.runtime.stepping`); ``modules`` supplies the module path.
    ``target``: the absent device a predicting run is for (e.g. ``"mlu"``): while the capture is
    active the program takes that device's code paths (:class:`TargetPaths`); None (a measured run,
    or a CPU target): nothing is changed."""

    def __init__(self, modules: Optional[ModuleTracker] = None, target: Optional[str] = None) -> None:
        super().__init__()
        self.modules = modules
        self.target_paths = TargetPaths(target, capture=self) if target and target != "cpu" else None
        self.optimizer_depth = 0
        self.paused = 0            # > 0: ops run unrecorded (inside a call recorded as the target's ops)
        self.paused_ops = 0        # how many ops ran unrecorded
        self.notes: dict[tuple, tuple] = {}  # (op, captured_as) -> (captured_as, why) of synthetic records
        # (func, phase, dtypes, module, device type) -> [calls, bytes in+out]
        self.counts: dict[tuple, list] = {}
        self.shapes: dict[Any, list] = {}
        self._shape_tries: dict[Any, int] = {}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch >= 2.10 wraps __torch_dispatch__ in torch._disable_dynamo unless this says False:
        # the wrapper imports torch._dynamo on the first op (about a second of CPU) and adds a frame
        # per op. The capture never runs under torch.compile's tracing, so it opts out.
        return False

    def __enter__(self) -> "OpCapture":
        if self.target_paths is not None:
            self.target_paths.install()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            if self.target_paths is not None:
                self.target_paths.remove()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.paused:
            self.paused_ops += 1
            return out
        ins: list = []
        _leaves(args, ins)
        if kwargs:
            _leaves(tuple(kwargs.values()), ins)
        if self.optimizer_depth:
            phase = "optimizer"
        elif _current_node is not None and _current_node() is not None:
            phase = "backward"
        elif not torch.is_grad_enabled():
            phase = "inference"
        else:
            phase = "forward"
        outs: list = []
        _leaves(out if isinstance(out, (list, tuple)) else (out,), outs)
        key = (func, phase, tuple([_dtype_name(t.dtype) for t in ins]), self.modules.current if self.modules else "",
               ins[0].device.type if ins else (outs[0].device.type if outs else "cpu"))
        slot = self.counts.get(key)
        if slot is None:
            slot = self.counts[key] = [0, 0]
        slot[0] += 1
        slot[1] += _nbytes(ins) + _nbytes(outs)
        tries = self._shape_tries.get(func, 0)
        if tries < SHAPE_TRIES:
            self._shape_tries[func] = tries + 1
            samples = self.shapes.setdefault(func, [])
            if len(samples) < SHAPE_SAMPLES:
                shape = [list(t.shape) for t in ins[:6]]
                if shape not in samples:
                    samples.append(shape)
        return out

    def phase(self) -> str:
        """The phase an op dispatched now belongs to (see the module docstring)."""
        if self.optimizer_depth:
            return "optimizer"
        if _current_node is not None and _current_node() is not None:
            return "backward"
        return "forward" if torch.is_grad_enabled() else "inference"

    def record_target_op(self, op: str, phase: str, tensors: list, count: int, captured_as: str, why: str,
                         shapes: Optional[list] = None) -> None:
        """Record ``op`` -- an op the *target* dispatches where the host ran something else -- as if it
        had been dispatched ``count`` times on ``tensors``. Its record keeps ``captured_as`` (what the
        host ran) and ``why``; it is never merged with a record of the same op that really ran here."""
        key = (_Synthetic(op, captured_as), phase, tuple(_dtype_name(t.dtype) for t in tensors),
               self.modules.current if self.modules else "", tensors[0].device.type if tensors else "cpu")
        slot = self.counts.setdefault(key, [0, 0])
        slot[0] += count
        slot[1] += _nbytes(tensors)
        if shapes is not None and key[0] not in self.shapes:
            self.shapes[key[0]] = shapes
        self.notes[(op, captured_as)] = (captured_as, why)

    def records(self) -> list[dict]:
        """One record per (op, phase, device type): counts, dtypes, modules and bytes, JSON-ready.
        Records of :meth:`record_target_op` are separate and carry ``captured_as`` and ``why``."""
        merged: dict[tuple, dict] = {}
        for (func, phase, dtypes, module, dev), (calls, nbytes) in self.counts.items():
            synthetic = func if isinstance(func, _Synthetic) else None
            op = synthetic.op if synthetic else aten_name(func)
            if op.startswith(IGNORED_NAMESPACES):
                continue
            mkey = (op, phase, dev, synthetic.captured_as if synthetic else None)
            rec = merged.get(mkey)
            if rec is None:
                rec = merged[mkey] = {"op": op, "phase": phase, "device_type": dev, "count": 0, "bytes": 0,
                                      "dtypes": [], "modules": [], "shapes": self.shapes.get(func, [])}
                if synthetic:
                    rec["captured_as"], rec["why"] = self.notes[(op, synthetic.captured_as)]
            rec["count"] += calls
            rec["bytes"] += nbytes
            for d in dtypes:
                if d not in rec["dtypes"]:
                    rec["dtypes"].append(d)
            if module and module not in rec["modules"] and len(rec["modules"]) < MAX_MODULES_PER_OP:
                rec["modules"].append(module)
        return sorted(merged.values(), key=lambda r: (-r["count"], r["op"], r["phase"]))


class _Synthetic(tuple):
    """Key of an op recorded by :meth:`OpCapture.record_target_op`: ``(op, captured_as)``."""

    op = property(lambda self: self[0])
    captured_as = property(lambda self: self[1])

    def __new__(cls, op: str, captured_as: str) -> "_Synthetic":
        return super().__new__(cls, (op, captured_as))


def enable_program_grad_scalers(patch: Callable[[Any, str, Any], None], present: str,
                                asked_for: tuple) -> None:
    """Make a GradScaler that the program enables for a device in ``asked_for`` (``"cuda"``, the
    target: the device redirect turns those into disabled scalers) run enabled on ``present``, with
    the program's own arguments (init_scale, growth...), so loss scaling and unscaling happen as on
    the device. ``patch(owner, name, value)`` installs the replacement classes on ``torch.amp`` and
    ``torch.cuda.amp`` (the caller restores them). Not thread-safe (process-global attributes)."""
    import torch.amp.grad_scaler as gs
    real = gs.GradScaler

    def enable(scaler: Any, device: str, args: tuple, kwargs: dict) -> None:
        enabled = kwargs.get("enabled", args[4] if len(args) > 4 else True)
        if enabled and device in asked_for and not getattr(scaler, "_enabled", False):
            kw = dict(kwargs, enabled=True)
            real.__init__(scaler, present, *args[:4], **kw)

    amp_cls = torch.amp.GradScaler

    class TargetGradScaler(amp_cls):  # type: ignore[misc, valid-type]
        def __init__(self, device: str = "cuda", *args: Any, **kwargs: Any) -> None:
            super().__init__(device, *args, **kwargs)
            enable(self, device, args, kwargs)

    patch(torch.amp, "GradScaler", TargetGradScaler)
    try:
        import torch.cuda.amp as cuda_amp
    except ImportError:  # pragma: no cover - every torch we support has it
        return
    cuda_cls = cuda_amp.GradScaler

    class TargetCudaGradScaler(cuda_cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            enable(self, "cuda", args, kwargs)

    patch(cuda_amp, "GradScaler", TargetCudaGradScaler)


class TargetPaths:
    """Make torch take the *target's* code paths where torch picks them by the host's device type.

    A program audited for an absent accelerator runs on the CPU, and in a few places torch chooses a
    different implementation because the tensors are on the CPU. While installed (only in a run that
    predicts for ``target``, never in a measured run):

    - optimizers default to their ``foreach`` implementation on ``present`` as they do on CUDA, XPU
      and PrivateUse1 devices (``torch.optim.optimizer._get_foreach_kernels_supported_devices``
      gains ``present``): AdamW/Adam/SGD... dispatch ``aten::_foreach_*`` as on the target;
    - a GradScaler the program enables for ``cuda`` or for ``target`` (which the device redirect
      turns into a disabled one) runs enabled on ``present``, so ``scale``/``unscale_``/``update``
      dispatch ``aten::_amp_foreach_non_finite_check_and_unscale_`` and ``aten::_amp_update_scale_``
      (both have CPU kernels in torch 2.4 and later);
    - training-mode dropout runs the fused ``aten::native_dropout`` (what ATen picks for CUDA, XPU
      and PrivateUse1 tensors) instead of the CPU's bernoulli_/div_/mul decomposition;
    - ``F.one_hot`` with ``num_classes`` given skips the CPU's check that every class is non-negative
      (``aten::aminmax`` or ``min`` and a host sync): ATen runs it on CPU tensors only, not on CUDA,
      MPS or PrivateUse1 (the MLU) ones, where ``one_hot`` is ``zeros`` + ``scatter_`` (MoE routers
      call it every step);
    - with a ``capture``: each recurrent call (``torch._VF.gru``/``lstm``/``rnn_tanh``/``rnn_relu``,
      which nn.GRU/LSTM/RNN call, packed sequences included) runs on the host unrecorded and is
      recorded as the ops the target dispatches for it (:func:`hal.conformance.runtime.predict.rnn_target_ops`:
      ``_cudnn_rnn`` on CUDA, ...), in its forward and, through an autograd Function around the call,
      in its backward (``_cudnn_rnn_backward``); the records keep ``captured_as`` (``aten::gru.input``)
      and why. On cuda, ``nn.RNNBase.flatten_parameters`` records the ``_cudnn_rnn_flatten_weight``
      that cuDNN modules run there. Nothing is changed for a CPU target or a measured run (no
      TargetPaths at all).

    Kernels the host picks inside one call (``mkldnn_rnn_layer`` of a direct ``torch.lstm`` call, the CPU's SDPA kernel,
    ``native_batch_norm`` where cuDNN would run) are mapped afterwards by
    :func:`hal.conformance.runtime.predict.target_kernel`, which keeps ``captured_as``.

    ``install`` patches process-global attributes and ``remove`` restores them (LIFO with any patch
    installed before: install after the device redirect, remove before it). Not thread-safe.
    """

    def __init__(self, target: str, present: str = "cpu", capture: Optional["OpCapture"] = None) -> None:
        self.target = target
        self.present = present
        self.capture = capture
        self._saved: list[tuple[Any, str, Any]] = []
        self._dropout_state = False  # cuDNN's dropout state was initialised (once per process)

    _ABSENT = object()

    def _patch(self, owner: Any, name: str, value: Any) -> None:
        # an attribute served by a module's __getattr__ (torch._VF) is deleted again, not pinned
        own = vars(owner).get(name, self._ABSENT) if hasattr(owner, "__dict__") else getattr(owner, name)
        self._saved.append((owner, name, own))
        setattr(owner, name, value)

    def install(self) -> "TargetPaths":
        import torch.optim.optimizer as optim_mod
        real_devices = optim_mod._get_foreach_kernels_supported_devices
        present = self.present

        def foreach_devices() -> list:
            devs = list(real_devices())
            return devs if present in devs else devs + [present]

        self._patch(optim_mod, "_get_foreach_kernels_supported_devices", foreach_devices)
        self._install_scaler()
        self._install_dropout()
        self._install_one_hot()
        if self.capture is not None:
            self._install_rnn()
        return self

    def _install_rnn(self) -> None:
        vf = torch._VF
        for name in ("gru", "lstm", "rnn_tanh", "rnn_relu"):
            self._patch(vf, name, self._rnn_call(name, getattr(vf, name)))
        if self.target == "cuda":
            self._patch(torch.nn.RNNBase, "flatten_parameters",
                        self._flatten(vars(torch.nn.RNNBase)["flatten_parameters"]))

    def _flatten(self, real: Any) -> Any:
        capture, present = self.capture, self.present

        def flatten_parameters(module: Any) -> None:
            real(module)
            ws = getattr(module, "_flat_weights", None) or []
            if not (ws and all(isinstance(w, torch.Tensor) and w.device.type == present for w in ws)
                    and len({w.dtype for w in ws}) == 1 and ws[0].dtype in _CUDNN_DTYPES
                    and len({w.data_ptr() for w in ws}) == len(ws) and torch.backends.cudnn.enabled):
                return
            why = ("nn.RNNBase.flatten_parameters of a module whose weights are on the device: on CUDA it "
                   "packs them into cuDNN's weight buffer (under no_grad)")
            for op in ("aten::_use_cudnn_rnn_flatten_weight", "aten::_cudnn_rnn_flatten_weight"):
                capture.record_target_op(op, "inference", list(ws), 1, "nn.RNNBase.flatten_parameters", why)

        return flatten_parameters

    def _rnn_call(self, name: str, real: Any) -> Any:
        paths = self

        def call(*args: Any, **kwargs: Any) -> Any:
            cap = paths.capture
            if kwargs or cap is None or cap.paused or len(args) < 8 or not isinstance(args[0], torch.Tensor):
                return real(*args, **kwargs)
            return paths._run_rnn(name, real, args)

        return call

    def _run_rnn(self, name: str, real: Any, args: tuple) -> Any:
        from hal.conformance.runtime.predict import rnn_target_ops
        cap = self.capture
        packed = isinstance(args[1], torch.Tensor) and (name == "lstm" or isinstance(args[2], torch.Tensor))
        k = 1 if packed else 0
        num_layers, dropout, train, bidir = args[4 + k], args[5 + k], args[6 + k], args[7 + k]
        batch_first = bool(args[8]) if not packed and len(args) > 8 else False
        x = args[0]
        steps = int(args[1].numel()) if packed else (x.size(1 if batch_first else 0) if x.dim() == 3 else x.size(0))
        call_op = f"aten::{name}.{'data' if packed else 'input'}"
        plan = rnn_target_ops(self.target, call_op, cudnn=bool(torch.backends.cudnn.enabled),
                              dtype=_dtype_name(x.dtype))
        flat: list = []
        _leaves(args, flat)
        tensors = [t for t in flat if t.is_floating_point()]
        phase = cap.phase()
        before = cap.paused_ops
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in flat)
        cap.paused += 1
        try:
            if grad:
                outs = _RNNCall.apply(_Call(real, args, cap, self, call_op, plan, steps, num_layers, bidir), *flat)
            else:
                outs = real(*args)
        finally:
            cap.paused -= 1
        host = cap.paused_ops - before
        why = (f"the host ran {call_op} as {host} ATen calls (its own decomposition); {plan['why']}")
        reps = steps * int(num_layers) * (2 if bidir else 1)
        shapes = [[list(t.shape) for t in flat[:2]]]
        for op, per in plan["forward"]:
            cap.record_target_op(op, phase, tensors, reps * per if per else 1, call_op, why, shapes)
        if train and dropout and plan.get("dropout_init") and not self._dropout_state:
            self._dropout_state = True
            for op in plan["dropout_init"]:
                cap.record_target_op(op, phase, tensors[:1], 1, call_op, why + "; train-mode dropout between layers "
                                     "initialises its dropout state once")
        if grad:
            outs = tuple(outs)
        return outs


    def _install_dropout(self) -> None:
        # ATen's dropout runs the fused native_dropout only on CUDA, XPU, lazy and PrivateUse1 tensors
        # (is_fused_kernel_acceptable); on the CPU it decomposes into bernoulli_/div_/mul.
        vf = torch._VF
        real = vf.dropout

        def dropout(input: Any, p: float, train: bool) -> Any:
            if train and 0 < p < 1 and type(input) is torch.Tensor and input.numel() > 0:
                return torch.native_dropout(input, p, train)[0]
            return real(input, p, train)

        self._patch(vf, "dropout", dropout)

    def _install_one_hot(self) -> None:
        # aten/src/ATen/native/Onehot.cpp: the min() >= 0 check runs unless the tensor is on CUDA, MPS or
        # PrivateUse1 (the device's own scatter_ asserts instead); there num_classes == -1 is max() + 1
        real = torch.nn.functional.one_hot

        def one_hot(tensor: Any, num_classes: int = -1) -> Any:
            if (type(tensor) is not torch.Tensor or tensor.dtype != torch.long or tensor.numel() == 0
                    or not isinstance(num_classes, int) or num_classes < -1):
                return real(tensor, num_classes)
            if num_classes == -1:
                num_classes = int(tensor.max().item()) + 1
            out = torch.zeros(*tensor.shape, num_classes, dtype=torch.long, device=tensor.device)
            return out.scatter_(-1, tensor.unsqueeze(-1), 1)

        self._patch(torch.nn.functional, "one_hot", one_hot)

    def _install_scaler(self) -> None:
        enable_program_grad_scalers(self._patch, self.present, ("cuda", self.target))

    def remove(self) -> None:
        self._dropout_state = False
        while self._saved:
            owner, name, value = self._saved.pop()
            if value is self._ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, value)

    def __enter__(self) -> "TargetPaths":
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.remove()


_CUDNN_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class _Call:
    """One recurrent call run by :class:`_RNNCall`: the real function and its arguments, and what to
    record for its backward."""

    def __init__(self, real: Any, args: tuple, capture: OpCapture, paths: TargetPaths, call_op: str, plan: dict,
                 steps: int, num_layers: int, bidir: bool) -> None:
        self.real, self.args, self.capture, self.paths = real, args, capture, paths
        self.call_op, self.plan = call_op, plan
        self.reps = steps * int(num_layers) * (2 if bidir else 1)

    def run(self, tensors: list) -> tuple:
        it = iter(tensors)

        def rebuild(obj: Any) -> Any:
            if isinstance(obj, torch.Tensor):
                return next(it)
            if isinstance(obj, (list, tuple)) and any(isinstance(o, (torch.Tensor, list, tuple)) for o in obj):
                return type(obj)(rebuild(o) for o in obj)
            return obj

        return tuple(self.real(*rebuild(list(self.args))))

    def record_backward(self, tensors: list) -> None:
        cap = self.capture
        why = f"backward of {self.call_op}; {self.plan['why']}"
        floats = [t for t in tensors if t.is_floating_point()]
        for op, per in self.plan["backward"]:
            cap.record_target_op(op, "backward", floats, self.reps * per if per else 1, self.call_op, why)


class _RNNCall(torch.autograd.Function):
    """Runs a recurrent call on the host with its own autograd graph inside, so that the op capture
    can record the target's forward *and* backward kernels for it and nothing the host decomposed
    it into (the capture is paused while the host graph runs). Numerics are the host call's."""

    @staticmethod
    def forward(ctx: Any, call: _Call, *tensors: torch.Tensor) -> tuple:
        needs = ctx.needs_input_grad[1:]
        ins = [t.detach().requires_grad_() if need else t for t, need in zip(tensors, needs)]
        with torch.enable_grad():
            outs = call.run(ins)
        ctx.call, ctx.ins, ctx.outs = call, ins, outs
        return tuple(o.detach() for o in outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, *grads: Any) -> tuple:
        call = ctx.call
        needs = ctx.needs_input_grad[1:]
        call.record_backward(list(ctx.ins))
        pairs = [(o, g) for o, g in zip(ctx.outs, grads) if g is not None and o.requires_grad]
        want = [t for t, need in zip(ctx.ins, needs) if need]
        call.capture.paused += 1
        try:
            got = torch.autograd.grad([o for o, _ in pairs], want, [g for _, g in pairs], allow_unused=True) \
                if pairs and want else [None] * len(want)
        finally:
            call.capture.paused -= 1
        it = iter(got)
        return (None,) + tuple(next(it) if need else None for need in needs)
