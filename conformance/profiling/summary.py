"""``markdown_summary``: a readable summary of a ``profile`` dict (and a load matrix) in Markdown.

Pure function; tables through ``tabulate``. Thread-safe.
"""
from __future__ import annotations

from typing import Any, Optional

from tabulate import tabulate


def _f(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _mib(v: Any) -> str:
    return "-" if v is None else f"{v / 2**20:.2f} MiB"


def markdown_summary(profile: dict, matrix: Optional[dict] = None, top: int = 15) -> str:
    """Markdown text: step time and overhead, the top ``top`` ops, copies and syncs with their
    locations, fallback cost, memory estimate vs peak, roofline peaks, and the load matrix."""
    p = profile
    wl = p.get("workload") or {}
    lines = [f"# Profile: {wl.get('name', 'callable')} {wl.get('config', '')} {wl.get('mode', '')} "
             f"on {p.get('backend')} ({p.get('device')})", ""]
    lines += [f"- activities: {', '.join(p.get('activities', []))} ({p.get('activity_note', '')})",
              f"- steps: {p.get('steps')} after {p.get('warmup')} warm-up; plain step median "
              f"{_f(p['step_ms']['median'])} ms, profiled {_f(p['profiled_step_ms']['median'])} ms "
              f"(ratio {_f(p.get('overhead_ratio'), 2)}x)",
              f"- timing: {p.get('timing', {}).get('method', '')}",
              f"- trace: {p.get('trace') or 'not written'}"]
    att = p.get("device_attribution") or {}
    if att.get("attribution_steps"):
        lines.append(f"- device time per op: {att['method']}; {_f(att.get('attributed_pct'), 1)}% of "
                     f"{_f(att.get('device_ms_total'))} ms attributed")
    lines += ["", "## Hot spots", "",
              ("Device times are totals over the profiled steps, calls and host times those of the attribution step; "
               if att.get("attribution_steps") else "Times are totals over the profiled steps; ")
              + "flops/bytes per step.", ""]
    rows = [[o["op"], o["calls"], _f(o["total_ms"]), _f(o["self_ms"]), _f(o["device_ms"]),
             _f((o["share"] or 0) * 100, 1), _f(o.get("flops")), _f(o.get("bytes")), _f(o.get("intensity"), 2),
             _f(o.get("roofline_pct"), 1), "yes" if o.get("fallback") else ""] for o in p["ops"][:top]]
    lines.append(tabulate(rows, headers=["op", "calls", "total ms", "self (host) ms", "device ms", "share %",
                                         "flops", "bytes", "intensity", "roofline %", "fallback"],
                          tablefmt="github"))
    lines.append("")
    for key, title in (("copies", "Host-device copies"), ("syncs", "Sync points")):
        sec = p.get(key) or {}
        extra = (f", profiler memcpy events {sec.get('profiler_memcpy_events', 0)}" if key == "copies"
                 else f", runtime synchronize calls {sec.get('runtime_calls', 0)}")
        lines += [f"## {title}", "", f"{sec.get('count', 0)} in one step ({sec.get('bytes', 0)} bytes){extra}", ""]
        locs = sec.get("locations") or []
        if locs:
            lines.append(tabulate([[loc["module"], f"{loc['file']}:{loc['line']}", loc.get("device", ""), loc["count"]]
                                   for loc in locs[:10]], headers=["module", "source", "device", "count"],
                                  tablefmt="github"))
            lines.append("")
    fb = p.get("fallback") or {}
    lines += ["## Fallback cost", "",
              f"{_f(fb.get('ms_per_step'))} ms/step in {len(fb.get('ops', []))} fallback op(s), copies "
              f"{_f(fb.get('copy_ms_per_step'))} ms/step ({fb.get('bandwidth_source', '')})", ""]
    m = p.get("memory") or {}
    lines += ["## Memory", "",
              f"- estimate {_mib(m.get('estimate_bytes'))}{' (lower bound)' if m.get('lower_bound') else ''}, "
              f"measured peak {_mib(m.get('peak_bytes'))}, error {_f(m.get('error_pct'), 1)}%",
              f"- peak source: {m.get('peak_source')}", ""]
    if m.get("items"):
        lines.append(tabulate([[k, _mib(v)] for k, v in m["items"].items()],
                              headers=["item", "estimate"], tablefmt="github"))
        lines.append("")
    rf = p.get("roofline") or {}
    lines += ["## Roofline peaks", "", f"- source: {rf.get('peaks_source', '')}"]
    lines += [f"- {k}: {v:.4g}" for k, v in (rf.get("peaks") or {}).items()]
    if rf.get("missing"):
        lines.append(f"- missing (roofline % null for those ops): {', '.join(rf['missing'])}")
    lines.append("")
    if matrix:
        lines += ["## Inference load matrix", ""]
        lines.append(tabulate([[r["batch"], r["prompt_len"], r["output_len"], _f(r["ttft_ms"]), _f(r["itl_ms_p50"]),
                                _f(r["itl_ms_p95"]), _f(r["itl_ms_p99"]), _f(r["e2e_ms"]),
                                _f(r["output_tokens_per_s"], 1), r["kv_cache_estimate_bytes"],
                                r["kv_cache_measured_bytes"], _f(r["kv_error_pct"], 2)] for r in matrix["rows"]],
                              headers=["batch", "prompt", "output", "TTFT ms", "ITL P50", "ITL P95", "ITL P99",
                                       "E2E ms", "out tok/s", "KV est B", "KV meas B", "KV err %"],
                              tablefmt="github"))
        lines.append("")
        for s in matrix.get("skipped", []):
            lines.append(f"- skipped b={s['batch']} p={s['prompt_len']} o={s['output_len']}: {s['reason']}")
        lines += ["", "Definitions:", ""] + [f"- **{k}**: {v}" for k, v in matrix["definitions"].items()]
        lines.append("")
    lines += ["## Definitions", ""] + [f"- **{k}**: {v}" for k, v in (p.get("definitions") or {}).items()]
    return "\n".join(lines) + "\n"
