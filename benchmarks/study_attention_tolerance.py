"""How the precision comparison's local rule judges 16-bit attention, fused and unfused (a study, not a benchmark).

Found on an HF-style BERT fine-tuning loop audited with ``--device mlu --precision`` (autocast, measured on the CPU in
bfloat16): ``scaled_dot_product_attention_backward`` was the first divergence, "introduced", mismatch_frac 0.0024 and
0.0039 > 0.001. A fused attention kernel rounds its intermediates (the probabilities P before ``P @ V``, and in the
backward ``dS = P * (dP - D)`` before ``dS @ K``) to the operand dtype, where the float64 shadow on the op's inputs
sees none of it, and ``dS`` cancels; the element rule's scale (``max(|ref|, rms(ref))``) does not follow the
cancellation. This measures, with the comparison's own statistics (``metrics.error_stats_many``) and thresholds
(``thresholds.threshold_for`` of the attention op), the mismatch fraction of ``O, dQ, dK, dV`` for the fused kernel
(``F.scaled_dot_product_attention``) and the unfused math form in the same dtype, against float64, over attention from
flat (q, k scaled 0.05) to peaked (3.0), with the rule's rtol as it is and widened by 1 and 2 epsilons of the dtype.

Usage: python benchmarks/study_attention_tolerance.py [--json reports/precision/attention-tolerance-cpu.json]
Prints a table; writes JSON (rows and the environment) with --json.
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from tabulate import tabulate

from hal.conformance.precision import thresholds as th
from hal.conformance.precision.metrics import StatsRequest, error_stats_many

OP = "_scaled_dot_product_flash_attention_for_cpu"


def _grads(dtype: torch.dtype, fused: bool, values: torch.dtype, qk_scale: float, shape) -> list:
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(*shape, dtype=torch.float64) for _ in range(4))
    q, k = q * qk_scale, k * qk_scale
    q, k, v, do = (t.to(values).to(dtype) for t in (q, k, v, do))  # the same 16-bit values on every side
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    if fused:
        o = F.scaled_dot_product_attention(q, k, v)
    else:
        o = torch.softmax((q @ k.transpose(-1, -2)) / shape[-1] ** 0.5, -1) @ v
    o.backward(do)
    return [o.detach(), q.grad, k.grad, v.grad]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--shape", default="8,4,64,16", help="batch, heads, length, head dim")
    a = ap.parse_args(argv)
    shape = tuple(int(x) for x in a.shape.split(","))
    k = max(shape[-1], shape[-2])  # the comparison's K for attention (thresholds.reduction_length)
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        eps = torch.finfo(dtype).eps
        for qk_scale in (0.05, 1.0, 3.0):
            ref = _grads(torch.float64, False, dtype, qk_scale, shape)
            for fused in (True, False):
                outs = _grads(dtype, fused, dtype, qk_scale, shape)
                for widen in (0, 1, 2):
                    thr = th.threshold_for(OP, dtype, k)
                    rtol = thr["rtol_eff"] + widen * eps
                    stats = error_stats_many([StatsRequest(t.reshape(-1), r.reshape(-1), dtype, rtol, thr["atol"], True)
                                              for t, r in zip(outs, ref)])
                    rows.append({"dtype": str(dtype).replace("torch.", ""), "qk_scale": qk_scale,
                                 "form": "fused" if fused else "math", "rtol_eff": rtol, "widened_eps": widen,
                                 **{f"mismatch_{n}": s["mismatch_frac"] for n, s in zip(("O", "dQ", "dK", "dV"), stats)},
                                 "exceeds": [n for n, s in zip(("O", "dQ", "dK", "dV"), stats)
                                             if s["mismatch_frac"] > th.MISMATCH_FRACTION]})
    print(tabulate([[r["dtype"], r["qk_scale"], r["form"], f"+{r['widened_eps']} eps", f"{r['rtol_eff']:.3g}",
                     *(f"{r[f'mismatch_{n}']:.4f}" for n in ("O", "dQ", "dK", "dV")), ",".join(r["exceeds"]) or "-"]
                    for r in rows],
                   headers=["dtype", "q,k scale", "form", "rtol", "rtol_eff", "O", "dQ", "dK", "dV",
                            f"over {th.MISMATCH_FRACTION}"], tablefmt="github"))
    if a.json:
        from hal.environment import fingerprint
        with open(a.json, "w") as fh:
            json.dump({"study": "attention-tolerance", "op": OP, "shape": list(shape), "k": k,
                       "mismatch_fraction": th.MISMATCH_FRACTION, "rows": rows, "environment": fingerprint()},
                      fh, indent=1, default=str)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
