"""Shared CLI plumbing: one-line errors with documented exit codes, never a traceback.

:func:`run_cli` parses, runs the handler and maps failures: :class:`CliError` and argparse usage
errors exit 2 with one line on stderr; ``KeyboardInterrupt`` exits 130; an unexpected exception
exits 4 with one line naming it (set ``HAL_DEBUG=1`` to see the traceback).
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Any, Callable

EXIT_OK, EXIT_FAIL_ON, EXIT_USAGE, EXIT_PROGRAM_FAILED, EXIT_INTERNAL = 0, 1, 2, 3, 4


class CliError(Exception):
    """Bad input or usage: printed as one line, exit code ``code`` (2 by default)."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


def add_format(p: argparse.ArgumentParser, choices=("text", "json"), default="text") -> None:
    p.add_argument("--format", choices=choices, default=default, help=f"stdout format (default: {default})")


def emit(text: str) -> None:
    sys.stdout.write(text + ("\n" if not text.endswith("\n") else ""))
    sys.stdout.flush()


def one_line(msg: str) -> str:
    return " ".join(str(msg).split())


def run_cli(parse: Callable[[], Any], handle: Callable[[Any], int], prog: str) -> int:
    try:
        args = parse()
    except SystemExit as exc:  # argparse: --help (0) or usage error (2, message already printed)
        return int(exc.code or 0)
    try:
        return int(handle(args) or 0)
    except CliError as exc:
        sys.stderr.write(f"{prog}: error: {one_line(exc)}\n")
        return exc.code
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        if os.environ.get("HAL_DEBUG"):
            traceback.print_exc()
        sys.stderr.write(f"{prog}: internal error: {type(exc).__name__}: {one_line(exc)} "
                         f"(set HAL_DEBUG=1 for the traceback)\n")
        return EXIT_INTERNAL
