"""Reference workloads: the programs migration engineers really move, device-agnostic through HAL.

- ``gpt``: decoder-only LM, AdamW + cross-entropy, KV-cache greedy decoding (:mod:`hal.models.gpt`);
- ``cnn``: small ResNet-style classifier, batch norm, SGD with momentum (:mod:`hal.models.cnn`);
- ``moe``: transformer blocks with a top-2 mixture-of-experts MLP, expert parallel over a HAL
  communicator (:mod:`hal.models.moe`).

Real architectures: ``hf:<arch>`` (``hf:llama``, ``hf:mixtral``, ``hf:whisper`` ...) builds a small
``transformers`` model with random weights (:mod:`hal.models.hf`; needs the ``models`` extra).

``get_workload(name, config="tiny", **overrides)`` constructs the config only; ``build()`` allocates.
Every workload implements :class:`hal.models.workload.Workload`. Commands: ``python -m
hal.models.run`` (single device), ``python -m torch.distributed.run ... -m hal.models.dp`` (data
parallel), ``python -m torch.distributed.run ... -m hal.models.ep`` (MoE expert parallel check).
"""
from __future__ import annotations

import importlib
from typing import Any

from hal.models.workload import Workload

#: the reference workloads (written here, device-agnostic through HAL)
WORKLOAD_NAMES = ("gpt", "cnn", "moe")
_CLASSES = {"gpt": "hal.models.gpt:GptWorkload", "cnn": "hal.models.cnn:CnnWorkload",
            "moe": "hal.models.moe:MoeWorkload"}


def model_sets() -> dict[str, tuple[str, ...]]:
    """Named sets of workload names: ``reference`` (ours), ``real`` (every ``hf:`` architecture),
    ``all`` (both)."""
    from hal.models.hf import HF_NAMES
    return {"reference": WORKLOAD_NAMES, "real": HF_NAMES, "all": WORKLOAD_NAMES + HF_NAMES}


def expand_models(names: "list[str] | tuple[str, ...]") -> list[str]:
    """Workload names with set names (:func:`model_sets`) expanded, in order, each once; ValueError
    for a name that is neither a workload nor a set."""
    sets, out = model_sets(), []
    for n in names:
        for m in sets.get(n, (n,)):
            workload_class(m)
            if m not in out:
                out.append(m)
    return out


def workload_class(name: str) -> type:
    """The :class:`Workload` subclass called ``name`` (a reference workload or ``hf:<arch>``);
    ValueError naming the valid choices."""
    if name.startswith("hf:"):
        from hal.models.hf import workload_class as hf_class
        return hf_class(name)
    if name not in _CLASSES:
        raise ValueError(f"unknown reference model {name!r}; one of {', '.join(WORKLOAD_NAMES)} or hf:<arch> "
                         f"(hf:llama, hf:mixtral, hf:bert ...: hal.models.hf.HF_NAMES)")
    module, attr = _CLASSES[name].split(":")
    return getattr(importlib.import_module(module), attr)


def workload_arg(name: str) -> str:
    """``name`` when it names a workload, for argparse ``type=``; ArgumentTypeError naming the choices."""
    import argparse
    try:
        workload_class(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return name


def get_workload(name: str, config: str = "tiny", **overrides: Any) -> Workload:
    """A workload with config ``config`` (plus field ``overrides``); nothing is allocated yet.

    Raises ValueError (never KeyError) for an unknown name, config or config field."""
    return workload_class(name)(config, **overrides)


def config_names(name: str) -> tuple[str, ...]:
    """The configs workload ``name`` offers."""
    return tuple(workload_class(name).CONFIGS)


__all__ = ["Workload", "WORKLOAD_NAMES", "get_workload", "workload_class", "config_names", "model_sets",
           "expand_models", "workload_arg"]
