"""``HAL_REQUIRE_BACKENDS`` (tests/conftest.py): a skip of a required backend's test is a failure.

Runs pytest in a subprocess on a throwaway test file that skips three ways, with this project's
conftest loaded as a plugin: a CUDA-backend skip, a machine-shape skip (``need 2 devices``) and an
unrelated skip. Works the same on any machine (the skips are unconditional)."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT

SKIPS = '''import pytest

def test_needs_cuda():
    pytest.skip("cuda: cupy is not importable (stand-in reason)")

@pytest.mark.skipif(True, reason="cuda: torch.cuda.is_available() is False (stand-in)")
def test_kernel():
    pass

def test_needs_two_gpus():
    pytest.skip("cuda: collectives need 2 devices, 1 visible")

def test_unrelated():
    pytest.skip("onnx is not installed")
'''


def _pytest(tmp_path, required: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "test_skips.py").write_text(SKIPS)
    env = {k: v for k, v in os.environ.items() if k != "HAL_REQUIRE_BACKENDS"}
    if required is not None:
        env["HAL_REQUIRE_BACKENDS"] = required
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:randomly",
                           "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "-c", os.devnull,
                           str(tmp_path / "test_skips.py")],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def test_required_backend_skips_fail_and_others_stay_skips(tmp_path):
    p = _pytest(tmp_path, "cuda")
    assert p.returncode == 1, p.stdout[-2000:]
    last = p.stdout.strip().splitlines()[-1]
    # the call-time skip fails in the call, the skipif mark fails in setup (an error); the others stay
    assert last.startswith("1 failed, 2 skipped, 1 error"), last
    assert "HAL_REQUIRE_BACKENDS=cuda: a required backend's test skipped: cuda: cupy is not importable" in p.stdout


def test_without_the_variable_skips_are_skips(tmp_path):
    p = _pytest(tmp_path, None)
    assert p.returncode == 0 and "4 skipped" in p.stdout.strip().splitlines()[-1], p.stdout[-2000:]
    p = _pytest(tmp_path, "mlu")  # another backend required: the cuda skips stay skips
    assert p.returncode == 0 and "4 skipped" in p.stdout.strip().splitlines()[-1], p.stdout[-2000:]
