"""hal-audit --precision/--profile end to end (real CLI, real child processes, real models)."""
from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, run_cli


@pytest.fixture(scope="module")
def gpt_cpu(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpt_cpu")
    r = run_cli("hal-audit", "gpt", "--device", "cpu", "--precision", "--profile", "--out", str(out), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return out, json.loads((out / "audit.json").read_text())


def test_profile_section_ops_memory_and_trace(gpt_cpu):
    out, doc = gpt_cpu
    prof = doc["profile"]
    assert prof["verified"] and prof["ops"] and {"op", "calls", "total_ms", "self_ms", "device_ms"} <= set(prof["ops"][0])
    mem = prof["memory"]
    assert mem["estimate_bytes"] > 0 and mem["peak_bytes"] > 0 and abs(mem["error_pct"]) < 25
    trace = json.loads((out / prof["trace"]).read_text())
    assert len(trace["traceEvents"]) > 100
    assert prof["inference"]["rows"][0]["ttft_ms"] > 0
    html = (out / "audit.html").read_text()
    assert "<svg" in html and "Hot spots" in html


def test_precision_section_passes_float32_with_errors_reported(gpt_cpu):
    _, doc = gpt_cpu
    p = doc["precision"]
    assert p["verdict"] == "pass" and p["first_divergence"] is None and p["verified"]
    assert p["metrics"] and p["drift"]["r2"] > 0.99
    assert "## Precision" in (gpt_cpu[0] / "audit.md").read_text()


def test_absent_target_is_measured_on_cpu_and_says_so(tmp_path):
    r = run_cli("hal-audit", "gpt", "--device", "mlu", "--profile", "--steps", "1", "--out", str(tmp_path), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    prof = json.loads((tmp_path / "audit.json").read_text())["profile"]
    assert prof["verified"] is False and "measured on the CPU, not on mlu" in prof["note"]


def test_script_targets_get_a_precision_section(tmp_path):
    """Issue 17: a script target is compared with no code change (it was "not-run" with exit 0 before)."""
    r = run_cli("hal-audit", str(ROOT / "examples" / "cuda_train.py"), "--device", "mlu", "--precision",
                "--steps", "1", "--out", str(tmp_path), timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    p = json.loads((tmp_path / "audit.json").read_text())["precision"]
    assert p["verdict"] in ("pass", "warning") and p["metrics"] and p["verified"] is False
    assert p["summary"]["matched_reference"] > 0 and "measured on the CPU, not on mlu" in p["note"]
