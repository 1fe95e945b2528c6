"""Rendering a ``hal-audit/1`` report as text, Markdown and self-contained HTML.

Every format opens with the same *lead* (:func:`hal.conformance.report.digest.lead`): the verdict,
the next steps with their exact commands (``--fix``, then the ``patch -p1`` / ``git apply`` line),
the fallbacks and what they cost, the precision verdict, and a banner when results were predicted
rather than measured on the device. Findings follow, most severe first, with a source snippet and
their run-time evidence attached ("confirmed at run time"); then one row per distinct op.

Sections are a registry (:data:`SECTIONS`): each has a key in the report, a title and a function
that turns that section's value into *blocks* (headings, paragraphs, tables as plain data). The
Markdown and HTML writers render blocks through jinja2 templates (``templates/`` in this package,
shipped as package data), so a later audit (precision, profile, ...) adds a section function with
:func:`register_section` and every format picks it up; no new writer. Sections without their own
function are rendered generically (a list of dicts is a table, a dict a key/value table).

Escaping: the templates autoescape. Every value a template prints goes through the format's
escaper of :mod:`hal.conformance.report.escape` unless it is :class:`markupsafe.Markup` built here
from escaped parts: Markdown keeps no markup at all (no image, link, HTML or block construct;
source snippets and commands are code spans/blocks whose delimiters are longer than any backtick run
inside), HTML goes through :func:`html.escape`, the terminal summary and all formats show control
characters as visible ``\\xNN`` escapes. The HTML page loads nothing (no external resource); its
one inline script sorts tables and is pinned by a Content-Security-Policy hash. Pure functions;
thread-safe.
"""
from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import json
import pathlib
import re
from typing import Any, Callable, Optional

import jinja2
from markupsafe import Markup
from tabulate import tabulate

from hal.conformance.report import digest, escape

# ---- blocks: the format-neutral intermediate --------------------------------------------------
# ("p", text) | ("table", headers, rows) | ("kv", [(key, value), ...]) | ("h", text)
# | ("code", [line, ...]): preformatted text (program output), each line escaped
# | ("details", summary, [blocks]): folded away (HTML <details>)
# | ("findings", rows of digest.merged_findings) | ("ops", rows of digest.distinct_ops)
# | ("svg", markup): a picture for the HTML page only, produced by our own code with every label
#   already escaped (hal.conformance.profiling.hotspot_chart_svg); other formats skip it.
Block = tuple


@dataclasses.dataclass(frozen=True)
class Section:
    key: str
    title: str
    blocks: Callable[[Any, dict], list]
    folded: bool = False  # rendered folded away (<details>) in HTML and Markdown


SECTIONS: list[Section] = []


def register_section(key: str, title: str, order: Optional[int] = None, folded: bool = False):
    """Decorator: ``fn(value, report) -> [blocks]`` renders ``report[key]`` in every format.
    ``order``: position among the sections (default: last); ``folded``: shown closed."""
    def deco(fn: Callable[[Any, dict], list]) -> Callable[[Any, dict], list]:
        global SECTIONS
        SECTIONS = [s for s in SECTIONS if s.key != key]
        sec = Section(key, title, fn, folded)
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


def _view(report: dict) -> dict:
    """The digest of ``report`` the writers attach as ``report["_view"]`` (computed here if absent)."""
    view = report.get("_view")
    if not isinstance(view, dict):
        view = {"rows": digest.merged_findings(report), "ops": digest.distinct_ops(report.get("ops"))}
    return view


@register_section("findings", "Findings")
def _findings(value: Any, report: dict) -> list:
    if not value:
        return [("p", "no device-specific code found")]
    rows = _view(report)["rows"]
    confirmed = sum(1 for r in rows if r["confirmed"])
    note = (f"{len(rows)} rows, most severe first; {confirmed} source findings were confirmed at run time "
            "(the run-time record is attached to the row, not repeated). ")
    note += f"audit.json keeps all {len(value)} records."
    return [("p", note), ("findings", rows)]


@register_section("ops", "Operators")
def _ops(value: Any, report: dict) -> list:
    if not value:
        return [("p", "not collected (static audit only)")]
    ops = _view(report)["ops"]
    counts = digest.ops_by_status(value)
    verified = all(o["verified"] for o in ops)
    head = (f"{len(ops)} distinct ops ({', '.join(f'{n} {s}' for s, n in counts.items())}); one row per op, "
            "summed over phases (forward, backward, optimizer). Statuses are "
            + ("measured on the device." if verified else "predicted from the capability data, not measured."))
    return [("p", head), ("ops", ops)]


def _not_collected(value: Any, flag: str) -> Optional[list]:
    if not value:
        return [("p", f"not collected (run with {flag})")]
    if not isinstance(value, dict):
        return generic_blocks(value, {})
    if value.get("verdict") in ("not-run", "error") and "metrics" not in value and "ops" not in value:
        return [("kv", [(k, _scalar(v)) for k, v in value.items()])]
    return None


def _sort_number(value: Any) -> float:
    """A figure for sorting: numbers as they are, "inf"/"nan" text as floats, anything else 0."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return 0.0
    return 0.0 if out != out else out


def _run_side(side: Any) -> str:
    """One precision run (the ``reference`` or ``target`` of the section) as a line: its settings, how its program run
    went (status, steps, seconds, error) and the compared window's time; its output tail stays in audit.json."""
    if not isinstance(side, dict):
        return _scalar(side)
    parts = [f"{k}: {_scalar(v)}" for k, v in side.items() if k not in ("status", "timing")]
    run = side.get("status")
    if isinstance(run, dict):
        line = f"program run {run.get('status')}, {run.get('steps')} step(s), {_scalar(run.get('seconds'))} s"
        parts.append(line + (f": {str(run['error']).splitlines()[0]}" if run.get("error") else ""))
    timing = side.get("timing")
    if isinstance(timing, dict) and isinstance(timing.get("window_ms"), (int, float)):
        parts.append(f"compared window {timing['window_ms']:.1f} ms (float64 shadows {_ms(timing.get('shadows_ms'))}, "
                     f"statistics {_ms(timing.get('statistics_ms'))})")
    return "; ".join(parts)


def _ms(x: Any) -> str:
    return f"{x:.1f} ms" if isinstance(x, (int, float)) else "-"


def _divergence(fd: Any) -> str:
    """The first divergence as a line: where (module, op, phase, occurrence), the metric over its threshold, the kind
    of blame and what it was compared against."""
    if not isinstance(fd, dict):
        return _scalar(fd)
    where = " ".join(str(fd[k]) for k in ("module", "op") if fd.get(k))
    at = ", ".join(f"{k} {fd[k]}" for k in ("phase", "occurrence") if fd.get(k) is not None)
    line = (f"{where} ({at}): {fd.get('metric')} {_scalar(fd.get('value'))}, "
            f"over its threshold {_scalar(fd.get('threshold'))}")
    extra = [f"{k.replace('_', ' ')} {_scalar(fd[k])}" for k in ("kind", "max_abs", "compared_against") if k in fd]
    return line + (f"; {'; '.join(extra)}" if extra else "")


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
                            ("reference", _run_side(value.get("reference"))),
                            ("target", _run_side(value.get("target"))),
                            ("first divergence", _divergence(fd) if fd else "none: every op within its threshold"),
                            ("loss drift (max relative deviation)", drift.get("max_rel_dev")),
                            ("loss curves R^2", drift.get("r2")), ("note", value.get("note", "")),
                            ("TF32", value.get("tf32") or ""),
                            ("not compared", "; ".join(map(str, value.get("not_compared") or [])))])]
    rows = []
    for m in value.get("metrics") or []:
        loc, tot = m.get("local") or {}, m.get("total") or {}
        rows.append((bool(loc.get("exceeds")) or bool(tot.get("exceeds")), _sort_number(tot.get("rms_rel")), [
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
                            ("overhead ratio", value.get("overhead_ratio")),
                            ("device time per op", (value.get("device_attribution") or {}).get("method")),
                            ("memory estimate bytes", mem.get("estimate_bytes")), ("peak bytes", mem.get("peak_bytes")),
                            ("estimate error %", mem.get("error_pct")), ("peak source", mem.get("peak_source")),
                            ("fallback ms per step", fb.get("ms_per_step")),
                            ("host-device copies", _scalar((value.get("copies") or {}).get("count"))),
                            ("sync points", _scalar((value.get("syncs") or {}).get("count"))),
                            ("trace", value.get("trace")), ("note", value.get("note", "")),
                            ("notes", "; ".join(map(str, value.get("notes") or []))),
                            ("not measured", "; ".join(map(str, value.get("not_measured") or [])))])]
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


@register_section("run", "Run")
def _run(value: Any, report: dict) -> list:
    run = dict(value or {})
    tail = run.pop("output_tail", None)
    blocks = generic_blocks(run, report)
    if isinstance(tail, list) and tail:
        blocks.append(("details", f"last {len(tail)} lines the program printed",
                       [("code", [str(x) for x in tail])]))
    return blocks


@register_section("target", "Target")
def _target(value: Any, report: dict) -> list:
    t = value or {}
    note = "measured on the device" if t.get("verified") else \
        "predicted: nothing here was measured on the target device (pending verification)"
    return [("kv", [(k, _scalar(v)) for k, v in t.items()]), ("p", note)]


@register_section("summary", "Counts", folded=True)
def _summary(value: Any, report: dict) -> list:
    s = value or {}
    sev = s.get("by_severity", {})
    rows = [[r, n] for r, n in (s.get("by_rule") or {}).items()]
    blocks = [("kv", [("finding records", s.get("findings", 0)), ("errors", sev.get("error", 0)),
                      ("warnings", sev.get("warning", 0)), ("info", sev.get("info", 0)),
                      ("files with findings", s.get("files_with_findings", 0)),
                      ("fixable (--fix-to device)", (s.get("fixable") or {}).get("device", 0)),
                      ("fixable (--fix-to hal)", (s.get("fixable") or {}).get("hal", 0)),
                      ("run", s.get("run_status")),
                      ("ops by status (distinct ops)", _scalar(digest.ops_by_status(report.get("ops")) or {})),
                      ("op records by status (one per op and phase)", _scalar(s.get("ops") or {}))])]
    if rows:
        blocks.append(("table", ["rule", "findings"], rows))
    return blocks


@register_section("environment", "Environment", folded=True)
def _environment(value: Any, report: dict) -> list:
    env = dict(value or {})
    backends = env.pop("backends", {}) or {}
    blocks = [("kv", [(k, _scalar(v)) for k, v in env.items()])]
    if backends:
        blocks.append(("table", ["backend", "available", "reason", "versions"],
                       [[n, _scalar(b.get("available")), _scalar(b.get("reason")), _scalar(b.get("versions"))]
                        for n, b in backends.items()]))
    return blocks


_SKIP_GENERIC = {"schema", "_view", "invocation"}


def _with_view(report: dict, root: Optional[str]) -> tuple[dict, dict]:
    """``(report + "_view", lead)``: the digest computed once for every section and the lead."""
    view = {"rows": digest.merged_findings(report, root), "ops": digest.distinct_ops(report.get("ops"))}
    return {**report, "_view": view}, digest.lead(report, root, view["rows"], view["ops"])


def _sections(report: dict) -> list[tuple[str, list, bool]]:
    """``[(title, blocks, folded)]`` in display order; sections without a renderer come last."""
    out = []
    known = {s.key for s in SECTIONS}
    for sec in SECTIONS:
        if sec.key in report:
            out.append((sec.title, sec.blocks(report[sec.key], report), sec.folded))
    for key, value in report.items():  # sections added by later producers without a renderer
        if key not in known and key not in _SKIP_GENERIC:
            out.append((key.replace("_", " ").capitalize(), generic_blocks(value, report), True))
    return out


# ---- templates --------------------------------------------------------------------------------
TEMPLATES = pathlib.Path(__file__).resolve().parent / "templates"


def md_escape(text: Any) -> str:
    """Literal Markdown text for a report value (see :func:`hal.conformance.report.escape.markdown`)."""
    return escape.markdown(_scalar(text))


def _longest_backtick_run(text: str) -> int:
    return max((len(m) for m in re.findall(r"`+", text)), default=0)


def md_code(text: Any) -> Markup:
    """An inline code span holding ``text`` literally (one line; ``|`` escaped for a table cell)."""
    s = escape.printable(text).replace("|", "\\|")
    if not s.strip():
        return Markup("")
    fence = "`" * (_longest_backtick_run(s) + 1)
    return Markup(f"{fence} {s} {fence}")


def md_fence(lines: Any, lang: str = "") -> Markup:
    """A fenced code block holding ``lines`` literally (each line made printable)."""
    body = [escape.printable(x) for x in (lines if isinstance(lines, (list, tuple)) else [lines])]
    fence = "`" * max(3, _longest_backtick_run("\n".join(body)) + 1)
    return Markup("\n".join([fence + lang, *body, fence]))


_MD_UNSAFE_IN_CODE = re.compile(r"`|<\S|\]\(|!\[|&")


def md_command(text: Any) -> Markup:
    """A shell command as a fenced ``sh`` block (copied as it is) when it holds nothing a naive
    Markdown viewer could take for markup (a backtick, ``<`` before a non-space, ``](``, ``![``,
    ``&``); else escaped text, which renders as the exact command."""
    s = escape.printable(text)
    if _MD_UNSAFE_IN_CODE.search(s.replace(" && ", " ; ")):
        return Markup(md_escape(s))
    return md_fence([s], "sh")


def md_lines(lines: Any) -> Markup:
    """Program output: a fenced block when no line holds anything a naive viewer could take for
    markup (see :func:`md_command`), else every line escaped, joined by hard line breaks."""
    body = [escape.printable(x) for x in (lines if isinstance(lines, (list, tuple)) else [lines])]
    if any(_MD_UNSAFE_IN_CODE.search(x) for x in body):
        return Markup("  \n".join(md_escape(x) for x in body))
    return md_fence(body)


def _md_finalize(value: Any) -> Any:
    return value if isinstance(value, Markup) else Markup(md_escape(value))


def _html_finalize(value: Any) -> Any:
    return value if isinstance(value, Markup) else Markup(escape.html_text(_scalar(value)))


@functools.lru_cache(maxsize=None)
def _env(fmt: str) -> jinja2.Environment:
    """The template environment of ``fmt`` (md | html). Autoescaping is on for both: ``finalize``
    escapes every printed value for the format and marks it safe; macro output is already safe."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             finalize=_html_finalize if fmt == "html" else _md_finalize,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    env.filters.update(md_code=md_code, md_fence=md_fence, md_command=md_command, md_lines=md_lines, human_bytes=digest.human_bytes, scalar=_scalar,
                       printable=escape.printable, anchor=_anchor, loc=_loc, num=_num, j=_join, svg=_svg)
    env.globals.update(SORT_JS=Markup(SORT_JS), CSP=Markup(CSP), CSS=Markup(CSS), sev_rank=digest._sev_rank,
                       status_rank=digest.STATUS_ORDER.index)
    return env


def _anchor(title: Any) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(title).lower()).strip("-") or "section"


def _loc(f: dict) -> str:
    col = f.get("column")
    return f"{f.get('path')}:{f.get('line')}" + (f":{col}" if isinstance(col, int) else "")


def _join(values: Any, sep: str = ", ") -> str:
    """Plain text (escaped later by the template's finalize, never pre-marked safe)."""
    return sep.join(_scalar(v) for v in values or [])


def _svg(markup: Any) -> Markup:
    """Our own chart (labels escaped where it was drawn); inline SVG needs no namespace address."""
    return Markup(str(markup).replace(' xmlns="http://www.w3.org/2000/svg"', ""))


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return _scalar(v)


def _context(report: dict, root: Optional[str]) -> dict:
    rpt, lead = _with_view(report, root)
    return {"report": rpt, "lead": lead, "sections": _sections(rpt), "flavour": digest.fix_flavour(report),
            "schema": report.get("schema"), "target": report.get("target") or {}}


# ---- Markdown ---------------------------------------------------------------------------------
def to_markdown(report: dict, root: Optional[str] = None) -> str:
    """``audit.md``: the lead, then every section (folded ones inside ``<details>``). ``root``: the
    audited folder (or file), for source snippets."""
    return _env("md").get_template("audit.md.j2").render(**_context(report, root))


# ---- HTML -------------------------------------------------------------------------------------
#: sorts any table with class "sortable" by the clicked header (numbers numerically; a cell's data-v wins)
SORT_JS = ("document.querySelectorAll('table.sortable th').forEach(function(th){th.tabIndex=0;"
           "function go(){var t=th.closest('table'),b=t.tBodies[0],i=Array.prototype.indexOf.call("
           "th.parentNode.children,th),d=th.getAttribute('aria-sort')==='ascending'?-1:1;"
           "t.querySelectorAll('th').forEach(function(h){h.removeAttribute('aria-sort')});"
           "th.setAttribute('aria-sort',d>0?'ascending':'descending');"
           "var k=function(r){var c=r.cells[i];return c?(c.getAttribute('data-v')||c.textContent.trim()):''};"
           "Array.prototype.slice.call(b.rows).sort(function(x,y){var a=k(x),c=k(y),na=parseFloat(a),"
           "nc=parseFloat(c);return d*(isNaN(na)||isNaN(nc)?a.localeCompare(c):na-nc)})"
           ".forEach(function(r){b.appendChild(r)})}"
           "th.addEventListener('click',go);th.addEventListener('keydown',function(e){"
           "if(e.key==='Enter'||e.key===' '){e.preventDefault();go()}})});")
CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-"
       + base64.b64encode(hashlib.sha256(SORT_JS.encode()).digest()).decode() + "'")
CSS = ("*{box-sizing:border-box}body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;padding:1.5em 2em;"
       "max-width:1400px;color:#1b1b1b}h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.2em;margin:1.4em 0 .4em;"
       "border-bottom:1px solid #ddd}h3{font-size:1.05em}"
       ".lead{border:1px solid #ccc;border-left:6px solid #888;padding:.6em 1.2em;border-radius:4px;"
       "background:#fafafa}.lead.ok{border-left-color:#2a7}.lead.action{border-left-color:#d80}"
       ".lead.failed{border-left-color:#c22}.verdict{font-size:1.1em;font-weight:600}"
       ".banner{background:#fff4d6;border:1px solid #e9c46a;padding:.5em .8em;border-radius:4px;margin:.6em 0}"
       ".banner b{color:#8a5a00}ol.steps li{margin:.35em 0}"
       "pre{background:#f4f4f4;border:1px solid #e2e2e2;padding:.4em .6em;margin:.3em 0;overflow-x:auto;"
       "white-space:pre}code,pre{font:12.5px/1.4 ui-monospace,Menlo,Consolas,monospace}"
       ".scroll{overflow-x:auto;max-width:100%}table{border-collapse:collapse;margin:.5em 0;width:100%}"
       "td,th{border:1px solid #d6d6d6;padding:.3em .5em;text-align:left;vertical-align:top}"
       "th{background:#f0f0f0;position:sticky;top:0}table.sortable th{cursor:pointer;user-select:none}"
       "table.sortable th:after{content:' \\2195';color:#aaa}th[aria-sort=ascending]:after{content:' \\2191'}"
       "th[aria-sort=descending]:after{content:' \\2193'}table.kv{width:auto}table.kv th{width:16em}"
       "td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}"
       ".sev{font-weight:600;white-space:nowrap}.error{color:#b00}.warning{color:#a60}.info{color:#06a}"
       ".st-fallback,.st-unsupported{color:#b00;font-weight:600}.st-unknown{color:#a60}.st-native{color:#276}"
       ".st-composite{color:#357}.where{white-space:nowrap}.conf{display:inline-block;background:#e6f4ea;"
       "color:#185c2f;border-radius:3px;padding:0 .4em;margin:.2em 0;font-size:.92em}"
       ".rt{display:inline-block;background:#e8eefc;color:#1d3f8a;border-radius:3px;padding:0 .4em;font-size:.92em}"
       "table.findings td:last-child{min-width:16em;word-break:break-word}td.src pre{margin:0;border:0;background:none;padding:0}.ln{color:#999;user-select:none}"
       "details{margin:.4em 0}summary{cursor:pointer}summary h2{display:inline;border:0}"
       "nav{margin:.8em 0;color:#555}nav a{margin-right:1em}.muted{color:#666}")


def to_html(report: dict, root: Optional[str] = None) -> str:
    """A self-contained page: inline CSS and one inline sorting script (pinned by its CSP hash), no
    external resource, every string escaped. Laid out for a 1400 px window."""
    return _env("html").get_template("audit.html.j2").render(**_context(report, root))


# ---- text (stdout) ----------------------------------------------------------------------------
def to_text(report: dict, written: Optional[dict] = None, top: int = 10, root: Optional[str] = None) -> str:
    """The stdout summary: the verdict and next steps first (exact commands), the predicted banner,
    then the most severe findings and where the reports are. Every value is escaped for a terminal."""
    esc = escape.terminal
    t = report.get("target") or {}
    rpt, lead = _with_view(report, root)
    rows, ops = rpt["_view"]["rows"], rpt["_view"]["ops"]
    lines = [f"hal-audit {esc(t.get('source', ''))} --device {esc(t.get('device', ''))}: {esc(lead['verdict'])}"]
    if lead["banner"]:
        lines.append(f"PREDICTED, not measured: {esc(lead['banner'])}")
    static = report.get("static") or {}
    for label, text in lead["facts"]:
        if label != "findings":
            lines.append(f"{label}: {esc(text)}")
    if static:
        lines.append(f"scanned {static.get('files', 0)} files, {static.get('lines', 0)} lines "
                     f"in {static.get('seconds', 0):.3f} s")
    if ops:
        lines.append("ops by status (distinct ops): " + ", ".join(f"{esc(k)} {esc(v)}"
                                                                  for k, v in digest.ops_by_status(report.get("ops")).items()))
    lines.append("next steps:")
    for i, step in enumerate(lead["steps"], 1):
        lines.append(f"  {i}. {esc(step['text'])}")
        if step.get("command"):
            lines.append(f"       {esc(step['command'])}")
    if rows:
        table = [[esc(r["finding"].get("severity")), esc(_loc(r["finding"])), esc(r["finding"].get("rule")),
                  "run" if r["runtime_only"] else ("yes" if r["confirmed"] else ""),
                  "yes" if r["fixable"] else "", esc((r["finding"].get("message") or "")[:90])] for r in rows[:top]]
        lines.append(tabulate(table, headers=["severity", "where", "rule", "confirmed", "--fix", "message"]))
        if len(rows) > top:
            lines.append(f"... and {len(rows) - top} more (see the reports)")
    if written:
        lines.append("reports: " + ", ".join(esc(p) for p in written.values()))
    return "\n".join(lines)
