"""Leaves and names of an aten op's arguments, fast: the tracers walk every op's ``(args, kwargs)``.

An op reaching ``__torch_dispatch__`` carries only nested tuples, lists and dicts of leaves
(tensors, numbers, dtypes, devices, None ...), so a plain recursive walk is exact here and about
ten times cheaper per call than ``torch.utils._pytree`` (which serves any registered container).
Pure functions; thread-safe. Also what a sharded tensor (DTensor) holds on this rank (:func:`local_tensor`).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List

import torch
from torch._subclasses.fake_tensor import FakeTensor

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


_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__


def is_dispatch_subclass(cls: type) -> bool:
    """Whether tensor class ``cls`` has a ``__torch_dispatch__`` of its own (DTensor, the functional collectives'
    AsyncCollectiveTensor, a FakeTensor ...): its values are not plain memory the tracers can sample or shadow
    (``nn.Parameter`` and ``torch.Tensor`` itself are not)."""
    return cls is not torch.Tensor and getattr(cls, "__torch_dispatch__", _PLAIN_DISPATCH) is not _PLAIN_DISPATCH


def is_sharded_class(cls: type) -> bool:
    """Whether tensor class ``cls`` is a sharded tensor's (DTensor: a ``_local_tensor`` slot holding this rank's
    shard), whose ops compute on that shard after any redistribution their sharding needs."""
    return hasattr(cls, "_local_tensor")


def is_pending_collective_class(cls: type) -> bool:
    """Whether tensor class ``cls`` is the functional collectives' AsyncCollectiveTensor: a collective's result,
    waited for (``wait_tensor``) by the first op that reads it, which then runs on the plain tensor."""
    return cls.__name__ == "AsyncCollectiveTensor" and cls.__module__.startswith("torch.distributed")


def is_fake_class(cls: type) -> bool:
    """Whether tensor class ``cls`` is FakeTensor's (shapes and dtypes, no values): DTensor's sharding propagation
    runs each new op once on fake tensors to learn its output's metadata."""
    return issubclass(cls, FakeTensor)


def local_tensor(t: Any) -> Any:
    """``t``'s local shard when ``t`` is a sharded tensor (DTensor: a ``_local_tensor`` slot), else ``t`` itself: what
    a fingerprint or a sample of this rank's values reads (an op mixing a DTensor with a plain tensor raises)."""
    return t._local_tensor if isinstance(t, torch.Tensor) and is_sharded_class(type(t)) else t


_functorch = getattr(torch._C, "_functorch", None)
_IS_WRAPPED = getattr(_functorch, "is_functorch_wrapped_tensor", None)


def unwrapped(t: Any) -> Any:
    """The plain tensor under ``t``'s torch.func wrappers (a ``vmap`` batch, a ``grad`` level: what a module called
    inside ``vmap(grad(...))``, as per-sample gradients are taken, gets), else ``t`` itself. The batch's values,
    whole: reading a wrapped tensor's values (``float(t.sum())``) raises under ``vmap``."""
    if _IS_WRAPPED is None or not isinstance(t, torch.Tensor):
        return t
    while _IS_WRAPPED(t):
        t = _functorch.get_unwrapped(t)
    return t


def plain_values(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor holding ``t``'s values on this rank where ``t`` is a wrapper whose ops compute on one: a
    DTensor's local shard, an AsyncCollectiveTensor's result (waited for here, as the first op reading it would), the
    batch under torch.func's wrappers (:func:`unwrapped`); else ``t`` itself."""
    t = local_tensor(unwrapped(t))
    return t.trigger_wait() if is_pending_collective_class(type(t)) else t


_COMPRESSED = {torch.sparse_csr: ("crow_indices", "col_indices"), torch.sparse_bsr: ("crow_indices", "col_indices"),
               torch.sparse_csc: ("ccol_indices", "row_indices"), torch.sparse_bsc: ("ccol_indices", "row_indices")}


def strided_parts(t: torch.Tensor) -> List[torch.Tensor]:
    """The strided tensors that hold ``t``'s data: ``[t]`` for a strided tensor; a sparse COO tensor's indices and
    values; a compressed sparse tensor's (CSR, CSC, BSR, BSC) two index tensors and values; ``[]`` for any other
    layout (oneDNN's, a jagged one). What reads a tensor element by element (``reshape(-1)``, a sample, a checksum)
    reads these: a graph network's sparse adjacency matrix (pytorch/examples gcn) has no ``reshape``."""
    layout = t.layout
    if layout == torch.strided:
        return [t]
    if layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    names = _COMPRESSED.get(layout)
    return [getattr(t, names[0])(), getattr(t, names[1])(), t.values()] if names else []
