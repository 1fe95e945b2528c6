"""Streams and events: real objects on every backend.

A :class:`Stream` orders work on one device; an :class:`Event` marks a point in a stream that
other streams can wait on and that the host can time. Device backends wrap the framework's own
stream objects (:class:`TorchStream` over ``torch.cuda.Stream`` / ``torch.mlu.Stream``); the CPU
gets :class:`HostStream` and :class:`HostEvent`, where work runs synchronously in issue order, so
an event is complete the moment it is recorded and its timestamp is the host clock.

Thread-safety: stream and event objects may be shared between threads; "current stream" state is
per thread (as in torch).
"""
from __future__ import annotations

import abc
import threading
import time
from typing import Any, Optional


class Event(abc.ABC):
    """A marker in a stream. ``record`` (re)places it; ``elapsed_time`` needs ``enable_timing``."""

    @abc.abstractmethod
    def record(self, stream: Optional["Stream"] = None) -> "Event":
        """Record the event on ``stream`` (default: the current stream); returns self."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Block the host until the work before the record point has finished."""

    @abc.abstractmethod
    def query(self) -> bool:
        """True when the work before the record point has finished."""

    @abc.abstractmethod
    def elapsed_time(self, end: "Event") -> float:
        """Milliseconds from this event to ``end`` (both recorded with timing enabled).

        Raises RuntimeError when either event was not recorded or timing is disabled."""


class Stream(abc.ABC):
    """An ordered queue of work on one device. Use as a context manager to make it current."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Block the host until all work queued on the stream has finished."""

    @abc.abstractmethod
    def query(self) -> bool:
        """True when all work queued on the stream has finished."""

    @abc.abstractmethod
    def wait_event(self, event: Event) -> None:
        """Make future work on this stream wait for ``event`` (does not block the host)."""

    @abc.abstractmethod
    def record_event(self, event: Optional[Event] = None) -> Event:
        """Record ``event`` (or a new one) on this stream and return it."""

    def wait_stream(self, other: "Stream") -> None:
        """Make future work on this stream wait for all work queued on ``other`` so far."""
        self.wait_event(other.record_event())

    @abc.abstractmethod
    def __enter__(self) -> "Stream": ...

    @abc.abstractmethod
    def __exit__(self, *exc: Any) -> None: ...


# ---------------------------------------------------------------------------------------------
# Host implementation (CPU)
# ---------------------------------------------------------------------------------------------
_host_current = threading.local()


class HostEvent(Event):
    """An event on a host stream: complete when recorded; times with ``perf_counter_ns``."""

    def __init__(self, enable_timing: bool = False):
        self.enable_timing = enable_timing
        self._t_ns: Optional[int] = None

    def record(self, stream: Optional[Stream] = None) -> "HostEvent":
        self._t_ns = time.perf_counter_ns()
        return self

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Event) -> float:
        if not (self.enable_timing and isinstance(end, HostEvent) and end.enable_timing):
            raise RuntimeError("elapsed_time needs two host events created with enable_timing=True")
        if self._t_ns is None or end._t_ns is None:
            raise RuntimeError("elapsed_time needs both events recorded")
        return (end._t_ns - self._t_ns) / 1e6


class HostStream(Stream):
    """A host stream: work issued while it is current runs synchronously, in order."""

    def __init__(self, priority: int = 0):
        self.priority = priority

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def wait_event(self, event: Event) -> None:
        event.synchronize()

    def record_event(self, event: Optional[Event] = None) -> Event:
        return (event or HostEvent()).record(self)

    def __enter__(self) -> "HostStream":
        stack = getattr(_host_current, "stack", None)
        if stack is None:
            stack = _host_current.stack = []
        stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _host_current.stack.pop()


_default_host_stream = HostStream()


def current_host_stream() -> HostStream:
    """The host stream current in this thread (a process-wide default outside any ``with``)."""
    stack = getattr(_host_current, "stack", None)
    return stack[-1] if stack else _default_host_stream


# ---------------------------------------------------------------------------------------------
# Wrappers over torch's device streams (torch.cuda.Stream, torch.mlu.Stream): no SDK import here.
# ---------------------------------------------------------------------------------------------
class TorchEvent(Event):
    """Wraps a ``torch.<device>.Event``. ``raw`` is the framework object."""

    def __init__(self, raw: Any):
        self.raw = raw

    def record(self, stream: Optional[Stream] = None) -> "TorchEvent":
        self.raw.record(stream.raw if isinstance(stream, TorchStream) else None)
        return self

    def synchronize(self) -> None:
        self.raw.synchronize()

    def query(self) -> bool:
        return bool(self.raw.query())

    def elapsed_time(self, end: Event) -> float:
        if not isinstance(end, TorchEvent):
            raise RuntimeError("elapsed_time needs two events of the same backend")
        try:
            return float(self.raw.elapsed_time(end.raw))
        except ValueError as exc:  # torch >= 2.11 raises ValueError for events without timing
            raise RuntimeError(str(exc)) from exc


class TorchStream(Stream):
    """Wraps a ``torch.<device>.Stream``; ``module`` is ``torch.cuda`` or ``torch.mlu``."""

    def __init__(self, raw: Any, module: Any):
        self.raw = raw
        self._module = module
        self._ctx: list = []

    def synchronize(self) -> None:
        self.raw.synchronize()

    def query(self) -> bool:
        return bool(self.raw.query())

    def wait_event(self, event: Event) -> None:
        if not isinstance(event, TorchEvent):
            raise TypeError("a device stream can only wait on an event of its backend")
        self.raw.wait_event(event.raw)

    def record_event(self, event: Optional[Event] = None) -> Event:
        ev = event if event is not None else TorchEvent(self._module.Event())
        return ev.record(self)

    def __enter__(self) -> "TorchStream":
        ctx = self._module.stream(self.raw)
        ctx.__enter__()
        self._ctx.append(ctx)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._ctx.pop().__exit__(*exc)
