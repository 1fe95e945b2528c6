"""The compatibility matrix: real cells in real subprocesses, crash isolation, merge, diff, rendering."""
from __future__ import annotations

import json

import pytest
import torch

from hal.conformance.matrix import merge, render
from hal.conformance.matrix.runner import INJECT_ENV, run_cell
from hal.conformance.matrix.schema import SCHEMA, Cell, document
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def matrix_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("matrix")
    r = run_cli("hal", "matrix", "--devices", "cpu,mlu", "--models", "gpt", "--modes", "train,infer",
                "--dtypes", "float32", "--no-precision", "--no-collectives", "--steps", "1", "--out", str(out),
                env={INJECT_ENV: "cpu/gpt/infer/float32=crash"}, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return out, json.loads((out / "compat-matrix.json").read_text())


def test_a_crashing_cell_is_marked_and_the_matrix_completes(matrix_run):
    _, doc = matrix_run
    cells = {(c["backend"], c["model"], c["mode"], c["dtype"]): c for c in doc["cells"]}
    assert len(cells) == 4 and doc["schema"] == SCHEMA
    crashed = cells[("cpu", "gpt", "infer", "float32")]
    assert crashed["status"] == "crashed" and "SIGSEGV" in crashed["reason"] and not crashed["verified"]
    ok = cells[("cpu", "gpt", "train", "float32")]
    assert ok["status"] == "pass" and ok["verified"] and ok["figures"]["step_ms"] > 0 and ok["figures"]["peak_bytes"] > 0
    for mode in ("train", "infer"):
        mlu = cells[("mlu", "gpt", mode, "float32")]
        assert not mlu["verified"], "no MLU here: an MLU cell can never be verified"
        assert "predicted" in mlu["reason"] and "step_ms" not in mlu["figures"]
        figs = mlu["figures"]
        # the cell's status follows from its own op lists ...
        # (a predicted cell states op support only, never a measured cell's words)
        want = ("ops-unsupported" if figs["unsupported_ops"] else "ops-fallback" if figs["fallback_ops"]
                else "ops-supported")
        assert mlu["status"] == want, (mlu["status"], figs)
        assert "precision not measured" in mlu["reason"] and figs["precision"] == "not measured"
        # ... and gpt in float32 reaches only ops with an MLU kernel (torch_mlu_kernels.tsv): none falls back
        assert figs["fallback_ops"] == [] and figs["unsupported_ops"] == [] and mlu["status"] == "ops-supported"
    assert doc["environments"][0]["backends"]["cpu"]["available"]
    assert doc["summary"]["crashed"] == 1 and doc["summary"]["verified"] == 1


def test_outputs_are_written_and_escaped(matrix_run):
    out, doc = matrix_run
    md = (out / "compat-matrix.md").read_text()
    assert "| model" in md and "predicted" in md and "crashed" in md
    html = (out / "compat-matrix.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "<svg" in html
    svg = (out / "compat-matrix.svg").read_text()
    assert svg.startswith("<svg") and "hatched blue-grey = predicted" in svg
    evil = Cell("cpu", "<script>alert(1)</script>", "train", "float32", status="fail", reason="<img src=x onerror=1>",
                ops={"aten::<b>": "fallback"})
    d = document([evil], [], [{"id": "<i>", "command": "</code><script>"}])
    # the page's one script element is ours (table sorting, pinned by its CSP hash): take it out before looking
    page = render.to_html(d).replace(f"<script>{render.SORT_JS}</script>", "")
    for text in (page, render.to_svg(d)):
        assert "<script>" not in text and "<img" not in text and "aten::<b>" not in text and "&lt;script&gt;" in text


HOSTILE = "<img src=x onerror=alert(1)>|`x`[l](javascript:alert(1))![i](https://e.x/i.png)"


def _hostile_doc() -> dict:
    cells = [Cell("cpu", "<script>alert(1)</script>", "train", "float32", status="fail", verified=True, reason=HOSTILE,
                  ops={"aten::<u>|`": "fallback"}, figures={"fallback_ops": ["aten::<u>|`"], "step_ms": 1.5}),
             Cell("mlu", "gpt", "train", "float32", status="ops-supported", verified=False,
                  reason="ops supported, precision not measured " + HOSTILE,
                  figures={"precision": "not measured", "precision_notes": ["TF32 " + HOSTILE]})]
    return document(cells, [{"backend": "cpu", "status": "fail", "verified": True, "passed": 1, "failed": 1,
                             "reason": HOSTILE}], [{"id": "<i>" + HOSTILE, "command": "</code><script>x",
                                                    "commit": "`a`", "torch": "<u>", "python": "3"}])


def test_matrix_templates_escape_hostile_text_in_both_formats():
    """Issue 22: the matrix is rendered from autoescaped jinja2 templates; text from a run (reason, op
    name, model, environment) never becomes markup in Markdown or HTML."""
    d = _hostile_doc()
    page = render.to_html(d)
    ours = f"<script>{render.SORT_JS}</script>"
    assert page.lower().count("<script") == 1 and ours in page
    rest = page.replace(ours, "")
    for bad in ("<img", "<script", "<u>", "<i>", "</code><script>", "aten::<u>"):
        assert bad not in rest, bad
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "aten::&lt;u&gt;|`" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    md = render.to_markdown(d)
    assert "<" not in md and "](" not in md and "![" not in md, md
    assert "&lt;img src\\=x onerror\\=alert\\(1\\)&gt;" in md and "\\|" in md
    # op names and commands: escaped text when they hold anything markup-like (else a code span)
    assert "aten\\:\\:&lt;u&gt;\\|\\`" in md and "&lt;/code&gt;&lt;script&gt;x" in md
    assert render.to_markdown(document([Cell("cpu", "m", "train", "float32", ops={"aten::a|b": "fallback"})], [],
                                       [])).count("` aten::a\\|b `") == 1
    assert "aten::<u>" not in md
    # the honesty survives: predicted cells say so in both formats
    assert "ops-supported (predicted)" in md and "ops-supported (predicted)" in page
    assert "precision not measured" in md and "precision not measured" in page


def test_matrix_html_is_sortable_self_contained_and_laid_out_for_1400px():
    from hal.conformance.report.render import CSP
    page = render.to_html(_hostile_doc())
    assert page.startswith("<!DOCTYPE html>")
    assert f'<meta http-equiv="Content-Security-Policy" content="{CSP}">' in page
    assert "script-src 'sha256-" in CSP and "default-src 'none'" in CSP
    # status grid, cells, per-op, the ops that are not native everywhere, ops x models, collectives
    assert page.count('<table class="sortable') == 6
    assert "max-width:1400px" in page and "table.sortable th" in page
    assert "http://" not in page.replace(' xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page.replace(
        "https://e.x/i.png", "")
    # predicted cells: hatched, in a neutral colour, not a measured green
    assert "class='st pred' style='background-color:" + render.COLOURS["ops-supported"] in page
    assert render.COLOURS["ops-supported"] != render.COLOURS["pass"]


def test_timeout_cell_is_marked_and_killed(monkeypatch):
    monkeypatch.setenv(INJECT_ENV, "cpu/gpt/train/float32=hang")
    cell = run_cell({"backend": "cpu", "model": "gpt", "mode": "train", "dtype": "float32", "steps": 1,
                     "precision": False}, timeout_s=8)
    assert cell.status == "timeout" and "8 s" in cell.reason and cell.seconds < 30


def test_raising_cell_is_a_failure_with_reason(monkeypatch):
    monkeypatch.setenv(INJECT_ENV, "cpu/gpt/train/float32=raise")
    cell = run_cell({"backend": "cpu", "model": "gpt", "mode": "train", "dtype": "float32", "steps": 1,
                     "precision": False}, timeout_s=120)
    assert cell.status == "fail" and "injected failure" in cell.reason


def _doc(*cells, env="e"):
    return document(list(cells), [], [{"id": env}])


def test_real_architectures_name_the_ops_that_block_them_on_mlu(tmp_path):
    """Two transformers models in parallel cells: wav2vec2's CTC loss has no MLU kernel
    (torch_mlu_kernels.tsv), so its predicted cell falls back with calls and bytes per step, and the
    op x model table names the model that needs the op; Mixtral's router does not."""
    out = tmp_path / "m"
    r = run_cli("hal", "matrix", "--devices", "cpu,mlu", "--models", "hf:wav2vec2,hf:mixtral", "--modes", "train",
                "--dtypes", "float32", "--no-precision", "--no-collectives", "--steps", "1", "--jobs", "2",
                "--out", str(out), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((out / "compat-matrix.json").read_text())
    assert doc["jobs"] == 2 and len(doc["cells"]) == 4
    cells = {(c["backend"], c["model"]): c for c in doc["cells"]}
    w2v = cells[("mlu", "hf:wav2vec2")]
    assert w2v["status"] == "ops-fallback" and not w2v["verified"]
    ctc = {d["op"]: d for d in w2v["figures"]["not_native"]}
    assert {"aten::_ctc_loss.Tensor", "aten::_ctc_loss_backward.Tensor"} <= set(ctc)
    assert all(d["calls_per_step"] >= 1 and d["bytes_per_step"] > 0 for d in ctc.values())
    assert cells[("cpu", "hf:wav2vec2")]["status"] == "pass" and cells[("cpu", "hf:wav2vec2")]["verified"]
    assert doc["op_models"]["aten::_ctc_loss.Tensor"] == ["hf:wav2vec2"]
    assert set(doc["op_models"]["aten::mm"]) == {"hf:wav2vec2", "hf:mixtral"}
    assert "aten::_ctc_loss.Tensor" not in cells[("mlu", "hf:mixtral")]["ops"]
    md = (out / "compat-matrix.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| ` aten::_ctc_loss.Tensor ` |"))
    assert "| fallback |" in row and row.rstrip().endswith("| hf:wav2vec2 |"), row
    page = (out / "compat-matrix.html").read_text()
    grid = page[page.index('<section id="op-models">'):]
    assert "<th>hf:mixtral</th>" in grid and "fallback: mlu<br><small>" in grid
    assert "<b>hf:wav2vec2</b>: fallback on mlu, 1 calls, " in grid  # the blocking ops' own table, with their cost
    assert grid.index("aten::_ctc_loss.Tensor") < grid.index("aten::mm<")  # blocking ops first
    assert grid.index("<th>hf:wav2vec2</th>") < grid.index("<th>hf:mixtral</th>")  # ... and the models they block
    assert merge.check_schema(doc, "doc") is doc


def test_merge_prefers_verified_and_keeps_every_environment():
    pred = Cell("cuda", "gpt", "train", "float32", status="ops-fallback", verified=False, env="cpu-host")
    meas = Cell("cuda", "gpt", "train", "float32", status="pass", verified=True, env="h200",
                figures={"step_ms": 5.0})
    cpu = Cell("cpu", "gpt", "train", "float32", status="pass", verified=True, env="cpu-host")
    merged = merge.merge([("a.json", _doc(meas, env="h200")), ("b.json", _doc(pred, cpu, env="cpu-host"))])
    cells = {(c["backend"]): c for c in merged["cells"]}
    assert cells["cuda"]["verified"] and cells["cuda"]["status"] == "pass" and cells["cpu"]["status"] == "pass"
    assert {e["id"] for e in merged["environments"]} == {"h200", "cpu-host"}
    assert merged["merged_from"] == ["a.json", "b.json"]
    with pytest.raises(ValueError, match="hal-compat-matrix/1"):
        merge.merge([("x.json", {"schema": "other"})])


def test_diff_lists_status_time_fallback_and_op_set_changes():
    old = _doc(Cell("mlu", "gpt", "train", "float32", status="ops-fallback",
                    figures={"fallback_ops": ["aten::a", "aten::b"]}),
               Cell("cpu", "gpt", "train", "float32", status="pass", verified=True, figures={"step_ms": 10.0}))
    new = _doc(Cell("mlu", "gpt", "train", "float32", status="ops-supported", figures={"fallback_ops": ["aten::a"]}),
               Cell("cpu", "gpt", "train", "float32", status="pass", verified=True, figures={"step_ms": 14.0}),
               Cell("cpu", "cnn", "train", "float32", status="pass", verified=True))
    def cpu_gpt(doc):
        return next(c for c in doc["cells"] if (c["backend"], c["model"]) == ("cpu", "gpt"))
    cpu_gpt(old)["ops"] = {"aten::mm": "native", "aten::_foreach_add_.List": "native"}
    cpu_gpt(new)["ops"] = {"aten::mm": "native", "aten::_foreach_add_.Scalar": "native"}
    rows = merge.diff(old, new)
    kinds = {(r["cell"], r["change"]) for r in rows}
    assert kinds == {("mlu/gpt/train/float32", "status"), ("mlu/gpt/train/float32", "fallback_ops"),
                     ("cpu/gpt/train/float32", "step_ms"), ("cpu/cnn/train/float32", "added"),
                     ("cpu/gpt/train/float32", "ops")}
    ops = next(r for r in rows if r["change"] == "ops")  # torch versions decompose differently
    assert ops["old"] == ["aten::_foreach_add_.List"] and ops["new"] == ["aten::_foreach_add_.Scalar"]
    assert merge.op_changes(rows) == [
        {"op": "aten::_foreach_add_.List", "only_old": 1, "only_new": 0, "models": ["gpt"]},
        {"op": "aten::_foreach_add_.Scalar", "only_old": 0, "only_new": 1, "models": ["gpt"]}]


def test_cli_merge_and_diff(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_doc(Cell("cpu", "gpt", "train", "float32", status="pass", verified=True))))
    b.write_text(json.dumps(_doc(Cell("cpu", "gpt", "train", "float32", status="fail", verified=True))))
    r = run_cli("hal", "matrix", "--merge", str(a), str(b), "--out", str(tmp_path / "m"))
    assert r.returncode == 0 and (tmp_path / "m" / "compat-matrix.html").is_file()
    r = run_cli("hal", "matrix", "--diff", str(a), str(b), "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["change"] == "status"
    r = run_cli("hal", "matrix", "--diff", str(a), str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("hal", "matrix", "--devices", "tpu", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "unknown device 'tpu'" in r.stderr


def test_an_inference_cell_names_the_forward_output_that_failed():
    """The precision check trains a step; an infer cell is judged on the forward pass only, and its
    reason names the forward output over its threshold, not the backward op blamed first overall."""
    from hal.conformance.matrix.cell import _precision_verdict
    # bfloat16 on the CPU: which op diverges first depends on how the reductions are split over threads (from 8
    # threads, as on the GPU machine's 16 cores, the moe's first divergence is its forward topk and the training
    # verdict a warning; with 1, 2 or 4 threads a layer norm backward): the thread count is pinned
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        verdict, why = _precision_verdict({"model": "moe", "dtype": "bfloat16", "mode": "infer"}, "cpu")
        train_verdict, train_why = _precision_verdict({"model": "moe", "dtype": "bfloat16", "mode": "train"}, "cpu")
    finally:
        torch.set_num_threads(threads)
    assert train_verdict == "fail" and "(backward," in train_why
    assert verdict == "fail" and why.startswith("forward divergence at ") and " output " in why
    assert why.endswith(f"the first divergence overall was in the backward pass: {train_why})")
