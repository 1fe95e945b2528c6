"""Host time per call of each layer of the CUDA kernel path, beside torch's, to find where a call's
host time goes (issue 23: a hal.ops call costs 35-90 us of host time forward, 500-800 us forward +
backward, where torch costs 9-30 and 150-230).

For each case (an op, dtype and small shape, where the GPU work is shorter than the host's), the
layers from the outside in:

- ``torch``: torch eager's call;
- ``hal.ops``: the user path with the shipped routing table;
- ``wrapper``: the kernel wrapper with routing forced to the kernel (``routing.using("triton")``);
- ``fwd_fn``: the wrapper's forward function (``norm_forward`` ...) called directly;
- ``launch``: the bare Triton launch with preallocated outputs (``kernel[grid](...)``);
- ``direct``: the same launch through the kernel's :class:`~hal.backends.cuda.kernels.launcher.Launcher`
  (the compiled kernel's C launcher, called directly);
- ``empty``: the output allocations alone;
- ``triton_nop``: a one-argument Triton kernel's launch (Triton's own floor);

and, forward + backward (``torch.autograd.grad``), ``torch train``, ``wrapper train``, ``autograd
bwd`` (backward only, graph retained) and ``bwd_fn`` (the backward function called directly).

Every case runs once per launch path (``--via bound,triton``: the wrappers' launches through
:mod:`~hal.backends.cuda.kernels.launcher` directly, or through Triton's own ``kernel[grid](...)``), side by
side in one process; rows carry ``via``.

Host time: ``perf_counter`` around N back-to-back calls, stopped before the sync (the GPU work of
these shapes is shorter than the host's, so nothing waits on the GPU), divided by N; median of the
repeats. ``--profile`` adds cProfile's top functions of the wrapper's forward and forward + backward (``--profile-ops``).
Prints a table and writes ``--json``.

Usage:  python benchmarks/bench_host_path.py --json out.json [--calls 300] [--repeats 7] [--profile]
Exit status: 0 ok, 2 no CUDA device or no Triton (one line on stderr).
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import pstats
import statistics
import sys
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F
from bench_kernels import environment, triton_gpu_missing


def host_us(fn: Callable[[], Any], calls: int, repeats: int) -> float:
    """Median host microseconds per call of ``fn`` (see the module docstring)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) * 1e6 / calls)
        torch.cuda.synchronize()
    return statistics.median(out)


def profile_text(fn: Callable[[], Any], calls: int, top: int = 25) -> str:
    """cProfile's ``top`` functions by own time over ``calls`` calls of ``fn``."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def grad_unit(fn: Callable, args: tuple, diff: tuple, retain: bool) -> Callable[[], Any]:
    """Forward + backward of ``fn`` (or, ``retain``, backward only over one retained graph)."""
    leaves = tuple(a.detach().requires_grad_() if i in diff else a for i, a in enumerate(args))
    inputs = [leaves[i] for i in diff]
    if retain:
        out = fn(*leaves)
        out = out[0] if isinstance(out, tuple) else out
        go = torch.ones_like(out)
        return lambda: torch.autograd.grad(out, inputs, go, retain_graph=True)

    def unit():
        out = fn(*leaves)
        out = out[0] if isinstance(out, tuple) else out
        return torch.autograd.grad(out, inputs, torch.ones_like(out))
    return unit


def cases(dtype: torch.dtype) -> tuple[list[dict], Callable[[], Any]]:
    """Per op: the torch call, the hal.ops call, the wrapper, its forward/backward functions and raw
    launch; and a one-argument Triton kernel's launch."""
    import triton
    import triton.language as tl

    import hal.ops as H
    from hal.backends.cuda.kernels import cross_entropy as ce, norms, silu_and_mul as sm, softmax as sx
    dev = torch.device("cuda")
    m, n = 8, 4096
    x = torch.randn(m, n, device=dev, dtype=dtype)
    w = torch.randn(n, device=dev, dtype=dtype)
    b = torch.randn(n, device=dev, dtype=dtype)
    y = torch.empty_like(x)
    rstd = torch.empty(m, device=dev, dtype=torch.float32)
    mean = torch.empty(m, device=dev, dtype=torch.float32)
    x2 = torch.randn(m, 2 * n, device=dev, dtype=dtype)
    block, warps = norms._fwd(n)

    def rms_launch():
        norms._norm_fwd[(m,)](x, x, y, y, w, w, rstd, rstd, x.stride(0), 0, y.stride(0), 0, n, 1e-6,
                              BLOCK=block, IS_RMS=True, HAS_RES=False, HAS_W=True, HAS_B=False, STATS=True,
                              num_warps=warps)

    rms_args = (x, x, y, y, w, w, rstd, rstd, x.stride(0), 0, y.stride(0), 0, n, 1e-6)
    rms_meta = dict(BLOCK=block, IS_RMS=True, HAS_RES=False, HAS_W=True, HAS_B=False, STATS=True, num_warps=warps)

    def rms_direct():
        norms._FWD((m, 1, 1), (x.get_device(), "bench", dtype), rms_args, rms_meta)

    def ln_launch():
        norms._norm_fwd[(m,)](x, x, y, y, w, b, mean, rstd, x.stride(0), 0, y.stride(0), 0, n, 1e-5,
                              BLOCK=block, IS_RMS=False, HAS_RES=False, HAS_W=True, HAS_B=True, STATS=True,
                              num_warps=warps)

    _, rs = norms.norm_forward(x, None, w, None, 1e-6, True, n)[2:]
    _, _, ln_mean, ln_rstd = norms.norm_forward(x, None, w, b, 1e-5, False, n)
    dy = torch.randn_like(x)
    v = 32000  # cross_entropy: decode-sized logits [m, v]
    logits = torch.randn(m, v, device=dev, dtype=dtype)
    target = torch.randint(0, v, (m,), device=dev)
    ce_x2, ce_t, ce_stats = ce.ce_forward(logits, target, -100)
    ce.ce_reduce(ce_stats, ce_t, "mean", dtype, -100)
    one = torch.ones((), device=dev, dtype=dtype)
    return [
        {"op": "rms_norm", "shape": [m, n], "args": (x, w), "diff": (0, 1),
         "torch": lambda a, c: F.rms_norm(a, (n,), c, 1e-6), "hal": lambda a, c: H.rms_norm(a, (n,), c, 1e-6),
         "wrapper": lambda a, c: norms.rms_norm(a, (n,), c, 1e-6),
         "fwd_fn": lambda: norms.norm_forward(x, None, w, None, 1e-6, True, n),
         "bwd_fn": lambda: norms.norm_backward(dy, x, w, None, None, rs, None, True, n),
         "launch": rms_launch, "direct": rms_direct,
         "empty": lambda: (torch.empty((m, n), dtype=dtype, device=dev), torch.empty(m, dtype=torch.float32, device=dev))},
        {"op": "layer_norm", "shape": [m, n], "args": (x, w, b), "diff": (0, 1, 2),
         "torch": lambda a, c, d: F.layer_norm(a, (n,), c, d, 1e-5),
         "hal": lambda a, c, d: H.layer_norm(a, (n,), c, d, 1e-5),
         "wrapper": lambda a, c, d: norms.layer_norm(a, (n,), c, d, 1e-5),
         "fwd_fn": lambda: norms.norm_forward(x, None, w, b, 1e-5, False, n), "launch": ln_launch,
         "bwd_fn": lambda: norms.norm_backward(dy, x, w, b, ln_mean, ln_rstd, None, False, n)},
        {"op": "cross_entropy", "shape": [m, v], "args": (logits, target), "diff": (0,),
         "torch": lambda a, t: F.cross_entropy(a, t), "hal": lambda a, t: H.cross_entropy(a, t),
         "wrapper": lambda a, t: ce.cross_entropy(a, t),
         "fwd_fn": lambda: ce.ce_reduce(ce.ce_forward(logits, target, -100)[2], ce_t, "mean", dtype, -100),
         "bwd_fn": lambda: ce.ce_backward(ce_x2, ce_t, ce_stats, one, True, -100)},
        {"op": "softmax", "shape": [m, n], "args": (x,), "diff": (0,),
         "torch": lambda a: torch.softmax(a, -1), "hal": lambda a: H.softmax(a, -1),
         "wrapper": lambda a: sx.softmax(a, -1), "fwd_fn": lambda: sx.softmax_forward(x, False)},
        {"op": "silu_and_mul", "shape": [m, 2 * n], "args": (x2,), "diff": (0,),
         "torch": lambda a: F.silu(a[..., :n]) * a[..., n:], "hal": lambda a: H.silu_and_mul(a),
         "wrapper": lambda a: sm.silu_and_mul(a), "fwd_fn": lambda: sm.silu_and_mul_forward(x2)},
    ], _nop(triton, tl, dev)


def _nop(triton, tl, dev) -> Callable[[], Any]:
    @triton.jit
    def nop(X):
        pass
    t = torch.empty(16, device=dev)
    return lambda: nop[(1,)](t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-ops", default="rms_norm,layer_norm,cross_entropy",
                    help="ops whose wrapper --profile profiles (forward, and forward + backward)")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--via", default="bound,triton", help="launch paths to compare (launcher.MODES)")
    args = ap.parse_args(argv)
    why = triton_gpu_missing("bench_host_path")
    if why:
        print(why, file=sys.stderr)
        return 2
    from tabulate import tabulate

    from hal.backends.cuda.kernels import launcher, routing
    rows, profiles = [], {}
    for via, dn in [(v, d) for d in args.dtypes.split(",") for v in args.via.split(",")]:
        launcher.MODE = via
        dtype = getattr(torch, dn)
        cs, nop = cases(dtype)
        for c in cs:
            rec = {"op": c["op"], "dtype": dn, "via": via, "shape": c["shape"]}
            a = c["args"]
            t = lambda f: host_us(f, args.calls, args.repeats)  # noqa: E731
            with torch.no_grad():
                rec["torch"] = t(functools.partial(c["torch"], *a))
                rec["hal.ops"] = t(functools.partial(c["hal"], *a))
                with routing.using("triton"):
                    rec["wrapper"] = t(functools.partial(c["wrapper"], *a))
                rec["fwd_fn"] = t(c["fwd_fn"])
                if "launch" in c:
                    rec["launch"] = t(c["launch"])
                if "direct" in c and via != "triton":
                    rec["direct"] = t(c["direct"])
                if "empty" in c:
                    rec["empty"] = t(c["empty"])
            rec["torch train"] = t(grad_unit(c["torch"], a, c["diff"], False))
            rec["hal.ops train"] = t(grad_unit(c["hal"], a, c["diff"], False))
            with routing.using("triton"):
                rec["wrapper train"] = t(grad_unit(c["wrapper"], a, c["diff"], False))
                rec["autograd bwd"] = t(grad_unit(c["wrapper"], a, c["diff"], True))
            rec["torch autograd bwd"] = t(grad_unit(c["torch"], a, c["diff"], True))
            if "bwd_fn" in c:
                rec["bwd_fn"] = t(c["bwd_fn"])
            if args.profile and c["op"] in args.profile_ops.split(",") and via == args.via.split(",")[0]:
                with routing.using("triton"):
                    with torch.no_grad():
                        profiles[f"{c['op']} {dn} wrapper fwd"] = profile_text(functools.partial(c["wrapper"], *a), 500)
                    profiles[f"{c['op']} {dn} wrapper train"] = profile_text(grad_unit(c["wrapper"], a, c["diff"], False), 300)
            rows.append(rec)
            print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in rec.items()}), flush=True)
        if via == args.via.split(",")[0]:
            rows.append({"op": "triton_nop", "dtype": dn, "via": "triton", "shape": [16],
                         "launch": host_us(nop, args.calls, args.repeats)})
    launcher.MODE = "bound"
    cols = ["torch", "hal.ops", "wrapper", "fwd_fn", "launch", "direct", "empty", "torch train", "hal.ops train",
            "wrapper train", "autograd bwd", "torch autograd bwd", "bwd_fn"]
    print(tabulate([[r["op"], r["dtype"], r["via"]] + [None if r.get(k) is None else round(r[k], 1) for k in cols]
                    for r in rows], headers=["op", "dtype", "via"] + cols))
    for k, v in profiles.items():
        print(f"\n--- cProfile: {k}\n{v}")
    doc = {"environment": environment(torch.device("cuda")),
           "timing": "host us per call: perf_counter around back-to-back calls, stopped before the sync; median",
           "via": "the wrappers' launch path: bound = launcher.Launcher's direct C launch, triton = kernel[grid](...)",
           "rows": rows, "profiles": profiles}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
