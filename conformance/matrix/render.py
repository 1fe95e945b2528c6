"""Render a ``hal-compat-matrix/1`` document as Markdown, self-contained HTML and an SVG heatmap.

Every string that can come from a run (reasons, op names, environment fields) is escaped: Markdown
through :func:`hal.conformance.report.escape.markdown` (no markup survives) or, inside code spans,
with backticks removed and ``|`` escaped; HTML and SVG go through :func:`html.escape`.
"""
from __future__ import annotations

import html
from typing import Any

from tabulate import tabulate

from hal.conformance.report import escape

COLOURS = {"pass": "#2e7d32", "pass-with-fallback": "#9e9d24", "precision-fail": "#ef6c00", "fail": "#c62828",
           "crashed": "#6a1b9a", "timeout": "#4e342e", "not-run": "#9e9e9e",
           # predicted cells: neutral blue-greys, always hatched; never a measured cell's green
           "ops-supported": "#607d8b", "ops-fallback": "#78716c", "ops-unsupported": "#57534e"}
LEGEND = ("solid = measured on the device (pass / pass-with-fallback / precision-fail / fail ...); hatched blue-grey = "
          "predicted from the capability manifest: op support only (ops-supported / ops-fallback / ops-unsupported), "
          "precision not measured")
OP_COLOURS = {"native": "#2e7d32", "composite": "#558b2f", "fallback": "#ef6c00", "unsupported": "#c62828",
              "unknown": "#9e9e9e"}


def _md(text: Any, limit: int = 0) -> str:
    """Literal Markdown text, cut to ``limit`` characters before escaping (0: no cut)."""
    text = " ".join(str(text).split())
    return escape.markdown(text[:limit] if limit else text)


def _code(text: Any) -> str:
    """Text for inside a Markdown code span in a table cell."""
    return escape.printable(" ".join(str(text).split())).replace("`", "'").replace("|", "\\|")


def _label(cell: dict) -> str:
    how = "verified" if cell["verified"] else ("predicted" if cell["status"] != "not-run" else "")
    return f"{cell['status']}" + (f" ({how})" if how else "")


def _fig(cell: dict, key: str, scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    v = cell.get("figures", {}).get(key)
    return fmt.format(v * scale) if isinstance(v, (int, float)) else "—"


def _grid(doc: dict) -> tuple[list[str], list[tuple[str, str, str]], dict]:
    backends = sorted({c["backend"] for c in doc["cells"]})
    rows = sorted({(c["model"], c["mode"], c["dtype"]) for c in doc["cells"]})
    by = {(c["model"], c["mode"], c["dtype"], c["backend"]): c for c in doc["cells"]}
    return backends, rows, by


def to_markdown(doc: dict) -> str:
    backends, rows, by = _grid(doc)
    out = ["# HAL compatibility matrix", "",
           "Each cell: status, and how we know — **verified** = measured on that device; **predicted** = "
           "derived from the backend's capability manifest on a machine without the device: it states op support "
           "only (ops-supported / ops-fallback / ops-unsupported), precision not measured, and carries the manifest's "
           "precision notes (TF32 defaults, float64 computed as float32, dtype gates).", ""]
    s = doc.get("summary", {})
    out.append(", ".join(f"{k}: {v}" for k, v in s.items()))
    out += ["", "## Status", ""]
    table = [[m, mo, dt] + [_label(by[(m, mo, dt, b)]) if (m, mo, dt, b) in by else "—" for b in backends]
             for m, mo, dt in rows]
    out.append(tabulate(table, headers=["model", "mode", "dtype", *backends], tablefmt="github"))
    out += ["", "## Figures", ""]
    fig_rows = []
    for c in doc["cells"]:
        fig_rows.append([c["backend"], c["model"], c["mode"], c["dtype"], _label(c), _fig(c, "step_ms"),
                         _fig(c, "peak_bytes", 1 / 2**20, "{:.0f}"), c.get("figures", {}).get("precision", "—"),
                         len(c.get("figures", {}).get("fallback_ops", [])), _md(c.get("reason", ""), 160)])
    out.append(tabulate(fig_rows, headers=["backend", "model", "mode", "dtype", "status", "step ms", "peak MiB",
                                           "precision", "fallback ops", "reason"], tablefmt="github"))
    if doc.get("collectives"):
        out += ["", "## Collectives", ""]
        out.append(tabulate([[r["backend"], r["status"], "verified" if r.get("verified") else "—",
                              r.get("passed", "—"), r.get("failed", "—"), _md(r.get("reason", ""))]
                             for r in doc["collectives"]],
                            headers=["backend", "status", "how", "passed", "failed", "reason"], tablefmt="github"))
    if doc.get("per_op"):
        obs = sorted({b for v in doc["per_op"].values() for b in v})
        interesting = {op: v for op, v in doc["per_op"].items() if any(s not in ("native", "composite") for s in v.values())}
        out += ["", f"## Ops that are not native everywhere ({len(interesting)} of {len(doc['per_op'])})", ""]
        out.append(tabulate([[f"`{_code(op)}`"] + [v.get(b, "—") for b in obs] for op, v in interesting.items()],
                            headers=["op", *obs], tablefmt="github"))
    out += ["", "## Environments", ""]
    for env in doc.get("environments", []):
        devs = "; ".join(f"{name}: " + ", ".join(str(d.get("name")) for d in b.get("devices", []))
                         for name, b in env.get("backends", {}).items() if b.get("available"))
        out.append(f"- `{_code(env.get('id', '?'))}`: torch {_md(env.get('torch'))}, python {_md(env.get('python'))}, "
                   f"commit `{_code(env.get('commit'))}`, devices: {_md(devs)}; command: `{_code(env.get('command'))}`")
    return "\n".join(out) + "\n"


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
    e = html.escape
    backends, rows, by = _grid(doc)
    css = ("body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;margin:1em 0}"
           "td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px}th{background:#f3f3f3}"
           ".st{color:#fff;font-weight:bold}.pred{background-image:repeating-linear-gradient(45deg,transparent 0 5px,"
           "rgba(255,255,255,.35) 5px 8px)}code{font-size:12px}")
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>HAL compatibility matrix</title><style>{css}</style></head><body>",
           "<h1>HAL compatibility matrix</h1>",
           "<p><b>verified</b> (solid): measured on that device. <b>predicted</b> (hatched blue-grey): derived from the "
           "backend's capability manifest on a machine without the device; it states op support only "
           "(ops-supported / ops-fallback / ops-unsupported), precision not measured, with the manifest's precision "
           "notes (TF32 defaults, float64 computed as float32, dtype gates).</p>",
           "<p>" + e(", ".join(f"{k}: {v}" for k, v in doc.get("summary", {}).items())) + "</p>",
           "<table><tr><th>model</th><th>mode</th><th>dtype</th>" + "".join(f"<th>{e(b)}</th>" for b in backends) + "</tr>"]
    for m, mo, dt in rows:
        tds = []
        for b in backends:
            c = by.get((m, mo, dt, b))
            if not c:
                tds.append("<td>—</td>")
                continue
            cls = "st" + ("" if c["verified"] or c["status"] == "not-run" else " pred")
            figs = c.get("figures", {})
            detail = []
            if isinstance(figs.get("step_ms"), (int, float)):
                detail.append(f"{figs['step_ms']:.2f} ms/step")
            if figs.get("fallback_ops"):
                detail.append(f"{len(figs['fallback_ops'])} fallback ops")
            notes = figs.get("precision_notes") or []
            if notes:
                detail.append("; ".join(notes[:2]))
            # background-color, not the background shorthand: that would reset the hatching's background-image
            tds.append(f"<td class='{cls}' style='background-color:{COLOURS.get(c['status'], '#999')}' "
                       f"title='{e(c.get('reason', ''))}'>"
                       f"{e(_label(c))}<br><small>{e(', '.join(detail))}</small></td>")
        out.append(f"<tr><td>{e(m)}</td><td>{e(mo)}</td><td>{e(dt)}</td>{''.join(tds)}</tr>")
    out.append("</table>")
    out.append("<h2>Picture</h2>" + to_svg(doc))
    out.append("<h2>Cells</h2><table><tr><th>cell</th><th>status</th><th>reason</th><th>fallback ops</th></tr>")
    for c in doc["cells"]:
        fb = ", ".join(c.get("figures", {}).get("fallback_ops", []))
        out.append(f"<tr><td>{e('/'.join(c[k] for k in ('backend', 'model', 'mode', 'dtype')))}</td><td>{e(_label(c))}</td>"
                   f"<td>{e(c.get('reason', ''))}</td><td><code>{e(fb)}</code></td></tr>")
    out.append("</table>")
    if doc.get("per_op"):
        obs = sorted({b for v in doc["per_op"].values() for b in v})
        out.append("<h2>Per-op support</h2><table><tr><th>op</th>" + "".join(f"<th>{e(b)}</th>" for b in obs) + "</tr>")
        for op, v in doc["per_op"].items():
            out.append(f"<tr><td><code>{e(op)}</code></td>" + "".join(
                f"<td style='background-color:{OP_COLOURS.get(v.get(b, ''), '#fff')};color:#fff'>{e(v.get(b, '—'))}</td>" for b in obs) + "</tr>")
        out.append("</table>")
    if doc.get("collectives"):
        out.append("<h2>Collectives</h2><table><tr><th>backend</th><th>status</th><th>how</th><th>reason</th></tr>")
        for r in doc["collectives"]:
            out.append(f"<tr><td>{e(r['backend'])}</td><td>{e(r['status'])}</td><td>{'verified' if r.get('verified') else '—'}</td>"
                       f"<td>{e(r.get('reason', ''))}</td></tr>")
        out.append("</table>")
    out.append("<h2>Environments</h2><ul>")
    for env in doc.get("environments", []):
        out.append(f"<li><code>{e(env.get('id', '?'))}</code>: torch {e(str(env.get('torch')))}, commit "
                   f"<code>{e(str(env.get('commit')))}</code>, command <code>{e(str(env.get('command')))}</code></li>")
    out.append("</ul></body></html>")
    return "\n".join(out)
