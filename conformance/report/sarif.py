"""SARIF 2.1.0 for code scanning: one run, the rule catalogue as ``tool.driver.rules``.

Result locations use ``artifactLocation.uri`` relative to the audited root (``uriBaseId``
``SRCROOT``) with 1-based ``startLine``/``startColumn``. Severity maps error->error,
warning->warning, info->note. Message texts go through
:func:`hal.conformance.report.escape.sarif_text` (control characters visible, ``[``/``]`` escaped so
no embedded link forms). Pure function; thread-safe.
"""
from __future__ import annotations

import pathlib
import urllib.parse
from typing import Mapping, Optional

from hal.conformance.report.escape import sarif_text

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVELS = {"error": "error", "warning": "warning", "info": "note"}


def _artifact(path: str) -> dict:
    """Relative paths resolve against SRCROOT (the audited folder); absolute ones are file URIs."""
    if path.startswith("/") or (len(path) > 2 and path[1] == ":"):
        return {"uri": pathlib.Path(path).as_uri()}
    return {"uri": urllib.parse.quote(path), "uriBaseId": "SRCROOT"}


def to_sarif(report: dict, catalogue: Mapping[str, str], root: Optional[str] = None,
             tool_version: str = "0") -> dict:
    findings = report.get("findings") or []
    used = sorted({f["rule"] for f in findings} | set(catalogue))
    index = {rid: i for i, rid in enumerate(used)}
    default_level = {}
    for f in findings:
        default_level.setdefault(f["rule"], LEVELS.get(f.get("severity"), "note"))
    rules = [{"id": rid, "name": rid.replace("-", " ").title().replace(" ", ""),
              "shortDescription": {"text": catalogue.get(rid, rid)},
              "defaultConfiguration": {"level": default_level.get(rid, "warning")},
              "help": {"text": f"See docs/audit-rules.md, rule {rid}."}} for rid in used]
    results = []
    for f in findings:
        region = {"startLine": max(1, int(f.get("line") or 1)), "startColumn": max(1, int(f.get("column") or 1))}
        if f.get("end_line"):
            region["endLine"] = int(f["end_line"])
            region["endColumn"] = max(1, int(f.get("end_column") or 1))
        res = {"ruleId": f["rule"], "ruleIndex": index[f["rule"]], "level": LEVELS.get(f.get("severity"), "note"),
               "message": {"text": sarif_text(f.get("message") or f["rule"])},
               "locations": [{"physicalLocation": {"artifactLocation": _artifact(str(f.get("path", ""))),
                                                    "region": region}}]}
        if f.get("fix"):
            res["properties"] = {"fix": f["fix"]}
        results.append(res)
    run = {"tool": {"driver": {"name": "hal-audit", "version": tool_version, "rules": rules}},
           "results": results, "columnKind": "unicodeCodePoints",
           "properties": {"target": report.get("target")}}
    if root:
        run["originalUriBaseIds"] = {"SRCROOT": {"uri": pathlib.Path(root).resolve().as_uri() + "/"}}
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
