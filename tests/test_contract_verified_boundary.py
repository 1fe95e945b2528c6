"""Where "verified" stops: torch_mlu's fallback warning is a measurement only on an MLU run.

Both ways, against the real child process and the real ops builder:

- a program that prints torch_mlu's warning text while running on the CPU never yields an MLU
  fallback, verified or not (the warning is just program output there);
- the same warning in a run whose device is an MLU (a stand-in: the spec says ``run_device: mlu``
  and the op records carry ``device_type: mlu``) is a measured fallback, and only for the op it
  names.

No MLU is involved: these are contract tests of the warning -> ops pipeline (``test_contract_*``).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hal.conformance.runtime import audit_target
from hal.conformance.runtime.predict import build_ops, measured_status

FIX = Path(__file__).resolve().parent / "fixtures" / "runtime"
STANDIN = FIX / "mlu_warning_standin.py"


def _child(tmp_path: Path, run_device: str) -> dict:
    """Run the audit child on the stand-in script with ``run_device`` and return its raw result."""
    result = tmp_path / f"result-{run_device}.json"
    spec = {"target": str(STANDIN), "kind": "script", "args": [], "steps": None, "timeout": 60,
            "run_device": run_device, "redirect_cuda": False, "result_path": str(result), "mode": "train"}
    spec_path = tmp_path / f"spec-{run_device}.json"
    spec_path.write_text(json.dumps(spec))
    p = subprocess.run([sys.executable, "-m", "hal.conformance.runtime.child", str(spec_path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(result.read_text())


def _rec(op: str, device_type: str) -> dict:
    return {"op": op, "count": 2, "dtypes": ["float32"], "phase": "forward", "device_type": device_type,
            "bytes": 400, "modules": [], "shapes": []}


@pytest.mark.contract
def test_contract_child_counts_mlu_warnings_only_on_an_mlu_run(tmp_path):
    on_cpu = _child(tmp_path, "cpu")
    assert on_cpu["run"]["status"] == "ok" and on_cpu["mlu_fallbacks"] == {}
    on_mlu = _child(tmp_path, "mlu")  # the stand-in prints the warning; the spec says the run is an MLU's
    assert on_mlu["mlu_fallbacks"] == {"aten::mode": 1}


@pytest.mark.contract
def test_contract_warning_on_a_cpu_run_is_never_a_verified_mlu_fallback():
    """The end-to-end CPU audit of the stand-in: mode ran natively on the CPU (measured there)."""
    s = audit_target({"target": str(STANDIN), "kind": "script", "device": "cpu", "args": [], "steps": None,
                      "timeout": 60, "precision": False, "profile": False, "out": None})
    mode = [o for o in s["ops"] if o["op"] == "aten::mode"]
    assert mode and all(o["status"] == "native" and o["device_type"] == "cpu" for o in mode), mode
    assert not any(o["status"] == "fallback" for o in s["ops"])


@pytest.mark.contract
def test_contract_builder_honours_warnings_only_for_mlu_runs():
    recs = [_rec("aten::mode", "cpu"), _rec("aten::addmm", "cpu")]
    warned = {"aten::mode": 1}
    # a CPU target measured on the CPU, with the warning text in the log: still native
    cpu = {o["op"]: o for o in build_ops(recs, "cpu", 1, {"device_type": "cpu", "mlu_fallbacks": warned})}
    assert cpu["aten::mode"]["status"] == "native" and cpu["aten::mode"]["verified"] is True
    assert cpu["aten::mode"]["bytes_per_step"] == 0
    # an MLU run: the ops ran on mlu tensors; the named op is a measured fallback, the other native
    mrecs = [_rec("aten::mode", "mlu"), _rec("aten::addmm", "mlu")]
    mlu = {o["op"]: o for o in build_ops(mrecs, "mlu", 2, {"device_type": "mlu", "mlu_fallbacks": warned})}
    assert mlu["aten::mode"]["status"] == "fallback" and mlu["aten::mode"]["verified"] is True
    assert mlu["aten::mode"]["bytes_per_step"] == 200 and mlu["aten::mode"]["calls_per_step"] == 1.0
    # ran there: the dispatcher's word for the MLU key (composite on this stand-in: no torch_mlu kernel)
    assert mlu["aten::addmm"]["status"] == measured_status("aten::addmm", "mlu")[0] in ("native", "composite")
    assert mlu["aten::addmm"]["verified"] is True
    # the warning names aten::mode with a trailing .default just as well
    dflt = build_ops(mrecs, "mlu", 1, {"device_type": "mlu", "mlu_fallbacks": {"aten::mode.default": 3}})
    assert {o["op"]: o["status"] for o in dflt}["aten::mode"] == "fallback"


@pytest.mark.contract
def test_contract_ops_that_ran_on_another_device_are_never_verified():
    """An MLU audit whose run happened on the CPU: nothing is verified, captured or from hal.ops."""
    recs = [_rec("aten::addmm", "cpu")]
    hal_fb = [{"hal_op": "rms_norm", "op": "aten::rms_norm", "device_type": "cpu", "calls": 4, "bytes": 64,
               "dtypes": ["float32"], "shapes": [[[2, 4]]], "reason": "no mlu implementation"}]
    # predicted (target absent): measured is None
    ops = build_ops(recs, "mlu", 2, None, hal_fb)
    assert ops and not any(o["verified"] for o in ops)
    # measured on an MLU, but these records ran on the CPU (e.g. a host-side tensor): not verified
    ops = build_ops(recs, "mlu", 2, {"device_type": "mlu", "mlu_fallbacks": {}}, hal_fb)
    assert ops and not any(o["verified"] for o in ops), ops
    # the hal.ops fallback that really ran on the MLU is a measured fallback: 4 calls / 2 steps, 64 B / 2
    fb_mlu = [dict(hal_fb[0], device_type="mlu")]
    ops = build_ops([], "mlu", 2, {"device_type": "mlu", "mlu_fallbacks": {}}, fb_mlu)
    assert len(ops) == 1 and ops[0]["verified"] is True and ops[0]["status"] == "fallback"
    assert ops[0]["calls_per_step"] == 2.0 and ops[0]["bytes_per_step"] == 32
