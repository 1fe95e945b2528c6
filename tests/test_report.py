"""The one report writer: audit.json contract, escaping, SARIF 2.1.0, generic sections, --out safety."""
import json
import os
import pathlib

import pytest

from hal.conformance import report as rep
from hal.conformance.migration import CATALOGUE, audit_static
from hal.conformance.report.render import SECTIONS, SORT_JS, register_section, to_html, to_markdown

EVIL = "<script>alert(1)</script>"
EVIL_NAME = "<script>alert(1)"  # the same, as a file name (no slash)


def sample(tmp_path) -> tuple[dict, pathlib.Path]:
    root = tmp_path / f"proj{EVIL_NAME}"
    root.mkdir()
    (root / f"m{EVIL_NAME}.py").write_text(
        "import torch\n"
        f"x = torch.ones(1, device='cuda')  # {EVIL}\n"
        "torch.cuda.synchronize()\n")
    res = audit_static(root, "mlu")
    findings = [f.as_dict() for f in res.findings]
    findings.append({"rule": "cuda-api", "path": f"m{EVIL_NAME}.py", "line": 3, "column": 1, "severity": "warning",
                     "message": f"identifier {EVIL} & \"quotes\" | pipes", "fix": f"use {EVIL}"})
    report = rep.new_report({"device": "mlu", "available": False, "verified": False, "reason": f"no {EVIL}",
                             "source": str(root)},
                            run={"status": "ok", "steps": 2, "seconds": 1.5, "error": None},
                            findings=findings,
                            ops=[{"op": "aten::nanmedian", "count": 3, "dtypes": ["float32"], "status": "fallback",
                                  "reason": f"no kernel {EVIL}", "bytes": 4096}],
                            precision={"reference": "float64", "metrics": {"cosine": 0.999},
                                       "first_divergence": {"module": f"layer{EVIL}", "op": "aten::mm",
                                                            "metric": "max_abs", "value": 0.1, "threshold": 1e-3}},
                            profile={"device_time_us": 12.5, "per_op": [{"op": "aten::mm", "us": 10.0}]},
                            static=res.stats())
    return report, root


def test_report_has_every_contract_key(tmp_path):
    report, _ = sample(tmp_path)
    assert rep.validate(report) == []
    assert set(rep.REQUIRED_KEYS) <= set(report)
    s = report["summary"]
    assert s["by_severity"] == {"error": 2, "warning": 1, "info": 0} and s["ops"] == {"fallback": 1}
    assert s["precision_diverged"] is True and s["fixable"]["device"] == 2
    assert rep.validate({"schema": "x"})  # problems are reported


def test_html_escapes_every_user_string(tmp_path):
    report, _ = sample(tmp_path)
    page = to_html(report)
    # the one script element is ours (table sorting), pinned by the page's Content-Security-Policy hash
    assert page.lower().count("<script") == 1 and f"<script>{SORT_JS}</script>" in page
    assert "script-src 'sha256-" in page and "default-src 'none'" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.startswith("<!DOCTYPE html>")
    assert "://" not in page and " src=" not in page  # self-contained: no external resource
    for title in ("Findings", "Operators", "Precision", "Profile", "Environment"):
        assert f"<h2>{title}</h2>" in page
    assert "aten::nanmedian" in page and "first_divergence" in page and "per_op" in page


def test_markdown_escapes_tables(tmp_path):
    report, _ = sample(tmp_path)
    md = to_markdown(report)
    assert "<script>" not in md and "\\| pipes" in md
    assert all(line.count("|") - line.count("\\|") >= 2 for line in md.splitlines() if line.startswith("| "))


def test_sarif_2_1_0(tmp_path):
    report, root = sample(tmp_path)
    sarif = json.loads(rep.render(report, "sarif", CATALOGUE, str(root)))
    assert sarif["version"] == "2.1.0" and sarif["$schema"].endswith("sarif-2.1.0.json")
    run = sarif["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert {r["id"] for r in rules} == set(CATALOGUE)
    res = run["results"][0]
    assert rules[res["ruleIndex"]]["id"] == res["ruleId"] == "device-string"
    assert res["level"] == "error"
    loc = res["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uriBaseId"] == "SRCROOT"
    assert not loc["artifactLocation"]["uri"].startswith("/") and "%3Cscript%3E" in loc["artifactLocation"]["uri"]
    assert loc["region"]["startLine"] == 2 and loc["region"]["startColumn"] == 26
    assert run["originalUriBaseIds"]["SRCROOT"]["uri"].startswith("file://")
    assert {r["level"] for r in run["results"]} == {"error", "warning"}
    report["findings"].append({"rule": "runtime-x", "path": "/abs/where.py", "line": 1, "severity": "info",
                               "message": "m", "fix": None})
    last = json.loads(rep.render(report, "sarif", CATALOGUE, str(root)))["runs"][0]
    assert last["results"][-1]["locations"][0]["physicalLocation"]["artifactLocation"] == {"uri": "file:///abs/where.py"}
    assert last["results"][-1]["level"] == "note" and "runtime-x" in {r["id"] for r in last["tool"]["driver"]["rules"]}


def test_a_new_section_is_a_renderer_not_a_writer(tmp_path):
    report, _ = sample(tmp_path)
    report["memory_estimate"] = {"params_bytes": 1024}
    assert "Memory estimate" in to_markdown(report)  # unknown sections render generically
    n = len(SECTIONS)
    try:
        @register_section("memory_estimate", "Memory estimate (predicted)")
        def _mem(value, rpt):
            return [("p", f"{value['params_bytes']} bytes of parameters")]
        assert "1024 bytes of parameters" in to_html(report) and "1024 bytes of parameters" in to_markdown(report)
    finally:
        SECTIONS[:] = [s for s in SECTIONS if s.key != "memory_estimate"]
    assert len(SECTIONS) == n


def test_write_reports_stays_inside_out(tmp_path):
    report, root = sample(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    os.symlink(outside, out / "audit.md")  # a planted symlink is replaced, never followed
    paths = rep.write_reports(report, out, CATALOGUE, str(root))
    assert set(paths) == {"json", "md", "html", "sarif"}
    assert outside.read_text() == "keep" and not (out / "audit.md").is_symlink()
    assert sorted(p.name for p in out.iterdir()) == ["audit.html", "audit.json", "audit.md", "audit.sarif"]
    assert json.loads((out / "audit.json").read_text())["schema"] == "hal-audit/1"
    only_json = rep.write_reports(report, tmp_path / "o2", formats=())
    assert set(only_json) == {"json"}
    (tmp_path / "file").write_text("x")
    with pytest.raises(rep.ReportError, match="not a folder"):
        rep.write_reports(report, tmp_path / "file")


def test_text_summary(tmp_path):
    report, _ = sample(tmp_path)
    text = rep.render(report, "text", written={"json": "out/audit.json"})
    assert "3 findings (2 error, 1 warning, 0 info)" in text and "out/audit.json" in text
    assert "predicted, not measured" in text.lower() and "fallback 1" in text


def test_a_programs_precision_runs_read_as_lines_not_json(tmp_path):
    """A script's precision section describes each run with settings and a status dict (the error may carry a
    DataLoader worker's traceback): audit.md shows each run, and the first divergence, as one readable line."""
    report, _ = sample(tmp_path)
    error = ("RuntimeError: Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent "
             "call last):\n  File \"worker.py\", line 375, in _worker_loop")
    report["precision"] = {
        "verdict": "warning", "verified": False, "metrics": [],
        "reference": {"device": "cpu", "dtype": "float64",
                      "status": {"status": "error", "error": error, "steps": 1, "seconds": 5.064, "output_tail": []}},
        "target": {"device": "cpu", "compared_window": "the first optimizer step",
                   "status": {"status": "ok", "error": None, "steps": 1, "seconds": 4.443, "output_tail": ["x"]},
                   "timing": {"window_ms": 826.84, "shadows_ms": 373.31, "statistics_ms": 69.11}},
        "first_divergence": {"module": "Net.bn1", "op": "native_batch_norm_backward", "phase": "backward",
                             "occurrence": 0, "metric": "rms_rel", "value": 0.01003, "threshold": 0.000385,
                             "kind": "amplified"}}
    md = to_markdown(report)
    rows = {line.split(" | ")[0][2:]: line for line in md.splitlines() if line.startswith("| ")}
    assert "program run error, 1 step(s), 5.064 s: RuntimeError: Caught RuntimeError in DataLoader worker " \
           "process 0" in rows["reference"].replace("\\", "") and "Original" not in rows["reference"]
    assert "compared window 826.8 ms (float64 shadows 373.3 ms, statistics 69.1 ms)" in rows["target"].replace("\\", "")
    assert "Net.bn1 native_batch_norm_backward (phase backward, occurrence 0): rms_rel 0.01003, over its threshold 0.000385; kind " \
           "amplified" in rows["first divergence"].replace("\\", "")
    assert not any('{"' in rows[k].replace("\\", "") for k in ("reference", "target", "first divergence"))
