"""The op registry: ops keyed by ATen name, implementations per device type, resolution with reasons.

An :class:`OpDef` names an op (``softmax``) and the ATen overload it stands for
(``aten::softmax.int``). Backends register :class:`OpImpl` objects for their device type with the
dtypes they compute natively, a priority, and optionally a ``supports(*args, **kwargs)`` predicate
that returns a rejection reason (or None) for a particular call. :meth:`OpRegistry.resolve` walks
the candidates best first and keeps the reason each one was rejected (vLLM's invalid_reasons);
the dispatcher in :mod:`hal.ops` caches the winner per (device, dtype) and falls back to the CPU
according to :mod:`hal.ops.fallback` when nothing fits.

Thread-safety: registration and resolution take a lock. The dispatch caches in :mod:`hal.ops` are
plain dicts read and written without a lock (a single ``dict`` get or set is atomic in CPython) and
cleared in place when the registry changes; a lookup racing an invalidation at worst resolves the
op again.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, Iterable, Optional

from hal.errors import OpNotFoundError

Supports = Callable[..., Optional[str]]


@dataclasses.dataclass(frozen=True)
class OpDef:
    """An op of the HAL API. ``aten`` is the ATen overload the op stands for; ``reference`` is its
    implementation with torch's own kernels (what a CPU fallback runs); ``reaches`` lists the ATen
    overloads the reference dispatches to (used by capability queries)."""

    name: str
    aten: str
    reference: Optional[Callable[..., Any]] = None
    doc: str = ""
    reaches: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class OpImpl:
    """One implementation of an op on one device type.

    ``dtypes`` is the set of dtype names computed natively (None: every dtype). ``impl`` names the
    engine ("torch", "triton", "cupy", ...)."""

    op: str
    device_type: str
    fn: Callable[..., Any]
    impl: str = "torch"
    dtypes: Optional[frozenset[str]] = None
    priority: int = 0
    supports: Optional[Supports] = None

    @property
    def label(self) -> str:
        return f"{self.device_type}/{self.impl}"


@dataclasses.dataclass(frozen=True)
class Resolution:
    """The outcome of resolving an op: the chosen implementation (or None) and why each
    candidate was rejected, in the order tried."""

    op: str
    device_type: str
    impl: Optional[OpImpl]
    rejected: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.impl is not None


class OpRegistry:
    """Holds op definitions and implementations. See the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._defs: dict[str, OpDef] = {}
        self._impls: dict[tuple[str, str], list[OpImpl]] = {}
        self._listeners: list[Callable[[], None]] = []

    # ---- definitions ------------------------------------------------------------------------
    def define(self, name: str, aten: str, reference: Optional[Callable[..., Any]] = None, doc: str = "",
               reaches: Iterable[str] = ()) -> OpDef:
        """Define (or redefine) an op; returns its definition."""
        with self._lock:
            opdef = OpDef(name, aten, reference, doc, tuple(reaches) or (aten,))
            self._defs[name] = opdef
            return opdef

    def get(self, name: str) -> OpDef:
        try:
            return self._defs[name]
        except KeyError:
            raise OpNotFoundError(name) from None

    def names(self) -> list[str]:
        return sorted(self._defs)

    # ---- implementations --------------------------------------------------------------------
    def register(self, op: str, device_type: str, fn: Callable[..., Any], *, impl: str = "torch",
                 dtypes: Optional[Iterable[str]] = None, priority: int = 0,
                 supports: Optional[Supports] = None) -> OpImpl:
        """Add an implementation. Raises OpNotFoundError for an undefined op."""
        self.get(op)
        entry = OpImpl(op, device_type, fn, impl, frozenset(dtypes) if dtypes is not None else None,
                       priority, supports)
        with self._lock:
            lst = [i for i in self._impls.get((op, device_type), []) if i.impl != impl]
            lst.append(entry)
            lst.sort(key=lambda i: -i.priority)
            self._impls[(op, device_type)] = lst
            listeners = list(self._listeners)
        for cb in listeners:
            cb()
        return entry

    def implementations(self, op: str, device_type: Optional[str] = None) -> list[OpImpl]:
        with self._lock:
            return [i for (o, d), lst in self._impls.items() if o == op and device_type in (None, d)
                    for i in lst]

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` after every registration (dispatch caches use it to invalidate)."""
        with self._lock:
            self._listeners.append(callback)

    # ---- resolution -------------------------------------------------------------------------
    def resolve(self, op: str, device_type: str, dtype: Optional[str], args: tuple = (),
                kwargs: Optional[dict] = None) -> Resolution:
        """The best implementation of ``op`` on ``device_type`` for inputs of ``dtype``.

        A ``supports`` predicate is consulted only when ``args`` are given (a dispatch call)."""
        self.get(op)
        rejected: list[str] = []
        with self._lock:
            candidates = list(self._impls.get((op, device_type), []))
        if not candidates:
            rejected.append(f"no implementation registered for {device_type}")
        for cand in candidates:
            if cand.dtypes is not None and dtype is not None and dtype not in cand.dtypes:
                rejected.append(f"{cand.label}: dtype {dtype} not in {sorted(cand.dtypes)}")
                continue
            if cand.supports is not None and args:
                why = cand.supports(*args, **(kwargs or {}))
                if why:
                    rejected.append(f"{cand.label}: {why}")
                    continue
            return Resolution(op, device_type, cand, tuple(rejected))
        return Resolution(op, device_type, None, tuple(rejected))


#: The process-wide registry used by :mod:`hal.ops`.
REGISTRY = OpRegistry()
