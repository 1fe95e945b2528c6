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
    (set by :mod:`hal.conformance.runtime.stepping`); ``modules`` supplies the module path."""

    def __init__(self, modules: Optional[ModuleTracker] = None) -> None:
        super().__init__()
        self.modules = modules
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
