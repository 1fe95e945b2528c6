"""Fallback policy and the fallback log.

When no implementation of an op fits a device and dtype, the policy decides:

- ``cpu``: run the CPU implementation (inputs copied to the host, outputs copied back), quietly;
- ``warn``: the same, with a ``HalFallbackWarning`` once per (op, device type, dtype) — torch_mlu's
  own behaviour, and the default;
- ``error``: raise :class:`~hal.errors.NotSupportedError` with every rejection reason.

The policy is chosen per call (``fallback=`` argument of every ``hal.ops`` function), per scope
(``with fallback_policy("error"):``, per thread/async context) or by ``$HAL_FALLBACK``, in that
order. Every fallback that runs is recorded in the log with op, dtypes, shapes, bytes copied and
seconds, whatever the policy. The log is bounded (the newest ``LOG_LIMIT`` records) and keeps
per-op totals that are never truncated. Thread-safe.
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import os
import threading
from typing import Iterator, Optional

POLICIES = ("cpu", "warn", "error")
ENV_POLICY = "HAL_FALLBACK"
DEFAULT_POLICY = "warn"
LOG_LIMIT = 10_000


class HalFallbackWarning(UserWarning):
    """An op ran on the CPU because the device has no implementation for it."""


_scope: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("hal_fallback_policy", default=None)


def _check(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"unknown fallback policy {policy!r}; one of {', '.join(POLICIES)}")
    return policy


def current_policy(explicit: Optional[str] = None) -> str:
    """The policy in force: ``explicit``, else the innermost scope, else ``$HAL_FALLBACK``, else warn."""
    if explicit is not None:
        return _check(explicit)
    scoped = _scope.get()
    if scoped is not None:
        return scoped
    return _check(os.environ.get(ENV_POLICY, DEFAULT_POLICY) or DEFAULT_POLICY)


@contextlib.contextmanager
def fallback_policy(policy: str) -> Iterator[str]:
    """Set the fallback policy inside the ``with`` block (this thread / async context only)."""
    token = _scope.set(_check(policy))
    try:
        yield policy
    finally:
        _scope.reset(token)


@dataclasses.dataclass(frozen=True)
class FallbackRecord:
    """One op call that ran on the CPU instead of its device."""

    op: str
    device_type: str
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    bytes_copied: int
    seconds: float
    reason: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class FallbackTotals:
    calls: int = 0
    bytes_copied: int = 0
    seconds: float = 0.0


class FallbackLog:
    """Records of fallbacks that ran (bounded) and per-(op, device) totals (complete)."""

    def __init__(self, limit: int = LOG_LIMIT):
        self._lock = threading.Lock()
        self._records: collections.deque[FallbackRecord] = collections.deque(maxlen=limit)
        self._totals: dict[tuple[str, str], FallbackTotals] = {}
        self._warned: set[tuple[str, str, tuple[str, ...]]] = set()

    def add(self, rec: FallbackRecord, warn: bool = False) -> bool:
        """Record ``rec``. With ``warn``, returns True the first time this (op, device, dtypes)
        asks for a warning (warn once, as torch_mlu does)."""
        key = (rec.op, rec.device_type, rec.dtypes)
        with self._lock:
            self._records.append(rec)
            tot = self._totals.setdefault((rec.op, rec.device_type), FallbackTotals())
            tot.calls += 1
            tot.bytes_copied += rec.bytes_copied
            tot.seconds += rec.seconds
            if not warn or key in self._warned:
                return False
            self._warned.add(key)
            return True

    def records(self) -> list[FallbackRecord]:
        with self._lock:
            return list(self._records)

    def totals(self) -> dict[tuple[str, str], FallbackTotals]:
        with self._lock:
            return {k: dataclasses.replace(v) for k, v in self._totals.items()}

    def clear(self) -> None:
        with self._lock:
            self._records.clear()
            self._totals.clear()
            self._warned.clear()


#: The process-wide fallback log.
LOG = FallbackLog()
