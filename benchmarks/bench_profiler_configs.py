"""Where torch.profiler's per-step overhead comes from, on the script fixture's training step (issue 17).

The profile section times its profiled steps under torch.profiler with the CPU activity and the
backend's device activity (no shapes, stacks or memory). On a GPU step of ~1000 small kernels that
doubled the step (1.78x on the H200). This measures, side by side in one process, the same training
step (the CUDA autocast TransformerEncoder fixture: autocast float16, GradScaler, AdamW) plain and
under each activity set, to say which part costs what before any redesign:

* ``plain``: no profiler;
* ``cpu+device``: the CPU and device activities; ``device``: the device activity alone (kernels and
  runtime calls, no operator events: what the audit's timed steps record); ``cpu``: operator events alone;
* ``device, no external correlation``: as ``device``, with Kineto's external correlation (the op ids pushed
  around every launch, for linking kernels to ops) off (``_ExperimentalConfig(disable_external_correlation=True)``,
  torch >= 2.5; absent where torch lacks it).

Method: variants interleaved round by round (``--rounds``), each round ``--steps`` steps of each
variant after one untimed warm-up step per profiler session; a step is timed on the host clock
between two synchronisations (as the audit's step boundaries are); the figure is the median step.
Prints a table and writes JSON (``--out``, default out/bench_profiler_configs.json).

    python benchmarks/bench_profiler_configs.py --device cuda     # on the GPU machine
    python benchmarks/bench_profiler_configs.py --device cpu      # a dry run anywhere
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "tests", "fixtures", "precision"))


def _lean_config():
    """``_ExperimentalConfig(disable_external_correlation=True)``, or None where this torch lacks the field."""
    try:
        from torch._C._profiler import _ExperimentalConfig
        return _ExperimentalConfig(disable_external_correlation=True)
    except (ImportError, TypeError):
        return None


def main(argv=None) -> int:
    from tabulate import tabulate
    from torch.profiler import ProfilerActivity, profile

    from cuda_autocast_train import Model  # the fixture the figures were measured on
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="out/bench_profiler_configs.json")
    a = p.parse_args(argv)
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    model = Model().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    scaler = torch.amp.GradScaler(dev.type, enabled=dev.type == "cuda")
    amp_dtype = torch.float16 if dev.type == "cuda" else torch.bfloat16

    def step():
        tokens = torch.randint(0, 512, (a.batch, a.seq), device=dev)
        with torch.autocast(dev.type, dtype=amp_dtype):
            loss = torch.nn.functional.cross_entropy(model(tokens).float().view(-1, 512), tokens.view(-1))
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    device_act = {"cuda": ProfilerActivity.CUDA}.get(dev.type)
    variants = {"plain": None, "cpu+device": [ProfilerActivity.CPU] + ([device_act] if device_act else []),
                "cpu": [ProfilerActivity.CPU]}
    configs = {}  # variant -> its experimental_config
    if device_act:
        variants["device"] = [device_act]
        lean = _lean_config()
        if lean is not None:
            variants["device, no external correlation"] = [device_act]
            configs["device, no external correlation"] = lean

    def timed(n):
        out = []
        for _ in range(n):
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            out.append((time.perf_counter() - t0) * 1e3)
        return out

    for _ in range(3):
        step()
    times = {k: [] for k in variants}
    for _ in range(a.rounds):
        for name, acts in variants.items():
            if acts is None:
                times[name] += timed(a.steps)
                continue
            kw = {"experimental_config": configs[name]} if name in configs else {}
            with profile(activities=acts, **kw) as prof:
                step()  # the session's first step (its setup) is not timed
                times[name] += timed(a.steps)
            prof.key_averages()  # what the audit reads after the session
    base = statistics.median(times["plain"])
    table = [[k, f"{statistics.median(v):.3f}", f"{min(v):.3f}", f"{statistics.median(v) / base:.2f}"]
             for k, v in times.items()]
    print(tabulate(table, headers=["variant", "median step ms", "min ms", "x plain"], tablefmt="github"))
    doc = {"device": str(dev), "batch": a.batch, "seq": a.seq, "steps_per_round": a.steps, "rounds": a.rounds,
           "step_ms": {k: {"median": statistics.median(v), "min": min(v), "all": v} for k, v in times.items()},
           "ratio_vs_plain": {k: statistics.median(v) / base for k, v in times.items()},
           "environment": {"python": platform.python_version(), "torch": torch.__version__,
                           "platform": platform.platform(),
                           "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else None},
           "method": __doc__}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
