"""The ``hal-audit/1`` report: building it, the summary, and the environment block.

Contract (DESIGN.md section 4): keys schema, target, environment, run, findings, ops, precision,
profile, summary always exist. Producers (the static audit, the runtime audit, later the precision
and profiling audits) fill sections; :func:`finalize` recomputes ``summary`` from them. Pure
functions on plain dicts (JSON-serialisable); thread-safe.
"""
from __future__ import annotations

import collections
import platform
import sys
from typing import Any, Optional

SCHEMA = "hal-audit/1"
REQUIRED_KEYS = ("schema", "target", "environment", "run", "findings", "ops", "precision", "profile", "summary")
SEVERITY_ORDER = ("error", "warning", "info")
RUN_STATUSES = ("ok", "skipped", "error", "timeout", "crashed")


def environment_info() -> dict:
    """``{python, torch, platform, backends: {name: {available, reason, versions}}}`` (never raises)."""
    env: dict = {"python": platform.python_version(), "platform": platform.platform(), "executable": sys.executable}
    try:
        import torch
        env["torch"] = torch.__version__
    except Exception as exc:  # pragma: no cover - torch is a dependency
        env["torch"] = f"unavailable ({type(exc).__name__})"
    backends = {}
    try:
        import hal
        for info in hal.list_backends():  # versions() never runs an isolated plugin in this process
            backends[info.name] = {"available": info.available, "reason": info.reason, "versions": info.versions()}
            if getattr(info, "collisions", ()):
                backends[info.name]["collisions"] = list(info.collisions)
    except Exception as exc:  # discovery must not break a report
        backends["error"] = {"available": False, "reason": f"{type(exc).__name__}: {exc}", "versions": {}}
    env["backends"] = backends
    try:
        import hal
        env["hal"] = hal.__version__
    except Exception:  # pragma: no cover
        pass
    return env


def new_report(target: dict, *, environment: Optional[dict] = None, run: Optional[dict] = None,
               findings: Optional[list] = None, ops: Optional[list] = None, precision: Any = None,
               profile: Any = None, **extra: Any) -> dict:
    """A complete ``hal-audit/1`` report; ``extra`` keys (e.g. ``static``, ``fix``) are kept as given."""
    report = {"schema": SCHEMA, "target": dict(target),
              "environment": environment if environment is not None else environment_info(),
              "run": run or {"status": "skipped", "steps": None, "seconds": None, "error": None},
              "findings": list(findings or []), "ops": list(ops or []), "precision": precision,
              "profile": profile, "summary": {}}
    report.update(extra)
    return finalize(report)


def finalize(report: dict) -> dict:
    """Fill missing required keys and recompute ``summary`` from the sections (in place; returns it)."""
    report.setdefault("schema", SCHEMA)
    for key in REQUIRED_KEYS:
        report.setdefault(key, [] if key in ("findings", "ops") else None)
    findings = report["findings"] or []
    by_sev = {s: 0 for s in SEVERITY_ORDER}
    by_rule: collections.Counter = collections.Counter()
    for f in findings:
        by_sev[f.get("severity", "info")] = by_sev.get(f.get("severity", "info"), 0) + 1
        by_rule[f.get("rule", "?")] += 1
    ops_status = collections.Counter(o.get("status", "unknown") for o in report["ops"] or [])
    precision = report.get("precision") or None
    summary = {
        "findings": sum(by_sev.values()),
        "by_severity": by_sev,
        "by_rule": dict(sorted(by_rule.items(), key=lambda kv: (-kv[1], kv[0]))),
        "files_with_findings": len({f.get("path") for f in findings}),
        "fixable": {fl: sum(1 for f in findings if (f.get("fixes") or {}).get(fl)) for fl in ("device", "hal")},
        "ops": dict(ops_status),
        "run_status": (report.get("run") or {}).get("status"),
        "precision_diverged": bool(precision and (precision.get("first_divergence")
                                                   or precision.get("verdict") == "fail")),
    }
    report["summary"] = summary
    return report


def validate(report: dict) -> list[str]:
    """Every way ``report`` breaks the published schema ``hal-audit/1`` (``hal schema hal-audit/1``), one
    line each, naming the exact JSON path (``$.findings[3].severity: 'fatal' is not one of [...]``);
    an empty list when it conforms."""
    from hal import schemas
    return [str(p) for p in schemas.problems(SCHEMA, report)]


def check(report: dict, source: Optional[str] = None) -> dict:
    """``report`` unchanged when it conforms to ``hal-audit/1``; else raise
    :class:`hal.schemas.SchemaError` (a ValueError; one line naming the first problem's JSON path)."""
    from hal import schemas
    return schemas.check(SCHEMA, report, source)
