"""The ``--precision`` / ``--profile`` hooks of a runtime run (the audit's child and its ``mp.spawn`` workers).

The spec's ``section_hooks`` names their factory as ``"module:function"``, called with ``(spec, modules,
limiter)``, so the runtime never imports the suites that drive it. Each hook has ``result() -> dict`` and
``disown()``: called in a process the program forks from the one that installed it, where the hook must stop
acting (the sections follow the audited process and the ``mp.spawn`` ranks, never a fork of them).
"""
from __future__ import annotations

import os
from typing import Any


def install_hooks(spec: dict, modules: Any, limiter: Any) -> list:
    """The hooks ``spec`` asks for, installed by their factory (none without ``section_hooks``). A process the
    program forks afterwards (a DataLoader worker, ``multiprocessing`` with the fork start method) calls each one's
    ``disown()`` as it starts (``os.register_at_fork``; a failure there is ignored: the fork must go on)."""
    factory = spec.get("section_hooks")
    if not factory:
        return []
    import importlib
    module, _, name = factory.partition(":")
    hooks = getattr(importlib.import_module(module), name)(spec, modules, limiter)
    if hooks:
        os.register_at_fork(after_in_child=lambda: _disown(hooks))
    return hooks


def take_back(handles: list, saved: list) -> None:
    """What a hook installed, taken back: each of ``handles`` (torch hook handles) removed and each ``(owner, name,
    value)`` of ``saved`` set back, the latest first; both lists are emptied."""
    for h in handles:
        h.remove()
    handles.clear()
    for owner, name, value in reversed(saved):
        setattr(owner, name, value)
    saved.clear()


def _disown(hooks: list) -> None:
    for h in reversed(hooks):  # the last installed first: each puts back what it found (another hook's patch maybe)
        try:
            h.disown()
        except Exception:  # never disturb the program's fork
            pass


def hook_results(hooks: list) -> dict:
    """Each hook's result keys; a hook that fails says so under ``hook_errors`` (never raises)."""
    out: dict = {}
    for h in hooks:
        try:
            out.update(h.result())
        except Exception as exc:
            out.setdefault("hook_errors", []).append(f"{type(h).__name__}: {type(exc).__name__}: {exc}"[:500])
    return out
