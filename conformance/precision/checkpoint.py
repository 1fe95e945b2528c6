"""Checkpoint portability: a checkpoint saved on one backend resumes on another with matching loss.

:func:`check_checkpoint_portability` trains a workload ``steps`` steps on ``src_device``, saves
model + optimizer state with ``torch.save`` (to memory), keeps training the original for
``resume_steps`` more steps (the uninterrupted run), and in parallel builds a fresh workload on
``dst_device``, loads the checkpoint (``map_location=dst_device``) and trains the same
``resume_steps`` steps on the same batches. The losses must agree within the tolerance of the
training dtype (``max(10 * rtol, 1e-6)`` relative, 10 x rtol for 16-bit). Not thread-safe.
"""
from __future__ import annotations

import copy
import io
from typing import Any, Dict, Optional

import torch

from hal.backend import dtype_name
from hal.errors import BackendUnavailableError

from . import thresholds as th
from .calibration import device_available
from .compare import disable_dropout


def _make(workload, config):
    if isinstance(workload, str):
        from hal.models import get_workload
        return get_workload(workload, config=config)
    return copy.deepcopy(workload)


def _state(w) -> Dict[str, Any]:
    if hasattr(w, "state_dict") and callable(w.state_dict):
        return w.state_dict()
    return {"model": w.model.state_dict(), "optimizer": w.optimizer.state_dict()}


def _load(w, state) -> None:
    if hasattr(w, "load_state_dict") and callable(w.load_state_dict):
        w.load_state_dict(state)
    else:
        w.model.load_state_dict(state["model"])
        w.optimizer.load_state_dict(state["optimizer"])


def _to(batch, device):
    from torch.utils._pytree import tree_map
    return tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, batch)


def _step(w, batch) -> float:
    if hasattr(w, "train_step"):
        out = w.train_step(batch)
        return float(out if not isinstance(out, dict) else out["loss"])
    w.optimizer.zero_grad(set_to_none=True)
    loss = w.forward_loss(batch)
    loss.backward()
    w.optimizer.step()
    return float(loss.detach())


def check_checkpoint_portability(workload: Any, src_device="cpu", dst_device="cpu", steps: int = 2,
                                 resume_steps: int = 2, dtype: torch.dtype = torch.float32,
                                 seed: int = 0, config: str = "tiny",
                                 rel_tol: Optional[float] = None) -> Dict[str, Any]:
    """Returns ``{"src", "dst", "losses_uninterrupted", "losses_resumed", "max_rel_dev", "tolerance",
    "match", "checkpoint_bytes", "verified"}``. Raises BackendUnavailableError for a device that
    cannot be used."""
    for d in (src_device, dst_device):
        reason = device_available(str(d))
        if reason is not None:
            raise BackendUnavailableError(torch.device(d).type, reason)
    src, dst = torch.device(src_device), torch.device(dst_device)
    w = _make(workload, config)
    w.build(src, dtype, seed=seed)
    disable_dropout(w.model)
    torch.manual_seed(seed)
    batches = [w.example_batch() for _ in range(steps + resume_steps)]
    for b in batches[:steps]:
        _step(w, b)
    buf = io.BytesIO()
    torch.save(_state(w), buf)
    size = buf.tell()
    uninterrupted = [_step(w, b) for b in batches[steps:]]

    w2 = _make(workload, config)
    w2.build(dst, dtype, seed=seed + 1)  # different init: the checkpoint must overwrite it all
    disable_dropout(w2.model)
    buf.seek(0)
    _load(w2, torch.load(buf, map_location=dst, weights_only=False))
    resumed = [_step(w2, _to(b, dst)) for b in batches[steps:]]
    devs = [abs(a - b) / max(abs(a), 1e-30) for a, b in zip(uninterrupted, resumed)]
    tol = rel_tol if rel_tol is not None else max(10 * th.base_tolerance(dtype)[0], 1e-6)
    max_dev = max(devs) if devs else 0.0
    return {"src": str(src), "dst": str(dst), "dtype": dtype_name(dtype), "steps_before_save": steps,
            "losses_uninterrupted": uninterrupted, "losses_resumed": resumed, "max_rel_dev": max_dev,
            "tolerance": tol, "match": bool(max_dev <= tol), "checkpoint_bytes": size, "verified": True}
