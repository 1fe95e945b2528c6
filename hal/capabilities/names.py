"""Spelling of ATen op overload names.

HAL data spells an overload the way the dispatcher prints it: ``aten::add.Tensor``, and the
``default`` overload without a suffix (``aten::addmm``). Op capture through a TorchDispatchMode
prints ``aten.addmm.default``; :func:`normalize_op` accepts every spelling. Pure functions.
"""
from __future__ import annotations


def normalize_op(name: str) -> str:
    """``aten.addmm.default`` / ``aten::addmm.default`` / ``aten::addmm`` -> ``aten::addmm``.

    A name without a namespace is taken as ``aten``. Raises ValueError for an empty name."""
    name = (name or "").strip()
    if not name:
        raise ValueError("empty op name")
    if "::" in name:
        ns, rest = name.split("::", 1)
    elif "." in name:
        ns, rest = name.split(".", 1)
        if ns not in ("aten", "prims", "torchvision", "torchaudio", "torch_mlu", "custom", "vision", "audio",
                      "c10d", "_c10d_functional", "quantized", "fbgemm"):
            ns, rest = "aten", name
    else:
        ns, rest = "aten", name
    base, _, overload = rest.partition(".")
    if overload in ("", "default"):
        return f"{ns}::{base}"
    return f"{ns}::{base}.{overload}"


def base_name(op: str) -> str:
    """``aten::add.Tensor`` -> ``aten::add``."""
    return normalize_op(op).split(".", 1)[0]


def overload_of(op: str) -> str:
    """``aten::add.Tensor`` -> ``Tensor``; ``aten::addmm`` -> ``default``."""
    rest = normalize_op(op).split("::", 1)[1]
    return rest.split(".", 1)[1] if "." in rest else "default"
