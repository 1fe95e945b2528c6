"""Reports open with the verdict and next steps (a real hal-audit of examples/cuda_train.py in a
subprocess), runtime evidence is attached to its static finding, ops are one row per distinct op,
templates escape, and progress is silent unless stderr is a terminal."""
from __future__ import annotations

import html
import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

from hal.conformance import report as rep
from hal.conformance.report import digest
from tests.conftest import ROOT, run_cli

EXAMPLE = ROOT / "examples" / "cuda_train.py"


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    out = tmp_path_factory.mktemp("lead")
    r = run_cli("hal-audit", str(EXAMPLE), "--device", "mlu", "--steps", "2", "--fix", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    return r, out, json.loads((out / "audit.json").read_text())


def test_every_format_opens_with_the_verdict_and_the_fix_command(audited):
    r, out, doc = audited
    apply = doc["fix"]["apply"]
    assert apply.startswith("cd ") and "patch -p1 < " in apply
    fixable = doc["summary"]["fixable"]["device"]
    # terminal: the verdict line first, the next steps (with the exact command) before any finding row
    first = r.stdout.splitlines()[0]
    assert first.startswith(f"hal-audit {EXAMPLE} --device mlu: ") and f"{fixable} fixable automatically" in first
    assert "nothing falls back to the CPU" in first
    assert r.stdout.index("next steps:") < r.stdout.index(apply) < r.stdout.index("cuda_train.py:33")
    assert "PREDICTED, not measured" in r.stdout
    # markdown: title, verdict, banner, next steps with the command in a fenced block, then the findings
    md = (out / "audit.md").read_text()
    head = md[: md.index("## Findings")]
    assert md.startswith("# hal-audit report: ") and "**Verdict: " in head and "Predicted, not measured" in head
    assert f"```sh\n   {apply}\n   ```" in head and "nothing falls back to the CPU" in head
    # html: the same, in the <header> before the first section
    page = (out / "audit.html").read_text()
    lead = page[: page.index("<h2>Findings</h2>")]
    assert '<header class="lead action">' in lead and "Predicted, not measured:" in lead
    assert f"<pre><code>{html.escape(apply)}</code></pre>" in lead and "nothing falls back to the CPU" in lead


def _runtime_on_static_lines(doc):
    static = {(f["path"], f["line"]) for f in doc["findings"] if not f["rule"].startswith("runtime-")}
    rt = [f for f in doc["findings"] if f["rule"].startswith("runtime-")]
    return [f for f in rt if (f["path"], f["line"]) in static], [f for f in rt if (f["path"], f["line"]) not in static]


def test_runtime_evidence_is_attached_not_repeated_and_findings_sorted(audited):
    _, out, doc = audited
    attached, alone = _runtime_on_static_lines(doc)
    assert attached, "the example's run confirms some static findings"
    md = (out / "audit.md").read_text()
    rows = [line for line in md[md.index("## Findings"): md.index("## Operators")].splitlines()
            if re.match(r"\| \d+ \|", line)]
    static = [f for f in doc["findings"] if not f["rule"].startswith("runtime-")]
    assert len(rows) == len(static) + len(alone)  # one row per static finding, plus run-time-only ones
    confirmed_rows = {next(f for f in static if (f["path"], f["line"]) == (a["path"], a["line"]))["line"]
                      for a in attached}
    assert sum("confirmed at run time" in r for r in rows) == len(confirmed_rows)
    sev = [r.split("|")[2].strip() for r in rows]
    assert sev == sorted(sev, key=["error", "warning", "info"].index)  # by severity
    # the source line is shown with its finding
    line33 = EXAMPLE.read_text().splitlines()[32].strip()
    assert line33 in md and html.escape(line33) in (out / "audit.html").read_text()


def test_ops_one_row_per_distinct_op_with_distinct_counts(audited):
    r, out, doc = audited
    distinct = {o["op"] for o in doc["ops"]}
    assert len(distinct) < len(doc["ops"])  # the example has ops in several phases
    page = (out / "audit.html").read_text()
    table = page[page.index('<table class="sortable ops">'):]
    table = table[: table.index("</table>")]
    assert table.count("<tr>") - 1 == len(distinct)  # header row + one per op
    assert table.count("<details>") == len(distinct)  # the why is folded away
    counts = digest.ops_by_status(doc["ops"])
    assert sum(counts.values()) == len(distinct)
    assert "ops by status (distinct ops): " + ", ".join(f"{k} {v}" for k, v in counts.items()) in r.stdout


def test_progress_is_silent_when_stderr_is_not_a_terminal(audited):
    r, _, _ = audited
    assert r.stderr == ""


def _on_a_terminal(args, timeout=300):
    """Run hal-audit with stderr on a pseudo-terminal; returns (exit code, what stderr showed)."""
    master, slave = pty.openpty()
    env = dict(os.environ, TERM="xterm", COLUMNS="120")
    env.pop("HAL_BACKEND", None)
    proc = subprocess.Popen([str(Path(sys.executable).parent / "hal-audit"), *args], stdout=subprocess.PIPE,
                            stderr=slave, env=env)
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    proc.stdout.read()
    rc = proc.wait(timeout=timeout)
    os.close(master)
    return rc, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode("utf-8", "replace"))


def test_progress_on_a_terminal_shows_phases_and_steps_and_quiet_silences_it(tmp_path):
    rc, shown = _on_a_terminal([str(EXAMPLE), "--device", "mlu", "--steps", "3", "--out", str(tmp_path / "a")])
    assert rc == 0
    for phase in ("scan", "run", "write"):
        assert phase in shown
    assert re.search(r"step \d+, \d+ ops seen", shown), shown[-500:]
    rc, shown = _on_a_terminal([str(EXAMPLE), "--device", "mlu", "--static-only", "--quiet",
                                "--out", str(tmp_path / "b")])
    assert rc == 0 and shown == ""


EVIL = "<script>alert(1)</script>"


def test_templates_escape_snippets_commands_and_op_names(tmp_path):
    root = tmp_path / "proj"
    root.mkdir()
    (root / "m.py").write_text(f"import torch\nx = torch.ones(1, device='cuda')  # {EVIL} ![p](https://e.x/p.png)\n")
    from hal.conformance.migration import audit_static
    res = audit_static(root, "mlu")
    report = rep.new_report({"device": "mlu", "available": False, "verified": False, "reason": EVIL,
                             "source": f"{root}/{EVIL}"},
                            run={"status": "ok", "steps": 1, "seconds": 1.0, "error": None,
                                 "output_tail": [EVIL, "`fence` ```"]},
                            findings=[f.as_dict() for f in res.findings]
                            + [{"rule": "runtime-redirect-cuda-device", "path": "m.py", "line": 2, "severity": "info",
                                "message": f"ran {EVIL}", "fix": None, "count": 2}],
                            ops=[{"op": f"aten::{EVIL}", "count": 3, "dtypes": ["float32"], "status": "fallback",
                                  "reason": EVIL, "phase": "forward", "calls_per_step": 3, "bytes_per_step": 4096}],
                            fix={"flavour": "device", "patch": EVIL, "apply": f"cd {EVIL} && patch -p1 < x"})
    page = rep.render(report, "html", root=str(root))
    assert page.lower().count("<script") == 1 and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "confirmed at run time: ran &lt;script&gt;" in page  # attached to the static row
    md = rep.render(report, "md", root=str(root))
    outside_code = re.sub(r"(`+) .*? \1", "", md)  # the source snippet is a literal code span
    assert "&lt;script&gt;alert\\(1\\)&lt;/script&gt;  \n\\`fence\\` \\`\\`\\`" in md  # output with markup: escaped
    assert "<script>" not in outside_code and not re.search(r"(?<!\\)\]\(", outside_code)
    assert "1 of 1 distinct ops fall back to the CPU, 4\\.0 KiB" in md
    text = rep.render(report, "text", root=str(root))
    assert text.splitlines()[0].endswith("1 of 1 distinct ops fall back to the CPU, 4.0 KiB host-device copies "
                                         "per step: aten::<script>alert(1)</script> (3 calls, 4.0 KiB copied per step)")


def test_templates_are_package_data():
    """Every template matches a package-data glob of pyproject.toml (an installed hal finds them)."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["*"]
    folder = ROOT / "conformance" / "report" / "templates"
    names = sorted(p.name for p in folder.iterdir())
    assert names and all(any(Path(f"templates/{n}").match(g) for g in data) for n in names)


def test_a_precision_verdict_that_no_op_explains_says_why():
    """pytorch/examples siamese_network: every op of its compared window within threshold, yet `warning` for the loss
    drift of its second step. The terminal's lines named no cause ("warning: every op within its threshold", "warning,
    no divergence"); both now give the verdict's reasons. A pass keeps its short line."""
    from hal.conformance.workload_audit import section_summary
    precision = {"verdict": "warning", "verified": False, "first_divergence": None, "metrics": [],
                 "summary": {"verdict_reasons": ["loss drift 0.766 > 1.3e-05"]}}
    report = {"precision": precision}
    assert digest._precision_fact(report) == ("warning: loss drift 0.766 > 1.3e-05 (every op within its threshold) "
                                              "(not measured on the target device)")
    assert section_summary(report)[0] == ("precision: warning, no divergence (loss drift 0.766 > 1.3e-05) "
                                          "[measured on the CPU, not on the target]")
    precision.update(verdict="pass", summary={"verdict_reasons": ["compared against float64 shadows only"]})
    assert digest._precision_fact(report) == "pass: every op within its threshold (not measured on the target device)"
    assert section_summary(report)[0].startswith("precision: pass, no divergence [")


def test_a_first_divergence_just_over_its_limit_is_followed_by_the_largest_one():
    """pytorch/examples siamese_network's second step (its real rows over tolerance, tests/fixtures/precision/
    siamese_step2_rows.json): the first divergence is a batch norm at 1.1x its limit; the loss differs because BCELoss
    takes a sigmoid that float32 rounded to 1.0 (68,000x its limit). The verdict's reasons, the report's lead and the
    terminal's precision line name both; with the largest being the first, nothing is added."""
    from hal.conformance.precision.compare import largest_divergence
    from hal.conformance.workload_audit import section_summary
    data = json.loads((ROOT / "tests" / "fixtures" / "precision" / "siamese_step2_rows.json").read_text())
    fd, rows = data["first_divergence"], data["rows"]
    big = largest_divergence(rows, fd)
    assert big.startswith("largest divergence: BCELoss:binary_cross_entropy amplified (rms_rel 0.766 > 1.13e-05)"), big
    bce = next(i for i, r in enumerate(rows) if r["op"] == "binary_cross_entropy")
    assert largest_divergence(rows, dict(fd, index=bce)) is None  # the first is the largest
    # a cosine under its floor reads "<" (an HF BERT loop's line read "cosine 0.285 > 0.99")
    low = dict(rows[bce], total=dict(rows[bce]["total"], cosine=0.285))
    assert largest_divergence([low], {}).endswith("amplified (cosine 0.285 < 0.99)"), largest_divergence([low], {})
    report = {"precision": {"verdict": "warning", "verified": False, "first_divergence": fd, "metrics": rows,
                            "summary": {"verdict_reasons": [big]}}}
    assert digest._precision_fact(report).endswith(f"; {big}")
    assert section_summary(report)[0] == (
        "precision: warning, first divergence SiameseNetwork.resnet.7.0.bn2:native_batch_norm (amplified, forward) "
        f"({big}) [measured on the CPU, not on the target]")
