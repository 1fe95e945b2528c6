"""Published JSON Schemas (hal.schemas, `hal schema`): every report and data file in the repository
validates against its schema, and a broken document is rejected with the exact JSON path.

Classification of reports/**/*.json (decided here): a document with a ``schema`` field is checked
against the shipped schema of that name (or, for a benchmark format the package does not publish,
against its shape below); a document without one must match exactly one path pattern in ``SHAPES``.
Anything else fails the test: a new kind of report needs a schema or a shape here.
"""
from __future__ import annotations

import copy
import fnmatch
import json
import pathlib
import subprocess
import sys

import jsonschema
import pytest
import yaml

from hal import schemas
from hal.capabilities.manifest import ManifestError, load_manifest
from hal.conformance.matrix import merge as mmerge
from hal.conformance.matrix.schema import OP_STATUS_ORDER, STATUSES
from hal.conformance.migration.rules import CATALOGUE, RulesError, hal_map, load_rules
from hal.conformance.report import schema as report_schema

ROOT = pathlib.Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports"


def _req(*keys: str, **props) -> dict:
    return {"type": "object", "required": list(keys), "properties": props}


ENV_FINGERPRINT = _req("python", "platform", "torch", "backends", "commit", "command")
#: benchmarks/gpu_suite.sh's summary.json (with commit, tests and seconds from 199d358 on)
GPU_SUITE_SUMMARY = _req("passed", "failed", "errors", "skipped", "cuda_skips", "pytest_exit",
                         **{k: {"type": "integer", "minimum": 0} for k in ("passed", "failed", "errors", "skipped",
                                                                           "cuda_skips")})
#: path pattern (fnmatch, relative to the repository root) -> the shape of that report kind
SHAPES: dict[str, dict] = {
    "reports/*precision-*.json": {"allOf": [{"$ref": "urn:hal:hal-audit/1#/$defs/precision"},
                                            _req("reference", "target", "metrics", "first_divergence", "verdict",
                                                 "verified", "thresholds")]},
    "reports/precision/cpu-*.json": {"allOf": [{"$ref": "urn:hal:hal-audit/1#/$defs/precision"},
                                           _req("reference", "target", "metrics", "first_divergence", "verdict",
                                                "verified", "thresholds")]},
    "reports/*/profile.json": {"allOf": [{"$ref": "urn:hal:hal-audit/1#/$defs/profile"},
                                         _req("device", "backend", "ops", "hotspots", "memory", "environment")]},
    "reports/*/trace.json": _req("traceEvents", traceEvents={"type": "array"}),  # Chrome trace format
    "reports/h200/models-*.json": _req("device", "dtype", "mode", "config", "batch_size", "step_times_s",
                                       "step_time_s_median", "samples_per_s", "peak_memory", "environment",
                                       step_times_s={"type": "array", "items": {"type": "number"}}),
    "reports/h200/dp-*.json": _req("device", "dist_backend", "dtype", "config", "step_time_s", "samples_per_s",
                                   "scaling_efficiency"),
    "reports/h200/env-*.json": ENV_FINGERPRINT,
    "reports/gpu-suite/env.json": ENV_FINGERPRINT,
    "reports/cuda/*env.json": _req("python", "backends", "commit", "versions", "gpus"),
    # the committed file is the first format (4c1dc74); benchmarks/gpu_suite.sh now writes GPU_SUITE_SUMMARY's
    "reports/gpu-suite/summary.json": {"anyOf": [
        _req("commit", "tests", "passed", "failures", "errors", "skipped", "seconds",
             **{k: {"type": "integer", "minimum": 0} for k in ("tests", "passed", "failures", "errors", "skipped")}),
        GPU_SUITE_SUMMARY]},
    # `hal collectives --format json`
    "reports/cuda/*hal_collectives.json": _req("device", "world_size", "passed", "rows", passed={"type": "boolean"},
                                               rows={"type": "array", "items": _req("collective", "dtype", "op",
                                                                                    "status", "max_error")}),
    "reports/cuda/env-*.json": ENV_FINGERPRINT,
    "reports/cuda/run1-*/bench_kernels.json": _req("backend", "command", "rows", "targets", rows={"type": "array"}),
    "reports/cuda/bench_kernels_graphs.json": _req("backend", "command", "rows", "targets", rows={"type": "array"}),
    # issue 23's eager rows (benchmarks/bench_kernels.py): every field the acceptance names, on every row
    "reports/cuda/bench_kernels.json": _req("mode", "environment", "command", "rows", "targets", rows={
        "type": "array", "minItems": 1, "items": _req(
            "kernel", "dtype", "shape", "direction", "timing", "hal_us", "torch_us", "liger_us", "compile_us",
            direction={"enum": ["fwd", "bwd"]}, timing={"enum": ["device", "wall"]})}),
    # the same rows from an earlier commit's run (the suffix names it)
    "reports/cuda/bench_kernels-*.json": _req("mode", "environment", "command", "rows", "targets", rows={
        "type": "array", "minItems": 1, "items": _req("kernel", "dtype", "shape", "direction", "timing", "hal_us",
                                                      "torch_us")}),
    # benchmarks/bench_dispatch.py --device cuda: per section, per call, hal.ops against torch
    "reports/cuda/bench_dispatch_*.json": _req("environment", "results", results={"type": "object", "minProperties": 1}),
    "reports/cuda/e2e_gpt2small-*.json": _req("speedup_vs_torch", "speedup_vs_compile", "median_ms", "environment"),
    "reports/cuda/e2e_gpt2small.json": _req("speedup_vs_torch", "speedup_vs_compile", "median_ms", "loss_curves",
                                            "loss_max_rel_diff", "environment"),
    "reports/cuda/routing.json": _req("measured", "default", "ops", "sweep", ops={"type": "object"}),
    "reports/cuda/routing-*.json": _req("measured", "default", "ops", "sweep", ops={"type": "object"}),
    "reports/cuda/kern_timing.json": _req("routing", "rows", rows={"type": "array"}),
    "reports/cuda/kern_timing-*.json": _req("routing", "rows", rows={"type": "array"}),
    "reports/cuda/h100/kern_timing-*.json": _req("routing", "rows", rows={"type": "array"}),
    # benchmarks/tune_norm_bwd.py: every norm backward plan's GPU time per width, and the chosen table
    "reports/cuda/tune_norm_bwd*.json": _req("environment", "rows", "tuned", rows={"type": "array", "minItems": 1},
                                            tuned={"type": "object", "minProperties": 1}),
    # benchmarks/tune_silu_and_mul.py: every launch plan's GPU time per shape and direction, and the chosen plan
    "reports/cuda/h100/tune_silu_and_mul-*.json": _req("environment", "rows", "tuned",
                                                       rows={"type": "array", "minItems": 1},
                                                       tuned={"type": "object", "minProperties": 1}),
    # benchmarks/tune_softmax_bwd.py: every softmax backward plan's GPU time per width, and the chosen warps
    "reports/cuda/tune_softmax_bwd.json": _req("environment", "rows", "tuned", rows={"type": "array", "minItems": 1},
                                               tuned={"type": "object", "minProperties": 1}),
    # benchmarks/tune_lce.py: the fused head padded or not per row count beside torch, and the thresholds
    "reports/cuda/tune_lce*.json": _req("environment", "rows", "tuned", rows={"type": "array", "minItems": 1},
                                       tuned={"type": "object", "required": ["pad_from", "kernel_from"]}),
    # benchmarks/bench_autograd_host.py: host time of a training-mode call, torch's op against autograd.Functions
    "reports/cuda/autograd_host*.json": _req("environment", "device", "shape", "method", "rows",
                                             rows={"type": "array", "minItems": 1}),
    # benchmarks/bench_host_path.py: host time per layer of the kernel path
    "reports/cuda/host_path-*.json": _req("environment", "timing", "rows", rows={"type": "array", "minItems": 1}),
    "reports/cuda/launch-experiment-*/kern_timing-*.json": _req("routing", "rows", rows={"type": "array"}),
    "reports/cuda/launch-experiment-*/routing-*.json": _req("measured", "default", "ops", "sweep"),
    "reports/h200/*/env.json": ENV_FINGERPRINT,
    "reports/h200/program-sections/env-*.json": ENV_FINGERPRINT,
    "reports/h200/program-sections/bench_program_sections_*.json": _req("script", "device", "summary", "repeats"),
    # benchmarks/bench_precision.py --device cuda: the shadowed step in steady state, beside plain and the floor
    "reports/h200/program-sections/bench_precision_*.json": _req("benchmark", "model", "config", "device", "results",
                                                                 "goal_met", results={"type": "object",
                                                                                      "minProperties": 3}),
    "reports/h200/program-sections/bench_profiler_configs_*.json": _req("device", "step_ms", "ratio_vs_plain",
                                                                        "environment", "method"),
    "reports/cuda/*bench_collectives.json": _req("command", "rows", "world_size", "versions", rows={"type": "array"}),
    "reports/collectives/soak-*.json": _req("command", "torch", "runs", "summary", runs={"type": "array"}),
    "reports/startup/bench_startup-*.json": _req("label", "environment", "results", "failures"),
    "reports/corpus/corpus.json": _req("meta", "results", results={"type": "array"}),
    # benchmarks/corpus.py --all-under: every program on one torch (2.4.1, torch_mlu r2.4's)
    "reports/corpus/corpus-torch24.json": _req("meta", "results", results={"type": "array", "items": _req(
        "program", "torch", "exit", "status", "cause")}),
    # benchmarks/corpus.py --sections: --precision --profile on the public programs
    "reports/corpus/sections.json": _req("meta", "results", results={"type": "array", "items": _req(
        "program", "commit", "exit", "precision", "profile")}),
    "reports/corpus/sections-torch24.json": _req("meta", "results", results={"type": "array", "items": _req(
        "program", "commit", "exit", "precision", "profile")}),
    # benchmarks/study_attention_tolerance.py: the local rule on a 16-bit attention backward, correct and wrong
    "reports/precision/attention-tolerance-*.json": _req("study", "op", "shape", "rows", "environment", rows={
        "type": "array", "minItems": 1, "items": _req("dtype", "form", "correct", "rule", "exceeds", "right")}),
    "reports/mutation.json": _req("method", "mutations", "caught", "survived", "score_pct", "results"),
    # `hal matrix --diff OLD NEW --format json`
    "reports/matrix/diff-*.json": {"type": "array", "items": _req("cell", "change", change={
        "enum": ["added", "removed", "status", "step_ms", "fallback_ops", "ops"]})},
}
# the same report kinds from a card other than the H200 (reports/cuda/h100/: the device service gave an H100)
SHAPES.update({p.replace("reports/cuda/", "reports/cuda/h100/"): SHAPES[p] for p in (
    "reports/cuda/env-*.json", "reports/cuda/bench_kernels-*.json", "reports/cuda/e2e_gpt2small-*.json",
    "reports/cuda/tune_norm_bwd*.json")})
# benchmarks/gpu_suite.sh run in parts (PART=k/n) on an H100: each part's summary, one environment for the run
SHAPES["reports/cuda/h100/gpu-suite-*/*/summary.json"] = GPU_SUITE_SUMMARY
SHAPES["reports/cuda/h100/gpu-suite-*/environment.json"] = _req("commit", "python", "torch", "triton", "cupy", "gpus",
                                                                "backends")
SHAPES["reports/cuda/h100/bench_program_sections_*.json"] = SHAPES["reports/h200/program-sections/bench_program_sections_*.json"]
for _kind in ("bench_precision", "bench_profiler_configs"):
    SHAPES[f"reports/cuda/h100/{_kind}_*.json"] = SHAPES[f"reports/h200/program-sections/{_kind}_*.json"]
SHAPES["reports/precision/program-sections-cpu-*.json"] = SHAPES["reports/h200/program-sections/bench_program_sections_*.json"]
#: `schema` names of benchmark outputs the package does not publish -> their shape
SHAPES_BY_SCHEMA: dict[str, dict] = {
    "hal-corpus-static/1": _req("schema", "environment", "rows", "totals", rows={"type": "array"}),
    # benchmarks/fidelity.py's per-side captures (--predict here, --measure on the GPU), inputs of hal-fidelity/1
    "hal-fidelity-capture/1": _req("schema", "environment", "mode", "programs",
                                   mode={"enum": ["predicted", "measured"]}, programs={"type": "object"}),
}


def classify(rel: str, doc) -> tuple[str, dict] | None:
    """(what, schema) for the report at ``rel`` (posix, from the repository root), None when unknown."""
    if isinstance(doc, dict) and "schema" in doc:
        name = doc["schema"]
        if isinstance(name, str) and name in schemas.names():
            return name, schemas.load(name)
        if name in SHAPES_BY_SCHEMA:
            return f"shape of {name}", SHAPES_BY_SCHEMA[name]
        return None
    hits = [p for p in SHAPES if fnmatch.fnmatchcase(rel, p)]
    return (f"shape {hits[0]}", SHAPES[hits[0]]) if len(hits) == 1 else None


def _reports() -> list[pathlib.Path]:
    return sorted(REPORTS.rglob("*.json"))


def test_every_shipped_schema_is_a_valid_2020_12_schema_named_by_its_id():
    names = schemas.names()
    assert {"hal-audit/1", "hal-compat-matrix/1", "hal-capabilities/1", "hal-migration-rules/1",
            "hal-migration-map/1", "hal-aten-ops/1", "hal-fidelity/1"} <= set(names)
    for name in names:
        s = schemas.load(name)
        jsonschema.Draft202012Validator.check_schema(s)
        assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert s["$id"] == f"urn:hal:{name}" and s["title"].startswith(name + ": ")
        assert s["properties"]["schema"] == {"const": name}


@pytest.mark.parametrize("path", _reports(), ids=lambda p: str(p.relative_to(REPORTS)))
def test_every_json_report_is_classified_and_valid(path):
    rel = path.relative_to(ROOT).as_posix()
    doc = json.loads(path.read_text(encoding="utf-8"))
    found = classify(rel, doc)
    assert found is not None, (f"{rel}: no schema field of a known format and no shape in SHAPES matches; "
                               "give it a schema (hal/schemas) or a shape (tests/test_schemas.py)")
    what, schema = found
    errors = [f"{schemas.json_path(e.absolute_path)}: {e.message[:200]}"
              for e in schemas.validator_for_schema(schema).iter_errors(doc)]
    assert errors == [], f"{rel} ({what}): {errors[:5]}"


def test_reports_folder_has_the_contract_documents():
    kinds = {json.loads(p.read_text()).get("schema") for p in _reports() if p.name in ("audit.json", "compat-matrix.json")}
    assert {"hal-audit/1", "hal-compat-matrix/1"} <= kinds
    assert (REPORTS / "matrix" / "compat-matrix.json").is_file()


def test_an_unknown_report_is_not_classified(tmp_path):
    assert classify("reports/new/thing.json", {"rows": []}) is None
    assert classify("reports/x.json", {"schema": "hal-nonesuch/1"}) is None
    assert classify("reports/h200/env-runZ.json", {})[0] == "shape reports/h200/env-*.json"
    # and a document that claims a known schema is checked against it, not waved through
    what, schema = classify("anywhere.json", {"schema": "hal-audit/1"})
    assert what == "hal-audit/1" and list(schemas.validator_for_schema(schema).iter_errors({"schema": "hal-audit/1"}))


DATA_FILES = [("hal-capabilities/1", p) for p in sorted(ROOT.glob("backends/*/manifest.json"))] + [
    ("hal-aten-ops/1", ROOT / "hal/capabilities/data/aten_ops.json")] + [
    ("hal-migration-rules/1", p) for p in sorted(ROOT.glob("backends/*/migration_rules.yaml"))] + [
    ("hal-migration-map/1", ROOT / "conformance/migration/hal_map.yaml")]


@pytest.mark.parametrize("name,path", DATA_FILES, ids=lambda x: x if isinstance(x, str) else x.relative_to(ROOT).as_posix())
def test_every_data_file_validates(name, path):
    text = path.read_text(encoding="utf-8")
    doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    assert doc["schema"] == name
    assert [str(p) for p in schemas.problems(name, doc)] == []


def test_data_files_cover_every_backend():
    assert {p.parent.name for _, p in DATA_FILES if p.name == "manifest.json"} >= {"cuda", "mlu"}
    assert {p.parent.name for _, p in DATA_FILES if p.name == "migration_rules.yaml"} >= {"cpu", "cuda", "mlu"}


def test_schema_enums_are_the_codes_own():
    """The schemas spell out what the code accepts; a new status or rule must be added to both."""
    rules = schemas.load("hal-migration-rules/1")
    assert set(rules["properties"]["rules"]["propertyNames"]["enum"]) == set(CATALOGUE)
    matrix = schemas.load("hal-compat-matrix/1")["$defs"]
    assert tuple(matrix["status"]["enum"]) == STATUSES
    assert tuple(matrix["op_status"]["enum"]) == OP_STATUS_ORDER
    assert set(matrix["op_status"]["enum"]) == set(schemas.load("hal-audit/1")["$defs"]["op"]["properties"]["status"]["enum"])
    audit = schemas.load("hal-audit/1")
    assert tuple(audit["properties"]["run"]["properties"]["status"]["enum"]) == report_schema.RUN_STATUSES
    assert tuple(audit["$defs"]["finding"]["properties"]["severity"]["enum"]) == report_schema.SEVERITY_ORDER
    assert tuple(audit["required"]) == report_schema.REQUIRED_KEYS
    assert set(matrix["status"]["enum"]) >= set(schemas.load("hal-compat-matrix/1")["properties"]["summary"]["required"]) - {
        "verified", "predicted"}


# -- typed errors name the exact path --------------------------------------------------------------

def _real_audit() -> dict:
    """The committed H200 audit of the gpt model (ops, precision) with the static findings of
    examples/cuda_train.py for the MLU (a real audit of each part)."""
    from hal.conformance.migration import audit_static
    rep = json.loads((REPORTS / "h200" / "audit-cuda-gpt" / "audit.json").read_text())
    rep["findings"] = [f.as_dict() for f in audit_static(ROOT / "examples" / "cuda_train.py", "mlu").findings]
    assert len(rep["findings"]) > 3 and len(rep["ops"]) > 1 and rep["precision"]
    return report_schema.finalize(rep)


def test_audit_report_problems_name_the_exact_path():
    rep = _real_audit()
    assert report_schema.validate(rep) == []
    bad = copy.deepcopy(rep)
    bad["findings"][3]["severity"] = "fatal"
    del bad["run"]["seconds"]
    bad["ops"][1]["op"] = "addmm"
    bad["target"]["verified"] = "yes"
    assert report_schema.validate(bad) == [
        "$.findings[3].severity: \"fatal\" is not one of [\"error\", \"warning\", \"info\"]",
        "$.ops[1].op: 'addmm' does not match '^[A-Za-z_][A-Za-z0-9_]*::'",
        "$.run: missing 'seconds'",
        "$.target.verified: \"yes\" is not of type 'boolean'"]
    with pytest.raises(schemas.SchemaError) as exc:
        report_schema.check(bad, "audit.json")
    assert exc.value.path == ("findings", 3, "severity") and "\n" not in str(exc.value)
    assert str(exc.value).startswith("audit.json: not a valid hal-audit/1 document: $.findings[3].severity: ")
    assert str(exc.value).endswith("(and 3 more)")


def test_audit_sections_other_helpers_extend_stay_open():
    rep = _real_audit()
    rep["precision"] = {"reference": {"device": "cpu"}, "metrics": [], "first_divergence": None, "new_field": 1}
    rep["profile"] = {"ops": [], "anything": {"new": True}}
    rep["findings"][0]["confirmed_at_run_time"] = True
    rep["new_section"] = {"x": 1}
    assert report_schema.validate(rep) == []
    rep["precision"] = {"metrics": []}
    assert report_schema.validate(rep)  # neither the measured form nor the error form


def test_matrix_merge_names_the_exact_path(tmp_path):
    doc = json.loads((REPORTS / "matrix" / "compat-matrix.json").read_text())
    cell = doc["cells"][2]
    cell["note"] = "additive fields in cells are allowed"
    cell["figures"]["anything"] = [1, 2]
    assert mmerge.merge([("a.json", doc)])["schema"] == "hal-compat-matrix/1"
    cell["verified"] = "no"
    doc["per_op"]["aten::addmm"]["cpu"] = "works"
    with pytest.raises(ValueError, match=r"^a\.json: not a valid hal-compat-matrix/1 document: "
                                         r"\$\.cells\[2\]\.verified: \"no\" is not of type 'boolean' \(and 1 more\)$"):
        mmerge.merge([("a.json", doc)])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    p = subprocess.run([sys.executable, "-m", "hal.cli.main", "matrix", "--merge", str(bad), "--out",
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert "$.cells[2].verified" in p.stderr


def test_manifest_errors_name_the_exact_path(tmp_path):
    data = json.loads((ROOT / "backends/mlu/manifest.json").read_text())
    data["native"]["aten"][5] = 5
    data["api_support"]["apis"]["torch.nanmedian"] = {"s": "yes"}
    p = tmp_path / "manifest.json"
    p.write_text(json.dumps(data))
    with pytest.raises(ManifestError) as exc:
        load_manifest("mlu", str(p))
    assert exc.value.path == ("api_support", "apis", "torch.nanmedian", "s")
    assert str(exc.value) == (f"{p}: not a valid hal-capabilities/1 document: "
                              "$.api_support.apis['torch.nanmedian'].s: \"yes\" is not of type 'boolean' (and 1 more)")
    p.write_text("{not json")
    with pytest.raises(ManifestError, match="not JSON"):
        load_manifest("mlu", str(p))
    p.write_text(json.dumps({"schema": "hal-capabilities/0"}))
    with pytest.raises(ManifestError, match="schema 'hal-capabilities/0', expected 'hal-capabilities/1'"):
        load_manifest("mlu", str(p))


def test_rules_errors_name_the_exact_path(tmp_path):
    data = yaml.safe_load((ROOT / "backends/mlu/migration_rules.yaml").read_text())
    data["rules"]["float64"]["severity"] = "fatal"
    data["rules"]["cuda-api"]["message"] = "{found} -> {countrepart}"
    data["env"]["PYTORCH_CUDA_ALLOC_CONF"] = ["PYTORCH_MLU_ALLOC_CONF"]
    p = tmp_path / "migration_rules.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(RulesError) as exc:
        load_rules("mlu", str(p))
    msg = str(exc.value)
    assert msg.startswith(f"{p}: not a valid hal-migration-rules/1 document: $.env.PYTORCH_CUDA_ALLOC_CONF: ")
    assert msg.endswith("(and 2 more)") and "\n" not in msg
    found = [str(x) for x in schemas.problems("hal-migration-rules/1", data)]
    assert found[1].startswith("$.rules['cuda-api'].message: '{found} -> {countrepart}' does not match")
    assert found[2] == "$.rules.float64.severity: \"fatal\" is not one of [\"error\", \"warning\", \"info\", \"off\", false]"
    data["rules"]["no-such-rule"] = {"severity": "error"}
    assert "$.rules['no-such-rule']: unknown rule id 'no-such-rule'" in [
        str(x) for x in schemas.problems("hal-migration-rules/1", data)]
    data = yaml.safe_load((ROOT / "backends/cuda/migration_rules.yaml").read_text())
    assert any(r["severity"] is False for r in data["rules"].values())  # a bare YAML off stays valid
    assert schemas.problems("hal-migration-rules/1", data) == []
    assert hal_map()["torch.cuda.synchronize"] == "hal_portable.synchronize"


def test_json_path_spelling():
    assert schemas.json_path(()) == "$"
    assert schemas.json_path(("a", 0, "b-c", "it's", "x.y")) == "$.a[0]['b-c']['it\\'s']['x.y']"


# -- hal schema ------------------------------------------------------------------------------------

def _hal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hal.cli.main", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_hal_schema_lists_and_prints():
    listed = _hal("schema")
    assert listed.returncode == 0, listed.stderr
    for name in schemas.names():
        assert name in listed.stdout
    shown = _hal("schema", "hal-audit/1")
    assert shown.returncode == 0 and json.loads(shown.stdout) == schemas.load("hal-audit/1")
    shipped = (ROOT / "hal" / "schemas" / "hal-audit-1.schema.json").read_text()
    assert shown.stdout == shipped
    bad = _hal("schema", "hal-audit/9")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "hal: error: unknown schema 'hal-audit/9'; known: " + ", ".join(schemas.names())]


def test_unknown_schema_name_is_a_typed_error():
    with pytest.raises(schemas.UnknownSchemaError, match="unknown schema '../x'"):
        schemas.load("../x")
    with pytest.raises(schemas.UnknownSchemaError):
        schemas.problems("hal-audit", {})


def test_fidelity_schema_takes_the_shape_issue_19_gives():
    doc = {"schema": "hal-fidelity/1", "environment": {"python": "3.11", "torch": "2.13.0"},
           "programs": [{"name": f"p{i}", "op_agreement": 0.9, "status_agreement": 1.0,
                         "only_predicted": ["aten::mm"], "only_measured": [],
                         "status_mismatches": [{"op": "aten::mm", "predicted": "native", "measured": "fallback"}]}
                        for i in range(12)],
           "summary": {"programs": 12, "op_agreement": 0.9, "status_agreement": 1.0}}
    assert schemas.problems("hal-fidelity/1", doc) == []
    doc["programs"][10]["op_agreement"] = 2
    doc["programs"][3]["only_measured"] = "aten::mm"
    assert [str(p) for p in schemas.problems("hal-fidelity/1", doc)] == [  # document order, not string order
        "$.programs[3].only_measured: \"aten::mm\" is not of type 'array'",
        "$.programs[10].op_agreement: 2 is greater than the maximum of 1"]


def test_matrix_schema_refuses_a_predicted_cell_with_measured_words():
    doc = json.loads((REPORTS / "matrix" / "compat-matrix.json").read_text(encoding="utf-8"))
    predicted = next(i for i, c in enumerate(doc["cells"]) if not c["verified"] and c["status"].startswith("ops-"))
    for bad in ({"status": "pass"}, {"status": "precision-fail"}, {"verified": True}):
        broken = copy.deepcopy(doc)
        broken["cells"][predicted].update(bad)
        assert schemas.problems("hal-compat-matrix/1", broken), bad
