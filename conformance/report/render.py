"""Rendering a ``hal-audit/1`` report as text, Markdown and self-contained HTML.

Sections are a registry (:data:`SECTIONS`): each has a key in the report, a title and a function
that turns that section's value into *blocks* (headings, paragraphs, tables as plain data). The
Markdown and HTML writers render blocks, so a later audit (ops, precision, profile) adds a section
function with :func:`register_section` and every format picks it up; no new writer. Sections without
their own function are rendered generically (a list of dicts is a table, a dict a key/value table).

Escaping: every string that can come from user code (paths, identifiers, messages, program output,
exception text) is escaped for the output format by :mod:`hal.conformance.report.escape`: Markdown
keeps no markup at all (no image, link, HTML or block construct), HTML goes through
:func:`html.escape`, the terminal summary and all formats show control characters as visible
``\\xNN`` escapes. Pure functions; thread-safe.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Optional

from tabulate import tabulate

from hal.conformance.report import escape

# ---- blocks: the format-neutral intermediate --------------------------------------------------
# ("p", text) | ("table", headers, rows) | ("kv", [(key, value), ...]) | ("h", text)
# | ("svg", markup): a picture for the HTML page only, produced by our own code with every label
#   already escaped (hal.conformance.profiling.hotspot_chart_svg); other formats skip it.
Block = tuple


@dataclasses.dataclass(frozen=True)
class Section:
    key: str
    title: str
    blocks: Callable[[Any, dict], list]


SECTIONS: list[Section] = []


def register_section(key: str, title: str, order: Optional[int] = None):
    """Decorator: ``fn(value, report) -> [blocks]`` renders ``report[key]`` in every format."""
    def deco(fn: Callable[[Any, dict], list]) -> Callable[[Any, dict], list]:
        global SECTIONS
        SECTIONS = [s for s in SECTIONS if s.key != key]
        sec = Section(key, title, fn)
        SECTIONS.insert(len(SECTIONS) if order is None else order, sec)
        return fn
    return deco


def _scalar(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v, default=str, sort_keys=True)
    return str(v)


def generic_blocks(value: Any, report: dict) -> list:
    """A list of dicts becomes a table (union of keys), a dict a key/value table, else a paragraph."""
    if value is None or value == [] or value == {}:
        return [("p", "none")]
    if isinstance(value, list) and all(isinstance(x, dict) for x in value):
        headers: list = []
        for row in value:
            headers.extend(k for k in row if k not in headers)
        return [("table", headers, [[_scalar(r.get(h)) for h in headers] for r in value])]
    if isinstance(value, dict):
        blocks: list = [("kv", [(k, _scalar(v)) for k, v in value.items()
                                if not (isinstance(v, list) and v and all(isinstance(x, dict) for x in v))])]
        for k, v in value.items():
            if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                blocks.append(("h", str(k)))
                blocks.extend(generic_blocks(v, report))
        return blocks
    if isinstance(value, list):
        return [("p", ", ".join(_scalar(x) for x in value))]
    return [("p", _scalar(value))]


@register_section("target", "Target")
def _target(value: Any, report: dict) -> list:
    t = value or {}
    note = "measured on the device" if t.get("verified") else \
        "predicted: nothing here was measured on the target device (pending verification)"
    return [("kv", [(k, _scalar(v)) for k, v in t.items()]), ("p", note)]


@register_section("summary", "Summary")
def _summary(value: Any, report: dict) -> list:
    s = value or {}
    sev = s.get("by_severity", {})
    rows = [[r, n] for r, n in (s.get("by_rule") or {}).items()]
    blocks = [("kv", [("findings", s.get("findings", 0)), ("errors", sev.get("error", 0)),
                      ("warnings", sev.get("warning", 0)), ("info", sev.get("info", 0)),
                      ("files with findings", s.get("files_with_findings", 0)),
                      ("fixable (--fix-to device)", (s.get("fixable") or {}).get("device", 0)),
                      ("fixable (--fix-to hal)", (s.get("fixable") or {}).get("hal", 0)),
                      ("run", s.get("run_status")), ("ops by status", _scalar(s.get("ops") or {}))])]
    if rows:
        blocks.append(("table", ["rule", "findings"], rows))
    return blocks


@register_section("findings", "Findings")
def _findings(value: Any, report: dict) -> list:
    if not value:
        return [("p", "no device-specific code found")]
    rows = [[f.get("severity"), f"{f.get('path')}:{f.get('line')}:{f.get('column', '')}", f.get("rule"),
             f.get("message"), _scalar(f.get("fix"))] for f in value]
    return [("table", ["severity", "where", "rule", "message", "fix"], rows)]


@register_section("run", "Run")
def _run(value: Any, report: dict) -> list:
    return generic_blocks(value, report)


@register_section("ops", "Operators")
def _ops(value: Any, report: dict) -> list:
    return generic_blocks(value, report) if value else [("p", "not collected (static audit only)")]


def _not_collected(value: Any, flag: str) -> Optional[list]:
    if not value:
        return [("p", f"not collected (run with {flag})")]
    if not isinstance(value, dict):
        return generic_blocks(value, {})
    if value.get("verdict") in ("not-run", "error") and "metrics" not in value and "ops" not in value:
        return [("kv", [(k, _scalar(v)) for k, v in value.items()])]
    return None


@register_section("precision", "Precision")
def _precision(value: Any, report: dict, worst: int = 15) -> list:
    early = _not_collected(value, "--precision")
    if early is not None:
        return early
    if not isinstance(value.get("metrics"), list) or not all(isinstance(m, dict) for m in value["metrics"]):
        return generic_blocks(value, report)  # not ours: show it as it is
    fd = value.get("first_divergence")
    drift = value.get("drift") or {}
    blocks: list = [("kv", [("verdict", value.get("verdict")), ("verified", value.get("verified")),
                            ("reference", _scalar(value.get("reference"))), ("target", _scalar(value.get("target"))),
                            ("first divergence", _scalar(fd) if fd else "none: every op within its threshold"),
                            ("loss drift (max relative deviation)", drift.get("max_rel_dev")),
                            ("loss curves R^2", drift.get("r2")), ("note", value.get("note", ""))])]
    rows = []
    for m in value.get("metrics") or []:
        loc, tot = m.get("local") or {}, m.get("total") or {}
        rows.append((bool(loc.get("exceeds")) or bool(tot.get("exceeds")), tot.get("rms_rel") or 0.0, [
            m.get("kind"), m.get("phase"), m.get("module"), m.get("op"), m.get("dtype"),
            _scalar(loc.get("max_rel")), _scalar(tot.get("max_rel")), _scalar(tot.get("rms_rel")),
            _scalar(tot.get("cosine")), _scalar((m.get("threshold") or {}).get("rtol_eff")),
            "exceeds" if loc.get("exceeds") or tot.get("exceeds") else "ok"]))
    rows.sort(key=lambda r: (not r[0], -r[1]))
    if rows:
        blocks.append(("h", f"Worst {min(worst, len(rows))} of {len(rows)} comparisons (own error = the op re-run "
                            f"in float64 on its actual inputs; total = against the float64 run)"))
        blocks.append(("table", ["kind", "phase", "module", "op", "dtype", "own max rel", "total max rel",
                                 "total rms rel", "cosine", "rtol", "status"], [r[2] for r in rows[:worst]]))
    return blocks


@register_section("profile", "Profile")
def _profile(value: Any, report: dict, top: int = 12) -> list:
    early = _not_collected(value, "--profile")
    if early is not None:
        return early
    if ("ops" not in value and "memory" not in value) or not isinstance(value.get("memory") or {}, dict) \
            or not all(isinstance(o, dict) for o in value.get("ops") or []):  # not ours: show it as it is
        return generic_blocks(value, report)
    mem = value.get("memory") or {}
    step = value.get("step_ms") or {}
    fb = value.get("fallback") or {}
    blocks: list = [("kv", [("device", value.get("device")), ("verified", value.get("verified")),
                            ("step ms (median)", step.get("median") if isinstance(step, dict) else step),
                            ("profiled step ms", value.get("profiled_step_ms")),
                            ("memory estimate bytes", mem.get("estimate_bytes")), ("peak bytes", mem.get("peak_bytes")),
                            ("estimate error %", mem.get("error_pct")), ("peak source", mem.get("peak_source")),
                            ("fallback ms per step", fb.get("ms_per_step")),
                            ("host-device copies", _scalar((value.get("copies") or {}).get("count"))),
                            ("sync points", _scalar((value.get("syncs") or {}).get("count"))),
                            ("trace", value.get("trace")), ("note", value.get("note", ""))])]
    try:
        from hal.conformance.profiling import hotspot_chart_svg
        blocks.append(("svg", hotspot_chart_svg(value)))
    except Exception:  # the chart is a picture of the table below; never fail the report for it
        pass
    ops = value.get("ops") or []
    if ops:
        blocks.append(("h", f"Hot spots (top {min(top, len(ops))} of {len(ops)} ops)"))
        blocks.append(("table", ["op", "calls", "total ms", "self ms", "device ms", "share", "intensity",
                                 "% of roofline", "fallback"],
                       [[o.get("op"), o.get("calls"), _scalar(o.get("total_ms")), _scalar(o.get("self_ms")),
                         _scalar(o.get("device_ms")), _scalar(o.get("share")), _scalar(o.get("intensity")),
                         _scalar(o.get("roofline_pct")), _scalar(o.get("fallback"))] for o in ops[:top]]))
    inf = value.get("inference") or {}
    if inf.get("rows"):
        blocks.append(("h", "Inference load matrix"))
        blocks.extend(generic_blocks(inf["rows"], report))
    return blocks


@register_section("environment", "Environment")
def _environment(value: Any, report: dict) -> list:
    env = dict(value or {})
    backends = env.pop("backends", {}) or {}
    blocks = [("kv", [(k, _scalar(v)) for k, v in env.items()])]
    if backends:
        blocks.append(("table", ["backend", "available", "reason", "versions"],
                       [[n, _scalar(b.get("available")), _scalar(b.get("reason")), _scalar(b.get("versions"))]
                        for n, b in backends.items()]))
    return blocks


_SKIP_GENERIC = {"schema"}


def _sections(report: dict) -> list[tuple[str, list]]:
    out = []
    known = {s.key for s in SECTIONS}
    for sec in SECTIONS:
        if sec.key in report:
            out.append((sec.title, sec.blocks(report[sec.key], report)))
    for key, value in report.items():  # sections added by later producers without a renderer
        if key not in known and key not in _SKIP_GENERIC:
            out.append((key.replace("_", " ").capitalize(), generic_blocks(value, report)))
    return out


# ---- Markdown ---------------------------------------------------------------------------------
def md_escape(text: Any) -> str:
    """Literal Markdown text for a report value (see :func:`hal.conformance.report.escape.markdown`)."""
    return escape.markdown(_scalar(text))


def to_markdown(report: dict) -> str:
    t = report.get("target") or {}
    lines = [f"# hal-audit report: {md_escape(t.get('source', ''))} for {md_escape(t.get('device', ''))}", "",
             f"Schema `{escape.printable(report.get('schema')).replace('`', '')}`.", ""]
    for title, blocks in _sections(report):
        lines += [f"## {md_escape(title)}", ""]
        for b in blocks:
            if b[0] == "p":
                lines += [md_escape(b[1]), ""]
            elif b[0] == "h":
                lines += [f"### {md_escape(b[1])}", ""]
            elif b[0] == "kv":
                lines += ["| key | value |", "|---|---|"] + [f"| {md_escape(k)} | {md_escape(v)} |" for k, v in b[1]]
                lines.append("")
            elif b[0] == "table":
                headers, rows = b[1], b[2]
                lines.append("| " + " | ".join(md_escape(h) for h in headers) + " |")
                lines.append("|" + "---|" * len(headers))
                lines += ["| " + " | ".join(md_escape(c) for c in r) + " |" for r in rows]
                lines.append("")
    return "\n".join(lines)


# ---- HTML -------------------------------------------------------------------------------------
_CSS = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse;"
        "margin:.5em 0}td,th{border:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}"
        "th{background:#f3f3f3}.error{color:#b00}.warning{color:#a60}.info{color:#06a}code{font-size:90%}")


def to_html(report: dict) -> str:
    """A self-contained page (inline CSS, no script, no external resource); every string escaped."""
    e = lambda s: escape.html_text(_scalar(s))  # noqa: E731
    t = report.get("target") or {}
    out = ["<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
           f"<title>hal-audit: {e(t.get('source', ''))}</title><style>{_CSS}</style></head><body>",
           f"<h1>hal-audit report: {e(t.get('source', ''))} for {e(t.get('device', ''))}</h1>",
           f"<p>Schema <code>{e(report.get('schema'))}</code>.</p>"]
    for title, blocks in _sections(report):
        out.append(f"<h2>{e(title)}</h2>")
        for b in blocks:
            if b[0] == "p":
                out.append(f"<p>{e(b[1])}</p>")
            elif b[0] == "h":
                out.append(f"<h3>{e(b[1])}</h3>")
            elif b[0] == "svg":  # inline SVG needs no namespace URL: the page names no external address
                out.append(b[1].replace(' xmlns="http://www.w3.org/2000/svg"', ""))
            elif b[0] == "kv":
                out.append("<table>" + "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in b[1])
                           + "</table>")
            elif b[0] == "table":
                headers, rows = b[1], b[2]
                sev_col = headers.index("severity") if "severity" in headers else -1
                body = []
                for r in rows:
                    cells = []
                    for i, c in enumerate(r):
                        cls = f' class="{e(c)}"' if i == sev_col and c in ("error", "warning", "info") else ""
                        cells.append(f"<td{cls}>{e(c)}</td>")
                    body.append("<tr>" + "".join(cells) + "</tr>")
                out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr>"
                           + "".join(body) + "</table>")
    out.append("</body></html>")
    return "\n".join(out)


# ---- text (stdout) ----------------------------------------------------------------------------
def to_text(report: dict, written: Optional[dict] = None, top: int = 10) -> str:
    """The short stdout summary: counts by severity, the top findings, where the reports are."""
    esc = escape.terminal
    t = report.get("target") or {}
    s = report.get("summary") or {}
    sev = s.get("by_severity", {})
    run = report.get("run") or {}
    lines = [f"hal-audit {esc(t.get('source', ''))} --device {esc(t.get('device', ''))}: "
             f"{s.get('findings', 0)} findings ({sev.get('error', 0)} error, {sev.get('warning', 0)} warning, "
             f"{sev.get('info', 0)} info) in {s.get('files_with_findings', 0)} files"
             + ("" if t.get("verified") else " [predicted, not measured on the device]")]
    static = report.get("static") or {}
    if static:
        lines.append(f"scanned {static.get('files', 0)} files, {static.get('lines', 0)} lines "
                     f"in {static.get('seconds', 0):.3f} s")
    lines.append(f"run: {esc(run.get('status'))}" + (f" ({esc(run.get('error'))})" if run.get("error") else ""))
    findings = sorted(report.get("findings") or [],
                      key=lambda f: (("error", "warning", "info").index(f.get("severity", "info")),
                                     f.get("path", ""), f.get("line", 0)))
    if findings:
        rows = [[esc(f.get("severity")), esc(f"{f.get('path')}:{f.get('line')}"), esc(f.get("rule")),
                 esc((f.get("message") or "")[:100])] for f in findings[:top]]
        lines.append(tabulate(rows, headers=["severity", "where", "rule", "message"]))
        if len(findings) > top:
            lines.append(f"... and {len(findings) - top} more (see the reports)")
    if s.get("ops"):
        lines.append("ops: " + ", ".join(f"{esc(k)} {esc(v)}" for k, v in s["ops"].items()))
    if written:
        lines.append("reports: " + ", ".join(esc(p) for p in written.values()))
    return "\n".join(lines)
