"""Typed errors raised by HAL.

Every error HAL raises on purpose derives from :class:`HalError`, so a caller can catch the
whole family with one clause and a specific failure with its own class. Errors carry their
structured fields as attributes (not only in the message) so reports can show them.
"""
from __future__ import annotations

from typing import Sequence


class HalError(Exception):
    """Base class of every error HAL raises on purpose."""


class BackendUnavailableError(HalError):
    """A backend was asked for explicitly but cannot be used here.

    ``name`` is the backend name, ``reason`` the recorded reason (its probe's answer or the
    import error of its plugin).
    """

    def __init__(self, name: str, reason: str):
        self.name = name
        self.reason = reason
        super().__init__(f"backend {name!r} is unavailable: {reason}")


class NotSupportedError(HalError):
    """An operation is not supported by a backend (and no fallback was allowed).

    ``reasons`` lists why each candidate implementation was rejected, in resolution order.
    """

    def __init__(self, what: str, backend: str, reasons: Sequence[str] = ()):
        self.what = what
        self.backend = backend
        self.reasons = list(reasons)
        detail = "; ".join(self.reasons) if self.reasons else "no implementation"
        super().__init__(f"{what} is not supported on {backend}: {detail}")


class OpNotFoundError(HalError):
    """No op of that name is defined in the op registry."""

    def __init__(self, op: str):
        self.op = op
        super().__init__(f"no op named {op!r} is defined")


class CollectiveError(HalError):
    """A collective failed (a peer died, the backend raised)."""


class CollectiveTimeoutError(CollectiveError):
    """A collective or the rendezvous did not complete within its timeout."""

    def __init__(self, what: str, timeout_s: float, detail: str = ""):
        self.what = what
        self.timeout_s = timeout_s
        msg = f"{what} timed out after {timeout_s:g} s"
        super().__init__(msg + (f": {detail}" if detail else ""))
