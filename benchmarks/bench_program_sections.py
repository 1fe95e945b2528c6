"""Overhead of --precision and --profile on a *program* target (a script run unchanged), issue 17.

For each repeat, one ``program_sections`` call (the real child runs: float64 reference, shadowed
target, profiled run) on the script; from its sections:

* precision: the shadowed-and-compared window of the target run (first top-level forward to the
  first optimizer step) against (a) the *first* step of the plain profile run (same one-time
  costs: lazy init, first allocations) and (b) the warmed-up plain step; goal <= 4x;
* profile: the median profiled step against the median plain step of the same run (plain steps
  run first, before any profiler); goal <= 1.2x.

Repeats are interleaved runs of the whole thing, so background load hits both sides alike; the
table gives medians and minima side by side. Prints a tabulate table and writes JSON
(``--out``, default out/bench_program_sections.json). Default script: the CUDA autocast
TransformerEncoder fixture, redirected to the CPU here (``--device mlu``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SCRIPT = os.path.join(HERE, os.pardir, "tests", "fixtures", "precision", "cuda_autocast_train.py")


def main(argv=None) -> int:
    from tabulate import tabulate

    from hal.conformance.workload_audit import program_sections
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--script", default=os.path.normpath(DEFAULT_SCRIPT))
    p.add_argument("--device", default="mlu")
    p.add_argument("--steps", type=int, default=3, help="profiled (and plain) steps; precision runs' bound")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="out/bench_program_sections.json")
    p.add_argument("script_args", nargs="*", default=["--iters", "20", "--batch", "8", "--seq", "64"])
    a = p.parse_args(argv)
    if not os.path.isfile(a.script):
        p.error(f"--script {a.script}: no such file")
    rows = []
    for i in range(a.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            s = program_sections({"target": a.script, "kind": "script", "device": a.device, "args": a.script_args,
                                  "steps": a.steps, "precision": True, "profile": True, "out": tmp,
                                  "timeout": 900}, [])
            wall = time.perf_counter() - t0
        pr, pf = s["precision"], s["profile"]
        if "target" not in pr or "step_ms" not in pf:
            p.exit(3, f"{p.prog}: the sections were not produced: precision {pr.get('verdict')}: {pr.get('error')}; "
                      f"profile: {pf.get('error')}\n")
        tm = pr["target"]["timing"]
        first, plain, prof = pf["first_step_ms"], pf["step_ms"], pf["profiled_step_ms"]
        rows.append({"repeat": i, "wall_s": wall, "precision_window_ms": tm["window_ms"],
                     "plain_first_step_ms": first, "plain_step_ms_median": plain["median"], "plain_step_ms_min": plain["min"],
                     "profiled_step_ms_median": prof["median"], "profiled_step_ms_min": prof["min"],
                     "precision_vs_first_step": tm["window_ms"] / first,
                     "precision_vs_plain_median": tm["window_ms"] / plain["median"],
                     "precision_vs_plain_min": tm["window_ms"] / plain["min"],
                     "profile_ratio_median": prof["median"] / plain["median"],
                     "profile_ratio_min": prof["min"] / plain["min"],
                     "precision_verdict": pr["verdict"]})
        print(f"repeat {i}: {json.dumps(rows[-1])}", file=sys.stderr)
    keys = ["precision_vs_first_step", "precision_vs_plain_median", "precision_vs_plain_min",
            "profile_ratio_median", "profile_ratio_min"]
    table = [[k, f"{statistics.median(r[k] for r in rows):.2f}", f"{min(r[k] for r in rows):.2f}",
              "<= 4" if k.startswith("precision") else "<= 1.2"] for k in keys]
    print(tabulate(table, headers=["ratio", f"median of {len(rows)}", "min", "goal"], tablefmt="github"))
    import torch
    doc = {"script": a.script, "args": a.script_args, "device": a.device, "steps": a.steps, "repeats": rows,
           "summary": {k: {"median": statistics.median(r[k] for r in rows), "min": min(r[k] for r in rows)} for k in keys},
           "environment": {"python": platform.python_version(), "torch": torch.__version__,
                           "platform": platform.platform(), "cpu_count": os.cpu_count(),
                           "load_avg": os.getloadavg()},
           "method": __doc__}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
