"""Command-line plumbing shared by every HAL command (``hal``, ``hal-audit``, ``python -m hal.models.run``,
the precision and profiling mains): one-line errors with documented exit codes, never a traceback.

It lives in the core so that models and the suite share it without importing the CLI package.

:func:`run_cli` parses, runs the handler and maps failures: :class:`CliError` and argparse usage
errors exit 2 with one line on stderr (parsers built with :class:`Parser` report a usage error as
one ``PROG: error: ...`` line, not a usage block); ``KeyboardInterrupt`` exits 130 and SIGTERM 143 (while the
handler runs, SIGTERM raises :class:`Terminated` in the main thread, so the ``finally`` blocks of the work in flight
run: the audit's child processes are killed, not left running after a ``timeout``, a CI job's cancel or torchrun
ending its workers); an unexpected exception exits 4 with one line naming it (set ``HAL_DEBUG=1`` to see the
traceback).
:func:`check_number` validates a numeric option (finite, in range) with a one-line CliError.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
import threading
import traceback
from typing import Any, Callable

EXIT_OK, EXIT_FAIL_ON, EXIT_USAGE, EXIT_PROGRAM_FAILED, EXIT_INTERNAL = 0, 1, 2, 3, 4
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143


class Terminated(BaseException):
    """SIGTERM arrived while a command ran (:func:`run_cli`); a BaseException, so ``except Exception`` passes it
    on to the ``finally`` blocks that stop the command's child processes."""


class CliError(Exception):
    """Bad input or usage: printed as one line, exit code ``code`` (2 by default)."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors raise :class:`CliError` (one line, exit 2).

    Subparsers made by ``add_subparsers`` inherit the class. ``--help`` still prints and exits 0.
    """

    def error(self, message: str):  # type: ignore[override]
        raise CliError(f"{message} (see {self.prog} --help)")


def check_number(option: str, value, *, minimum=None, maximum=None, above=None, integer: bool = False,
                 what: str = "") -> None:
    """Raise CliError unless ``value`` (None passes) is finite and within the bounds.

    ``minimum``/``maximum`` are inclusive, ``above`` exclusive. The message reads
    ``--timeout must be a finite number of seconds > 0 and at most 1e+06, not nan``.
    """
    if value is None:
        return
    try:
        ok = math.isfinite(value)
    except TypeError:
        ok = False
    if ok:
        ok = ((minimum is None or value >= minimum) and (maximum is None or value <= maximum)
              and (above is None or value > above))
    if ok:
        return
    def num(x) -> str:
        return str(int(x)) if isinstance(x, (int, float)) and math.isfinite(x) and float(x).is_integer() \
            and abs(x) < 1e15 else f"{x:g}"

    bounds = []
    if above is not None:
        bounds.append(f"> {num(above)}")
    if minimum is not None and not (what.startswith("a positive") and minimum == 1):
        bounds.append(f"at least {num(minimum)}")
    if maximum is not None:
        bounds.append(f"at most {num(maximum)}")
    kind = what or ("an integer" if integer else "a finite number")
    shown = num(value) if isinstance(value, (int, float)) else repr(value)
    raise CliError(f"{option} must be {kind} {' and '.join(bounds)}, not {shown}".replace("  ", " "))


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help when it has a real default (not None or False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.default not in (None, False, argparse.SUPPRESS) and "%(default)" not in text
                and action.option_strings and "default:" not in text):
            text += " (default: %(default)s)"
        return text


def add_version(p: argparse.ArgumentParser) -> None:
    """``--version``: prints ``PROG VERSION`` (the installed distribution's version) and exits 0."""
    from hal import __version__
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


def add_format(p: argparse.ArgumentParser, choices=("text", "json"), default="text") -> None:
    p.add_argument("--format", choices=choices, default=default, help=f"stdout format (default: {default})")


def emit(text: str) -> None:
    sys.stdout.write(text + ("\n" if not text.endswith("\n") else ""))
    sys.stdout.flush()


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def one_line(msg: str) -> str:
    """``msg`` on one line, control characters (terminal escape sequences) shown as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", " ".join(str(msg).split()))


def run_cli(parse: Callable[[], Any], handle: Callable[[Any], int], prog: str) -> int:
    try:
        args = parse()
    except SystemExit as exc:  # argparse: --help (0) or usage error (2, message already printed)
        return int(exc.code or 0)
    except CliError as exc:
        sys.stderr.write(f"{prog}: error: {one_line(exc)}\n")
        return exc.code
    previous = _raise_on_sigterm()
    try:
        return int(handle(args) or 0)
    except CliError as exc:
        sys.stderr.write(f"{prog}: error: {one_line(exc)}\n")
        return exc.code
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return EXIT_INTERRUPTED
    except Terminated:
        sys.stderr.write(f"{prog}: terminated (SIGTERM)\n")
        return EXIT_TERMINATED
    except BrokenPipeError:
        return 0
    except Exception as exc:
        if os.environ.get("HAL_DEBUG"):
            traceback.print_exc()
        sys.stderr.write(f"{prog}: internal error: {type(exc).__name__}: {one_line(exc)} "
                         f"(set HAL_DEBUG=1 for the traceback)\n")
        return EXIT_INTERNAL
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _raise_on_sigterm() -> Any:
    """Make SIGTERM raise :class:`Terminated` (main thread only; elsewhere nothing changes); returns the handler it
    replaced, or None when it changed nothing."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def terminated(_signum: int, _frame: Any) -> None:
        raise Terminated()
    try:
        return signal.signal(signal.SIGTERM, terminated)
    except (ValueError, OSError):  # pragma: no cover - no signals here
        return None
