"""Calibrated verdicts: the target's error against float64 relative to a second device's.

msprobe's "new standard" divides the NPU's error by the GPU's error, both measured against a CPU
high-precision benchmark, and passes an API when the ratios stay under its L0 limits: RMSE ratio
<= 2, max relative error ratio <= 10, mean relative error ratio <= 2. We apply the same ratios
per op to the *local* (introduced) errors and decide

* ``pass``: every ratio within its limit (or both errors are zero);
* ``warning``: a ratio over its limit but the target's error is still within its absolute
  threshold (dtype/op-class rule) - worse than the calibration device, still acceptable;
* ``error``: a ratio over its limit and the target's error over its threshold.

Pure functions; thread-safe.
"""
from __future__ import annotations

import math
from typing import Dict, Iterable, Optional

#: msprobe new-standard L0 limits (target error / calibration error).
RATIO_LIMITS = {"rms_rel": 2.0, "max_rel": 10.0, "mean_rel": 2.0}
_FLOOR = 1e-300


def device_available(device: str) -> Optional[str]:
    """None if a tensor can be created on ``device``, else the reason (one line)."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        return f"not a device: {exc}"
    if dev.type == "cuda" and not torch.cuda.is_available():
        return "torch.cuda.is_available() is False on this machine"
    try:
        torch.empty(1, device=dev)
    except Exception as exc:  # any backend error means "not usable here"
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return None


def ratio(target: float, calib: float) -> float:
    if target == calib == 0:
        return 1.0
    if not (math.isfinite(target) and math.isfinite(calib)):
        return math.inf if not math.isfinite(target) or target > 0 else 1.0
    return target / max(calib, _FLOOR)


def op_verdict(target_local: Dict, calib_local: Dict) -> Dict[str, object]:
    """Ratios and verdict for one op (both dicts from :func:`metrics.error_stats`)."""
    ratios = {m: ratio(float(target_local[m]), float(calib_local[m])) for m in RATIO_LIMITS}
    over = [m for m, v in ratios.items() if v > RATIO_LIMITS[m]]
    if target_local.get("nan_inf_mismatch", 0) > calib_local.get("nan_inf_mismatch", 0):
        over.append("nan_inf")
    if not over:
        status = "pass"
    else:
        status = "error" if target_local.get("exceeds") else "warning"
    return {"ratios": ratios, "over": over, "status": status}


def calibrate(target_rows: Iterable[Dict], calib_rows: Iterable[Dict], device: str) -> Dict[str, object]:
    """Match op rows by key (phase, module, op, occurrence, output) and grade each."""
    calib = {_key(r): r for r in calib_rows if r["kind"] == "op" and r.get("local")}
    ops, counts = [], {"pass": 0, "warning": 0, "error": 0, "unmatched": 0}
    for r in target_rows:
        if r["kind"] != "op" or not r.get("local"):
            continue
        c = calib.get(_key(r))
        if c is None:
            counts["unmatched"] += 1
            continue
        v = op_verdict(r["local"], c["local"])
        counts[v["status"]] += 1
        ops.append({"phase": r["phase"], "module": r["module"], "op": r["op"],
                    "occurrence": r["occurrence"], **v})
    return {"device": device, "limits": RATIO_LIMITS, "counts": counts, "ops": ops}


def _key(r):
    return (r["phase"], r["module"], r["op"], r["occurrence"], r["out_index"])
