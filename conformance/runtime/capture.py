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
from typing import Any, Optional

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
        self.target_paths = TargetPaths(target) if target and target != "cpu" else None
        self.optimizer_depth = 0
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

    def records(self) -> list[dict]:
        """One record per (op, phase, device type): counts, dtypes, modules and bytes, JSON-ready."""
        merged: dict[tuple, dict] = {}
        for (func, phase, dtypes, module, dev), (calls, nbytes) in self.counts.items():
            op = aten_name(func)
            if op.startswith(IGNORED_NAMESPACES):
                continue
            rec = merged.setdefault((op, phase, dev), {"op": op, "phase": phase, "device_type": dev, "count": 0,
                                                       "bytes": 0, "dtypes": [], "modules": [],
                                                       "shapes": self.shapes.get(func, [])})
            rec["count"] += calls
            rec["bytes"] += nbytes
            for d in dtypes:
                if d not in rec["dtypes"]:
                    rec["dtypes"].append(d)
            if module and module not in rec["modules"] and len(rec["modules"]) < MAX_MODULES_PER_OP:
                rec["modules"].append(module)
        return sorted(merged.values(), key=lambda r: (-r["count"], r["op"], r["phase"]))


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
      and PrivateUse1 tensors) instead of the CPU's bernoulli_/div_/mul decomposition.

    Kernels the host picks inside one call (``mkldnn_rnn_layer``, the CPU's SDPA kernel,
    ``native_batch_norm`` where cuDNN would run) are mapped afterwards by
    :func:`hal.conformance.runtime.predict.target_kernel`, which keeps ``captured_as``.

    ``install`` patches process-global attributes and ``remove`` restores them (LIFO with any patch
    installed before: install after the device redirect, remove before it). Not thread-safe.
    """

    def __init__(self, target: str, present: str = "cpu") -> None:
        self.target = target
        self.present = present
        self._saved: list[tuple[Any, str, Any]] = []

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
        return self

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

    def _install_scaler(self) -> None:
        import torch.amp.grad_scaler as gs
        real = gs.GradScaler
        present, asked_for = self.present, ("cuda", self.target)

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

        self._patch(torch.amp, "GradScaler", TargetGradScaler)
        try:
            import torch.cuda.amp as cuda_amp
        except ImportError:  # pragma: no cover - every torch we support has it
            return
        cuda_cls = cuda_amp.GradScaler

        class TargetCudaGradScaler(cuda_cls):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                enable(self, "cuda", args, kwargs)

        self._patch(cuda_amp, "GradScaler", TargetCudaGradScaler)

    def remove(self) -> None:
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
