"""The runtime audit through the real ``hal-audit`` console script: exit codes and audit.json."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli

FIX = Path(__file__).resolve().parent / "fixtures" / "runtime"


def _report(out: Path) -> dict:
    return json.loads((out / "audit.json").read_text())


def test_cli_cuda_training_script_audits_for_mlu_on_this_machine(tmp_path):
    p = run_cli("hal-audit", str(FIX / "cuda_train.py"), "--device", "mlu", "--steps", "2", "--out", str(tmp_path),
                "--format", "json", "--", "50")
    assert p.returncode == 0, p.stderr
    rep = _report(tmp_path)
    assert rep["run"]["status"] == "ok" and rep["run"]["steps"] == 2
    assert rep["target"]["device"] == "mlu" and rep["target"]["verified"] is False
    assert any(o["op"] == "aten::addmm" for o in rep["ops"])
    rules = {f["rule"] for f in rep["findings"]}
    assert {"runtime-redirect-cuda-device", "runtime-redirect-autocast", "runtime-redirect-grad-scaler"} <= rules


def test_cli_fail_on_fallback_exits_1(tmp_path):
    p = run_cli("hal-audit", str(FIX / "fallback_ops.py"), "--device", "mlu", "--steps", "1", "--out", str(tmp_path),
                "--fail-on", "fallback", "--format", "json")
    rep = _report(tmp_path)
    fallbacks = {o["op"] for o in rep["ops"] if o["status"] == "fallback"}
    assert p.returncode == 1 and "aten::mode" in fallbacks, (p.returncode, p.stderr[-500:])


# the crash gets a long bound (it exits at once; a short one could turn a slow start into "timeout")
@pytest.mark.parametrize("script,status,bound", [("crash_os_exit.py", "crashed", "120"),
                                                 ("crash_hang.py", "timeout", "12")])
def test_cli_failing_program_exits_3_with_a_report(tmp_path, script, status, bound):
    p = run_cli("hal-audit", str(FIX / script), "--device", "mlu", "--timeout", bound, "--out", str(tmp_path),
                "--format", "json")
    assert p.returncode == 3, p.stderr[-500:]
    rep = _report(tmp_path)
    assert rep["run"]["status"] == status and rep["run"]["error"]
