"""The ``--precision`` / ``--profile`` hooks of a runtime run (the audit's child and its ``mp.spawn`` workers).

The spec's ``section_hooks`` names their factory as ``"module:function"``, called with ``(spec, modules,
limiter)``, so the runtime never imports the suites that drive it; each hook has ``result() -> dict``.
"""
from __future__ import annotations

from typing import Any


def install_hooks(spec: dict, modules: Any, limiter: Any) -> list:
    """The hooks ``spec`` asks for, installed by their factory (none without ``section_hooks``)."""
    factory = spec.get("section_hooks")
    if not factory:
        return []
    import importlib
    module, _, name = factory.partition(":")
    return getattr(importlib.import_module(module), name)(spec, modules, limiter)


def hook_results(hooks: list) -> dict:
    """Each hook's result keys; a hook that fails says so under ``hook_errors`` (never raises)."""
    out: dict = {}
    for h in hooks:
        try:
            out.update(h.result())
        except Exception as exc:
            out.setdefault("hook_errors", []).append(f"{type(h).__name__}: {type(exc).__name__}: {exc}"[:500])
    return out
