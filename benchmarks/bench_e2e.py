"""End-to-end training of gpt2-small through hal.ops vs torch eager vs torch.compile, one GPU.

Variants (each a fresh workload from the same seed, same batches): ``torch`` (the gpt workload with
``ops="torch"``, eager), ``hal`` (``ops="hal"``: norms, GELU, LM head + loss through ``hal.ops``;
the chunked linear_cross_entropy is registered for the device when the backend does not provide
one), ``compile`` (``ops="torch"`` with ``torch.compile(model)``; the loss stays outside), and with
``--hal-compile`` also ``hal+compile``, and with ``--vocab64`` ``torch-vocab64`` (torch eager with the
vocabulary padded to a multiple of 64 by hand, as nanoGPT does: the strongest plain-torch baseline for an
odd vocabulary; ``speedup_vs_torch_vocab64``). A step is forward + loss + backward + AdamW step +
zero_grad; batches are made before timing. Step time: CUDA events around each step, no
synchronisation between steps (so steady-state pipelining counts), median over ``--steps`` after
``--warmup`` steps (host timers on the CPU). Loss curves: every step's loss (warm-up included),
compared with torch's (max abs and max relative difference). Peak memory:
``max_memory_allocated`` over the measured steps.

Writes ``--json`` with ``{"speedup_vs_torch": torch_ms / hal_ms, "speedup_vs_compile":
compile_ms / hal_ms, "steps", "warmup", "median_ms": {...}, "loss_curves": {...},
"loss_max_abs_diff": {...}, "loss_max_rel_diff", "peak_mib": {...}, "environment"}`` and prints a table; ``--breakdown`` adds ``"breakdown": {variant:
{"device_ms", "kernels", "categories_ms", "top_kernels"}}`` from one profiled step per variant, taken after
every variant's timed steps (a profiler session slows the host-bound steps timed after it);
``"host_ms": {variant: {"per_step", "median", "waited"}}`` is the host time of ``--host-steps`` more steps
enqueued while the GPU is held busy (:func:`host_ms`: a host-bound step's time is this, not its kernels');
``"launches": {variant: {kernel: {"direct", "via_triton"}}}`` counts the Triton kernels' launches
(:mod:`hal.backends.cuda.kernels.launcher`).

Usage:  python benchmarks/bench_e2e.py --json e2e.json [--config gpt2-small --dtype bfloat16 --steps 20]
        python benchmarks/bench_e2e.py --device cpu --config tiny --dtype float32 --steps 3   (dry run)
Exit status: 0 ok, 2 no CUDA device (one line on stderr).
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from typing import Optional

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(variant: str, args: argparse.Namespace, device: torch.device):
    """The workload of one variant, built on ``device`` from ``args.seed``."""
    from hal.models import get_workload
    hal_ops = variant.startswith("hal")
    overrides = {"ops": "hal"} if hal_ops else {}
    if variant == "torch-vocab64":  # nanoGPT's hand fix: more (never-target) classes, so cuBLAS gets aligned shapes
        vocab = get_workload("gpt", args.config).config.vocab_size
        overrides["vocab_size"] = -(-vocab // 64) * 64
    w = get_workload("gpt", args.config, **overrides)
    w.build(device, args.dtype, args.seed)
    if variant == "compile":
        w.model = torch.compile(w.model)
    elif variant == "hal+compile":  # the hal loss calls model.features (the head + loss stay hal's fused op)
        w.model.features = torch.compile(w.model.features)
    return w


def train(variant: str, args: argparse.Namespace, device: torch.device) -> dict:
    """Train one variant for ``warmup + steps`` steps; its times, losses and peak memory."""
    w = build(variant, args, device)
    n = args.warmup + args.steps
    batches = [w.example_batch(args.batch_size, index=i) for i in range(n)]
    losses, marks = [], []
    cuda = device.type == "cuda"
    t_first = time.perf_counter()
    for i, batch in enumerate(batches):
        if i == args.warmup:
            _sync(device)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        else:
            t0 = time.perf_counter()
        loss = w.backward(batch)
        w.optimizer_step()
        if cuda:
            e1.record()
            marks.append((e0, e1))
        else:
            marks.append(time.perf_counter() - t0)
        losses.append(loss)
        if i == 0:
            _sync(device)
            first_s = time.perf_counter() - t_first
    _sync(device)
    times = [(m[0].elapsed_time(m[1]) if cuda else m * 1e3) for m in marks][args.warmup:]
    host = host_ms(w, batches[-1], args.host_steps, device) if cuda and args.host_steps else None
    out = {"median_ms": statistics.median(times), "step_ms": times, "first_step_s": first_s, "host_ms": host,
           "losses": [float(x) for x in losses],
           "peak_mib": torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None}
    del w, batches, losses
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return out


def host_ms(w, batch, steps: int, device: torch.device) -> dict:
    """Host time of ``steps`` more training steps of ``w``, each enqueued on its own while the GPU is held busy
    (``torch.cuda._sleep`` for longer than a step takes to enqueue, then a synchronisation before the next: more
    than one step's kernels would fill the launch queue and block the host), so no step waits for the device:
    ``{"per_step", "median", "waited"}`` in ms. A step that synchronises with the device waits for the sleep and
    shows it (``waited``: a step's host time exceeded half the sleep). Tells a host-bound step (host time above
    the device time) from a device-bound one."""
    from bench_kernels import sleep_cycles_per_s  # this folder is sys.path[0] as a script
    _sync(device)
    cycles_per_ms = sleep_cycles_per_s(device) / 1e3
    sleep_ms = 300.0  # far above any step's host time
    per = []
    for _ in range(steps):
        torch.cuda._sleep(int(cycles_per_ms * sleep_ms))
        t0 = time.perf_counter()
        w.backward(batch)
        w.optimizer_step()
        per.append((time.perf_counter() - t0) * 1e3)
        _sync(device)
    return {"per_step": per, "median": statistics.median(per), "waited": any(p > sleep_ms / 2 for p in per)}


#: kernel-name patterns (first match wins) for :func:`breakdown`'s categories
_CATEGORIES = (("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "sm80_")),
               ("attention", ("flash", "fmha", "attention", "sdpa")),
               ("optimizer", ("multi_tensor", "adam", "foreach")),
               ("norm", ("layer_norm", "layernorm", "rms_norm", "rmsnorm", "norm_")),
               ("loss / softmax", ("softmax", "cross_entropy", "nll", "_ce_", "ce_forward", "ce_backward")),
               ("gelu / activation", ("gelu", "silu", "swiglu")),
               ("reduction", ("reduce",)),
               ("copy / cast", ("copy", "memcpy", "memset", "cat", "fill")),
               ("elementwise", ("elementwise", "vectorized", "unrolled", "pointwise")),
               ("embedding", ("embedding", "index", "scatter", "gather")))


def breakdown(variant: str, args: argparse.Namespace, device: torch.device, top: int = 25) -> Optional[dict]:
    """One training step of a fresh workload of ``variant`` (after two warm-up steps) under torch.profiler (the
    device activity only): its kernels' device time by category (:data:`_CATEGORIES`, by kernel name) and the
    ``top`` kernels. None off CUDA. :func:`run` profiles only after every variant's timed steps: a profiler
    session leaves the CUDA activity tracing loaded in the process, which slowed later host-bound steps
    (gpt2-small through hal.ops: 29-30 ms a step timed after a profiled step, 20.4-22.4 without)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    from hal.conformance.profiling.attribution import device_event_times
    w = build(variant, args, device)
    batch = w.example_batch(args.batch_size, index=0)
    for _ in range(2):
        w.backward(batch)
        w.optimizer_step()
    _sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        w.backward(batch)
        w.optimizer_step()
        _sync(device)
    kernels = device_event_times(prof.events())  # {name: {"count", "us"}}
    cats: dict = {}
    for name, row in kernels.items():
        low = name.lower()
        cat = next((c for c, pats in _CATEGORIES if any(p in low for p in pats)), "other")
        cats[cat] = cats.get(cat, 0.0) + row["us"] / 1e3
    rows = sorted(kernels.items(), key=lambda kv: -kv[1]["us"])[:top]
    return {"device_ms": sum(r["us"] for r in kernels.values()) / 1e3,
            "kernels": sum(r["count"] for r in kernels.values()),
            "categories_ms": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
            "top_kernels": [{"kernel": n[:160], "calls": r["count"], "ms": r["us"] / 1e3} for n, r in rows]}


def compare(curve: list[float], ref: list[float]) -> tuple[float, float]:
    """(max abs diff, max relative diff) of two loss curves."""
    diffs = [abs(a - b) for a, b in zip(curve, ref)]
    rels = [d / max(abs(b), 1e-12) for d, b in zip(diffs, ref)]
    return max(diffs), max(rels)


def run(args: argparse.Namespace, device: torch.device) -> dict:
    """All variants; the result document (see the module docstring)."""
    variants = ["torch", "hal"] + ([] if args.no_compile else ["compile"]) + (["hal+compile"] if args.hal_compile else [])
    variants += ["torch-vocab64"] if args.vocab64 else []
    from bench_kernels import ensure_linear_cross_entropy, environment  # this folder is sys.path[0] as a script

    from hal.backends.cuda.kernels.launcher import launch_counts  # imports no Triton (counts stay 0 without it)
    head = ensure_linear_cross_entropy(device, torch.bfloat16 if args.dtype == "bfloat16" else torch.float32)
    res: dict = {"config": args.config, "dtype": args.dtype, "batch_size": args.batch_size, "steps": args.steps,
                 "warmup": args.warmup, "variants": variants, "hal_linear_cross_entropy_impl": head,
                 "timing": "CUDA events around each training step (fwd+loss+bwd+AdamW+zero_grad), no sync between "
                           "steps, median after warm-up" if device.type == "cuda" else "host perf_counter per step",
                 "median_ms": {}, "loss_curves": {}, "peak_mib": {}, "first_step_s": {}, "errors": {},
                 "environment": environment(device), "command": " ".join(sys.argv)}
    for v in variants:
        before = launch_counts()
        try:
            r = train(v, args, device)
        except Exception as exc:  # one variant failing (compile, say) must not lose the others
            res["errors"][v] = f"{type(exc).__name__}: {str(exc)[:500]}"
            print(f"{v}: {res['errors'][v]}", flush=True)
            continue
        res["median_ms"][v], res["loss_curves"][v] = r["median_ms"], r["losses"]
        res.setdefault("step_ms", {})[v] = r["step_ms"]
        res["peak_mib"][v], res["first_step_s"][v] = r["peak_mib"], r["first_step_s"]
        if r["host_ms"] is not None:
            res.setdefault("host_ms", {})[v] = r["host_ms"]
        launches = {k: {m: c[m] - before.get(k, {}).get(m, 0) for m in c} for k, c in launch_counts().items()}
        launches = {k: c for k, c in launches.items() if c["direct"] or c["via_triton"]}
        if launches:  # the Triton kernels' launches in this variant: directly, or through Triton
            res.setdefault("launches", {})[v] = launches
            print(f"{v:12s} Triton launches: " + ", ".join(f"{k} {c['direct']} direct / {c['via_triton']} via Triton"
                                                          for k, c in sorted(launches.items())), flush=True)
        print(f"{v:12s} median {r['median_ms']:.2f} ms/step  peak {r['peak_mib']} MiB  "
              f"loss {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}"
              + (f"  host {r['host_ms']['median']:.2f} ms/step" + (" (a step waited for the device)"
                                                                  if r["host_ms"]["waited"] else "")
                 if r["host_ms"] else ""), flush=True)
        summarise(res)
        res["complete"] = v == variants[-1]
        if args.json:  # rewritten after every variant, so a time limit keeps what finished
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1, default=str)
    for v in variants if args.breakdown else ():  # after every timed step (see breakdown)
        try:
            b = breakdown(v, args, device)
        except Exception as exc:
            res["errors"][f"{v} breakdown"] = f"{type(exc).__name__}: {str(exc)[:500]}"
            continue
        if b is None:
            continue
        res.setdefault("breakdown", {})[v] = b
        print(f"{v:12s} one profiled step: {b['device_ms']:.2f} ms device time, {b['kernels']} kernels: "
              + ", ".join(f"{c} {ms:.2f}" for c, ms in b["categories_ms"].items()), flush=True)
        gc.collect()
        torch.cuda.empty_cache()
    if args.json and args.breakdown:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return summarise(res)


def summarise(res: dict) -> dict:
    """Fill the speedups and loss-curve differences from what has run so far; returns ``res``."""
    ms = res["median_ms"]
    res["speedup_vs_torch"] = ms["torch"] / ms["hal"] if "torch" in ms and "hal" in ms else None
    res["speedup_vs_compile"] = ms["compile"] / ms["hal"] if "compile" in ms and "hal" in ms else None
    res["speedup_vs_torch_vocab64"] = ms["torch-vocab64"] / ms["hal"] if "torch-vocab64" in ms and "hal" in ms else None
    ref = res["loss_curves"].get("torch")
    res["loss_max_abs_diff"], rel = {}, {}
    for v, curve in res["loss_curves"].items():
        if ref is not None and v not in ("torch", "torch-vocab64"):  # vocab64 trains another model (more classes)
            res["loss_max_abs_diff"][v], rel[v] = compare(curve, ref)
    res["loss_max_rel_diff_by_variant"] = rel
    res["loss_max_rel_diff"] = rel.get("hal")
    return res


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the results here")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--config", default="gpt2-small")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--hal-compile", action="store_true", help="also torch.compile the hal model")
    p.add_argument("--vocab64", action="store_true",
                   help="also torch eager with the vocabulary padded to a multiple of 64 (nanoGPT's 50304: a "
                        "slightly larger model, aligned matmuls; its loss curve is not compared)")
    p.add_argument("--host-steps", type=int, default=5,
                   help="CUDA: after the timed steps, this many more enqueued with the GPU held busy: the host time "
                        "of a step (0: skip)")
    p.add_argument("--breakdown", action="store_true",
                   help="after the timed steps, one profiled step per variant: kernel device time by category")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_e2e: no CUDA device (torch.cuda.is_available() is False); use --device cpu for a dry run",
              file=sys.stderr)
        return 2
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    res = run(args, device)
    res["complete"] = True
    from tabulate import tabulate
    print(tabulate([[v, f"{res['median_ms'][v]:.2f}", res["peak_mib"].get(v),
                     f"{res['loss_curves'][v][-1]:.4f}", res["loss_max_abs_diff"].get(v, "")]
                    for v in res["median_ms"]],
                   headers=["variant", "median ms/step", "peak MiB", "final loss", "max |dloss| vs torch"]))
    print(f"speedup_vs_torch {res['speedup_vs_torch']}  speedup_vs_compile {res['speedup_vs_compile']}  "
          f"loss_max_rel_diff {res['loss_max_rel_diff']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
