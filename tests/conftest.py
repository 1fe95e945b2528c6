"""Shared fixtures. Tests run against the installed package (``pip install -e .``).

Also, for the whole suite:

- hypothesis profiles: ``ci`` (derandomized: the same examples every run; chosen when ``$CI`` is
  set) and ``dev`` (random, a fresh seed each run); ``$HYPOTHESIS_PROFILE`` picks one explicitly.
- ``HAL_REQUIRE_BACKENDS=cuda[,mlu...]``: a test that skips because a required backend (or its
  kernel toolchain) is not usable here *fails* instead. A device test's skip reason starts with
  ``"<backend>: "`` (the backend's own probe reason); skips for a machine shape the run does not
  have (``need 2 devices``) stay skips. ``triton-interpret`` names the CUDA kernels' CPU toolchain
  (tests/test_triton_interpret.py: Triton's interpreter), required by ``make test-triton-interpret``.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent


_HYP = dict(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", derandomize=True, print_blob=True, **_HYP)
settings.register_profile("dev", **_HYP)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))

#: skip reasons that name a machine shape, not a missing backend (stay skips under HAL_REQUIRE_BACKENDS)
SHAPE_SKIPS = ("need 2 devices",)


def cuda_backend_missing() -> str:
    """'' when HAL's CUDA backend is available here, else its own reason, prefixed "cuda:" (as
    :func:`triton_gpu_missing`)."""
    import hal
    info = {i.name: i for i in hal.list_backends()}.get("cuda")
    return "" if info is not None and info.available else f"cuda: {info.reason if info else 'backend not installed'}"


def triton_gpu_missing() -> str:
    """'' when the Triton kernels can run here (torch.cuda and Triton; CuPy is not needed), else why not,
    prefixed "cuda:" so that HAL_REQUIRE_BACKENDS=cuda turns the skip into a failure."""
    import torch
    if not torch.cuda.is_available():
        return f"cuda: torch.cuda.is_available() is False (torch {torch.__version__})"
    try:
        import triton  # noqa: F401
    except Exception as exc:
        return f"cuda: triton is not importable ({type(exc).__name__}: {exc})"
    return ""


def required_backends() -> tuple[str, ...]:
    """Backends named in ``$HAL_REQUIRE_BACKENDS`` (comma-separated), lower case."""
    return tuple(b.strip().lower() for b in os.environ.get("HAL_REQUIRE_BACKENDS", "").split(",") if b.strip())


def _skip_reason(report) -> str:
    lr = report.longrepr
    text = lr[2] if isinstance(lr, tuple) and len(lr) == 3 else str(lr)
    return text.removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under ``HAL_REQUIRE_BACKENDS``, a skip of a required backend's test becomes a failure."""
    outcome = yield
    report = outcome.get_result()
    required = required_backends()
    if not required or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if any(reason.lower().startswith(f"{b}:") for b in required) and not any(s in reason for s in SHAPE_SKIPS):
        report.outcome = "failed"
        report.longrepr = f"HAL_REQUIRE_BACKENDS={','.join(required)}: a required backend's test skipped: {reason}"


@pytest.fixture(autouse=True)
def _no_explicit_backend(monkeypatch):
    """Tests choose backends explicitly; a developer's $HAL_BACKEND must not leak in."""
    monkeypatch.delenv("HAL_BACKEND", raising=False)
    monkeypatch.delenv("HAL_FALLBACK", raising=False)


@pytest.fixture(autouse=True)
def _no_torch_mode_left_on_the_stack():
    """A test that leaves a torch dispatch or function mode on the stack fails here, by name, and the modes are
    taken off: left there, a mode sees every op of the worker's later tests (a random-stream mode a hook install
    left behind broke ONNX exports two files later)."""
    yield
    torch = sys.modules.get("torch")
    if torch is None:
        return
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack, _pop_mode
    left = [*_get_current_dispatch_mode_stack(), *_get_current_function_mode_stack()]
    if not left:
        return
    while _get_current_dispatch_mode_stack():
        _pop_mode()
    while _get_current_function_mode_stack():
        torch._C._pop_torch_function_stack()
    pytest.fail(f"the test left torch modes on the stack: {', '.join(type(m).__name__ for m in left)}")


def run_cli(*args: str, env: dict | None = None, cwd: str | Path | None = None, timeout: float = 300,
            input: str | None = None) -> subprocess.CompletedProcess:
    """Run a console script of this package in a subprocess (real entry point, real process)."""
    full_env = dict(os.environ)
    full_env.pop("HAL_BACKEND", None)
    full_env.update(env or {})
    exe = Path(sys.executable).parent / args[0]
    return subprocess.run([str(exe), *args[1:]], capture_output=True, text=True, env=full_env,
                          cwd=cwd, timeout=timeout, input=input)


def unmeasured_besides_retries(profile: dict) -> list:
    """A profile section's ``not_measured`` lines other than the audit's retry line: torch.profiler crashes a child
    now and then (SIGSEGV stopping a session), and the audit runs it again and says "N profiled run(s) crashed before
    this one" (``conformance/workload_audit.py``)."""
    return [m for m in profile["not_measured"] if "crashed before this one" not in m]


def free_port() -> str:
    """A TCP port free on this machine now, for the rendezvous of a fixture's ranks."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])
