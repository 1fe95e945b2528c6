"""Progress of a long command on stderr (rich), silent unless stderr is a terminal.

    progress = make_progress(["scan", "run", "write"], quiet=args.quiet)
    with progress:
        progress("scan")                    # a phase starts (the bar advances one phase)
        progress("run", steps=3, ops=41)    # the same phase, new counts ("step 3, 41 ops seen")

Contract: nothing is written anywhere when ``quiet`` is true, when ``stream`` (default
``sys.stderr``) is not a TTY, or when ``TERM=dumb``; rich is then not even imported. The display is
transient (cleared when the ``with`` block ends, also on an error), so stdout and the one-line
error of a failing command are never mixed with it. Every call is drawn at once (a phase shorter than
rich's refresh tick is still shown, with its counts). Calls are thread-safe (rich's Progress locks).
A phase name not in the list is shown without advancing the bar.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Optional, Sequence, TextIO

#: every phase hal-audit can go through, in order
AUDIT_PHASES = ("scan", "run", "capture", "predict", "precision", "profile", "write")


class NullProgress:
    """Does nothing (not a terminal, or ``--quiet``)."""

    enabled = False

    def __call__(self, phase: str, **counts: Any) -> None:
        pass

    def __enter__(self) -> "NullProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class RichProgress(NullProgress):
    """A one-line transient bar: spinner, phase, ``done/total`` phases, counts, elapsed time."""

    enabled = True

    def __init__(self, phases: Sequence[str], stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
        self.phases = list(phases)
        self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(bar_width=20),
                             TextColumn("{task.completed}/{task.total}", markup=False),
                             TextColumn("{task.fields[detail]}", markup=False), TimeElapsedColumn(),
                             console=Console(file=stream, force_terminal=True), transient=True)
        self._task = self._bar.add_task("starting", total=len(self.phases), detail="")

    def __call__(self, phase: str, **counts: Any) -> None:
        detail = ", ".join(_count(k, v) for k, v in counts.items() if v is not None)
        done = self.phases.index(phase) if phase in self.phases else None
        self._bar.update(self._task, description=phase, detail=detail, refresh=True,
                         **({"completed": done} if done is not None else {}))

    def __enter__(self) -> "RichProgress":
        self._bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bar.stop()


def _count(key: str, value: Any) -> str:
    if key == "steps":
        return f"step {value}"
    if key == "ops":
        return f"{value} ops seen"
    return f"{key.replace('_', ' ')} {value}"


def make_progress(phases: Sequence[str], quiet: bool = False, stream: Optional[TextIO] = None) -> NullProgress:
    """A :class:`RichProgress` on ``stream`` (default stderr) when it is a terminal and not ``quiet``,
    else a :class:`NullProgress`."""
    stream = sys.stderr if stream is None else stream
    if quiet or os.environ.get("TERM") == "dumb":
        return NullProgress()
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # closed or replaced stream
        tty = False
    if not tty:
        return NullProgress()
    try:
        return RichProgress(phases, stream)
    except ImportError:  # rich missing from a broken install: no progress, never a failure
        return NullProgress()
