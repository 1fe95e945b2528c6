"""Dispatch overhead of hal.ops against calling torch directly, side by side in one process.

Two sections, each row a pair of callables timed in interleaved rounds (so drift affects both alike):

- ``plain``: ``hal.ops`` dispatch to torch's own function (issue 2's goal: hal.ops.softmax adds at most
  1 us per call over torch.softmax on a 64-element CPU tensor, 1.5 us at the very most).
- ``wrappers``: ``hal.ops.<op>`` with the CUDA backend's self-checking kernel wrappers registered
  (``backends/cuda/kernels``) at small shapes, which the routing table sends to torch's kernel: the dispatcher
  takes the wrappers' size route (``hal.ops.SIZE_ROUTE``) and calls the op's torch reference itself (issue 23's
  goal: no row below 0.97x torch). With ``--device cpu`` the wrappers are pointed at CPU tensors
  (``_rows.KERNEL_DEVICE = "cpu"``, as tests/test_triton_interpret.py does) and registered for the CPU in
  the op registry, so ``hal.ops.softmax(cpu_tensor)`` takes exactly the path a CUDA call takes on the GPU
  (Triton must be importable; nothing is launched). With ``--device cuda`` the tensors are CUDA tensors and
  the wrappers are the CUDA backend's own (``KERNEL_DEVICE`` untouched).

Method: after a warm-up, N calls per round are timed with time.perf_counter (N calibrated per row so
that a round lasts about ``--round-s``); on CUDA ``torch.cuda.synchronize()`` runs before each clock read,
so the figure is the wall time per call of back-to-back eager calls (host-bound at these sizes). Per row:
the median over rounds of each side, and ``added`` = the median of the per-round differences (hal - torch).
``--baseline OLD.json`` (a JSON this script wrote, e.g. run against an older checkout) adds that run's
hal figures as "before" columns, joined by row name.

    python benchmarks/bench_dispatch.py [--device cpu|cuda] [--rounds 15] [--round-s 0.05]
        [--dtypes float32,bfloat16] [--sections plain,wrappers] [--baseline OLD.json] [--out out/bench_dispatch.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable

import torch
import torch.nn.functional as F
from tabulate import tabulate

import hal.ops
from hal.ops import torch_impl

#: the ops the wrappers section times (the ops the routing table decides)
WRAPPED_OPS = ("softmax", "log_softmax", "layer_norm", "rms_norm", "add_rms_norm", "silu_and_mul", "cross_entropy")
#: small shapes, all routed to torch by the shipped table: a decode-sized batch of rows, and 64 elements
SHAPES = ((8, 4096), (64,))


def timer(device: torch.device) -> Callable[[Callable[[], object], int], float]:
    """``per_call_us(fn, n)``: wall time per call of ``n`` back-to-back calls, in microseconds."""
    if device.type == "cuda":
        sync = torch.cuda.synchronize

        def per_call_us(fn, n):
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            sync()
            return (time.perf_counter() - t0) / n * 1e6
    else:
        def per_call_us(fn, n):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - t0) / n * 1e6
    return per_call_us


def measure(plain, via_hal, per_call_us, rounds: int, round_s: float) -> dict:
    for _ in range(3):  # warm-up: resolution cache, allocator, branch predictors
        per_call_us(plain, 200)
        per_call_us(via_hal, 200)
    t1 = max(per_call_us(plain, 200), per_call_us(via_hal, 200))
    n = max(100, int(round_s * 1e6 / max(t1, 1e-3)))
    t_plain, t_hal = [], []
    for _ in range(rounds):
        t_plain.append(per_call_us(plain, n))
        t_hal.append(per_call_us(via_hal, n))
    mp, mh = statistics.median(t_plain), statistics.median(t_hal)
    diffs = sorted(h - p for h, p in zip(t_hal, t_plain))
    return {"torch_us": mp, "hal_us": mh, "added_us": statistics.median(diffs), "x_torch": mp / mh,
            "added_us_p10": diffs[len(diffs) // 10], "added_us_p90": diffs[(9 * len(diffs)) // 10],
            "n_per_round": n, "torch_us_all": t_plain, "hal_us_all": t_hal}


def plain_pairs(device: torch.device) -> dict:
    x = torch.randn(64, device=device)
    m = torch.randn(8, 8, device=device)
    w = torch.ones(64, device=device)
    return {
        "softmax[64]": (lambda: torch.softmax(x, -1), lambda: hal.ops.softmax(x, -1)),
        "gelu[64]": (lambda: F.gelu(x), lambda: hal.ops.gelu(x)),
        "matmul[8x8]": (lambda: torch.matmul(m, m), lambda: hal.ops.matmul(m, m)),
        "rms_norm[64]": (lambda: F.rms_norm(x, (64,), w, 1e-6), lambda: hal.ops.rms_norm(x, (64,), w, 1e-6)),
    }


def install_cpu_wrappers() -> None:
    """Point the CUDA kernel wrappers at CPU tensors and register them for the CPU as the CUDA backend
    registers them for CUDA (Triton imported under its interpreter; small calls launch nothing)."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from hal.backends.cuda import kernels
    from hal.backends.cuda.kernels import _rows
    _rows.KERNEL_DEVICE = "cpu"
    for op in WRAPPED_OPS:
        fn, pred = kernels.load(op)
        hal.ops.REGISTRY.register(op, "cpu", fn, impl="triton", dtypes=_rows.KERNEL_DTYPES,
                                  priority=kernels.PRIORITY, supports=pred)


def _flat(v) -> tuple:
    return v if isinstance(v, tuple) else (v,)


def wrapper_pairs(device: torch.device, dtypes: list[torch.dtype]) -> dict:
    from hal.backends.cuda.kernels import routing
    pairs = {}
    g = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        for shape in SHAPES:
            rows = shape if len(shape) == 2 else (1, shape[0])  # cross_entropy takes [rows, classes]
            n = shape[-1]
            x, r, w, b, x2 = (torch.randn(*s, generator=g).to(device=device, dtype=dtype)
                              for s in (shape, shape, (n,), (n,), rows))
            tgt = torch.randint(0, n, (rows[0],), generator=g).to(device)
            calls = {
                "softmax": (lambda x=x: torch.softmax(x, -1), lambda x=x: hal.ops.softmax(x, -1), x),
                "log_softmax": (lambda x=x: torch.log_softmax(x, -1), lambda x=x: hal.ops.log_softmax(x, -1), x),
                "layer_norm": (lambda x=x, w=w, b=b, n=n: F.layer_norm(x, (n,), w, b, 1e-5),
                               lambda x=x, w=w, b=b, n=n: hal.ops.layer_norm(x, (n,), w, b, 1e-5), x),
                "rms_norm": (lambda x=x, w=w, n=n: torch_impl.rms_norm(x, (n,), w, 1e-6),
                             lambda x=x, w=w, n=n: hal.ops.rms_norm(x, (n,), w, 1e-6), x),
                "add_rms_norm": (lambda x=x, r=r, w=w, n=n: torch_impl.add_rms_norm(x, r, (n,), w, 1e-6),
                                 lambda x=x, r=r, w=w, n=n: hal.ops.add_rms_norm(x, r, (n,), w, 1e-6), x),
                "silu_and_mul": (lambda x=x: torch_impl.silu_and_mul(x), lambda x=x: hal.ops.silu_and_mul(x), x),
                "cross_entropy": (lambda x2=x2, tgt=tgt: F.cross_entropy(x2, tgt),
                                  lambda x2=x2, tgt=tgt: hal.ops.cross_entropy(x2, tgt), x2),
            }
            for op, (plain, via_hal, inp) in calls.items():
                res = hal.ops.resolve(op, inp.device, dtype)
                impl = res.impl.impl if res.impl is not None else None
                routed = None
                if impl == "triton":
                    routed = "kernel" if routing.decide(op, dtype, "infer", inp.numel()) else "torch"
                # the same result as torch (to the last bit where the call is routed to torch)
                got, want = _flat(via_hal()), _flat(plain())
                same = len(got) == len(want) and all(torch.equal(p, q) for p, q in zip(got, want))
                name = f"{op}[{'x'.join(map(str, inp.shape))}] {str(dtype).replace('torch.', '')}"
                pairs[name] = (plain, via_hal, {"op": op, "dtype": str(dtype).replace("torch.", ""),
                                                "shape": list(inp.shape), "impl": impl, "routed": routed,
                                                "bit_equal_to_torch": same})
    return pairs


def environment(a, device: torch.device) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    from hal.environment import git_commit
    env = {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
           "cpu_count": os.cpu_count(), "threads": a.threads, "rounds": a.rounds, "round_s": a.round_s,
           "device": str(device), "commit": git_commit(), "hal_path": os.path.dirname(hal.ops.__file__),
           "HAL_CUDA_ROUTING": os.environ.get("HAL_CUDA_ROUTING"),
           "method": "interleaved rounds, time.perf_counter" + (" after torch.cuda.synchronize()" if
                                                                 device.type == "cuda" else "")
           + ", N calls per round calibrated to --round-s; medians over rounds; added = median of paired diffs"}
    try:
        env["triton"] = version("triton")
    except PackageNotFoundError:
        env["triton"] = None
    env["gpu"] = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--round-s", type=float, default=0.05, help="target seconds per round and side")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", default=None, help="wrappers section (default: float32 on cpu, "
                                                   "float32,bfloat16 on cuda)")
    ap.add_argument("--sections", default="plain,wrappers")
    ap.add_argument("--baseline", default=None, help="a JSON this script wrote before (the 'before' columns)")
    ap.add_argument("--out", default="out/bench_dispatch.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_dispatch: error: --device cuda but torch.cuda.is_available() is False")
    dtypes = [getattr(torch, d) for d in (a.dtypes or ("float32,bfloat16" if device.type == "cuda"
                                                          else "float32")).split(",")]
    sections = a.sections.split(",")
    per_call_us = timer(device)
    baseline = {}
    if a.baseline:
        with open(a.baseline) as f:
            baseline = json.load(f)["results"]

    results: dict = {}
    if "plain" in sections:  # before the CPU wrappers are registered: hal.ops -> torch's function
        for name, (p, h) in plain_pairs(device).items():
            op = name.split("[")[0]
            res = hal.ops.resolve(op, device, torch.float32)
            impl = res.impl.impl if res.impl is not None else None
            results[name] = {"section": "plain", "op": op, "impl": impl,
                             **measure(p, h, per_call_us, a.rounds, a.round_s)}
    if "wrappers" in sections:
        if device.type == "cpu":
            install_cpu_wrappers()
        for name, (p, h, meta) in wrapper_pairs(device, dtypes).items():
            results[name] = {"section": "wrappers", **meta, **measure(p, h, per_call_us, a.rounds, a.round_s)}

    rows = []
    for name, r in results.items():
        old = baseline.get(name)
        before = [f"{old['hal_us']:.3f}", f"{old['added_us']:+.3f}", f"{old['torch_us'] / old['hal_us']:.3f}x"] \
            if old else ["", "", ""]
        rows.append([r["section"], name, r.get("impl") or "", r.get("routed") or "", f"{r['torch_us']:.3f}", *before,
                     f"{r['hal_us']:.3f}", f"{r['added_us']:+.3f}", f"{r['x_torch']:.3f}x",
                     f"[{r['added_us_p10']:+.2f}, {r['added_us_p90']:+.2f}]"])
    print(tabulate(rows, headers=["section", "call", "impl", "routed", "torch us", "hal before us", "added before",
                                  "x torch before", "hal now us", "added now", "x torch now",
                                  "added p10..p90"]))
    print("goals: plain softmax[64] added <= 1.0 us on the CPU (issue 2); wrappers: no row below 0.97x torch "
          "(issue 23)")
    env = environment(a, device)
    if a.baseline:
        with open(a.baseline) as f:
            env["baseline"] = {"path": a.baseline, "environment": json.load(f).get("environment")}
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"environment": env, "results": results}, f, indent=2)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
