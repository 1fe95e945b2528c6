"""Precision comparison on the reference workloads (hal.models) and checkpoint portability."""
from __future__ import annotations

import json
import subprocess
import sys

import torch

from hal.conformance.precision import check_checkpoint_portability, compare_workload


def test_gpt_tiny_float32_passes_and_compares_every_level():
    res = compare_workload("gpt", device="cpu", steps=2)
    assert res.verdict == "pass", res.summary["verdict_reasons"]
    s = res.summary
    assert s["ops"] > 50 and s["shadowed"] == s["ops"] and s["matched_reference"] == s["ops"]
    assert s["gradients"] == s["parameters"] > 0 and s["modules"] > 10
    # backward ops are attributed to the module whose forward created them
    bwd = {r["module"] for r in res.rows(kind="op", phase="backward")}
    assert any(m.startswith("blocks.0.") for m in bwd)
    assert res.drift["r2"] > 0.999
    json.dumps(res.as_dict())


def test_cnn_tiny_bfloat16_autocast_reports_bfloat16_errors():
    res = compare_workload("cnn", device="cpu", autocast=torch.bfloat16, steps=2)
    conv = [r for r in res.rows(kind="op", phase="forward") if r["op"] == "convolution"]
    assert conv and all(r["dtype"] == "bfloat16" for r in conv)
    assert all(not r["local"]["exceeds"] for r in conv)
    assert res.as_dict()["target"]["autocast"] == "bfloat16"
    # the forward convolutions are within bf16 tolerance (above); whatever is judged must name its
    # cause: a failure is an op that introduced error in the backward pass (bf16 conv backward on the
    # CPU), a warning lists its reasons; "pass" would mean bf16 errors went unreported
    fd = res.first_divergence
    if res.verdict == "fail":
        assert fd is not None and fd["kind"] == "introduced" and fd["phase"] == "backward", fd
    else:
        assert res.verdict == "warning" and res.summary["verdict_reasons"], res.verdict
    assert res.drift["max_rel_dev"] < 0.05


def test_checkpoint_portability_cpu_to_cpu():
    out = check_checkpoint_portability("gpt", "cpu", "cpu", steps=1, resume_steps=2)
    assert out["match"] is True and out["max_rel_dev"] <= out["tolerance"]
    assert len(out["losses_resumed"]) == 2 and out["checkpoint_bytes"] > 0


def test_cli_writes_json_and_markdown(tmp_path):
    out = tmp_path / "cpu-cnn.json"
    p = subprocess.run([sys.executable, "-m", "hal.conformance.precision", "--model", "cnn", "--device", "cpu",
                        "--steps", "2", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    assert doc["reference"] == {"device": "cpu", "dtype": "float64"} and doc["verdict"] in ("pass", "warning")
    assert (tmp_path / "cpu-cnn.md").read_text().startswith("# Precision: cnn")
