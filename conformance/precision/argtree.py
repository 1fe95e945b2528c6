"""Leaves and names of an aten op's arguments, fast: the tracers walk every op's ``(args, kwargs)``.

An op reaching ``__torch_dispatch__`` carries only nested tuples, lists and dicts of leaves
(tensors, numbers, dtypes, devices, None ...), so a plain recursive walk is exact here and about
ten times cheaper per call than ``torch.utils._pytree`` (which serves any registered container).
Pure functions; thread-safe.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List

_CONTAINERS = (tuple, list)


def leaves(*objs: Any) -> List[Any]:
    """Every leaf of ``objs`` (tuples, lists and dict values walked), in order."""
    out: List[Any] = []
    for o in objs:
        _collect(o, out)
    return out


def _collect(o: Any, out: List[Any]) -> None:
    if isinstance(o, _CONTAINERS):
        for x in o:
            _collect(x, out)
    elif isinstance(o, dict):
        for x in o.values():
            _collect(x, out)
    else:
        out.append(o)


def map_leaves(fn: Callable[[Any], Any], o: Any) -> Any:
    """``o`` with every leaf ``x`` replaced by ``fn(x)`` (containers rebuilt with their own type)."""
    if isinstance(o, tuple):
        return tuple(map_leaves(fn, x) for x in o)
    if isinstance(o, list):
        return [map_leaves(fn, x) for x in o]
    if isinstance(o, dict):
        return {k: map_leaves(fn, v) for k, v in o.items()}
    return fn(o)


def named_arguments(func: Any, args: tuple, kwargs: Any = None) -> Dict[str, Any]:
    """An aten overload's arguments by their schema names (positional ones zipped with ``func._schema``, keyword
    ones as given): for ops whose argument positions differ between torch versions (cudnn attention took
    ``attn_bias`` from 2.5 on) or that are read by name (a dropout's ``p`` and ``train``)."""
    named = dict(zip((a.name for a in func._schema.arguments), args))
    named.update(kwargs or {})
    return named
