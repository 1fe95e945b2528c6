"""Training drift: how far the target's loss curve departs from the float64 reference's.

Pure functions on two equal-length loss lists; thread-safe.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence


def relative_deviations(target: Sequence[float], reference: Sequence[float]) -> List[float]:
    """|t-r|/|r| of each pair of losses (|r| floored at 1e-30); infinity where either loss is not finite."""
    return [abs(a - b) / max(abs(b), 1e-30) if math.isfinite(a) and math.isfinite(b) else math.inf
            for a, b in zip(target, reference)]


def drift_stats(target: Sequence[float], reference: Sequence[float]) -> Dict[str, object]:
    """``max_rel_dev`` = max |t-r|/|r| over steps; ``r2`` = 1 - SS_res/SS_tot of the target
    curve as a predictor of the reference curve (None when the reference curve is flat, or when
    a loss is not finite). Raises ValueError on lists of different lengths."""
    if len(target) != len(reference):
        raise ValueError(f"loss curves differ in length: {len(target)} vs {len(reference)}")
    t, r = [float(x) for x in target], [float(x) for x in reference]
    finite = all(math.isfinite(x) for x in t + r)
    devs = relative_deviations(t, r)
    r2: Optional[float] = None
    if finite and len(r) >= 2:
        mean = sum(r) / len(r)
        ss_tot = sum((b - mean) ** 2 for b in r)
        ss_res = sum((a - b) ** 2 for a, b in zip(t, r))
        if ss_tot > 0:
            r2 = 1.0 - ss_res / ss_tot
    return {"losses_target": t, "losses_reference": r,
            "max_rel_dev": max(devs) if devs else 0.0, "r2": r2}
