"""What a reader needs first, computed from a ``hal-audit/1`` report: the verdict and next steps,
findings with their run-time evidence attached, one row per distinct op.

Pure functions on the report dict (plus reading source lines for snippets); the report itself is
never changed, so ``audit.json`` keeps every record. The writers (:mod:`.render`) format what these
return; nothing here escapes text (the writers do, for their format).

- :func:`merged_findings` -- a ``runtime-redirect-*`` finding on the same ``path:line`` as a
  static finding is attached to it (``confirmed``: "confirmed at run time") instead of being a
  second row; the others stay rows of their own (``runtime_only``). Rows are sorted by severity
  (error, warning, info), then path, line and column.
- :func:`distinct_ops` -- the ``ops`` records (one per op *per phase*) folded to one row per op:
  calls summed, dtypes and phases united, the worst status, the fallback cost summed.
- :func:`lead` -- the opening of every report: verdict line, the predicted-not-measured banner,
  key facts (fallbacks and their cost, precision verdict) and the next steps with exact commands.
"""
from __future__ import annotations

import os
import shlex
from typing import Any, Optional

SEVERITIES = ("error", "warning", "info")
#: worst first: the status a distinct op shows when its records disagree
STATUS_ORDER = ("unsupported", "fallback", "unknown", "composite", "native")
RUNTIME_PREFIX = "runtime-"
SNIPPET_MAX_LINES = 3
SNIPPET_MAX_BYTES = 2_000_000  # a source file larger than this gets no snippet


def _sev_rank(sev: Any) -> int:
    return SEVERITIES.index(sev) if sev in SEVERITIES else len(SEVERITIES)


def _loc_key(f: dict) -> tuple:
    line = f.get("line")
    col = f.get("column")
    return (str(f.get("path") or ""), line if isinstance(line, int) else 0, col if isinstance(col, int) else 0)


def is_runtime(f: dict) -> bool:
    """A finding the run produced (``runtime-*`` rules), not the static scan."""
    return str(f.get("rule") or "").startswith(RUNTIME_PREFIX)


def fix_flavour(report: dict) -> str:
    return str((report.get("fix") or {}).get("flavour") or "device")


def _fixable(f: dict, flavour: str) -> bool:
    return bool((f.get("fixes") or {}).get(flavour))


def snippet(root: Optional[str], path: Any, line: Any, end_line: Any = None,
            _cache: Optional[dict] = None) -> list[tuple[int, str]]:
    """``[(line number, text)]`` of ``path`` (relative to ``root`` unless absolute), lines ``line`` to
    ``end_line`` (at most :data:`SNIPPET_MAX_LINES`); ``[]`` when the file cannot be read or is not a
    ``.py`` file (a notebook's lines are cell-relative). Never raises."""
    if not isinstance(path, str) or not path.endswith(".py") or not isinstance(line, int) or line < 1:
        return []
    full = path if os.path.isabs(path) or not root else os.path.join(root, path)
    if root and os.path.isfile(root) and not os.path.isabs(path):  # a single-file audit: root is the file
        full = root if os.path.basename(root) == path else os.path.join(os.path.dirname(root), path)
    lines = None if _cache is None else _cache.get(full)
    if lines is None:
        try:
            if os.path.getsize(full) > SNIPPET_MAX_BYTES:
                return []
            with open(full, encoding="utf-8", errors="replace") as fh:
                lines = fh.read().splitlines()
        except (OSError, ValueError):
            return []
        if _cache is not None:
            _cache[full] = lines
    last = end_line if isinstance(end_line, int) and end_line >= line else line
    last = min(last, line + SNIPPET_MAX_LINES - 1, len(lines))
    return [(n, lines[n - 1].rstrip()) for n in range(line, last + 1)]


def merged_findings(report: dict, root: Optional[str] = None) -> list[dict]:
    """Display rows: each static finding once, with ``confirmed`` (the run-time findings on its line),
    ``fixable`` (for the report's fix flavour) and ``snippet``; run-time findings with no static
    finding on their line are rows of their own with ``runtime_only`` True. Sorted by severity, then
    location."""
    flavour = fix_flavour(report)
    findings = [f for f in report.get("findings") or [] if isinstance(f, dict)]
    static = [f for f in findings if not is_runtime(f)]
    by_line: dict[tuple, list[dict]] = {}
    for f in static:
        by_line.setdefault((str(f.get("path")), f.get("line")), []).append(f)
    rows: list[dict] = [{"finding": f, "confirmed": [], "runtime_only": False, "fixable": _fixable(f, flavour)}
                        for f in static]
    row_of = {id(r["finding"]): r for r in rows}
    for f in findings:
        if not is_runtime(f):
            continue
        hosts = by_line.get((str(f.get("path")), f.get("line")))
        if hosts:  # attach to the most severe static finding on that line
            host = min(hosts, key=lambda h: (_sev_rank(h.get("severity")), _loc_key(h)))
            row_of[id(host)]["confirmed"].append(f)
        else:
            rows.append({"finding": f, "confirmed": [], "runtime_only": True, "fixable": False})
    cache: dict = {}
    for r in rows:
        f = r["finding"]
        r["snippet"] = snippet(root, f.get("path"), f.get("line"), f.get("end_line"), cache)
    rows.sort(key=lambda r: (_sev_rank(r["finding"].get("severity")), _loc_key(r["finding"]), r["runtime_only"]))
    return rows


def distinct_ops(ops: Any) -> list[dict]:
    """One row per distinct op: ``{op, status, calls, calls_per_step, dtypes, phases, bytes_per_step,
    verified, reasons, dtype_notes, modules, hints, records}``, worst status first, then fallback cost
    and calls."""
    rows: dict[str, dict] = {}
    for o in ops or []:
        if not isinstance(o, dict):
            continue
        name = str(o.get("op"))
        r = rows.setdefault(name, {"op": name, "status": None, "calls": 0, "calls_per_step": 0.0, "dtypes": [],
                                   "phases": [], "bytes_per_step": 0, "verified": True, "reasons": [],
                                   "dtype_notes": [], "modules": [], "hints": [], "records": 0})
        r["records"] += 1
        st = o.get("status") if o.get("status") in STATUS_ORDER else "unknown"
        if r["status"] is None or STATUS_ORDER.index(st) < STATUS_ORDER.index(r["status"]):
            r["status"] = st
        r["calls"] += o.get("count") if isinstance(o.get("count"), int) else 0
        cps = o.get("calls_per_step")
        r["calls_per_step"] += float(cps) if isinstance(cps, (int, float)) else 0.0
        bps = o.get("bytes_per_step")
        r["bytes_per_step"] += int(bps) if isinstance(bps, (int, float)) else 0
        r["verified"] = r["verified"] and bool(o.get("verified"))
        for key, src in (("dtypes", o.get("dtypes")), ("dtype_notes", o.get("dtype_notes")),
                         ("modules", o.get("modules")), ("hints", o.get("hints")), ("reasons", [o.get("reason")])):
            for v in src if isinstance(src, list) else []:
                if v is not None and not isinstance(v, (dict, list)) and v not in r[key]:
                    r[key].append(v)
        phase = o.get("phase")
        if phase and phase not in r["phases"]:
            r["phases"].append(phase)
    out = list(rows.values())
    for r in out:
        r["calls_per_step"] = round(r["calls_per_step"], 3)
    out.sort(key=lambda r: (STATUS_ORDER.index(r["status"]), -r["bytes_per_step"], -r["calls"], r["op"]))
    return out


def ops_by_status(ops: Any) -> dict[str, int]:
    """Distinct ops per status, worst status first (an op counts once, under its worst status)."""
    counts: dict[str, int] = {}
    for r in distinct_ops(ops):
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return {s: counts[s] for s in STATUS_ORDER if s in counts}


def human_bytes(n: Any) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    if not isinstance(n, (int, float)):
        return "-"
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(v) < 1024 or unit == "GiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} TiB"  # pragma: no cover


def _cmd(*parts: Any) -> str:
    return " ".join(shlex.quote(str(p)) for p in parts)


def fix_command(report: dict) -> str:
    """The exact command that writes ``migration.patch`` for this target (static part only: fast)."""
    t = report.get("target") or {}
    inv = report.get("invocation") or {}
    prog = inv.get("prog") or "hal-audit"
    src = t.get("source") or "TARGET"
    out = inv.get("out") or "hal-audit-out"
    flavour = fix_flavour(report)
    target = ["-m", src] if t.get("kind") == "module" else [src]
    return " ".join([prog if prog in ("hal-audit", "hal audit") else "hal-audit",
                     _cmd(*target, "--device", t.get("device") or "mlu", "--static-only", "--fix",
                          *(("--fix-to", flavour) if flavour != "device" else ()), "--out", out)])


def _run_line(report: dict) -> str:
    run = report.get("run") or {}
    status = run.get("status")
    if status == "skipped":
        return f"skipped ({run.get('reason') or run.get('error') or 'static audit only'})"
    bits = [str(status)]
    if run.get("steps") is not None:
        bits.append(f"{run['steps']} steps")
    if isinstance(run.get("seconds"), (int, float)):
        bits.append(f"{run['seconds']:.1f} s")
    if run.get("device"):
        bits.append(f"on {run['device']}" + (f" as {run['devices']} GPUs (--devices)" if run.get("devices") else ""))
    line = ", ".join(bits)
    if run.get("error"):
        line += f": {run['error']}"
    workers = run.get("spawned") or []
    if workers:
        failed = [w for w in workers if w.get("status") not in (None, "ok")]
        line += f"; {len(workers)} worker process{'es' if len(workers) != 1 else ''} audited"
        if failed:  # a program need not check its workers' exit codes: say it here, not only in audit.json
            w = failed[0]
            line += (f", {len(failed)} failed ({w.get('process') or 'rank ' + str(w.get('rank'))}: "
                     f"{w.get('error') or w.get('status')})")
    return line


def _fallback_fact(report: dict, ops: list[dict]) -> str:
    run = report.get("run") or {}
    if not ops:
        if run.get("status") == "skipped":
            return "ops not captured (the program was not run), so fallbacks are unknown"
        return "no ops were captured, so fallbacks are unknown"
    falls = [o for o in ops if o["status"] == "fallback"]
    unsupported = [o for o in ops if o["status"] == "unsupported"]
    unknown = [o for o in ops if o["status"] == "unknown"]
    if not falls and not unsupported:
        text = f"nothing falls back to the CPU ({len(ops)} distinct ops)"
    else:
        parts = []
        if falls:
            cost = ", ".join(f"{o['op']} ({o['calls_per_step']:g} calls, {human_bytes(o['bytes_per_step'])} copied "
                             f"per step)" for o in falls[:5]) + (" ..." if len(falls) > 5 else "")
            total = sum(o["bytes_per_step"] for o in falls)
            parts.append(f"{len(falls)} of {len(ops)} distinct ops fall back to the CPU, {human_bytes(total)} "
                         f"host-device copies per step: {cost}")
        if unsupported:
            parts.append(f"{len(unsupported)} unsupported (would raise): "
                         + ", ".join(o["op"] for o in unsupported[:5]))
        text = "; ".join(parts)
    fb_ms = ((report.get("profile") or {}).get("fallback") or {}).get("ms_per_step") \
        if isinstance(report.get("profile"), dict) else None
    if isinstance(fb_ms, (int, float)) and fb_ms:
        text += f"; fallback time {fb_ms:.3g} ms per step"
    if unknown:
        text += f"; {len(unknown)} with unknown status"
    return text


def _g(x: Any) -> str:
    """A metric value as the summary prints it: 3 significant digits (``1.33e-05``), anything else as is."""
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def unexplained_verdict_reasons(precision: dict) -> list:
    """The reasons (``summary.verdict_reasons``) of a precision verdict other than pass that no divergent op explains
    (a loss drift, calibration): what the terminal's precision lines add; empty otherwise."""
    if precision.get("first_divergence") or precision.get("verdict") in (None, "pass"):
        return []
    return [str(r) for r in (precision.get("summary") or {}).get("verdict_reasons") or []]


def largest_divergence_reasons(precision: dict) -> list[str]:
    """The verdict's ``largest divergence: ...`` reason (:func:`hal.conformance.precision.compare.largest_divergence`:
    the op furthest over its limit, when that is not the first divergence), for the lines that name the first."""
    from hal.conformance.precision.compare import LARGEST
    return [str(r) for r in (precision.get("summary") or {}).get("verdict_reasons") or [] if str(r).startswith(LARGEST)]


def _precision_fact(report: dict) -> Optional[str]:
    p = report.get("precision")
    if not isinstance(p, dict):
        return None
    verdict = p.get("verdict")
    fd = p.get("first_divergence")
    if verdict in ("not-run", "error"):
        return f"{verdict}: {p.get('reason') or p.get('error') or p.get('note') or 'no reason given'}"
    if isinstance(fd, dict):
        where = " ".join(str(x) for x in (fd.get("module"), fd.get("op")) if x)
        return (f"{verdict or 'diverged'}: first divergence at {where} ({fd.get('metric')} {_g(fd.get('value'))} > "
                f"{_g(fd.get('threshold'))})" + "".join(f"; {x}" for x in largest_divergence_reasons(p)))
    text = str(verdict or "compared")
    reasons = unexplained_verdict_reasons(p)
    if reasons:  # not pass, yet no op diverged: say why
        text += f": {'; '.join(reasons)}"
        if "first_divergence" in p:
            text += " (every op within its threshold)"
    elif fd is None and "first_divergence" in p:
        text += ": every op within its threshold"
    if p.get("verified") is False:
        text += " (not measured on the target device)"
    return text


def lead(report: dict, root: Optional[str] = None, rows: Optional[list] = None,
         ops: Optional[list] = None) -> dict:
    """The opening of every report: ``{title, verdict, state, banner, facts: [(label, text)],
    steps: [{text, command}]}``. ``state`` is ``ok`` (nothing to do), ``action`` (findings or
    fallbacks to act on) or ``failed`` (the program did not run to the end)."""
    t = report.get("target") or {}
    run = report.get("run") or {}
    rows = merged_findings(report, root) if rows is None else rows
    ops = distinct_ops(report.get("ops")) if ops is None else ops
    flavour = fix_flavour(report)
    sev = {s: sum(1 for r in rows if r["finding"].get("severity") == s) for s in SEVERITIES}
    fixable = sum(1 for r in rows if r["fixable"])
    manual = sum(1 for r in rows if not r["fixable"] and not r["runtime_only"]
                 and r["finding"].get("severity") in ("error", "warning"))
    confirmed = sum(1 for r in rows if r["confirmed"])
    runtime_only = sum(1 for r in rows if r["runtime_only"])
    files = len({r["finding"].get("path") for r in rows})
    falls = [o for o in ops if o["status"] in ("fallback", "unsupported")]
    failed = run.get("status") in ("error", "timeout", "crashed")
    p = report.get("precision") if isinstance(report.get("precision"), dict) else {}
    diverged = bool(p and (p.get("first_divergence") or p.get("verdict") == "fail"))
    state = "failed" if failed else ("action" if rows and (sev["error"] or sev["warning"]) or falls or diverged
                                     else "ok")
    device = t.get("device") or "?"
    if rows:
        verdict = (f"{len(rows)} findings ({sev['error']} error, {sev['warning']} warning, {sev['info']} info) in "
                   f"{files} file{'s' if files != 1 else ''}; {fixable} fixable automatically")
    else:
        verdict = "no device-specific code found"
    verdict += "; " + _fallback_fact(report, ops)
    interrupted = run.get("interrupted")  # stopped by Ctrl-C / SIGTERM to the audit: not the program's failure
    if interrupted:
        from hal.conformance.runtime.runner import INTERRUPTS
        verdict = f"the run was interrupted ({INTERRUPTS.get(interrupted, interrupted)}); " + verdict
    elif failed:
        verdict = f"the program failed ({run.get('status')}); " + verdict
    banner = None
    if not t.get("verified"):
        banner = (f"nothing here ran on a {device} device"
                  + (f" ({t.get('reason')})" if t.get("reason") else "")
                  + f". Op statuses and fallback costs are predicted from the {device} capability data; "
                    "verify on the device.")
    facts = [("run", _run_line(report))]
    if rows:
        facts.append(("findings", f"{sev['error']} error, {sev['warning']} warning, {sev['info']} info; "
                                  f"{fixable} fixable with --fix-to {flavour}; {confirmed} confirmed at run time"
                                  + (f"; {runtime_only} seen only at run time" if runtime_only else "")))
    facts.append(("fallbacks", _fallback_fact(report, ops)))
    prec = _precision_fact(report)
    if prec is not None:
        facts.append(("precision", prec))
    steps: list[dict] = []
    fix = report.get("fix") if isinstance(report.get("fix"), dict) else None
    if fixable:
        if fix and fix.get("apply"):
            steps.append({"text": f"{fixable} findings are fixed by the patch written to {fix.get('patch')}: "
                                  "review it, then apply it (or use `git apply` from the same folder):",
                          "command": str(fix["apply"])})
        else:
            steps.append({"text": f"{fixable} findings can be fixed automatically: write the patch "
                                  "(a unified diff; no file is edited), review it, then apply it with "
                                  "`patch -p1` or `git apply` from the audited folder:",
                          "command": fix_command(report)})
    if manual:
        steps.append({"text": f"{manual} error/warning findings need a change by hand: see the findings below "
                              "(each says what to use instead).", "command": None})
    if falls:
        steps.append({"text": f"{len(falls)} ops would run on the CPU or raise on {device}: replace them or "
                              "accept the cost (see Operators).", "command": None})
    if diverged:
        steps.append({"text": "precision diverged: start from the first divergence (see Precision).",
                      "command": None})
    if interrupted:
        steps.append({"text": "the run was stopped before its end: what it covers is what ran until then; audit it "
                              "again (a smaller --steps bounds it) for the rest.", "command": None})
    elif failed:
        steps.append({"text": "the program did not finish: see Run for its last output.", "command": None})
    if not t.get("verified") and not failed:
        steps.append({"text": f"verify on a machine with {device}: run the same audit there; results it measures "
                              "are marked verified.", "command": None})
    if not steps:
        steps.append({"text": "nothing to do: the program is ready for " + device + ".", "command": None})
    title = f"hal-audit report: {t.get('source', '')} for {device}"
    return {"title": title, "verdict": verdict, "state": state, "banner": banner, "facts": facts, "steps": steps,
            "counts": {"rows": len(rows), "fixable": fixable, "manual": manual, "confirmed": confirmed,
                       "runtime_only": runtime_only, "fallback_ops": len(falls), **sev}}
