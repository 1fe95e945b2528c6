"""Tune the Triton SiLU-and-mul (``hal.backends.cuda.kernels.silu_and_mul``) on a GPU: GPU time of each launch
plan ``(block, warps)`` per shape, forward and backward, beside torch's unfused sequence and Liger-Kernel's
swiglu (its halves as two contiguous tensors, split outside the timing).

Plans: every block in :data:`BLOCKS` (columns per program; one program per row and column tile) with every warp
count in :data:`WARPS`. Each plan's output is checked against the shipped plan's (relative error, ``rel_err``).
Timing: bench_kernels' ``device`` timing (L2 flushed, the GPU held busy while the host enqueues, events around the
call, median of the repeats); ours is ``silu_and_mul_forward`` / ``silu_and_mul_backward`` itself, torch's and
Liger's forward under ``no_grad`` and backward as ``torch.autograd.grad`` over a retained graph. ``tbps`` counts
the fewest bytes (forward: x read, y written; backward: dy and x read, dx written).

Prints every plan beside torch and Liger per (direction, dtype, shape), and per direction the plan with the lowest
geometric mean of time / best time over that direction's cases (the JSON's ``tuned`` field).

Usage:  python benchmarks/tune_silu_and_mul.py --json out.json [--dtypes float32,bfloat16] [--quick]
Exit status: 0 ok, 2 no CUDA device or no Triton (one line on stderr).
"""
from __future__ import annotations

import sys

import torch
from bench_kernels import candidates, geomean_choice, rel_err, time_plans, tuning_cases, tuning_end, tuning_start

from hal.backend import dtype_name

#: [rows, 2 d] inputs: bench_kernels' medium and large silu_and_mul shapes, and a LLaMA-7B MLP (d 11008)
SHAPES = ((4096, 8192), (16384, 32768), (8192, 22016))
QUICK = ((4096, 8192), (16384, 32768))
BLOCKS = (1024, 2048, 4096, 8192)
WARPS = (4, 8, 16)
REL_ERR_OK = 1e-3


def case(direction: str, dtype: torch.dtype, m: int, n: int, timer, LF) -> dict:
    from hal.backends.cuda.kernels import silu_and_mul as sm
    from hal.ops import torch_impl
    dev = torch.device("cuda")
    d = n // 2
    x = torch.randn(m, n, device=dev, dtype=dtype)
    dy = torch.randn(m, d, device=dev, dtype=dtype)
    e = x.element_size()
    fwd = direction == "fwd"

    def ours(plan=None):
        return sm.silu_and_mul_forward(x, plan) if fwd else sm.silu_and_mul_backward(dy, x, plan)

    rec = {"direction": direction, "dtype": dtype_name(dtype), "shape": [m, n],
           "bytes": (m * n + m * d) * e if fwd else (m * d + 2 * m * n) * e, "liger_us": None}
    leaf = x.detach().requires_grad_()
    if fwd:
        with torch.no_grad():
            rec["torch_us"] = timer.device_time(lambda: torch_impl.silu_and_mul(x))
    else:
        yt = torch_impl.silu_and_mul(leaf)
        rec["torch_us"] = timer.device_time(lambda: torch.autograd.grad(yt, [leaf], dy, retain_graph=True))
    if LF is not None:
        a, b = (t.contiguous() for t in x.chunk(2, -1))
        if fwd:
            with torch.no_grad():
                rec["liger_us"] = timer.device_time(lambda: LF.liger_swiglu(a, b))
        else:
            la, lb = a.requires_grad_(), b.requires_grad_()
            yl = LF.liger_swiglu(la, lb)
            rec["liger_us"] = timer.device_time(lambda: torch.autograd.grad(yl, [la, lb], dy.clone(), retain_graph=True))
    ref = ours()
    rec["plans"] = time_plans(ours, [(f"b{block} w{w}", (block, w)) for block in BLOCKS for w in WARPS],
                              lambda got: rel_err(got, ref), timer, rec["bytes"])
    ok = candidates(rec["plans"], REL_ERR_OK)
    rec["best"] = min(ok, key=ok.get) if ok else None
    block, w = sm._plan(d)
    rec["shipped"] = f"b{block} w{w}"
    rec["shipped_us"] = timer.device_time(ours)
    return rec


def main(argv=None) -> int:
    start = tuning_start("tune_silu_and_mul", __doc__, QUICK, argv)
    if start == 2:
        return 2
    args, timer, LF = start
    from tabulate import tabulate

    rows, table = [], []
    for dn, m, n, direction, rec in tuning_cases(args, QUICK if args.quick else SHAPES, ("fwd", "bwd"), case, timer, LF):
        rows.append(rec)
        best = rec["plans"][rec["best"]]["us"] if rec["best"] else None
        table.append([direction, dn, f"{m}x{n}", round(rec["torch_us"], 1),
                      None if rec["liger_us"] is None else round(rec["liger_us"], 1), rec["shipped"],
                      round(rec["shipped_us"], 1), rec["best"], None if best is None else round(best, 1),
                      None if best is None else round(rec["bytes"] / best / 1e6, 2),
                      None if best is None or rec["liger_us"] is None else round(rec["liger_us"] / best, 3)])
    print(tabulate(table, headers=["dir", "dtype", "shape", "torch", "liger", "shipped", "us", "best plan", "us",
                                   "TB/s", "x liger"]))
    tuned = geomean_choice([(r["direction"], candidates(r["plans"], REL_ERR_OK)) for r in rows])
    return tuning_end(args, timer, rows, tuned, "tuned (per direction)")


if __name__ == "__main__":
    sys.exit(main())
