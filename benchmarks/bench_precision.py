"""Overhead of the precision comparison on a training step: plain vs naive shadow vs ours.

Measures, side by side in one run and on the same workload (default: hal.models gpt
``gpt2-small`` shapes, batch 1 x 128 tokens, float32, 2 CPU threads):

* ``plain``: ``forward -> loss -> backward -> optimizer step``;
* ``naive shadow``: the same step with every op re-run in float64 on its full inputs and
  compared in full (no upcast cache, no sampling);
* ``shadow + stats``: the tool's target pass: float64 shadows with the upcast cache, fused
  one-pass statistics and sampled giant outputs (``max_elements`` per tensor);
* ``dispatch mode only``: the step under a pass-through ``TorchDispatchMode`` (each op called, nothing
  else): the floor any per-op interceptor in Python pays, shadow or not;
* ``float64 reference step`` (plain, and traced keeping the per-op samples): the reference
  side, reported for context; a full comparison step costs ours + the traced reference.

Variants run interleaved, round by round (1 warm-up round, ``--repeats`` timed rounds, median),
so background load affects them alike. Goal: shadow + stats <= 4x plain.

``--device cuda`` (the GPU machine): the workload is built there and each step ends with a
synchronisation; the tool's pass runs twice, its float64 shadows and statistics on the device (the
default where the backend computes float64) and on the CPU (``HAL_PRECISION_SHADOW_DEVICE=cpu``); the naive and the
float64 reference variants are CPU-only (the reference run is always on the CPU) and are left out.
Prints a tabulate table and writes JSON (``--out``, default out/bench_precision.json).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _step(w, batch, tracer=None) -> float:
    """One timed training step, optionally inside ``tracer`` (a dispatch mode), synchronised."""
    w.optimizer.zero_grad(set_to_none=True)
    _sync()
    t0 = time.perf_counter()
    if tracer is None:
        loss = w.forward_loss(batch)
        loss.backward()
    else:
        with tracer:
            loss = w.forward_loss(batch)
            loss.backward()
    w.optimizer.step()
    _sync()
    return time.perf_counter() - t0


class _PassThrough(TorchDispatchMode):
    """A dispatch mode that only calls each op: what one Python call per op costs, before any shadow."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _shadow_on(where: str, make):
    """``make`` with the float64 shadows' home forced to ``where`` ("device" | "cpu") for the tracer."""
    from hal.conformance.precision import shadow

    def made():
        os.environ[shadow.ENV_SHADOW_DEVICE] = where
        shadow._HOMES.clear()
        return make()
    return made


def _diagnose(ours, plain, device: str, top: int = 25) -> dict:
    """Where one shadowed step's time goes: a cProfile of it (the ``top`` functions by own time) and
    torch.profiler counts of the aten ops and device kernels it runs, beside a plain step's. Printed and
    returned (JSON-ready)."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity, profile

    from hal.conformance.profiling.attribution import device_event_times

    prof = cProfile.Profile()
    prof.enable()
    ours()
    prof.disable()
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(top)
    print(buf.getvalue())
    stats = st.stats  # {(file, line, func): (cc, nc, tottime, cumtime, callers)}
    functions = sorted(({"function": f"{os.path.basename(k[0])}:{k[1]}({k[2]})", "calls": v[1],
                         "tottime_ms": v[2] * 1e3, "cumtime_ms": v[3] * 1e3} for k, v in stats.items()),
                       key=lambda r: -r["tottime_ms"])[:top]
    counts = {}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    for label, fn in (("plain", plain), ("ours", ours)):
        with profile(activities=activities) as p:
            fn()
        aten = [e for e in p.key_averages() if e.key.startswith("aten::")]
        by_name = device_event_times(p.events())  # kernels, memcpy, memset
        kernels = by_name.values()
        counts[label] = {
            "aten_calls": sum(e.count for e in aten),
            "device_kernels": sum(r["count"] for r in kernels),
            "device_time_ms": sum(r["us"] for r in kernels) / 1e3,
            "top_aten": [{"op": e.key, "calls": e.count} for e in sorted(aten, key=lambda e: -e.count)[:15]],
            "top_kernels": [{"kernel": k[:120], "calls": r["count"], "device_ms": r["us"] / 1e3}
                            for k, r in sorted(by_name.items(), key=lambda kv: -kv[1]["us"])[:12]],
        }
        print(f"{label}: {counts[label]['aten_calls']} aten calls, {counts[label]['device_kernels']} device kernels, "
              f"{counts[label]['device_time_ms']:.2f} ms device time; top kernels:")
        for r in counts[label]["top_kernels"]:
            print(f"  {r['device_ms']:8.3f} ms {r['calls']:5d}x {r['kernel'][:100]}")
    return {"cprofile_top": functions, "profiler": counts}


def _program_bench(script: str, rest: list) -> int:
    """``--script PATH [bench_program_sections options] [-- script args]``: the program-target benchmark
    (benchmarks/bench_program_sections.py, beside this script: ``python benchmarks/x.py`` puts this folder first
    on sys.path)."""
    import bench_program_sections
    return bench_program_sections.main(["--script", script, *rest])


def main(argv=None) -> int:
    from tabulate import tabulate

    from hal.conformance.precision.compare import to_reference
    from hal.conformance.precision.tracer import StepTracer, Widen64Mode
    from hal.models import get_workload

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt")
    p.add_argument("--config", default="gpt2-small")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda (see the module docstring)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-elements", type=int, default=1 << 15)
    p.add_argument("--skip-naive", action="store_true", help="skip the (slow) naive shadow")
    p.add_argument("--no-cpu-shadows", action="store_true",
                   help="on a device, leave out the variant with the float64 shadows on the CPU (slow at large steps)")
    p.add_argument("--out", default="out/bench_precision.json")
    p.add_argument("--diagnose", action="store_true",
                   help="after the timed rounds, one more step of each 'ours' variant under cProfile and one under "
                        "torch.profiler: where its host time goes and how many ops and kernels it runs (printed, and "
                        "in the JSON's results.diagnoses)")
    p.add_argument("--script", metavar="PATH", help="measure a program target instead (a script run unchanged): "
                   "delegates to benchmarks/bench_program_sections.py (precision window and profile ratios)")
    args, rest = p.parse_known_args(argv)
    if args.script:
        return _program_bench(args.script, rest)
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    torch.set_num_threads(args.threads)
    overrides = {"batch_size": args.batch_size}
    if args.model in ("gpt", "moe"):
        overrides["seq_len"] = args.seq_len
    w = get_workload(args.model, config=args.config, **overrides).build(args.device, torch.float32, seed=0)
    batch = w.example_batch()
    n_params = sum(p.numel() for p in w.model.parameters())

    variants = {
        "plain": lambda: None,
        "dispatch mode only (pass-through: the floor of any per-op interceptor)": _PassThrough,
        "naive shadow (full, no cache)": lambda: StepTracer(w.model, "target", shadow=True, sample=False,
                                                            cache_bytes=0, record_module_outputs=False),
        "shadow + stats (ours)": lambda: StepTracer(w.model, "target", shadow=True, sample=True,
                                                    max_elements=args.max_elements, record_module_outputs=True),
    }
    if args.skip_naive or args.device != "cpu":
        del variants["naive shadow (full, no cache)"]
    if args.device != "cpu":  # the default home is the device (it computes float64); the CPU beside it
        ours = variants.pop("shadow + stats (ours)")
        variants["shadow + stats (ours)"] = _shadow_on("device", ours)
        if not args.no_cpu_shadows:
            variants["shadow + stats (ours, float64 on the CPU)"] = _shadow_on("cpu", ours)
    import copy

    from hal.conformance.precision.compare import widen_optimizer_state
    variants = [(name, w, batch, make) for name, make in variants.items()]
    if args.device == "cpu":
        ref = copy.deepcopy(w)
        ref.model.to(torch.float64)
        widen_optimizer_state(ref.optimizer)
        rb = to_reference(batch)
        variants += [("float64 reference step", ref, rb, Widen64Mode),
                     ("float64 reference step, traced (samples kept)", ref, rb,
                      lambda: StepTracer(ref.model, "reference", max_elements=args.max_elements))]
    # interleaved rounds (round 0 is the warm-up): background load hits every variant alike
    times = {name: [] for name, *_ in variants}
    parts = {name: [] for name, *_ in variants}  # a tracer's end-of-step work: (shadows ms, statistics ms)
    for i in range(args.repeats + 1):
        for name, wl, b, make in variants:
            tracer = make()
            t = _step(wl, b, tracer)
            if i:
                times[name].append(t)
                if getattr(tracer, "do_shadow", False):
                    parts[name].append((tracer.shadow_ms, tracer.statistics_ms))
    base = statistics.median(times["plain"])
    base_min = min(times["plain"])
    rows, result = [], {}
    for name, runs in times.items():
        med = statistics.median(runs)
        rows.append([name, f"{med:.3f}", f"{med / base:.2f}x", f"{min(runs):.3f}", f"{min(runs) / base_min:.2f}x",
                     " ".join(f"{r:.3f}" for r in runs)])
        result[name] = {"median_s": med, "ratio_to_plain": med / base, "min_s": min(runs),
                        "min_ratio_to_plain": min(runs) / base_min, "runs_s": runs}
        if parts[name]:  # of the step's time: the deferred float64 shadows and the statistics, at its end
            result[name]["end_of_step_ms"] = {"shadows": statistics.median(p[0] for p in parts[name]),
                                              "statistics": statistics.median(p[1] for p in parts[name])}
            rows[-1][0] += " [end of step: shadows {shadows:.1f} ms, statistics {statistics:.1f} ms]".format(
                **result[name]["end_of_step_ms"])
    print(f"{args.model}:{args.config} batch {args.batch_size}"
          + (f" x {args.seq_len} tokens" if args.model in ("gpt", "moe") else "")
          + f", {n_params / 1e6:.1f}M parameters, float32 on {args.device}, {args.threads} CPU threads, "
          f"median of {args.repeats}, max_elements {args.max_elements}")
    print(tabulate(rows, headers=["variant", "median s", "vs plain", "min s", "min vs plain", "runs s"], tablefmt="github"))
    ref_key = "float64 reference step, traced (samples kept)"
    if ref_key in result:
        full = result["shadow + stats (ours)"]["median_s"] + result[ref_key]["median_s"]
        full_min = result["shadow + stats (ours)"]["min_s"] + result[ref_key]["min_s"]
        result["full comparison step (ours + traced reference)"] = {
            "median_s": full, "ratio_to_plain": full / base, "min_s": full_min, "min_ratio_to_plain": full_min / base_min}
        print(f"full comparison step (ours + traced reference): median {full:.3f} s ({full / base:.2f}x), "
              f"min {full_min:.3f} s ({full_min / base_min:.2f}x)")
    ours = result["shadow + stats (ours)"]["ratio_to_plain"]
    ours_min = result["shadow + stats (ours)"]["min_ratio_to_plain"]
    print(f"goal: shadow + stats <= 4x plain -> median {ours:.2f}x, min {ours_min:.2f}x "
          f"({'met' if max(ours, ours_min) <= 4 else 'NOT met'}); on a shared machine the min is the "
          "better estimate of uncontended cost")
    if args.diagnose:  # every variant of ours: the default home, and on a device the CPU beside it
        for name, wl, b, make in variants:
            if name.startswith("shadow + stats (ours"):
                print(f"diagnosis: {name}")
                result.setdefault("diagnoses", {})[name] = _diagnose(
                    functools.partial(lambda w_, b_, m_: _step(w_, b_, m_()), wl, b, make),
                    functools.partial(_step, wl, b, None), args.device)
    doc = {"benchmark": "precision_overhead", "model": args.model, "config": args.config, "device": args.device,
           "batch_size": args.batch_size, "seq_len": args.seq_len, "threads": args.threads,
           "repeats": args.repeats, "max_elements": args.max_elements, "parameters": n_params,
           "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
           "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
           "results": result, "goal_ratio": 4.0, "goal_met": max(ours, ours_min) <= 4.0}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
