"""One analysis step under dispatch modes: FLOPs, bytes, dtype per op, host-device copies and
host-blocking ops, each located (module, source file, line).

The step runs once, outside the timed profiler (so stack capture costs the timed steps nothing),
under :class:`torch.utils.flop_counter.FlopCounterMode` (FLOPs per ATen op) and :class:`_OpTally`
(a ``TorchDispatchMode`` that sees every op after autograd, forward and backward):

- ``bytes``: the bytes of every input and output tensor of the op (views and ops that only alias
  count 0: they move nothing);
- ``dtype``: the dtype of the op's first floating-point input (selects the roofline's compute peak);
- copies: ``aten::_to_copy`` / ``aten::copy_`` whose source and destination devices differ
  (host<->device traffic), with their bytes;
- syncs: ops that make the host wait for the device when they run on an accelerator
  (``aten::_local_scalar_dense`` behind ``.item()``/``float()``/``bool()``, ``aten::nonzero``,
  ``aten::masked_select``, and blocking device->host copies), with the device of the tensor waited
  on (``device``). Only those on an accelerator block; on a CPU-only run every tensor is a host
  tensor, so they are listed as the places that *will* block if that tensor lives on the target
  (``float(loss)`` does; AdamW's ``step.item()`` on its host step counter does not).

Locations: the first Python frame outside torch and outside this package (``file``, ``line``) and
the innermost module of ``model`` whose forward was running (``module``; ``"<backward>"`` for ops of
the backward pass, ``"-"`` when no model was given or no module was active). Not thread-safe: one
analysis at a time per process (the module stack is per instance, the dispatch mode per thread).
"""
from __future__ import annotations

import collections
import os
import traceback
from typing import Any, Callable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from hal.backend import dtype_name

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_SYNC_OPS = frozenset({"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select",
                       "aten::is_nonzero"})
_COPY_OPS = frozenset({"aten::_to_copy", "aten::copy_"})


def op_name(func: Any) -> str:
    """``aten.addmm.default`` -> ``"aten::addmm"`` (the profiler's spelling)."""
    packet = getattr(func, "overloadpacket", func)
    ns = getattr(func, "namespace", "aten")
    return f"{ns}::{getattr(packet, '__name__', str(packet)).split('.')[-1]}"


def _tensors(tree: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(tree)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _nbytes(t: torch.Tensor) -> int:
    return int(t.numel()) * int(t.element_size())


def user_frame(skip_dirs: tuple[str, ...] = ()) -> tuple[str, int]:
    """(file, line) of the innermost frame outside torch, this package and ``skip_dirs``."""
    skip = (_TORCH_DIR, _PKG_DIR) + tuple(skip_dirs)
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if path.startswith(skip) or frame.filename.startswith("<"):
            continue
        return frame.filename, int(frame.lineno or 0)
    return "-", 0


class _ModuleStack:
    """Names of the modules of ``model`` whose forward is running (forward hooks)."""

    def __init__(self, model: Optional[torch.nn.Module]):
        self.stack: list[str] = []
        self.handles: list[Any] = []
        if model is None:
            return
        for name, mod in model.named_modules():
            label = name or type(mod).__name__
            self.handles.append(mod.register_forward_pre_hook(lambda *_a, n=label: self.stack.append(n)))
            self.handles.append(mod.register_forward_hook(lambda *_a, n=label: self._pop(n)))

    def _pop(self, name: str) -> None:
        if self.stack and self.stack[-1] == name:
            self.stack.pop()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


class _OpTally(TorchDispatchMode):
    def __init__(self, modules: _ModuleStack, has_model: bool):
        super().__init__()
        self.modules, self.has_model = modules, has_model
        self.ops: dict[str, dict] = {}
        self.copies: collections.Counter = collections.Counter()
        self.copy_bytes = 0
        self.syncs: collections.Counter = collections.Counter()

    def _where(self) -> tuple[str, str, int]:
        module = self.modules.stack[-1] if self.modules.stack else ("<backward>" if self.has_model and
                                                                     _in_backward() else "-")
        file, line = user_frame()
        return module, file, line

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = op_name(func)
        ins, outs = _tensors((args, kwargs)), _tensors(out)
        rec = self.ops.setdefault(name, {"calls": 0, "bytes": 0, "dtype": None})
        rec["calls"] += 1
        if not getattr(func, "is_view", False) and name not in ("aten::detach", "aten::alias"):
            rec["bytes"] += sum(_nbytes(t) for t in ins) + sum(_nbytes(t) for t in outs)
        if rec["dtype"] is None:
            fl = [t for t in ins if t.is_floating_point()]
            if fl:
                rec["dtype"] = dtype_name(fl[0].dtype)
        if name in _COPY_OPS and ins and outs:
            src = ins[1] if name == "aten::copy_" and len(ins) > 1 else ins[0]
            dst = outs[0]
            if src.device != dst.device:
                nb = _nbytes(dst)
                self.copies[self._where()] += 1
                self.copy_bytes += nb
                if dst.device.type == "cpu" and not kwargs.get("non_blocking", False):
                    self.syncs[self._where() + (src.device.type,)] += 1
        elif name in _SYNC_OPS and ins:
            self.syncs[self._where() + (ins[0].device.type,)] += 1
        return out


def _in_backward() -> bool:
    try:
        return bool(torch._C._current_graph_task_id() != -1)
    except Exception:  # pragma: no cover - older torch
        return False


def _locations(counter: collections.Counter) -> list[dict]:
    rows = []
    for key, c in counter.most_common():
        row = {"module": key[0], "file": key[1], "line": key[2], "count": c}
        if len(key) > 3:
            row["device"] = key[3]  # where the waited-on tensor lives
        rows.append(row)
    return rows


def _extra_flop_formulas() -> dict:
    """FLOP formulas FlopCounterMode lacks: the CPU flash-attention kernels (same count as the CUDA
    ones, from torch's own ``sdpa_flop_count``: the full s x L square, causal masking not halved)."""
    import torch.utils.flop_counter as fc
    out: dict = {}
    fwd = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    bwd = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if fwd is not None and hasattr(fc, "sdpa_flop_count"):
        out[fwd] = lambda q, k, v, *a, out_shape=None, **kw: fc.sdpa_flop_count(q, k, v)
    if bwd is not None and hasattr(fc, "sdpa_backward_flop_count"):
        out[bwd] = lambda g, q, k, v, *a, out_shape=None, **kw: fc.sdpa_backward_flop_count(g, q, k, v)
    return out


def analyse_step(step_fn: Callable[[], Any], model: Optional[torch.nn.Module] = None) -> dict:
    """Run ``step_fn`` once under the analysis modes; returns::

        {"ops": {op: {"calls", "bytes", "dtype", "flops"}},
         "copies": {"count", "bytes", "locations": [{"module", "file", "line", "count"}]},
         "syncs": {"count", "bytes": 0, "locations": [...]}, "flop_counter": "FlopCounterMode"}

    Counts are for the one step. Raises whatever ``step_fn`` raises (hooks are removed first).
    """
    from torch.utils.flop_counter import FlopCounterMode
    modules = _ModuleStack(model)
    tally = _OpTally(modules, model is not None)
    try:
        with FlopCounterMode(display=False, custom_mapping=_extra_flop_formulas()) as counter, tally:
            step_fn()
    finally:
        modules.remove()
    flops: dict[str, int] = {}
    for packet, n in counter.get_flop_counts().get("Global", {}).items():
        flops[op_name(packet)] = flops.get(op_name(packet), 0) + int(n)
    for name, rec in tally.ops.items():
        rec["flops"] = flops.get(name, 0)
    return {"ops": tally.ops,
            "copies": {"count": sum(tally.copies.values()), "bytes": tally.copy_bytes,
                       "locations": _locations(tally.copies)},
            "syncs": {"count": sum(tally.syncs.values()), "bytes": 0, "locations": _locations(tally.syncs)},
            "flop_counter": "torch.utils.flop_counter.FlopCounterMode"}
