"""Render a ``hal-compat-matrix/1`` document as Markdown, self-contained HTML and an SVG heatmap.

Markdown and HTML come from jinja2 templates (``templates/compat-matrix.{md,html}.j2`` in this
package, shipped as package data) with autoescaping, like the audit reports
(:mod:`hal.conformance.report.render`): :func:`_context` turns the document into plain values and
every value a template prints goes through the format's escaper unless it is
:class:`markupsafe.Markup` built here from escaped parts. Markdown: text made only of letters,
digits, spaces and ``. , : ; ( ) / + % = -`` is printed as it is (nothing in it can form markup);
anything else goes through :func:`hal.conformance.report.escape.markdown` (no markup survives) or,
for op names and commands, a code span longer than any backtick run inside. HTML goes through
:func:`hal.conformance.report.escape.html_text`; the page reuses the audit report's CSS, its one
inline table-sorting script and the Content-Security-Policy that pins it by hash, and loads nothing.
The SVG is built here with :func:`html.escape` on every label.
"""
from __future__ import annotations

import functools
import html
import pathlib
import re
from typing import Any

import jinja2
from markupsafe import Markup

from hal.conformance.matrix.schema import OP_STATUS_ORDER
from hal.conformance.report import escape
from hal.conformance.report.digest import human_bytes
from hal.conformance.report.render import _MD_UNSAFE_IN_CODE, CSP, CSS, SORT_JS, md_code

COLOURS = {"pass": "#2e7d32", "pass-with-fallback": "#9e9d24", "precision-fail": "#ef6c00", "fail": "#c62828",
           "crashed": "#6a1b9a", "timeout": "#4e342e", "not-run": "#9e9e9e",
           # predicted cells: neutral blue-greys, always hatched; never a measured cell's green
           "ops-supported": "#607d8b", "ops-fallback": "#78716c", "ops-unsupported": "#57534e"}
LEGEND = ("solid = measured on the device (pass / pass-with-fallback / precision-fail / fail ...); hatched blue-grey = "
          "predicted from the capability manifest: op support only (ops-supported / ops-fallback / ops-unsupported), "
          "precision not measured")
OP_COLOURS = {"native": "#2e7d32", "composite": "#558b2f", "fallback": "#ef6c00", "unsupported": "#c62828",
              "unknown": "#9e9e9e"}


def _label(cell: dict) -> str:
    how = "verified" if cell["verified"] else ("predicted" if cell["status"] != "not-run" else "")
    return f"{cell['status']}" + (f" ({how})" if how else "")


def _grid(doc: dict) -> tuple[list[str], list[tuple[str, str, str]], dict]:
    backends = sorted({c["backend"] for c in doc["cells"]})
    rows = sorted({(c["model"], c["mode"], c["dtype"]) for c in doc["cells"]})
    by = {(c["model"], c["mode"], c["dtype"], c["backend"]): c for c in doc["cells"]}
    return backends, rows, by


TEMPLATES = pathlib.Path(__file__).resolve().parent / "templates"
_MD_PLAIN = re.compile(r"[A-Za-z0-9 .,:;()/+%=\-]*")
#: matrix-only styles on top of the audit report's CSS: status cells, predicted hatching, legend swatches
MATRIX_CSS = (".grid th{white-space:nowrap}.grid td.st{color:#fff;font-weight:600;min-width:11em}.grid td.st small{font-weight:400;opacity:.95}"
              ".pred{background-image:repeating-linear-gradient(45deg,transparent 0 5px,rgba(255,255,255,.35) 5px 8px)}"
              ".sw{display:inline-block;color:#fff;border-radius:3px;padding:.1em .5em;margin:.15em .3em .15em 0;"
              "font-size:.92em}td.op{color:#fff}.picture{overflow-x:auto}.summary span{margin-right:1em;"
              "white-space:nowrap}td.reason{min-width:24em;word-break:break-word}")


def md_text(value: Any) -> str:
    """Literal Markdown text: plain words pass as they are, anything else is escaped."""
    s = " ".join(escape.printable("" if value is None else value).split())
    return s if _MD_PLAIN.fullmatch(s) and not s.startswith(("-", "+", "=")) else escape.markdown(s)


def md_span(value: Any) -> Markup:
    """An op name, id or command as an inline code span (fence longer than any backtick run inside,
    ``|`` escaped) when nothing in it could be taken for markup by a naive viewer (``<``, ``&``, a
    backtick, ``](``, ``![``); else escaped text, which renders as the exact string."""
    s = escape.printable("" if value is None else value)
    if _MD_UNSAFE_IN_CODE.search(s.replace(" && ", " ; ")):
        return Markup(escape.markdown(s))
    return md_code(s)


def _md_finalize(value: Any) -> Any:
    return value if isinstance(value, Markup) else Markup(md_text(value))


def _html_finalize(value: Any) -> Any:
    return value if isinstance(value, Markup) else Markup(escape.html_text("" if value is None else value))


@functools.lru_cache(maxsize=None)
def _env(fmt: str) -> jinja2.Environment:
    """The matrix's template environment for ``fmt`` (md | html); autoescaping on for both."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             finalize=_html_finalize if fmt == "html" else _md_finalize,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    env.filters.update(md_code=md_span, cut=lambda v, n: " ".join(str(v).split())[:n],
                       op_status=lambda b, v: v.get(b, "—"), bytes=human_bytes, num=lambda v: f"{v:g}")
    env.globals.update(SORT_JS=Markup(SORT_JS), CSP=Markup(CSP),
                       CSS=Markup(CSS + MATRIX_CSS), COLOURS=COLOURS, OP_COLOURS=OP_COLOURS,
                       LEGEND=LEGEND)
    return env


def _num(v: Any, scale: float = 1.0) -> Any:
    return v * scale if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _context(doc: dict) -> dict:
    """The document as plain values for the templates (nothing escaped here; the templates do it)."""
    backends, rows, by = _grid(doc)
    grid = []
    for m, mo, dt in rows:
        tds = []
        for b in backends:
            c = by.get((m, mo, dt, b))
            if not c:
                tds.append(None)
                continue
            figs = c.get("figures", {})
            detail = []
            if _num(figs.get("step_ms")) is not None:
                detail.append(f"{figs['step_ms']:.2f} ms/step")
            if figs.get("fallback_ops"):
                detail.append(f"{len(figs['fallback_ops'])} fallback ops")
            notes = figs.get("precision_notes") or []
            if notes:
                detail.append("; ".join(notes[:2]))
            tds.append({"label": _label(c), "status": c["status"], "reason": c.get("reason", ""),
                        "predicted": not c["verified"] and c["status"] != "not-run",
                        "colour": COLOURS.get(c["status"], "#999"), "detail": ", ".join(detail)})
        grid.append({"model": m, "mode": mo, "dtype": dt, "cells": tds,
                     "labels": [c["label"] if c else "—" for c in tds]})
    cells = []
    for c in doc["cells"]:
        figs = c.get("figures", {})
        step, peak = _num(figs.get("step_ms")), _num(figs.get("peak_bytes"), 1 / 2**20)
        cells.append({"backend": c["backend"], "model": c["model"], "mode": c["mode"], "dtype": c["dtype"],
                      "label": _label(c), "status": c["status"],
                      "step_ms": "—" if step is None else f"{step:.2f}", "step_v": -1 if step is None else step,
                      "peak_mib": "—" if peak is None else f"{peak:.0f}", "peak_v": -1 if peak is None else peak,
                      "precision": figs.get("precision", "—"),
                      "fallback_ops": list(figs.get("fallback_ops", [])), "reason": c.get("reason", "")})
    per_op = doc.get("per_op") or {}
    op_backends = sorted({b for v in per_op.values() for b in v})
    not_native = {op: v for op, v in per_op.items() if any(s not in ("native", "composite") for s in v.values())}
    needs = _op_model_grid(doc, not_native)
    envs = []
    for env in doc.get("environments", []):
        devs = "; ".join(f"{name}: " + ", ".join(str(d.get("name")) for d in b.get("devices", []))
                         for name, b in env.get("backends", {}).items() if b.get("available"))
        envs.append({"id": env.get("id", "?"), "torch": str(env.get("torch")), "python": str(env.get("python")),
                     "commit": str(env.get("commit")), "command": str(env.get("command")), "devices": devs})
    return {"schema": doc.get("schema", "hal-compat-matrix/1"), "summary": list(doc.get("summary", {}).items()),
            "backends": backends, "grid": grid, "cells": cells, "collectives": doc.get("collectives") or [],
            "per_op": per_op, "op_backends": op_backends, "not_native": not_native, "environments": envs,
            "needs": needs, "grid_models": _grid_models(doc, needs),
            "merged_from": doc.get("merged_from") or []}


def _model_order(model: str) -> tuple:
    return (model.startswith("hf:"), model)


def _grid_models(doc: dict, needs: list[dict]) -> list[str]:
    """Columns of the op x model grid: the models that need an op that is not native everywhere
    first (so they are on screen beside those ops), then ours, then the hf: architectures."""
    blocked = {m for r in needs if r["not_native"] for m in r["models"]}
    return sorted({c["model"] for c in doc["cells"]}, key=lambda m: (m not in blocked, *_model_order(m)))


def _op_model_grid(doc: dict, not_native: dict) -> list[dict]:
    """Which model needs which op: one row per op (the ops that are not native everywhere first),
    ``models`` mapping each model whose cells ran the op to ``{"status", "where", "calls", "bytes"}``:
    the op's worst status over that model's cells, the backends where it has that status, and the
    largest calls and bytes per step a cell of that model moves through it there."""
    rank = {st: i for i, st in enumerate(OP_STATUS_ORDER)}
    rows: dict[str, dict] = {}
    for c in doc["cells"]:
        detail = {d["op"]: d for d in c.get("figures", {}).get("not_native") or []}
        for op, st in (c.get("ops") or {}).items():
            m = rows.setdefault(op, {}).setdefault(c["model"], {"status": st, "where": set(), "calls": 0, "bytes": 0})
            if rank.get(st, 2) > rank.get(m["status"], 2):
                m.update(status=st, where=set())
            if st == m["status"]:
                m["where"].add(c["backend"])
            if op in detail:
                m["calls"] = max(m["calls"], detail[op].get("calls_per_step") or 0)
                m["bytes"] = max(m["bytes"], detail[op].get("bytes_per_step") or 0)
    out = []
    for op in sorted(rows, key=lambda o: (o not in not_native, o)):
        models = {k: {**v, "where": ", ".join(sorted(v["where"]))} for k, v in rows[op].items()}
        blocked = sorted((m for m, v in models.items() if v["status"] in ("fallback", "unsupported", "unknown")),
                         key=_model_order)
        out.append({"op": op, "not_native": op in not_native, "statuses": not_native.get(op, {}), "models": models,
                    "model_list": ", ".join(sorted(models, key=_model_order)),
                    "blocked": [{"model": m, **models[m]} for m in blocked]})
    return out


def to_markdown(doc: dict) -> str:
    """``compat-matrix.md`` from ``templates/compat-matrix.md.j2`` (every value escaped for Markdown)."""
    return _env("md").get_template("compat-matrix.md.j2").render(**_context(doc))


def to_svg(doc: dict, cell_w: int = 150, cell_h: int = 26) -> str:
    """A heatmap: rows model/mode/dtype, columns backends, colour = status, hatched = predicted."""
    backends, rows, by = _grid(doc)
    left, top = 220, 40
    w, h = max(left + cell_w * len(backends) + 10, 760), top + cell_h * len(rows) + 60
    e = html.escape
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
             '<defs><pattern id="pred" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
             '<line x1="0" y1="0" x2="0" y2="6" stroke="#fff" stroke-width="2" opacity="0.5"/></pattern></defs>']
    for j, b in enumerate(backends):
        parts.append(f'<text x="{left + j * cell_w + cell_w / 2}" y="{top - 10}" text-anchor="middle" font-weight="bold">{e(b)}</text>')
    for i, (m, mo, dt) in enumerate(rows):
        y = top + i * cell_h
        parts.append(f'<text x="{left - 8}" y="{y + cell_h * 0.65}" text-anchor="end">{e(m)} / {e(mo)} / {e(dt)}</text>')
        for j, b in enumerate(backends):
            c = by.get((m, mo, dt, b))
            x = left + j * cell_w
            status = c["status"] if c else "not-run"
            parts.append(f'<rect x="{x + 1}" y="{y + 1}" width="{cell_w - 2}" height="{cell_h - 2}" fill="{COLOURS.get(status, "#9e9e9e")}">'
                         f'<title>{e(_label(c) if c else "not-run")}: {e(c.get("reason", "") if c else "")}</title></rect>')
            if c and not c["verified"] and status != "not-run":
                parts.append(f'<rect x="{x + 1}" y="{y + 1}" width="{cell_w - 2}" height="{cell_h - 2}" fill="url(#pred)"/>')
            parts.append(f'<text x="{x + cell_w / 2}" y="{y + cell_h * 0.65}" text-anchor="middle" fill="#fff">{e(status)}</text>')
    ly = top + cell_h * len(rows) + 25
    parts.append(f'<text x="{left}" y="{ly}">solid = measured on the device; hatched blue-grey = predicted: op '
                 'support only, precision not measured</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def to_html(doc: dict) -> str:
    """``compat-matrix.html`` from ``templates/compat-matrix.html.j2``: self-contained (inline CSS, the
    audit report's one sorting script pinned by its CSP hash, the SVG heatmap inline), every string
    escaped, sortable tables, laid out for a 1400 px window."""
    return _env("html").get_template("compat-matrix.html.j2").render(**_context(doc), svg=Markup(to_svg(doc)))
