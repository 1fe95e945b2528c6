"""Profiling overhead: a plain step against the same step under the profiler as
``hal.conformance.profiling.profile_workload`` runs it (issue 9, goal: at most 1.2x).

For each case the workload is built once and warmed up; then ``--rounds`` rounds each time
``--repeats`` plain steps, ``--repeats`` profiled steps (``profiled_steps``: CPU activity plus the
backend's device activity, no shapes/stacks/memory, after the profiler's own untimed warm-up
step), and, for comparison, ``--repeats`` steps under a profiler with ``record_shapes=True,
with_stack=True`` (the configuration the separate analysis step replaces). Medians over all
rounds (the verdict), and the ratio of the minima beside it (the least-disturbed step of each
kind: on a machine shared with other work it is the steadier figure); many short alternating
rounds keep a busy machine's drift out of the ratio. Times:
backend events around each synchronised step. The machine's load average before and after is
recorded: on a shared CPU box the ratio is only as good as the machine is quiet.

Cases: gpt tiny train and infer; gpt2-small train (batch 1, seq_len 64, ``--small-rounds``
rounds, so that one CPU step takes seconds, not minutes). Prints a tabulate table and writes
JSON (``--out``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
from tabulate import tabulate

import hal
from hal.conformance.profiling.profiler import _activities, profiled_steps, timed_steps
from hal.models import get_workload

GOAL = 1.2


def _stack_steps(step_fn, backend, acts, n):
    from torch.profiler import profile, schedule
    with profile(activities=acts, record_shapes=True, with_stack=True,
                 schedule=schedule(wait=0, warmup=1, active=n, repeat=1)) as prof:
        step_fn()
        backend.synchronize()
        prof.step()
        return timed_steps(step_fn, backend, n, around=prof.step)


def run_case(name, config, mode, overrides, backend, device, rounds, repeats, warmup):
    w = get_workload(name, config=config, **overrides).build(device, seed=0)
    batch = w.example_batch()
    step = (lambda: w.train_step(batch)) if mode == "train" else (lambda: w.infer(batch))
    acts, _, _ = _activities(backend)
    for _ in range(warmup):
        step()
    backend.synchronize()
    plain, prof, stack = [], [], []
    for _ in range(rounds):
        plain += timed_steps(step, backend, repeats)
        prof += profiled_steps(step, backend, repeats, acts)["step_ms"]
        stack += _stack_steps(step, backend, acts, repeats)
    p, q, s = statistics.median(plain), statistics.median(prof), statistics.median(stack)
    return {"case": f"{name}:{config} {mode}", "overrides": overrides, "plain_ms": p, "profiled_ms": q,
            "ratio": q / p, "stack_shapes_ms": s, "stack_shapes_ratio": s / p,
            "min_ratio": min(prof) / min(plain), "min_stack_shapes_ratio": min(stack) / min(plain), "goal": GOAL,
            "meets_goal": q / p <= GOAL, "samples": {"plain": plain, "profiled": prof, "stack_shapes": stack}}


def _load():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        return None


def _program_bench(script: str, rest: list) -> int:
    """``--script PATH [bench_program_sections options] [-- script args]``: the program-target benchmark
    (benchmarks/bench_program_sections.py, beside this script: ``python benchmarks/x.py`` puts this folder first
    on sys.path)."""
    import bench_program_sections
    return bench_program_sections.main(["--script", script, *rest])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--small-rounds", type=int, default=3, help="rounds for gpt2-small")
    ap.add_argument("--repeats", type=int, default=1, help="steps per block in a round")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-small", action="store_true", help="skip gpt2-small")
    ap.add_argument("--out", default="out/bench_profiling.json")
    ap.add_argument("--script", metavar="PATH", help="measure a program target instead (a script run unchanged): "
                    "delegates to benchmarks/bench_program_sections.py (precision window and profile ratios)")
    known, rest = ap.parse_known_args(argv)
    if known.script:
        return _program_bench(known.script, ["--device", known.device, *rest])
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    backend = hal.get_backend(args.device)
    device = backend.torch_device()
    cases = [("gpt", "tiny", "train", {}), ("gpt", "tiny", "infer", {})]
    if not args.no_small:
        cases.append(("gpt", "gpt2-small", "train", {"batch_size": 1, "seq_len": 64}))
    rows = []
    load_before = _load()
    for case in cases:
        t0 = time.time()
        rounds = args.small_rounds if case[1] == "gpt2-small" else args.rounds
        r = run_case(*case, backend, device, rounds, args.repeats, args.warmup)
        r["rounds"] = rounds
        r["wall_s"] = time.time() - t0
        rows.append(r)
        print(f"{r['case']}: done in {r['wall_s']:.0f} s", file=sys.stderr)
    print(tabulate([[r["case"], f"{r['plain_ms']:.2f}", f"{r['profiled_ms']:.2f}", f"{r['ratio']:.2f}x",
                     f"{r['stack_shapes_ms']:.2f}", f"{r['stack_shapes_ratio']:.2f}x",
                     f"{r['min_ratio']:.2f}x", f"{r['min_stack_shapes_ratio']:.2f}x",
                     "yes" if r["meets_goal"] else "NO"] for r in rows],
                   headers=["case", "plain ms", "profiled ms", "ratio", "+shapes+stack ms", "ratio",
                            "ratio of mins", "+shapes+stack (mins)", f"<= {GOAL}x (medians)"], tablefmt="github"))
    load = {"before": load_before, "after": _load(), "cores": os.cpu_count()}
    print(f"load average before {load_before}, after {load['after']} on {os.cpu_count()} cores")
    result = {"benchmark": "profiling overhead", "goal_ratio": GOAL, "rows": rows,
              "method": {"rounds": args.rounds, "small_rounds": args.small_rounds, "repeats": args.repeats, "warmup": args.warmup,
                         "statistic": "median over all rounds", "timing": "backend events, synchronised"},
              "environment": {"python": platform.python_version(), "torch": torch.__version__,
                              "device": backend.device_properties(0).name, "backend": backend.name,
                              "threads": torch.get_num_threads(), "loadavg": load,
                              "command": " ".join([sys.executable] + sys.argv)}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
