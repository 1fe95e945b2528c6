"""SARIF 2.1.0 for code scanning: one run, the rule catalogue as ``tool.driver.rules``.

Result locations use ``artifactLocation.uri`` relative to the audited root (``uriBaseId``
``SRCROOT``) with 1-based ``startLine``/``startColumn`` (``columnKind`` unicodeCodePoints). Severity
maps error->error, warning->warning, info->note. Message texts go through
:func:`hal.conformance.report.escape.sarif_text` (control characters visible, ``[``/``]`` escaped so
no embedded link forms).

Fixes: a finding with exact edits (audit.json ``findings[].edits``, one list per ``--fix-to``
flavour) gets one SARIF ``fix`` per flavour, the chosen flavour (``findings[].fix``'s) first; each
edit is a ``replacement`` whose ``deletedRegion`` is the edit's span (0-based edit columns become
1-based SARIF columns; an empty region is an insertion) and whose ``insertedContent`` is the new
text. Notebook findings (``cell`` set) get no fix: their edits address the joined cells, not the
``.ipynb`` file. A device fix does not repeat the file-level ``import`` the patch adds once per file
(its description says so; ``migration.patch`` has it).

``partialFingerprints["halFinding/v1"]``: a hash of (rule, path, the flagged text, its occurrence
number among identical triples), with no line number, so a finding keeps its identity when lines
move. ``rules[].helpUri`` and ``informationUri``: the rule's page under the docs URL -- the
``docs_url`` argument, else the installed distribution's ``Documentation`` project URL; the project
has no published home yet, so by default there is none and these keys are left out rather than
pointing at an address that does not exist. Pure function; thread-safe.
"""
from __future__ import annotations

import collections
import hashlib
import pathlib
import urllib.parse
from typing import Mapping, Optional

from hal.conformance.report.escape import sarif_text

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVELS = {"error": "error", "warning": "warning", "info": "note"}
FINGERPRINT = "halFinding/v1"
FLAVOUR_TEXT = {"device": "rewrite for the target device", "hal": "rewrite to device-neutral hal_portable calls"}


def published_docs_url() -> Optional[str]:
    """The ``Documentation`` project URL of the installed hal-portability distribution, or None."""
    try:
        from importlib.metadata import PackageNotFoundError, metadata
        urls = metadata("hal-portability").get_all("Project-URL") or []
    except (ImportError, PackageNotFoundError):
        return None
    for entry in urls:
        label, _, url = entry.partition(",")
        if label.strip().lower() == "documentation" and url.strip():
            return url.strip().rstrip("/")
    return None


def help_uri(rule: str, docs_url: str) -> str:
    """The documentation of ``rule`` under ``docs_url``: audit-rules.md (runtime rules: runtime-audit.md)."""
    page = "runtime-audit.md" if rule.startswith("runtime-") else "audit-rules.md#rules"
    return f"{docs_url.rstrip('/')}/{page}"


def _artifact(path: str) -> dict:
    """Relative paths resolve against SRCROOT (the audited folder); absolute ones are file URIs."""
    if path.startswith("/") or (len(path) > 2 and path[1] == ":"):
        return {"uri": pathlib.Path(path).as_uri()}
    return {"uri": urllib.parse.quote(path), "uriBaseId": "SRCROOT"}


def _replacement(edit: dict) -> dict:
    return {"deletedRegion": {"startLine": int(edit["line"]), "startColumn": int(edit["col"]) + 1,
                              "endLine": int(edit["end_line"]), "endColumn": int(edit["end_col"]) + 1},
            "insertedContent": {"text": str(edit["text"])}}


def fixes(finding: dict, chosen: Optional[str] = None) -> list[dict]:
    """SARIF ``fix`` objects for ``finding``'s exact edits (see the module docstring); [] when it has none."""
    edits = finding.get("edits") or {}
    if not isinstance(edits, dict) or finding.get("cell") is not None:
        return []
    order = sorted(edits, key=lambda fl: (fl != chosen, fl))
    out = []
    for flavour in order:
        spans = edits.get(flavour) or []
        if not spans:
            continue
        text = FLAVOUR_TEXT.get(flavour, f"--fix-to {flavour}")
        if flavour == "device":
            text += " (migration.patch also adds the target's import once per file)"
        out.append({"description": {"text": sarif_text(f"--fix-to {flavour}: {text}")},
                    "artifactChanges": [{"artifactLocation": _artifact(str(finding.get("path", ""))),
                                         "replacements": [_replacement(e) for e in spans]}]})
    return out


def _chosen_flavour(finding: dict) -> Optional[str]:
    """The flavour whose text is ``finding["fix"]`` (the run's ``--fix-to``), when it can be told."""
    for flavour, text in (finding.get("fixes") or {}).items():
        if text is not None and text == finding.get("fix"):
            return flavour
    return None


def to_sarif(report: dict, catalogue: Mapping[str, str], root: Optional[str] = None,
             tool_version: str = "0", docs_url: Optional[str] = None) -> dict:
    findings = report.get("findings") or []
    docs_url = docs_url or published_docs_url()
    used = sorted({f["rule"] for f in findings} | set(catalogue))
    index = {rid: i for i, rid in enumerate(used)}
    default_level = {}
    for f in findings:
        default_level.setdefault(f["rule"], LEVELS.get(f.get("severity"), "note"))
    rules = [{"id": rid, "name": rid.replace("-", " ").title().replace(" ", ""),
              "shortDescription": {"text": catalogue.get(rid, rid)},
              "defaultConfiguration": {"level": default_level.get(rid, "warning")},
              **({"helpUri": help_uri(rid, docs_url)} if docs_url else {}),
              "help": {"text": f"See docs/audit-rules.md, rule {rid}."}} for rid in used]
    results = []
    seen: collections.Counter = collections.Counter()
    for f in findings:
        region = {"startLine": max(1, int(f.get("line") or 1)), "startColumn": max(1, int(f.get("column") or 1))}
        if f.get("end_line"):
            region["endLine"] = max(region["startLine"], int(f["end_line"]))
            region["endColumn"] = max(1, int(f.get("end_column") or 1))
        key = (f["rule"], str(f.get("path", "")), str(f.get("found", f.get("message", ""))))
        seen[key] += 1
        digest = hashlib.sha256("\0".join((*key, str(seen[key]))).encode("utf-8", "surrogatepass")).hexdigest()
        res = {"ruleId": f["rule"], "ruleIndex": index[f["rule"]], "level": LEVELS.get(f.get("severity"), "note"),
               "message": {"text": sarif_text(f.get("message") or f["rule"])},
               "locations": [{"physicalLocation": {"artifactLocation": _artifact(str(f.get("path", ""))),
                                                    "region": region}}],
               "partialFingerprints": {FINGERPRINT: digest[:32]}}
        fx = fixes(f, _chosen_flavour(f))
        if fx:
            res["fixes"] = fx
        if f.get("fix"):
            res["properties"] = {"fix": f["fix"]}
        results.append(res)
    driver = {"name": "hal-audit", "version": tool_version, "rules": rules}
    if docs_url:
        driver["informationUri"] = docs_url.rstrip("/") + "/audit-rules.md"
    run = {"tool": {"driver": driver},
           "results": results, "columnKind": "unicodeCodePoints",
           "properties": {"target": report.get("target")}}
    if root:
        run["originalUriBaseIds"] = {"SRCROOT": {"uri": pathlib.Path(root).resolve().as_uri() + "/"}}
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
