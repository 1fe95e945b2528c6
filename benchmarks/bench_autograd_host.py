"""Where the host time of a training-mode call goes: torch's op against Python ``autograd.Function``s.

The routing table (``backends/cuda/kernels/routing.json``) sends training-mode calls to torch up to
33-268M elements because, timed eagerly on the H200, a kernel wrapped in an ``autograd.Function`` costs
260-310 us per forward + backward where torch's softmax costs 140-160 us, whatever the size. This script
splits that cost, side by side in one process, for one small softmax ([rows, n], default 8 x 4096):

- ``torch``: ``torch.softmax`` and ``torch.autograd.grad`` (torch's autograd node, in C++);
- ``fn-torch``: an ``autograd.Function`` whose forward is ``torch.softmax`` and whose backward is
  ``torch._softmax_backward_data`` (what Python adds around the same two kernels);
- ``fn-none``: the same forward, a backward that returns its input (the engine's cost of a Python node
  with no kernel in it);
- ``hal``: ``SoftmaxFunction`` of the CUDA backend (the Triton kernels, direct launch; CUDA and Triton only).

Each is timed as ``fwd+grad`` (one forward under grad mode and one ``torch.autograd.grad``), ``fwd``
(the forward alone, graph built and dropped) and, for the Python ones, the backward's three parts:
``to_bwd`` (from the call of ``torch.autograd.grad`` to the first line of ``backward``: the engine's
start, the hand-off to the device's worker thread, the GIL), ``in_bwd`` (the body) and ``after_bwd``
(the body's return to ``grad`` returning in the caller). Each variant runs twice: with autograd's
device threads (torch's default) and under ``torch.autograd.set_multithreading_enabled(False)``
(the backward on the calling thread), the ``threads`` column. Method: rounds of N back-to-back
iterations timed with ``time.perf_counter`` (a device sync before each clock read), variants
interleaved per round, medians over rounds; the parts are medians over the timed iterations.

    python benchmarks/bench_autograd_host.py [--device cuda|cpu] [--shape 8,4096] [--rounds 11]
        [--iters 200] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Callable, Optional

import torch
from tabulate import tabulate

#: perf_counter stamps written by the Python backwards: [entered, left] of the last call
_STAMP = [0.0, 0.0]


class _FnTorch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        y = torch.softmax(x, -1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        _STAMP[0] = time.perf_counter()
        (y,) = ctx.saved_tensors
        dx = torch._softmax_backward_data(dy, y, -1, y.dtype)
        _STAMP[1] = time.perf_counter()
        return dx


class _FnNone(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return torch.softmax(x, -1)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        _STAMP[0] = time.perf_counter()
        _STAMP[1] = time.perf_counter()
        return dy


def _hal_forward() -> Optional[Callable]:
    """The CUDA backend's softmax autograd Function with its backward stamped, or None without Triton."""
    try:
        from hal.backends.cuda.kernels import softmax as sx
    except ImportError:
        return None

    class _Stamped(sx.SoftmaxFunction):
        @staticmethod
        def backward(ctx, dy):  # type: ignore[override]
            _STAMP[0] = time.perf_counter()
            out = sx.SoftmaxFunction.backward(ctx, dy)
            _STAMP[1] = time.perf_counter()
            return out

    return lambda x: _Stamped.apply(x, False, None)


def variants(device: torch.device) -> dict:
    out = {"torch": (lambda x: torch.softmax(x, -1), False), "fn-torch": (_FnTorch.apply, True),
           "fn-none": (_FnNone.apply, True)}
    if device.type == "cuda":
        hal = _hal_forward()
        if hal is not None:
            out["hal"] = (hal, True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", default="8,4096")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("bench_autograd_host: no CUDA device (use --device cpu)", file=sys.stderr)
        return 2
    shape = tuple(int(s) for s in args.shape.split(","))
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    x = torch.randn(*shape, device=dev).requires_grad_()
    g = torch.randn(*shape, device=dev)
    vs = variants(dev)

    def one(fwd, stamped, parts):
        y = fwd(x)
        t1 = time.perf_counter()
        torch.autograd.grad(y, x, g)
        t2 = time.perf_counter()
        if stamped:
            parts["to_bwd"].append(_STAMP[0] - t1)
            parts["in_bwd"].append(_STAMP[1] - _STAMP[0])
            parts["after_bwd"].append(t2 - _STAMP[1])

    rows = []
    for threads in (True, False):
        res = {name: {"fwd+grad": [], "fwd": [], "parts": {k: [] for k in ("to_bwd", "in_bwd", "after_bwd")}}
               for name in vs}
        with torch.autograd.set_multithreading_enabled(threads):
            for name, (fwd, stamped) in vs.items():  # warm-up (compiles the hal kernels)
                for _ in range(20):
                    one(fwd, stamped, {k: [] for k in res[name]["parts"]})
            sync()
            for r in range(args.rounds):
                order = list(vs.items()) if r % 2 == 0 else list(reversed(vs.items()))
                for name, (fwd, stamped) in order:
                    parts = res[name]["parts"]
                    sync()
                    t0 = time.perf_counter()
                    for _ in range(args.iters):
                        one(fwd, stamped, parts)
                    sync()
                    res[name]["fwd+grad"].append((time.perf_counter() - t0) / args.iters * 1e6)
                    sync()
                    t0 = time.perf_counter()
                    for _ in range(args.iters):
                        fwd(x)
                    sync()
                    res[name]["fwd"].append((time.perf_counter() - t0) / args.iters * 1e6)
        for name, (_, stamped) in vs.items():
            rec = res[name]
            row = {"variant": name, "threads": threads, "fwd_grad_us": statistics.median(rec["fwd+grad"]),
                   "fwd_us": statistics.median(rec["fwd"])}
            for k in ("to_bwd", "in_bwd", "after_bwd"):
                row[f"{k}_us"] = statistics.median(rec["parts"][k]) * 1e6 if stamped else None
            rows.append(row)
    base = {r["threads"]: r["fwd_grad_us"] for r in rows if r["variant"] == "torch"}
    for r in rows:
        r["x_torch"] = r["fwd_grad_us"] / base[r["threads"]]
    print(f"device {dev} ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}), torch "
          f"{torch.__version__}, shape {list(shape)}: host us per iteration (medians)")
    print(tabulate([[r["variant"], "on" if r["threads"] else "off", r["fwd_grad_us"], r["fwd_us"], r["to_bwd_us"],
                     r["in_bwd_us"], r["after_bwd_us"], r["x_torch"]] for r in rows],
                   headers=["variant", "device threads", "fwd+grad", "fwd", "to_bwd", "in_bwd", "after_bwd",
                            "/ torch"], floatfmt=".1f"))
    if args.json:
        from hal.environment import fingerprint
        with open(args.json, "w") as f:
            json.dump({"environment": fingerprint(), "device": str(dev), "shape": list(shape), "rounds": args.rounds,
                       "iters": args.iters, "method": __doc__.split("Method: ")[1].split("\n\n")[0].replace("\n", " "),
                       "rows": rows}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
