"""``python -m hal.models.run``: train or serve one reference workload on one device and report.

    python -m hal.models.run --model gpt --config tiny --device cpu --dtype float32 \\
        --mode train --steps 10 --out results.json [--ops hal]

Prints a table (tabulate): median step time after ``--warmup`` steps, samples/s and tokens/s,
measured peak memory of one step (:mod:`hal.models.measure`), the estimate
(:mod:`hal.models.estimate`) and its relative error. ``--save``/``--resume`` write and read a
checkpoint (any backend to any backend). ``--ops hal`` runs the model's norms, activations and
LM head + loss through ``hal.ops`` (config field ``ops``; workloads with that field only, gpt and
moe); the default ``torch`` uses torch's modules. Exit codes: 0 ok, 2 bad input (one line on stderr),
4 internal error (see :mod:`hal.commandline`).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Any, Optional

import torch

from hal.commandline import CliError, emit, run_cli


def parse(argv: Optional[list[str]] = None) -> argparse.Namespace:
    from hal.models import workload_arg
    p = argparse.ArgumentParser(prog="python -m hal.models.run", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, type=workload_arg,
                   help="gpt, cnn, moe or hf:<arch> (hal.models.hf.HF_NAMES)")
    p.add_argument("--config", default="tiny")
    p.add_argument("--device", default="cpu", help="HAL backend / torch device name (cpu, <type>:<index>)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "float64"))
    p.add_argument("--mode", default="train", choices=("train", "infer"))
    p.add_argument("--steps", type=int, default=10, help="measured steps (after warm-up)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ops", default="torch", choices=("torch", "hal"),
                   help="torch: torch's modules (default); hal: norms, activations, LM head + loss through hal.ops")
    p.add_argument("--save", default=None, help="write a checkpoint after the run")
    p.add_argument("--resume", default=None, help="load a checkpoint before the run")
    p.add_argument("--out", default=None, help="write the results as JSON")
    return p.parse_args(argv)


def _fmt_bytes(n: Optional[int]) -> str:
    return "n/a" if n is None else f"{n / 2**20:.1f} MiB"


def run(args: argparse.Namespace) -> dict:
    """Run the workload as ``args`` say; returns the results dict (also written to ``--out``)."""
    from hal.models import get_workload
    from hal.models.measure import measure_peak
    if args.steps < 1 or args.warmup < 0:
        raise CliError("--steps must be >= 1 and --warmup >= 0")
    try:
        w = get_workload(args.model, args.config, **({"ops": args.ops} if args.ops != "torch" else {}))
        w.build(args.device, args.dtype, args.seed)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.resume:
        try:
            w.resume(args.resume)
        except (OSError, ValueError, RuntimeError) as exc:
            raise CliError(f"cannot resume from {args.resume}: {exc}") from None
    bs = args.batch_size or w.config.batch_size
    batch = w.example_batch(bs, index=w.step)

    if args.mode == "train":
        def one(i: int) -> Any:
            return w.train_step(w.example_batch(bs, index=w.step))
    else:
        def one(i: int) -> Any:
            return w.infer(batch)
    losses, times = [], []
    for i in range(args.warmup + args.steps):
        w.synchronize()
        t0 = time.perf_counter()
        out = one(i)
        w.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
        if args.mode == "train":
            losses.append(out)
    live = [w.model, w.optimizer, batch]
    measured = measure_peak(lambda: one(-1), w.device, w.backend, live)
    est = w.estimates(batch_size=bs, mode=args.mode)
    peak, total = measured["peak_bytes"], est["memory"]["total_bytes"]
    step_s = statistics.median(times)
    tokens = bs * (w.config.seq_len if args.mode == "train" else w.config.gen_tokens) \
        if args.model in ("gpt", "moe") else 0
    res = {
        "workload": w.name, "config": args.config, "device": str(w.device), "dtype": args.dtype,
        "mode": args.mode, "ops": args.ops, "batch_size": bs, "warmup": args.warmup, "steps": args.steps,
        "step_time_s_median": step_s, "step_times_s": times,
        "samples_per_s": bs / step_s, "tokens_per_s": (tokens / step_s) if tokens else None,
        "tflops_per_s": est["flops_per_step"] / step_s / 1e12,
        "losses": losses, "final_step": w.step,
        "peak_memory": measured, "estimate": est,
        "memory_estimate_error": (total - peak) / peak if peak else None,
        "timing": "host perf_counter around each step with device synchronize before and after",
        "environment": {"torch": torch.__version__, "python": platform.python_version(),
                        "backend": w.backend.name if w.backend else None, "backend_reason": w.backend_reason},
    }
    if args.save:
        w.save(args.save)
        res["checkpoint"] = args.save
    return res


def table(res: dict) -> str:
    from tabulate import tabulate
    rows = [["workload", f"{res['workload']}:{res['config']} ({res['mode']})"],
            ["device / dtype", f"{res['device']} / {res['dtype']}"],
            ["step time (median)", f"{res['step_time_s_median'] * 1e3:.2f} ms"],
            ["samples/s", f"{res['samples_per_s']:.1f}"]]
    if res["tokens_per_s"]:
        rows.append(["tokens/s", f"{res['tokens_per_s']:.0f}"])
    rows += [["TFLOP/s (estimated FLOPs)", f"{res['tflops_per_s']:.3f}"],
             ["peak memory (measured)", _fmt_bytes(res["peak_memory"]["peak_bytes"])],
             ["memory estimate", _fmt_bytes(res["estimate"]["memory"]["total_bytes"])
              + (" (lower bound)" if res["estimate"]["memory"]["lower_bound"] else "")],
             ["estimate error", "n/a" if res["memory_estimate_error"] is None
              else f"{res['memory_estimate_error'] * 100:+.1f}%"]]
    if res["losses"]:
        rows.append(["loss first -> last", f"{res['losses'][0]:.4f} -> {res['losses'][-1]:.4f}"])
    return tabulate(rows, tablefmt="simple")


def handle(args: argparse.Namespace) -> int:
    res = run(args)
    emit(table(res))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=2, default=str)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    return run_cli(lambda: parse(argv), handle, "hal.models.run")


if __name__ == "__main__":
    raise SystemExit(main())
