"""PrecisionResult: the outcome of one comparison, as the audit.json ``precision`` section.

Owned by the caller once returned; immutable by convention. :meth:`PrecisionResult.as_dict` is
JSON-ready (non-finite floats are written as the strings ``"inf"``, ``"-inf"``, ``"nan"``);
:meth:`PrecisionResult.to_markdown` renders a short summary with tabulate.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional


def json_safe(x: Any) -> Any:
    """Recursively replace non-finite floats by strings and tuples by lists."""
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


@dataclasses.dataclass
class PrecisionResult:
    """Result of :func:`compare_module` / :func:`compare_workload`.

    ``metrics`` holds one row per compared op output, module output, gradient, parameter and
    loss; ``first_divergence`` the blamed op (or None); ``verdict`` is ``pass``, ``warning`` or
    ``fail``; ``verified`` is True only when the target device really ran.
    """

    reference: Dict[str, Any]
    target: Dict[str, Any]
    metrics: List[Dict[str, Any]]
    first_divergence: Optional[Dict[str, Any]]
    drift: Optional[Dict[str, Any]]
    calibration: Optional[Dict[str, Any]]
    verdict: str
    thresholds: Dict[str, Any]
    verified: bool
    summary: Dict[str, Any] = dataclasses.field(default_factory=dict)
    calibration_reason: Optional[str] = None

    def as_dict(self) -> Dict[str, Any]:
        d = {
            "reference": self.reference, "target": self.target, "metrics": self.metrics,
            "first_divergence": self.first_divergence, "drift": self.drift,
            "calibration": self.calibration, "verdict": self.verdict,
            "thresholds": self.thresholds, "verified": self.verified, "summary": self.summary,
        }
        if self.calibration is None and self.calibration_reason:
            d["calibration_reason"] = self.calibration_reason
        return json_safe(d)

    def rows(self, kind: Optional[str] = None, phase: Optional[str] = None) -> List[Dict[str, Any]]:
        return [r for r in self.metrics if (kind is None or r["kind"] == kind)
                and (phase is None or r["phase"] == phase)]

    def to_markdown(self, title: str = "Precision report", top: int = 12) -> str:
        from tabulate import tabulate

        t = self.target
        lines = [f"# {title}", "",
                 f"- target: {t.get('device')} {t.get('dtype')}"
                 + (f" autocast {t['autocast']}" if t.get("autocast") else "")
                 + f"; reference: {self.reference['device']} {self.reference['dtype']}",
                 f"- verdict: **{self.verdict}**; verified on target: {self.verified}",
                 f"- compared: {self.summary.get('ops', 0)} op outputs "
                 f"({self.summary.get('shadowed', 0)} shadowed in float64, "
                 f"{self.summary.get('sampled', 0)} sampled), "
                 f"{self.summary.get('modules', 0)} module outputs, "
                 f"{self.summary.get('gradients', 0)} gradients, "
                 f"{self.summary.get('parameters', 0)} parameters after the optimizer step"]
        if self.summary.get("tf32"):
            lines.append(f"- TF32: {self.summary['tf32']}")
        fd = self.first_divergence
        if fd:
            lines.append(f"- first divergence ({fd['kind']}): module `{fd['module']}`, op `{fd['op']}` "
                         f"({fd['phase']}), {fd['metric']} = {fd['value']} vs threshold {fd['threshold']}"
                         f"; inputs within tolerance: {fd['inputs_within']}; measured against the "
                         f"{fd['compared_against']}")
        else:
            lines.append("- first divergence: none (every op within its threshold)")
        if self.drift:
            dr = self.drift
            lines.append(f"- training drift over {len(dr['losses_target'])} steps: "
                         f"max relative deviation {dr['max_rel_dev']:.3g}, R^2 {dr['r2']}")
        if self.calibration:
            c = self.calibration
            lines.append(f"- calibration against {c['device']}: {c['counts']}")
        elif self.calibration_reason:
            lines.append(f"- calibration: none ({self.calibration_reason})")
        lines += ["", "## Op outputs, worst first (status, then local and total RMS relative error "
                  "over their thresholds)", ""]
        ops = [r for r in self.metrics if r["kind"] == "op"]

        def score(r):
            loc, tot = r.get("local") or {}, r.get("total") or {}
            lr = _f(loc.get("rms_rel", 0.0)) / max(r["threshold"]["rtol_eff"], 1e-12)
            tr = _f(tot.get("rms_rel", 0.0)) / max((r.get("total_threshold") or r["threshold"])["rtol_eff"], 1e-12)
            return (_STATUS_ORDER.get(r["status"], 9), -lr, -tr)
        ops.sort(key=score)
        table = []
        for r in ops[:top]:
            loc, tot = r.get("local") or {}, r.get("total") or {}
            table.append([r["phase"], r["module"], r["op"], r["dtype"],
                          _g(loc.get("max_abs")), _g(loc.get("rms_rel")), _g(tot.get("rms_rel")),
                          _g(tot.get("cosine")), r["status"]])
        lines.append(tabulate(table, headers=["phase", "module", "op", "dtype", "local max abs",
                                              "local rms rel", "total rms rel", "total cosine",
                                              "status"], tablefmt="github"))
        lines += ["", "## Modules, gradients, parameters, loss (worst first)", ""]
        mods = [r for r in self.metrics if r["kind"] != "op"]
        mods.sort(key=score)
        lines.append(tabulate([[r["kind"], r["module"], r["op"], _g((r.get("total") or {}).get("max_abs")),
                                _g((r.get("total") or {}).get("rms_rel")),
                                _g((r.get("total") or {}).get("cosine")), r["status"]] for r in mods[:top]],
                              headers=["kind", "module", "name", "max abs", "rms rel", "cosine", "status"],
                              tablefmt="github"))
        return "\n".join(lines) + "\n"


_STATUS_ORDER = {"introduced": 0, "amplified": 1, "exceeds": 2, "inherited": 3, "overflow": 4, "cancelled": 5, "ok": 6,
                 "unchecked": 7}


def _f(v):
    if isinstance(v, str):
        return math.inf if v in ("inf", "nan") else float(v)
    return float(v)


def _g(v):
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    return f"{v:.3g}"
