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


def _hal_audit(*args: str):
    """``hal-audit ARGS`` started (not waited for), its output piped."""
    import os
    import subprocess
    import sys
    exe = Path(sys.executable).parent / "hal-audit"
    return subprocess.Popen([str(exe), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={k: v for k, v in os.environ.items() if k != "HAL_BACKEND"})


def test_a_terminated_hal_audit_takes_the_audited_program_and_its_children_down_and_reports(tmp_path):
    """SIGTERM to hal-audit (a ``timeout`` command, a CI job cancelled, torchrun ending its workers) killed it and left
    the audited program running; now the program's process group is killed, the report is still written (the run
    stopped, ``run.interrupted``), and hal-audit exits 143."""
    import signal
    import time

    import psutil
    proc = _hal_audit(str(FIX / "hang_with_child.py"), "--device", "mlu", "--timeout", "300",
                      "--out", str(tmp_path / "out"))
    try:
        deadline, grandchild = time.monotonic() + 120, None
        while grandchild is None and time.monotonic() < deadline:  # the program's own child is up: all are running
            kids = psutil.Process(proc.pid).children(recursive=True)
            grandchild = next((k for k in kids if "sleep(3600)" in " ".join(k.cmdline())), None)
            time.sleep(0.2)
        assert grandchild is not None, "the program never started its child"
        kids = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and "hal-audit: terminated (SIGTERM)" in err.strip().splitlines()[-1], (out, err)
    _, alive = psutil.wait_procs(kids, timeout=10)
    assert not [k for k in alive if k.status() != psutil.STATUS_ZOMBIE], alive
    run = _report(tmp_path / "out")["run"]
    assert run["status"] == "error" and run["interrupted"] == "SIGTERM", run
    assert "interrupted (SIGTERM)" in run["error"] and "grandchild" in " ".join(run["output_tail"]), run


def test_ctrl_c_stops_the_program_and_the_report_keeps_what_ran(tmp_path):
    """Ctrl-C (SIGINT to hal-audit alone: the program runs in its own session, out of the terminal's reach) during a
    long training run: the program is stopped as at the timeout, the report holds its steps and captured ops, the
    sections not reached say why, and hal-audit exits 130 with one line naming the report."""
    import signal
    import time
    marker = tmp_path / "two-steps-done"
    proc = _hal_audit(str(FIX / "slow_train.py"), "--device", "mlu", "--steps", "1000", "--precision", "--profile",
                      "--format", "json", "--out", str(tmp_path / "out"), "--", str(marker))
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), "the program never reached its second step"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert err.strip().splitlines()[-1].startswith("hal-audit: interrupted: the program was stopped; the report in"), err
    rep = _report(tmp_path / "out")
    assert json.loads(out)["run"]["interrupted"] == "SIGINT"  # stdout still gets the report
    run = rep["run"]
    assert run["status"] == "error" and run["interrupted"] == "SIGINT" and run["steps"] >= 2, run
    assert run["error"].startswith("the audit was interrupted (Ctrl-C) and the program was stopped after"), run
    assert any(o["op"] == "aten::addmm" for o in rep["ops"]), rep["ops"]
    for section in ("precision", "profile"):
        assert rep[section]["verdict"] == "not-run" and "interrupted (Ctrl-C)" in rep[section]["reason"], rep[section]
