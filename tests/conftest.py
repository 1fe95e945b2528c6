"""Shared fixtures. Tests run against the installed package (``pip install -e .``)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_explicit_backend(monkeypatch):
    """Tests choose backends explicitly; a developer's $HAL_BACKEND must not leak in."""
    monkeypatch.delenv("HAL_BACKEND", raising=False)
    monkeypatch.delenv("HAL_FALLBACK", raising=False)


def run_cli(*args: str, env: dict | None = None, cwd: str | Path | None = None, timeout: float = 300,
            input: str | None = None) -> subprocess.CompletedProcess:
    """Run a console script of this package in a subprocess (real entry point, real process)."""
    full_env = dict(os.environ)
    full_env.pop("HAL_BACKEND", None)
    full_env.update(env or {})
    exe = Path(sys.executable).parent / args[0]
    return subprocess.run([str(exe), *args[1:]], capture_output=True, text=True, env=full_env,
                          cwd=cwd, timeout=timeout, input=input)
