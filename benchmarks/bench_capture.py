"""Overhead of the runtime audit: op capture + support audit vs. the plain training step.

Side by side in one process, interleaved (plain, captured, plain, captured, ...) so that machine
load affects both alike: a gpt2-small-shaped training step (hal.models ``gpt`` config
``gpt2-small``: 12 layers, 12 heads, 768 wide, 50257 vocab; batch and sequence length are options
because one full 8x1024 step takes about a minute on 2 cores) on ``--threads`` CPU threads (2).

- ``plain``: ``train_step`` (forward, backward, AdamW);
- ``capture+audit``: the same step under the audit's op capture (dispatch mode, module tracker,
  step hooks), then the support audit of what was captured (capability query for MLU, cost per
  step) — the work ``hal-audit`` adds per step, plus the one-off audit, charged to every step;
  wall and CPU time (``process_time``, all threads) are both reported: on a shared box the CPU
  ratio is the steadier one;
- ``capture+audit+redirect``: also the CUDA-redirect TorchFunctionMode the audit of a CUDA script adds.

Then the wall time of whole ``hal-audit gpt --device mlu`` CLI runs (tiny gpt), as a subprocess.
Median of ``--repeats`` after ``--warmup``; prints a table (tabulate), writes JSON (``--out``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from tabulate import tabulate


def _captured_step(w, batch, redirect: bool) -> dict:
    from hal.conformance.runtime.capture import ModuleTracker, OpCapture
    from hal.conformance.runtime.predict import build_ops
    from hal.conformance.runtime.stepping import StepLimiter
    modules = ModuleTracker()
    cap = OpCapture(modules)
    limiter = StepLimiter(None, cap)
    modules.on_top_level_forward = limiter.before_top_level_forward
    red = None
    modules.install()
    limiter.install()
    try:
        if redirect:
            from hal.conformance.runtime.redirect import DeviceRedirect
            red = DeviceRedirect("cpu")
            red.install()
        with cap:
            w.train_step(batch)
    finally:
        if red is not None:
            red.remove()
        modules.remove()
        limiter.remove()
    ops = build_ops(cap.records(), "mlu", steps=1)
    return {"ops": len(ops), "calls": sum(o["count"] for o in ops),
            "fallback": sum(o["status"] == "fallback" for o in ops)}


def bench_step(args) -> tuple[list, dict]:
    from hal.models import get_workload
    torch.set_num_threads(args.threads)
    w = get_workload("gpt", config=args.config, batch_size=args.batch, seq_len=args.seq)
    w.build("cpu", torch.float32, seed=0)
    batch = w.example_batch()
    modes = {"plain": lambda: w.train_step(batch),
             "capture+audit": lambda: _captured_step(w, batch, redirect=False),
             "capture+audit+redirect": lambda: _captured_step(w, batch, redirect=True)}
    for _ in range(args.warmup):
        for fn in modes.values():
            fn()
    times: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    info = {}
    for _ in range(args.repeats):
        for name, fn in modes.items():
            c0, t0 = time.process_time(), time.perf_counter()
            out = fn()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            if isinstance(out, dict):
                info = out
    base, base_cpu = statistics.median(times["plain"]), statistics.median(cpu["plain"])
    rows = [{"mode": m, "median_s": round(statistics.median(t), 4), "min_s": round(min(t), 4),
             "ratio_vs_plain": round(statistics.median(t) / base, 3),
             "min_ratio_vs_plain": round(min(t) / min(times["plain"]), 3),
             "cpu_median_s": round(statistics.median(cpu[m]), 4),
             "cpu_ratio_vs_plain": round(statistics.median(cpu[m]) / base_cpu, 3), "repeats": len(t)}
            for m, t in times.items()]
    return rows, {"params": w.parameter_count(), **info}


def bench_cli(args) -> dict:
    exe = shutil.which("hal-audit") or os.path.join(os.path.dirname(sys.executable), "hal-audit")
    if not os.path.exists(exe):
        return {"skipped": "hal-audit console script not installed"}
    walls, cpus, codes = [], [], []
    for _ in range(args.cli_repeats):
        with tempfile.TemporaryDirectory() as out:
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            proc = subprocess.run([exe, "gpt", "--device", "mlu", "--out", out, "--format", "json"],
                                  capture_output=True, text=True, timeout=300)
            walls.append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append((r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime))
            codes.append(proc.returncode)
            report = None
            path = os.path.join(out, "audit.json")
            if os.path.exists(path):
                with open(path) as f:
                    report = json.load(f)
    summary = {"command": "hal-audit gpt --device mlu --out TMP --format json", "exit_codes": codes,
               "median_s": round(statistics.median(walls), 3), "runs_s": [round(x, 3) for x in walls],
               "cpu_median_s": round(statistics.median(cpus), 3), "load_avg_1m": round(os.getloadavg()[0], 2)}
    if report:
        summary.update(run_status=report.get("run", {}).get("status"), ops=len(report.get("ops", [])),
                       run_seconds=report.get("run", {}).get("seconds"))
    if proc.returncode not in (0, 1):
        summary["stderr_tail"] = proc.stderr[-500:]
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="gpt2-small")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cli-repeats", type=int, default=3)
    p.add_argument("--skip-cli", action="store_true")
    p.add_argument("--out", default="out/bench_capture.json")
    args = p.parse_args(argv)
    rows, info = bench_step(args)
    print(f"gpt {args.config} ({info['params']/1e6:.1f}M params) training step, batch {args.batch} x seq "
          f"{args.seq}, {args.threads} CPU threads; {info['calls']} op calls, {info['ops']} op rows, "
          f"{info['fallback']} predicted MLU fallbacks")
    print(tabulate(rows, headers="keys"))
    cli = {"skipped": "--skip-cli"} if args.skip_cli else bench_cli(args)
    print("\nwhole CLI run:", json.dumps(cli))
    result = {"benchmark": "bench_capture", "step": rows, "step_info": info, "cli": cli,
              "settings": vars(args), "timing": "time.perf_counter (wall) and time.process_time (CPU, all threads), interleaved modes, median",
              "load_avg_1m": round(os.getloadavg()[0], 2),
              "environment": {"python": platform.python_version(), "torch": torch.__version__,
                              "platform": platform.platform(), "cpu_count": os.cpu_count()}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
