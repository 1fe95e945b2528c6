"""The ``hal`` command's subcommand registry: modules add ``hal`` subcommands with :func:`subcommand`.

Its own module (not :mod:`hal.cli.main`) so that a subcommand module never imports the ``hal``
entry point: ``python -m hal.cli.main`` runs main as ``__main__``, and a second copy of it would
hold its own, empty registry. Registration happens at import time, from one thread.
"""
from __future__ import annotations

import argparse
from typing import Callable

#: subcommand name -> (configure parser, handler); other modules add entries with :func:`subcommand`
SUBCOMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int], str]] = {}


def subcommand(name: str, help: str):
    """``@subcommand(name, help)(configure)`` on a handler: ``configure(parser)`` adds its options,
    ``handler(args) -> exit code`` runs it."""
    def deco(configure):
        def bind(handler):
            SUBCOMMANDS[name] = (configure, handler, help)
            return handler
        return bind
    return deco
