"""``hotspot_chart_svg``: an inline SVG bar chart of the top ops' share of the step.

Pure function of a ``profile`` dict; every label is HTML-escaped, so op names or file paths that
contain markup cannot inject into the report. Thread-safe.
"""
from __future__ import annotations

import html
from typing import Any


def _fmt_ms(v: Any) -> str:
    return "-" if v is None else f"{float(v):.3f} ms"


def hotspot_chart_svg(profile: dict, top: int = 10, width: int = 720) -> str:
    """SVG (a string starting with ``<svg``) of the ``top`` ops by ``share``: one bar per op with
    its name, share in percent and time. An empty or missing ``ops`` list gives a chart that says
    so. Raises nothing for well-formed dicts; non-numeric shares count as 0."""
    ops = [o for o in (profile or {}).get("ops") or [] if isinstance(o, dict)]
    ops = sorted(ops, key=lambda o: -_num(o.get("share")))[:max(int(top), 0)]
    bar_h, gap, label_w, pad = 18, 6, 260, 8
    height = pad * 2 + max(len(ops), 1) * (bar_h + gap) + 20
    plot_w = width - label_w - 150
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'role="img" aria-label="hot spots: share of step time per op" font-family="sans-serif" font-size="12">',
           f'<text x="{pad}" y="{pad + 10}" font-weight="bold">Hot spots (share of step time)</text>']
    if not ops:
        out.append(f'<text x="{pad}" y="{pad + 34}">no ops recorded</text>')
    biggest = max([_num(o.get("share")) for o in ops] + [1e-12])
    for i, o in enumerate(ops):
        y = pad + 20 + i * (bar_h + gap)
        share = _num(o.get("share"))
        w = max(1.0, plot_w * share / biggest) if share > 0 else 0.0
        name = html.escape(str(o.get("op", "?")))
        t = o.get("device_ms") if o.get("device_ms") is not None else o.get("self_ms")
        fb = " (fallback)" if o.get("fallback") else ""
        colour = "#d9534f" if o.get("fallback") else "#4a7ebb"
        out.append(f'<text x="{pad}" y="{y + 13}">{name}{html.escape(fb)}</text>')
        out.append(f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{colour}">'
                   f'<title>{name}: {share * 100:.1f}%</title></rect>')
        out.append(f'<text x="{label_w + w + 6:.1f}" y="{y + 13}">{share * 100:.1f}% · '
                   f'{html.escape(_fmt_ms(t))}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _num(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return 0.0
    return f if f == f else 0.0  # NaN -> 0
