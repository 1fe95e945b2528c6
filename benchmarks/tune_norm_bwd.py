"""Tune the Triton norm backward (``hal.backends.cuda.kernels.norms.norm_backward``) on a GPU: GPU time
of every plan (:class:`~hal.backends.cuda.kernels.norms.BwdPlan`) at each row width, beside torch's and
Liger-Kernel's backward, for layer_norm (with a bias), rms_norm and add_rms_norm (rms_norm's backward plus the
gradient flowing into the sum), float32 and bfloat16 (``--ops`` picks).

Plans (:attr:`BwdPlan.name`): ``two-stage`` (dx row kernel + column-tiled dw/db), its dx row held in
registers at 16384 wide (``two-stage single wW``), and ``fused`` (one kernel over strips of rows) for
every (programs per SM, warps) in the grid below, and at 8192 and 16384 wide the fused plan with the row in
2 or 4 column tiles read twice (``fused pP wW sS``: only the weight/bias accumulators stay row-wide in
registers). (A fused plan with the bias gradient taken apart, as torch's column sum of dy, was tried at
2c3f3b6 and won at no width: ``tune_norm_bwd.json``'s ``db-apart`` plans.) Each plan's dx and dw are checked
against the shipped plan's (relative error, field ``rel_err``). Timing: the GPU time of one call (bench_kernels'
``device`` timing: L2 flushed, the GPU held busy while the host enqueues, events around the call, median of the
repeats); ours is ``norm_backward`` itself, torch's and Liger's are ``torch.autograd.grad`` over a retained graph.

Prints, per (op, dtype, shape), the best plan against torch, Liger and the shipped plan
(``norms.bwd_plan``, column ``shipped``), and per (op, dtype, row block) the plan with the lowest
geometric mean of time / best time over the shapes of that block: the ``BWD_TUNED`` entries, in the
JSON's ``tuned`` field (``{"rms_norm/float32/16384": "fused p1 w32", ...}``).

Usage:  python benchmarks/tune_norm_bwd.py --json out.json [--dtypes float32,bfloat16] [--quick]
        [--ops layer_norm,rms_norm,add_rms_norm] [--widths 16384,...]
Exit status: 0 ok, 2 no CUDA device or no Triton (one line on stderr).
"""
from __future__ import annotations

import json
import sys
from typing import Optional

import torch
import torch.nn.functional as F
from bench_kernels import candidates, geomean_choice, rel_err, time_plans, tuning_cases, tuning_end, tuning_start

from hal.backend import dtype_name

SHAPES = ((4096, 1024), (4096, 4096), (16384, 4096), (8192, 8192), (4096, 16384), (16384, 16384), (2048, 32768))
QUICK = ((4096, 4096), (16384, 16384))
#: warps tried per row block
WARPS = {1024: (4, 8), 2048: (4, 8), 4096: (4, 8, 16), 8192: (8, 16), 16384: (8, 16, 32), 32768: (16, 32)}
PROGRAMS_PER_SM = (1, 2, 4, 8)
#: fused plans with the row in column tiles read twice (``norms._norm_bwd_split``) are tried for these blocks
SPLIT_FROM, SPLIT_TO = 8192, 16384
SPLITS = (2, 4)
SPLIT_PROGRAMS_PER_SM = (1, 2)
#: the two-stage plan's dx kernel is also tried with the row in registers up to this block
SINGLE_DX_MAX = 16384
#: a plan whose dx or dw differs from the shipped plan's by more than this (relative to its largest
#: element) is not a candidate
REL_ERR_OK = 0.05


def plans(n: int) -> list[tuple[str, object]]:
    """``(name, plan)`` of every plan tried for rows of ``n`` elements (names as ``norms.plan_named`` reads
    them): the two-stage plan, its dx row in registers (rows up to ``SINGLE_DX_MAX``), and the fused
    plans."""
    from hal.backends.cuda.kernels import norms
    block = norms.next_power_of_2(n)
    out = [norms.two_stage_plan(n)]
    if norms.DX_SINGLE_MAX < block <= SINGLE_DX_MAX:
        out += [norms.BwdPlan(False, block, True, w) for w in (16, 32)]
    for w in WARPS.get(block, (8,)):
        for p in PROGRAMS_PER_SM:
            out.append(norms.BwdPlan(True, block, True, w, p))
    if SPLIT_FROM <= block <= SPLIT_TO:
        out += [norms.BwdPlan(True, block, True, w, p, s) for s in SPLITS for w in WARPS.get(block, (8,))
                for p in SPLIT_PROGRAMS_PER_SM]
    return [("two-stage" if i == 0 else plan.name, plan) for i, plan in enumerate(out)]


def main(argv=None) -> int:
    def options(ap):
        ap.add_argument("--ops", default="layer_norm,rms_norm,add_rms_norm")
        ap.add_argument("--widths", default="", help="only the shapes of these row widths (comma-separated)")
    start = tuning_start("tune_norm_bwd", __doc__, QUICK, argv, options)
    if start == 2:
        return 2
    args, timer, LF = start
    widths = {int(w) for w in args.widths.split(",") if w}
    from tabulate import tabulate

    rows_out: list[dict] = []
    summary = []
    shapes = [(m, n) for m, n in (QUICK if args.quick else SHAPES) if not widths or n in widths]
    for dn, m, n, op, rec in tuning_cases(args, shapes, args.ops.split(","), case, timer, LF):
        rows_out.append(rec)
        ok = rec["plans"][rec["best"]]["us"]
        summary.append([op, dn, f"{m}x{n}", round(rec["torch_us"], 1), _r(rec["liger_us"]),
                        round(rec["shipped_us"], 1), rec["best"], round(ok, 1), round(rec["torch_us"] / ok, 2),
                        None if rec["liger_us"] is None else round(rec["liger_us"] / ok, 2)])
    print(tabulate(summary, headers=["op", "dtype", "shape", "torch", "liger", "shipped", "best plan", "best",
                                     "x torch", "x liger"]))
    return tuning_end(args, timer, rows_out, choose(rows_out), "BWD_TUNED")


def case(op: str, dtype: torch.dtype, m: int, n: int, timer, LF) -> dict:
    """One (op, dtype, shape): torch's, Liger's, the shipped plan's and every plan's GPU time."""
    from hal.backends.cuda.kernels import norms
    from hal.ops import torch_impl
    dev = torch.device("cuda")
    add = op == "add_rms_norm"
    is_rms = add or op == "rms_norm"
    x, dy, r, dh = (torch.randn(m, n, device=dev, dtype=dtype) for _ in range(4))
    w, b = (torch.randn(n, device=dev, dtype=dtype) for _ in range(2))
    bias = None if is_rms else b
    _, h, mean, rstd = norms.norm_forward(x, r if add else None, w, bias, 1e-6, is_rms, n)

    def ours(plan=None):
        return norms.norm_backward(dy, h if add else x, w, bias, mean, rstd, dh if add else None, is_rms, n, plan=plan)

    def grad_of(outs, leaves):
        # their own copies of the gradients: Liger's rms_norm backward writes dx into its grad_output
        gos = [g.clone() for g in ((dy, dh) if add else (dy,))]
        return lambda: torch.autograd.grad(outs, leaves, gos, retain_graph=True)
    ref = ours()
    leaves = [t.detach().requires_grad_() for t in ((x, r, w) if add else (x, w) if is_rms else (x, w, b))]
    if add:
        yt = torch_impl.add_rms_norm(leaves[0], leaves[1], (n,), leaves[2], 1e-6)
    elif is_rms:
        yt = F.rms_norm(leaves[0], (n,), leaves[1], 1e-6)
    else:
        yt = F.layer_norm(leaves[0], (n,), leaves[1], leaves[2], 1e-6)
    rec = {"op": op, "dtype": dtype_name(dtype), "shape": [m, n],
           "torch_us": timer.device_time(grad_of(yt, leaves)), "liger_us": None}
    if LF is not None:
        yl = (LF.liger_fused_add_rms_norm(leaves[0], leaves[1], leaves[2], 1e-6) if add
              else LF.liger_rms_norm(leaves[0], leaves[1], 1e-6) if is_rms
              else LF.liger_layer_norm(leaves[0], leaves[1], leaves[2], 1e-6))
        rec["liger_us"] = timer.device_time(grad_of(yl, leaves))
    rec["plans"] = time_plans(ours, plans(n), lambda got: max(rel_err(got[0], ref[0]), rel_err(got[1], ref[1])),
                              timer)
    ok = candidates(rec["plans"], REL_ERR_OK)
    if not ok:
        raise RuntimeError(f"{op} {rec['dtype']} {m}x{n}: no plan ran within {REL_ERR_OK:.0%} of the shipped plan's result: "
                           + json.dumps(rec["plans"])[:2000])
    rec["best"] = min(ok, key=ok.get)
    rec["shipped"] = norms.bwd_plan(n, dtype, is_rms, add).name
    rec["shipped_us"] = timer.device_time(ours)
    return rec


def _r(v: Optional[float]) -> Optional[float]:
    return None if v is None else round(v, 1)


def choose(rows: list[dict]) -> dict:
    """Per (op, dtype, row block): the name of the plan with the lowest geometric mean of time / best time
    over its cases (the ``BWD_TUNED`` entries)."""
    from hal.backends.cuda.kernels._rows import next_power_of_2
    return geomean_choice([(f"{r['op']}/{r['dtype']}/{next_power_of_2(r['shape'][1])}", candidates(r["plans"], REL_ERR_OK))
                           for r in rows])


if __name__ == "__main__":
    sys.exit(main())
