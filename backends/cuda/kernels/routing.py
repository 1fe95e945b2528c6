"""Which calls the Triton kernels take and which go straight to torch's CUDA kernel (pure Python, no Triton).

A call whose launch overhead exceeds its GPU time is faster through ATen: the table says, per op,
dtype and mode, the smallest input (in elements) from which the Triton kernel is used. ``mode`` is
``"infer"`` (no autograd graph: forward only) or ``"train"`` (the forward records a backward); the
decision is taken once, at forward time, for forward and backward together (a call routed to torch
gets torch's autograd). The decision is a dict lookup and a compare: no sync, no timing, so it is
CUDA-graph friendly.

The table is data: ``routing.json`` next to this module, or the file named by the environment
variable ``HAL_CUDA_ROUTING`` (read once, at the first decision; :func:`reload` re-reads it). Two
special values of that variable need no file: ``triton`` (every call the kernels support takes the
kernel) and ``torch`` (every call goes to torch). Table format::

    {"measured": "<where the figures come from>",
     "default": <elements>,                       # any op/dtype/mode not listed
     "ops": {"rms_norm": {"default": <elements>,  # optional per op
                          "bfloat16": {"infer": <elements>, "train": <elements>}, ...}, ...}}

Thresholds are non-negative integers (0: always the kernel) or null (never the kernel). A
malformed table raises :class:`RoutingTableError` with a one-line message.

The kernel wrappers' fast path: :func:`floors` gives, per op, the smallest threshold of the table over
every dtype and both modes. An input with fewer elements than that goes to torch whatever its dtype, its
mode and the kernel's predicate, so a wrapper compares ``input.numel()`` with it before anything else
and runs the predicate, :func:`mode` and :func:`decide` (which stays the contract) only at or above it:
the fast path skips only work whose answer is already known to be "torch". It is per op, not per
(op, dtype), because reading ``input.dtype`` costs as much again as ``numel()``. The dict is updated in
place whenever a table is installed (:func:`reload`, :func:`using`); before the first table is loaded
every floor is 0 ("ask": the full path, whose :func:`decide` loads the table).
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, Iterator, Optional, Union

import torch

from hal.errors import HalError

#: the ops the table may name and the modes
OPS = ("softmax", "log_softmax", "layer_norm", "rms_norm", "add_rms_norm", "silu_and_mul", "cross_entropy")
MODES = ("infer", "train")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
ENV = "HAL_CUDA_ROUTING"
DEFAULT_PATH = Path(__file__).with_name("routing.json")
_NEVER = 1 << 62  # threshold stored for null: no tensor has that many elements

#: the loaded table: {"source", "measured", "thresholds": {(op, dtype name, mode): int}}
_table: Optional[dict] = None
#: (op, torch.dtype | dtype name, mode) -> threshold, for the hot path
_fast: dict = {}
#: op -> min(threshold over DTYPES and MODES): the live dict :func:`floors` hands out (identity kept)
_floors: dict = {op: 0 for op in OPS}
#: the grad states :func:`dispatch_floors` keeps a floor for (``hal.ops.SIZE_ROUTE``'s): 0 grad mode off, 1 grad mode
#: on and the call's input not requiring grad, 2 grad mode on and the input requiring grad
GRAD_STATES = (0, 1, 2)
#: ops whose wrappers ask :func:`mode` about tensors besides the input (a weight, a residual): with the input not
#: requiring grad such a call may still record a graph
_MODE_READS_MORE = frozenset({"layer_norm", "rms_norm", "add_rms_norm"})
#: (op, torch dtype, grad state) -> floor: the live dict :func:`dispatch_floors` hands out (identity kept)
_dispatch_floors: dict = {(op, dt, g): 0 for op in OPS for dt in DTYPES.values() for g in GRAD_STATES}


class RoutingTableError(HalError, ValueError):
    """The routing table (routing.json or ``$HAL_CUDA_ROUTING``) is malformed or unreadable."""


def _threshold(v: Any, where: str) -> int:
    if v is None:
        return _NEVER
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise RoutingTableError(f"routing table: {where} must be a non-negative integer or null, got {v!r}")
    return v


def parse(doc: Any, source: str = "<dict>") -> dict:
    """Validate a table document (see the module docstring) and return the loaded form.

    Raises RoutingTableError on any malformation: unknown op/dtype/mode, a bad threshold, a
    missing ``default`` or ``measured``."""
    if not isinstance(doc, dict):
        raise RoutingTableError(f"routing table {source}: top level must be an object, got {type(doc).__name__}")
    for key in ("measured", "default"):
        if key not in doc:
            raise RoutingTableError(f"routing table {source}: missing key {key!r}")
    if not isinstance(doc["measured"], str):
        raise RoutingTableError(f"routing table {source}: 'measured' must be a string")
    default = _threshold(doc["default"], "'default'")
    ops = doc.get("ops", {})
    if not isinstance(ops, dict):
        raise RoutingTableError(f"routing table {source}: 'ops' must be an object")
    out = {(op, dt, mode): default for op in OPS for dt in DTYPES for mode in MODES}
    for op, spec in ops.items():
        if op not in OPS:
            raise RoutingTableError(f"routing table {source}: unknown op {op!r} (known: {', '.join(OPS)})")
        if not isinstance(spec, dict):
            raise RoutingTableError(f"routing table {source}: ops.{op} must be an object")
        op_default = _threshold(spec["default"], f"ops.{op}.default") if "default" in spec else default
        for dt in DTYPES:
            for mode in MODES:
                out[(op, dt, mode)] = op_default
        for dt, modes in spec.items():
            if dt == "default":
                continue
            if dt not in DTYPES:
                raise RoutingTableError(f"routing table {source}: ops.{op}: unknown dtype {dt!r}")
            if not isinstance(modes, dict):
                raise RoutingTableError(f"routing table {source}: ops.{op}.{dt} must be an object of modes")
            for mode, v in modes.items():
                if mode not in MODES:
                    raise RoutingTableError(f"routing table {source}: ops.{op}.{dt}: unknown mode {mode!r}")
                out[(op, dt, mode)] = _threshold(v, f"ops.{op}.{dt}.{mode}")
    return {"source": source, "measured": doc["measured"], "thresholds": out}


def _read(spec: Optional[str]) -> dict:
    if spec == "triton":
        return parse({"measured": "HAL_CUDA_ROUTING=triton: every supported call takes the kernel", "default": 0},
                     "triton")
    if spec == "torch":
        return parse({"measured": "HAL_CUDA_ROUTING=torch: every call goes to torch", "default": None}, "torch")
    path = Path(spec) if spec else DEFAULT_PATH
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RoutingTableError(f"routing table {path}: cannot be read as JSON ({type(exc).__name__}: "
                                f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    return parse(doc, str(path))


def _dispatch_floor(op: str, infer: int, train: int, state: int) -> int:
    """The floor of one grad state (:data:`GRAD_STATES`): the threshold of every mode :func:`mode` may answer in it."""
    if state == 0:
        return infer
    if state == 2:
        return train
    return min(infer, train) if op in _MODE_READS_MORE else infer


def _install(t: dict) -> None:
    global _table
    fast = {}
    for (op, dt, mode), v in t["thresholds"].items():
        fast[(op, dt, mode)] = v
        fast[(op, DTYPES[dt], mode)] = v
    th = t["thresholds"]
    floors = {op: min(th[(op, dt, m)] for dt in DTYPES for m in MODES) for op in OPS}
    by_dtype = {(op, DTYPES[dt], g): _dispatch_floor(op, th[(op, dt, "infer")], th[(op, dt, "train")], g)
                for op in OPS for dt in DTYPES for g in GRAD_STATES}
    _table = t
    _fast.clear()
    _fast.update(fast)
    _floors.update(floors)  # in place, same keys: the wrappers hold this dict
    _dispatch_floors.update(by_dtype)  # likewise; hal.ops' dispatcher copies it into its cache entries:
    from hal.ops import invalidate_cache  # late: hal.ops' backend loading imports this module
    invalidate_cache()


def reload(spec: Optional[str] = None) -> dict:
    """(Re)load the table from ``spec`` (a path, ``"triton"`` or ``"torch"``), else from
    ``$HAL_CUDA_ROUTING``, else the shipped routing.json; returns :func:`table`."""
    _install(_read(spec if spec is not None else os.environ.get(ENV) or None))
    return table()


def table() -> dict:
    """The table in use: ``{"source", "measured", "thresholds": {"op/dtype/mode": elements | None}}``."""
    if _table is None:
        reload()
    assert _table is not None
    th = {f"{op}/{dt}/{mode}": (None if v == _NEVER else v) for (op, dt, mode), v in _table["thresholds"].items()}
    return {"source": _table["source"], "measured": _table["measured"], "thresholds": th}


@contextlib.contextmanager
def using(doc: Union[dict, str]) -> Iterator[dict]:
    """Use another table inside the block (a document as :func:`parse` takes, or a :func:`reload`
    spec), then restore the previous one. Not thread-safe."""
    if _table is None:
        reload()
    prev = _table
    try:
        _install(parse(doc) if isinstance(doc, dict) else _read(doc))
        yield table()
    finally:
        assert prev is not None
        _install(prev)


def floors() -> dict:
    """``{op: elements}``: per op, the smallest threshold of the table in use over every dtype and both
    modes (null stored as a number no tensor reaches). ``numel < floors()[op]`` means :func:`decide`
    answers False for every dtype and mode, so the call can go to torch without asking it; at or above
    it, ask (the predicate, :func:`mode`, :func:`decide`). 0 for every op until a table is loaded.

    The same dict object is returned every time and updated in place by :func:`reload` and
    :func:`using`, so a kernel wrapper may bind it once, at import."""
    return _floors


def dispatch_floors() -> dict:
    """``{(op, torch dtype, grad state): elements}``: a call of ``op`` on fewer input elements of that dtype
    goes to torch whatever :func:`mode` would say, given the grad state (:data:`GRAD_STATES`): grad mode off,
    the infer threshold; on with the input requiring grad, the train threshold (:func:`mode` answers train);
    on with the input not requiring grad, the infer threshold, or for an op whose mode also reads a weight or a
    residual (:data:`_MODE_READS_MORE`) the smaller of the two. The size route the kernel wrappers give
    ``hal.ops``' dispatcher (:data:`hal.ops.SIZE_ROUTE`), finer than :func:`floors` (per dtype and grad state,
    which the dispatcher reads in its own frame). The same dict object every time, updated in place as
    :func:`floors`'s is (and ``hal.ops.invalidate_cache()`` called, since the dispatcher copies the floors); 0
    for every key until a table is loaded."""
    return _dispatch_floors


def mode(*tensors: Optional[torch.Tensor]) -> str:
    """``"train"`` when autograd records a call on ``tensors`` (grad mode on and one of them, None
    skipped, requires grad), else ``"infer"``: the mode a kernel wrapper asks :func:`decide` about."""
    if torch.is_grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                return "train"
    return "infer"


def decide(op: str, dtype: Union[torch.dtype, str], mode: str, numel: int) -> bool:
    """True when a call of ``op`` on ``numel`` input elements of ``dtype`` in ``mode`` ("infer" or
    "train") should take the Triton kernel, False when it should go straight to torch's kernel.

    Raises KeyError for an op, dtype or mode the table does not know."""
    try:
        return numel >= _fast[(op, dtype, mode)]
    except KeyError:
        if _table is None:
            reload()
            return numel >= _fast[(op, dtype, mode)]
        raise
