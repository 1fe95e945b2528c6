"""Dispatch overhead of hal.ops against calling torch directly, side by side in one process.

Goal (issue 2): hal.ops.softmax adds at most 1 us per call over torch.softmax on a 64-element CPU
tensor (1.5 us at the very most). Method: both callables timed in interleaved rounds (so drift
affects both alike) with time.perf_counter over N calls per round, after a warm-up; the figure is
the median over rounds, and "added" is median(hal) - median(torch) per call.

    python benchmarks/bench_dispatch.py [--n 20000] [--rounds 15] [--out out/bench_dispatch.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F
from tabulate import tabulate

import hal.ops


def per_call_us(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000, help="calls per round")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="out/bench_dispatch.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    x = torch.randn(64)
    m = torch.randn(8, 8)
    w = torch.ones(64)
    pairs = {
        "softmax[64]": (lambda: torch.softmax(x, -1), lambda: hal.ops.softmax(x, -1)),
        "gelu[64]": (lambda: F.gelu(x), lambda: hal.ops.gelu(x)),
        "matmul[8x8]": (lambda: torch.matmul(m, m), lambda: hal.ops.matmul(m, m)),
        "rms_norm[64]": (lambda: F.rms_norm(x, (64,), w, 1e-6), lambda: hal.ops.rms_norm(x, (64,), w, 1e-6)),
    }
    rows, results = [], {}
    for name, (plain, via_hal) in pairs.items():
        for _ in range(3):  # warm-up: resolution cache, allocator, branch predictors
            per_call_us(plain, 2000)
            per_call_us(via_hal, 2000)
        t_plain, t_hal = [], []
        for _ in range(a.rounds):
            t_plain.append(per_call_us(plain, a.n))
            t_hal.append(per_call_us(via_hal, a.n))
        mp, mh = statistics.median(t_plain), statistics.median(t_hal)
        diffs = sorted(h - p for h, p in zip(t_hal, t_plain))
        results[name] = {"torch_us": mp, "hal_us": mh, "added_us": mh - mp, "ratio": mh / mp,
                         "added_us_p10": diffs[len(diffs) // 10], "added_us_p90": diffs[(9 * len(diffs)) // 10],
                         "torch_us_all": t_plain, "hal_us_all": t_hal}
        rows.append([name, f"{mp:.3f}", f"{mh:.3f}", f"{mh - mp:+.3f}", f"{mh / mp:.2f}x"])
    env = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
           "cpu_count": os.cpu_count(), "threads": a.threads, "n_per_round": a.n, "rounds": a.rounds,
           "method": "interleaved rounds, time.perf_counter, median over rounds"}
    print(tabulate(rows, headers=["op", "torch us/call", "hal.ops us/call", "added us", "ratio"]))
    print("goal: softmax[64] added <= 1.0 us (1.5 us at the very most)")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"environment": env, "results": results}, f, indent=2)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
