"""Profiling: where a step's time and memory go after migration (issue 9).

- :func:`profile_workload` / :func:`profile_callable`: per-op time (host dispatch vs device),
  hot spots, host-device copies and sync points located by module and source line, the cost of
  fallback ops and their copies, the memory estimate beside the measured peak, a roofline per op,
  and a Chrome trace (``trace.json``). The result is the ``profile`` section of audit.json.
- :func:`inference_load_matrix`: TTFT, inter-token latency percentiles, end-to-end latency,
  output tokens/s and KV-cache memory (estimate vs measured) over batch x prompt x output length.
- :func:`hotspot_chart_svg`: an inline SVG bar chart of the hot spots for the HTML report.
- ``python -m hal.conformance.profiling``: writes profile.json, trace.json and profile.md.

See docs/profiling.md for the method and every definition.
"""
from __future__ import annotations

from hal.conformance.profiling.chart import hotspot_chart_svg
from hal.conformance.profiling.loadmatrix import inference_load_matrix
from hal.conformance.profiling.profiler import DEFINITIONS, profile_callable, profile_workload
from hal.conformance.profiling.summary import markdown_summary

__all__ = ["profile_workload", "profile_callable", "inference_load_matrix", "hotspot_chart_svg",
           "markdown_summary", "DEFINITIONS"]
