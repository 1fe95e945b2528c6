"""Tune the Triton softmax / log_softmax backward (``hal.backends.cuda.kernels.softmax.softmax_backward``) on
a GPU: GPU time of each plan per row width, beside torch's and Liger-Kernel's backward (softmax only).

Plans: ``two-pass`` (tiles of ``BWD_TILE``: dy and y read twice) and ``single wN`` (the row of dy and y in
registers, read once, N warps) for every warp count in the grid below. Each plan's dx is checked against
the two-pass plan's (relative error, field ``rel_err``). Timing: bench_kernels' ``device`` timing (L2
flushed, the GPU held busy while the host enqueues, events around the call, median of the repeats); ours
is ``softmax_backward`` itself, torch's and Liger's ``torch.autograd.grad`` over a retained graph.
``tbps`` counts the fewest bytes (dy and y read once, dx written once).

Prints, per (op, dtype, shape), every plan beside torch and Liger, and per row block the warps of the
single-pass plan with the lowest geometric mean of time / best time over that block's cases (the
``BWD_WARPS`` entries, the JSON's ``tuned`` field; ``"two-pass"`` where that plan wins the block).

Usage:  python benchmarks/tune_softmax_bwd.py --json out.json [--dtypes float32,bfloat16] [--quick]
Exit status: 0 ok, 2 no CUDA device or no Triton (one line on stderr).
"""
from __future__ import annotations

import sys

import torch
from bench_kernels import candidates, geomean_choice, rel_err, time_plans, tuning_cases, tuning_end, tuning_start

from hal.backend import dtype_name

SHAPES = ((16384, 1024), (4096, 4096), (16384, 4096), (8192, 8192), (16384, 16384), (4096, 32768))
QUICK = ((4096, 4096), (16384, 16384))
#: warps tried per row block by the single-pass plan
WARPS = {1024: (2, 4, 8), 4096: (4, 8, 16), 8192: (8, 16, 32), 16384: (8, 16, 32), 32768: (16, 32)}
#: a plan whose dx differs from the two-pass plan's by more than this (relative to its largest element)
REL_ERR_OK = 1e-3


def plans(n: int) -> list[tuple[str, tuple]]:
    from hal.backends.cuda.kernels import softmax as sx
    block = sx.next_power_of_2(n)
    out = [("two-pass", (False, sx.BWD_TILE, 8))]
    for w in WARPS.get(block, (8,)):
        out.append((f"single w{w}", (True, block, w)))
    return out


def case(op: str, dtype: torch.dtype, m: int, n: int, timer, LF) -> dict:
    from hal.backends.cuda.kernels import softmax as sx
    dev = torch.device("cuda")
    log = op == "log_softmax"
    x = torch.randn(m, n, device=dev, dtype=dtype) * 3
    dy = torch.randn(m, n, device=dev, dtype=dtype)
    y = sx.softmax_forward(x, log)

    def ours(plan=None):
        return sx.softmax_backward(dy, y, log, dtype, plan=plan)

    leaf = x.detach().requires_grad_()
    yt = (torch.log_softmax if log else torch.softmax)(leaf, -1)
    rec = {"op": op, "dtype": dtype_name(dtype), "shape": [m, n], "bytes": 3 * m * n * x.element_size(),
           "torch_us": timer.device_time(lambda: torch.autograd.grad(yt, [leaf], dy, retain_graph=True)),
           "liger_us": None}
    if LF is not None and not log:
        yl = LF.liger_softmax(leaf)
        rec["liger_us"] = timer.device_time(lambda: torch.autograd.grad(yl, [leaf], dy.clone(), retain_graph=True))
    ref = ours(plans(n)[0][1])
    rec["plans"] = time_plans(ours, plans(n), lambda got: rel_err(got, ref), timer, rec["bytes"])
    ok = candidates(rec["plans"], REL_ERR_OK)
    rec["best"] = min(ok, key=ok.get) if ok else None
    rec["shipped"] = list(sx.bwd_plan(n))
    rec["shipped_us"] = timer.device_time(ours)
    return rec


def choose(rows: list[dict]) -> dict:
    """Per row block: the plan with the lowest geometric mean of time / best time over its cases (every op
    and dtype): the warp count of a single-pass plan, or "two-pass"."""
    from hal.backends.cuda.kernels._rows import next_power_of_2
    chosen = geomean_choice([(str(next_power_of_2(r["shape"][1])), candidates(r["plans"], REL_ERR_OK)) for r in rows])
    return {block: "two-pass" if name == "two-pass" else int(name.split("w")[1]) for block, name in chosen.items()}


def main(argv=None) -> int:
    start = tuning_start("tune_softmax_bwd", __doc__, QUICK, argv)
    if start == 2:
        return 2
    args, timer, LF = start
    from tabulate import tabulate

    rows, table = [], []
    for dn, m, n, op, rec in tuning_cases(args, QUICK if args.quick else SHAPES, ("softmax", "log_softmax"), case,
                                          timer, LF):
        rows.append(rec)
        for name, p in rec["plans"].items():
            table.append([op, dn, f"{m}x{n}", name, round(p["us"], 1) if "us" in p else p.get("error"),
                          round(p["tbps"], 2) if "tbps" in p else None, round(rec["torch_us"], 1),
                          None if rec["liger_us"] is None else round(rec["liger_us"], 1),
                          "*" if name == rec["best"] else ""])
    print(tabulate(table, headers=["op", "dtype", "shape", "plan", "us", "TB/s", "torch", "liger", "best"]))
    return tuning_end(args, timer, rows, choose(rows), "BWD_WARPS (per row block)")


if __name__ == "__main__":
    sys.exit(main())
