"""Names a program bound before the audit patched what they name.

A ``mp.spawn`` worker unpickles the program's function, importing the program, before the audit installs its
patches there. A name the program bound with ``from torch.distributed import init_process_group`` still holds
torch's function. :func:`rebind` points such names at the patched values.
"""
from __future__ import annotations

import sys
from typing import Any


def rebind(fn: Any, saved: list[tuple[Any, str, Any]]) -> None:
    """For each patch in ``saved`` (``(owner, name, original)`` triples, as the runtime's installers return them),
    rebind the names that hold ``original`` to ``getattr(owner, name)``, in ``fn``'s globals and in its module
    (multiprocessing runs the main script with runpy: its globals are a dict of their own). Not thread-safe."""
    replaced = {id(original): getattr(owner, name) for owner, name, original in saved}
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    for names in (getattr(fn, "__globals__", None), vars(module) if module is not None else None):
        for key, value in list(names.items()) if names is not None else ():
            if id(value) in replaced:
                names[key] = replaced[id(value)]
