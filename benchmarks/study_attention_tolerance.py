"""How the precision comparison's local rule judges a 16-bit attention backward, correct and wrong (a study, not a
benchmark).

Found on an HF-style BERT fine-tuning loop audited with ``--device mlu --precision`` (autocast, measured on the CPU in
bfloat16): ``scaled_dot_product_attention_backward`` was the first divergence, "introduced", mismatch_frac 0.0024 and
0.0039 > 0.001, of a correct kernel. The backward's ``dS = P * (dP - D)`` cancels, and a fused kernel rounds ``P`` and
``dS`` to the operand dtype; an element scale relative to the output (``max(|ref|, rms(ref))``) does not follow that.

For the CPU's fused kernel and for attention made wrong on purpose (probabilities rounded to 4 bits; a softmax scale
3% off), in bfloat16 and float16, over attention from flat (q, k scaled 0.05) to peaked (6.0), this measures the
mismatch fraction of ``dQ, dK, dV`` under two rules, with the comparison's own statistics
(``metrics.error_stats_many``) and thresholds (``thresholds.threshold_for``):

* ``output``: the rule before 2026-12-06, reference the float64 math gradients with ``D`` recomputed exactly, scale
  ``max(|ref|, rms(ref))``;
* ``shipped``: the tracer's shadow of the kernel's backward call (``shadow.Shadow.plan``: the float64 math gradients
  on the kernel's own inputs, ``D`` from the forward output it was given) and at least the products' magnitudes
  (``attention.math_attention_grads``).

A rule is right when the correct kernel's rows are within (mismatch <= 0.001) and the wrong ones over.

``--device cuda``: the device's own kernels (flash, efficient; ``sdpa_kernel``) through the tracer (``StepTracer``,
as an audit runs them), the shipped rule only (their backward has no float64 call to hold the output rule's
reference against: it is the math form's either way).

Usage: python benchmarks/study_attention_tolerance.py [--device cuda] [--json reports/precision/attention-tolerance-cpu.json]
Prints a table; writes JSON (rows and the environment) with --json.
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from tabulate import tabulate

from hal.conformance.precision import thresholds as th
from hal.conformance.precision.attention import math_attention_grads
from hal.conformance.precision.metrics import StatsRequest, error_stats_many
from hal.conformance.precision.shadow import Shadow

BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
GRADS = ("dQ", "dK", "dV")
#: the device kernels of --device (torch.nn.attention.SDPBackend names)
DEVICE_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION")


def _rounded_probabilities(q, k, v):
    p = torch.softmax(q @ k.transpose(-1, -2) / q.size(-1) ** 0.5, -1)
    return (p + (torch.round(p * 16) / 16 - p).detach()) @ v


FORMS = {  # name -> (forward in the computing dtype, correct?)
    "fused kernel": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), True),
    "P rounded to 4 bits": (_rounded_probabilities, False),
    "scale 3% off": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=1.03 / q.size(-1) ** 0.5), False),
}


def _inputs(dtype, qk_scale, shape):
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(*shape, dtype=torch.float64) for _ in range(4))
    return [t.to(dtype) for t in (q * qk_scale, k * qk_scale, v, do)]


def _run(form, dtype, q, k, v, do):
    """The form's output and gradients in ``dtype`` (the fused kernel in ``dtype`` itself; the wrong forms in float32,
    rounded: their error is the defect, not float32's)."""
    fn, _ = FORMS[form]
    work = dtype if form == "fused kernel" else torch.float32
    x = [t.to(work).detach().requires_grad_() for t in (q, k, v)]
    o = fn(*x)
    o.backward(do.to(work))
    return o.detach().to(dtype), [t.grad.to(dtype) for t in x]


def _judge(rule, dtype, q, k, v, do, o, grads):
    thr = th.threshold_for(BACKWARD.name().split("::")[1], dtype, max(q.size(-1), q.size(-2)))
    if rule == "output":
        refs = math_attention_grads(*(t.double() for t in (do, q, k, v)))
        mags = (None,) * 3
    else:
        sh = Shadow()
        lse = torch.zeros(q.shape[:-1])  # the shadow does not read it
        jobs = [sh.plan(BACKWARD, (do, q, k, v, o, lse, 0.0, False), {}, grads[i], i) for i in range(3)]
        sh.flush(jobs)
        refs, mags = [j.ref for j in jobs], [j.magnitude for j in jobs]
    stats = error_stats_many([StatsRequest(g, r, dtype, thr["rtol_eff"], thr["atol"], True, magnitude=m)
                              for g, r, m in zip(grads, refs, mags)])
    return thr["rtol_eff"], [s["mismatch_frac"] for s in stats]


class _Sdpa(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def _device_rows(device, shape):
    """The device's fused kernels, correct by assumption, through the tracer: one row per dtype, scale and kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from hal.conformance.precision.tracer import StepTracer
    rows = []
    for dtype in (torch.bfloat16, torch.float16):
        for qk_scale in (0.05, 1.0, 3.0, 6.0):
            for backend in DEVICE_BACKENDS:
                q, k, v, do = (t.to(device) for t in _inputs(dtype, qk_scale, shape))
                q, k, v = (t.requires_grad_() for t in (q, k, v))
                m = _Sdpa()
                tr = StepTracer(m, "target")
                with tr, sdpa_kernel(getattr(SDPBackend, backend)):
                    m(q, k, v).backward(do)
                back = sorted((r for r in tr.records if r.phase == "backward" and r.op.startswith("scaled_dot_product")
                               and r.out_index < 3), key=lambda r: r.out_index)
                fracs = [r.local["mismatch_frac"] if r.local else None for r in back]
                over = [n for n, f in zip(GRADS, fracs) if f is None or f > th.MISMATCH_FRACTION]
                rows.append({"dtype": str(dtype).replace("torch.", ""), "qk_scale": qk_scale,
                             "form": f"{backend.split('_')[0].lower()} kernel", "correct": True, "rule": "shipped",
                             "op": back[0].op if back else None,
                             **{f"mismatch_{n}": f for n, f in zip(GRADS, fracs)}, "exceeds": over, "right": not over})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--shape", default="8,4,64,16", help="batch, heads, length, head dim")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args(argv)
    shape = tuple(int(x) for x in a.shape.split(","))
    rows = [] if a.device == "cpu" else _device_rows(torch.device(a.device), shape)
    for dtype in (torch.bfloat16, torch.float16) if a.device == "cpu" else ():
        for qk_scale in (0.05, 1.0, 3.0, 6.0):
            q, k, v, do = _inputs(dtype, qk_scale, shape)
            for form, (_, correct) in FORMS.items():
                o, grads = _run(form, dtype, q, k, v, do)
                for rule in ("output", "shipped"):
                    rtol, fracs = _judge(rule, dtype, q, k, v, do, o, grads)
                    over = [n for n, f in zip(GRADS, fracs) if f > th.MISMATCH_FRACTION]
                    rows.append({"dtype": str(dtype).replace("torch.", ""), "qk_scale": qk_scale, "form": form,
                                 "correct": correct, "rule": rule, "rtol_eff": rtol,
                                 **{f"mismatch_{n}": f for n, f in zip(GRADS, fracs)}, "exceeds": over,
                                 "right": (not over) if correct else bool(over)})
    print(tabulate([[r["dtype"], r["qk_scale"], r["form"], r["rule"], *("-" if r[f"mismatch_{n}"] is None else f"{r[f'mismatch_{n}']:.4f}" for n in GRADS),
                     ",".join(r["exceeds"]) or "-", "yes" if r["right"] else "NO"] for r in rows],
                   headers=["dtype", "q,k scale", "gradients of", "rule", *GRADS, f"over {th.MISMATCH_FRACTION}",
                            "judged right"], tablefmt="github"))
    for rule in ("output", "shipped"):
        mine = [r for r in rows if r["rule"] == rule]
        if not mine:
            continue
        print(f"{rule}: {sum(r['right'] for r in mine)}/{len(mine)} judged right "
              f"(correct kernel within: {sum(r['right'] for r in mine if r['correct'])}/"
              f"{sum(r['correct'] for r in mine)}; wrong ones over: {sum(r['right'] for r in mine if not r['correct'])}/"
              f"{sum(not r['correct'] for r in mine)})")
    if a.json:
        from hal.environment import fingerprint
        with open(a.json, "w") as fh:
            json.dump({"study": "attention-backward-tolerance", "device": a.device,
                       "op": BACKWARD.name() if a.device == "cpu" else "the device's fused kernels", "shape": list(shape),
                       "mismatch_fraction": th.MISMATCH_FRACTION, "rows": rows, "environment": fingerprint()},
                      fh, indent=1, default=str)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
