"""Reference workloads: the programs migration engineers really move, device-agnostic through HAL.

- ``gpt``: decoder-only LM, AdamW + cross-entropy, KV-cache greedy decoding (:mod:`hal.models.gpt`);
- ``cnn``: small ResNet-style classifier, batch norm, SGD with momentum (:mod:`hal.models.cnn`);
- ``moe``: transformer blocks with a top-2 mixture-of-experts MLP, expert parallel over a HAL
  communicator (:mod:`hal.models.moe`).

``get_workload(name, config="tiny", **overrides)`` constructs the config only; ``build()`` allocates.
Every workload implements :class:`hal.models.workload.Workload`. Commands: ``python -m
hal.models.run`` (single device), ``python -m torch.distributed.run ... -m hal.models.dp`` (data
parallel), ``python -m torch.distributed.run ... -m hal.models.ep`` (MoE expert parallel check).
"""
from __future__ import annotations

import importlib
from typing import Any

from hal.models.workload import Workload

WORKLOAD_NAMES = ("gpt", "cnn", "moe")
_CLASSES = {"gpt": "hal.models.gpt:GptWorkload", "cnn": "hal.models.cnn:CnnWorkload",
            "moe": "hal.models.moe:MoeWorkload"}


def workload_class(name: str) -> type:
    """The :class:`Workload` subclass called ``name``; ValueError naming the valid choices."""
    if name not in _CLASSES:
        raise ValueError(f"unknown workload {name!r}; one of {', '.join(WORKLOAD_NAMES)}")
    module, attr = _CLASSES[name].split(":")
    return getattr(importlib.import_module(module), attr)


def get_workload(name: str, config: str = "tiny", **overrides: Any) -> Workload:
    """A workload with config ``config`` (plus field ``overrides``); nothing is allocated yet.

    Raises ValueError (never KeyError) for an unknown name, config or config field."""
    return workload_class(name)(config, **overrides)


def config_names(name: str) -> tuple[str, ...]:
    """The configs workload ``name`` offers."""
    return tuple(workload_class(name).CONFIGS)


__all__ = ["Workload", "WORKLOAD_NAMES", "get_workload", "workload_class", "config_names"]
