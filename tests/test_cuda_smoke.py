"""hal-audit on a present CUDA device, end to end (real CLI, real child processes, real GPU).

Skips off the GPU with the CUDA backend's own probe reason, prefixed ``cuda:``, so that
``HAL_REQUIRE_BACKENDS=cuda`` (``benchmarks/gpu_suite.sh``) turns a skip into a failure. What it
checks is what only a present device can give: ops measured (``verified``) on cuda, a precision
verdict against the float64 CPU reference, and a profile with device times.
"""
from __future__ import annotations

import json

import pytest

import hal
from tests.conftest import ROOT, run_cli, unmeasured_besides_retries

_INFO = {i.name: i for i in hal.list_backends()}.get("cuda")
pytestmark = pytest.mark.skipif(not (_INFO and _INFO.available),
                                reason=f"cuda: {_INFO.reason if _INFO else 'backend not installed'}")


def test_script_audit_on_cuda_is_measured_there(tmp_path):
    r = run_cli("hal-audit", str(ROOT / "examples" / "cuda_train.py"), "--device", "cuda", "--steps", "2",
                "--out", str(tmp_path), "--format", "json", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((tmp_path / "audit.json").read_text())
    assert doc["target"]["device"] == "cuda" and doc["target"]["available"] and doc["target"]["verified"]
    assert doc["run"]["status"] == "ok" and doc["run"]["device"] == "cuda"
    on_cuda = [o for o in doc["ops"] if o.get("device_type") == "cuda"]
    assert on_cuda and all(o["verified"] and o["status"] in ("native", "composite") for o in on_cuda)
    assert "aten::addmm" in {o["op"] for o in on_cuda} or "aten::mm" in {o["op"] for o in on_cuda}
    # nothing CUDA-specific is redirected when the target is CUDA itself
    assert not [f for f in doc["findings"] if f["rule"].startswith("runtime-redirect-cuda")]


def test_model_audit_on_cuda_with_precision_and_profile(tmp_path):
    r = run_cli("hal-audit", "gpt", "--device", "cuda", "--precision", "--profile", "--steps", "2",
                "--out", str(tmp_path), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((tmp_path / "audit.json").read_text())
    p, prof = doc["precision"], doc["profile"]
    # gpt tiny in float32 on the H200 passed against the float64 CPU reference (reports/h200)
    assert p["verified"] and p["verdict"] == "pass", p.get("verdict_reasons") or p
    assert prof["verified"] and any((o.get("device_ms") or 0) > 0 for o in prof["ops"])
    assert prof["memory"]["peak_bytes"] > 0


def test_script_profile_on_cuda_times_the_device_activity_and_attributes_kernels_to_ops(tmp_path):
    fixture = ROOT / "tests" / "fixtures" / "precision" / "cuda_autocast_train.py"
    r = run_cli("hal-audit", str(fixture), "--device", "cuda", "--profile", "--steps", "2", "--out", str(tmp_path),
                "--format", "json", "--", "--iters", "12", "--batch", "4", "--seq", "32", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    f = json.loads((tmp_path / "audit.json").read_text())["profile"]
    assert f["verified"] and f["errors"] == [], f
    assert unmeasured_besides_retries(f) == [], f
    assert f["activities"] == ["CPU", "CUDA"] and f["schedule"]["attribution_steps"] == 1
    att = f["device_attribution"]
    assert att["timed_activities"] == ["CUDA"] and att["attributed_pct"] > 90, att
    on_device = {o["op"]: o for o in f["ops"] if (o["device_ms"] or 0) > 0}
    assert {"aten::addmm", "aten::mm"} & set(on_device), sorted(on_device)
    # the ops' device time is the timed steps' kernel time, less what no op of the attribution step launched
    assert sum(o["device_ms"] for o in f["ops"]) == pytest.approx(att["device_ms_total"] - att["unattributed_ms"],
                                                                rel=1e-6)
    trace = json.loads((tmp_path / f["trace"]).read_text())["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in trace) and any(e.get("cat") == "cpu_op" for e in trace)
