"""Reference workloads: step time, throughput, peak memory and memory-estimate error per workload.

    python benchmarks/bench_models.py --device cpu --out bench_models.json
    python benchmarks/bench_models.py --device <accelerator> --dtype bfloat16 \\
        --cases gpt:gpt2-small:train gpt:gpt2-small:infer cnn:resnet18:train moe:small:train

Each case runs :func:`hal.models.run.run` (``--warmup`` steps, then ``--steps`` timed steps with
device synchronisation; the median is reported, then one more step measured for peak memory).
Prints a table (tabulate) and writes every case's full result to ``--out`` (JSON).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys

import torch
from tabulate import tabulate

DEFAULT_CASES = ["gpt:tiny:train", "gpt:tiny:infer", "cnn:tiny:train", "cnn:tiny:infer", "moe:tiny:train",
                 "moe:tiny:infer"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--cases", nargs="+", default=DEFAULT_CASES, help="model:config:mode")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", default="bench_models.json")
    args = p.parse_args(argv)
    from hal.models.run import parse, run
    results, rows = [], []
    for case in args.cases:
        model, config, mode = case.split(":")
        res = run(parse(["--model", model, "--config", config, "--device", args.device, "--dtype", args.dtype,
                         "--mode", mode, "--steps", str(args.steps), "--warmup", str(args.warmup)]))
        results.append(res)
        err = res["memory_estimate_error"]
        peak = res["peak_memory"]["peak_bytes"]
        rows.append([case, f"{res['step_time_s_median'] * 1e3:.2f}", f"{res['samples_per_s']:.1f}",
                     f"{res['tokens_per_s']:.0f}" if res["tokens_per_s"] else "",
                     "n/a" if peak is None else f"{peak / 2**20:.1f}",
                     f"{res['estimate']['memory']['total_bytes'] / 2**20:.1f}",
                     "n/a" if err is None else f"{err * 100:+.1f}%"])
    print(tabulate(rows, headers=["case", "step ms (median)", "samples/s", "tokens/s", "peak MiB",
                                  "estimate MiB", "estimate error"]))
    with open(args.out, "w") as fh:
        json.dump({"device": args.device, "dtype": args.dtype, "torch": torch.__version__,
                   "python": platform.python_version(), "warmup": args.warmup, "steps": args.steps,
                   "results": results}, fh, indent=2, default=str)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
