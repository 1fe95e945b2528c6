"""Tune the fused linear + cross-entropy (``hal.backends.cuda.kernels.linear_cross_entropy``) on a GPU: from how
many rows padding the vocabulary pays, and what its chunking costs, beside torch eager.

Per dtype (float32, bfloat16), row count (``ROWS``, hidden 768, GPT-2's 50257 classes) and mode (``infer``: the
forward under ``no_grad``; ``train``: forward + backward of the input and the weight, one
``torch.autograd.grad``), the plans ``pad`` / ``nopad`` (the vocabulary padded to a multiple of 64 or not,
``pad_vocab=``) with the shipped chunking (``chunk_rows``: the rows spread evenly over the fewest chunks that
fit the budget), ``pad budget-chunks`` (the chunking before: full chunks of the budget and a remainder; only
where it differs) and torch eager (``F.cross_entropy(F.linear(x, w), t)``). Each plan's loss and gradients are
checked against torch's in float64 (field ``rel_err``, largest relative error). Timing: bench_kernels' ``wall``
(back-to-back calls, host time included: what a small call costs) and ``device`` (GPU time only, L2 flushed)
for every plan, and the peak memory of one call (``peak_mib``).

Prints the table and, per dtype and mode, the smallest measured row count from which ``pad`` is at least as fast
as ``nopad`` at every larger row count (by wall time up to ``WALL_ROWS`` rows, by device time above: the
figure each size is dominated by) -- the ``PAD_FROM_ROWS`` entries (a call knows its mode: it computes the
gradients in its forward when grad is enabled and an input requires it) -- and from which the faster of the two is
at least as fast as torch (``TORCH_BELOW_LOGITS``'s measure); the JSON's ``tuned`` field.

Usage:  python benchmarks/tune_lce.py --json out.json [--dtypes float32,bfloat16] [--quick | --rows 256,384]
Exit status: 0 ok, 2 no CUDA device or no Triton (one line on stderr).
"""
from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F
from bench_kernels import _peak_mib, _write, environment, tuning_start

from hal.backend import dtype_name

HIDDEN, VOCAB = 768, 50257
ROWS = (8, 32, 128, 256, 384, 512, 1024, 2048, 4096, 8192)
QUICK = (8, 512, 4096)
#: up to this many rows a plan is judged by its wall time (host-bound calls), above by its device time
WALL_ROWS = 512
MODES = ("infer", "train")


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30))


def budget_chunks(n: int, vocab: int, elem_bytes: int) -> int:
    """The chunk rows of the chunking before even chunks: as many whole rows as fit the budget."""
    from hal.backends.cuda.kernels import linear_cross_entropy as lce
    fit = max(1, lce.CHUNK_BYTES // (vocab * elem_bytes))
    return min(n, fit - fit % 8 if fit > 8 else fit)


def case(dtype: torch.dtype, n: int, timer) -> list[dict]:
    from hal.backends.cuda.kernels import linear_cross_entropy as lce
    dev = torch.device("cuda")
    x = torch.randn(n, HIDDEN, device=dev, dtype=dtype)
    w = torch.randn(VOCAB, HIDDEN, device=dev, dtype=dtype) * 0.02
    t = torch.randint(0, VOCAB, (n,), device=dev)
    xl, wl = x.detach().requires_grad_(), w.detach().requires_grad_()
    ref_loss = F.cross_entropy(F.linear(xl.double(), wl.double()), t)
    ref_grads = torch.autograd.grad(ref_loss, [xl, wl])
    shipped = lce.chunk_rows(n, lce.padded_vocab(VOCAB), x.element_size(), float32_copy=False)
    old = budget_chunks(n, lce.padded_vocab(VOCAB), x.element_size())
    plans = {"torch": lambda a, b: F.cross_entropy(F.linear(a, b), t),
             "pad": lambda a, b: lce.linear_cross_entropy(a, b, t, pad_vocab=True),
             "nopad": lambda a, b: lce.linear_cross_entropy(a, b, t, pad_vocab=False)}
    if old != shipped:
        plans["pad budget-chunks"] = lambda a, b: lce.linear_cross_entropy(a, b, t, chunk_size=old, pad_vocab=True)
    rows = []
    for mode in MODES:
        rec = {"dtype": dtype_name(dtype), "rows": n, "hidden": HIDDEN, "vocab": VOCAB, "mode": mode,
               "chunk_rows": shipped, "budget_chunk_rows": old, "plans": {}}
        for name, fn in plans.items():
            if mode == "infer":
                def unit(_f=fn):
                    with torch.no_grad():
                        return _f(x, w)
            else:
                def unit(_f=fn):
                    return torch.autograd.grad(_f(xl, wl), [xl, wl])
            try:
                got = unit()
                outs = [got] if mode == "infer" else list(got)
                want = [ref_loss] if mode == "infer" else list(ref_grads)
                err = max(_rel_err(g, r) for g, r in zip(outs, want))
                got = outs = None
                rec["plans"][name] = {"wall_us": timer.wall(unit), "device_us": timer.device_time(unit),
                                      "peak_mib": _peak_mib(unit, timer), "rel_err": err}
            except Exception as exc:  # one failing plan must not lose the others
                rec["plans"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            torch.cuda.empty_cache()
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    return rows


def _judged(r: dict, plan: str) -> "float | None":
    """A plan's figure at a row: wall time up to :data:`WALL_ROWS` rows, device time above; None if it failed."""
    return r["plans"].get(plan, {}).get("wall_us" if r["rows"] <= WALL_ROWS else "device_us")


def from_rows(rows: list[dict], wins) -> dict:
    """``{dtype: {mode: rows}}``: the smallest measured row count from which ``wins(record)`` holds at every
    larger one; null where it does not hold at the largest."""
    out: dict = {}
    for r in sorted(rows, key=lambda r: -r["rows"]):
        slot = out.setdefault(r["dtype"], {}).setdefault(r["mode"], {"from": None, "open": True})
        if slot["open"] and wins(r):
            slot["from"] = r["rows"]
        else:
            slot["open"] = False
    return {d: {m: v["from"] for m, v in modes.items()} for d, modes in out.items()}


def _beats(r: dict, a: str, b: str) -> bool:
    ta, tb = _judged(r, a), _judged(r, b)
    return ta is not None and tb is not None and ta <= tb


def tuned(rows: list[dict]) -> dict:
    """``pad_from``: where ``pad`` is at least as fast as ``nopad`` (``PAD_FROM_ROWS``); ``kernel_from``: where the
    faster of the two is at least as fast as torch (what ``TORCH_BELOW_LOGITS`` should let through)."""
    best = {True: "pad", False: "nopad"}
    return {"pad_from": from_rows(rows, lambda r: _beats(r, "pad", "nopad")),
            "kernel_from": from_rows(rows, lambda r: _beats(r, best[_beats(r, "pad", "nopad")], "torch"))}


def main(argv=None) -> int:
    start = tuning_start("tune_lce", __doc__, QUICK, argv, lambda ap: ap.add_argument(
        "--rows", help=f"comma-separated row counts (default {','.join(map(str, ROWS))})"))
    if start == 2:
        return 2
    args, timer, _ = start
    from tabulate import tabulate

    rows, table = [], []
    for dn in args.dtypes.split(","):
        for n in (QUICK if args.quick else [int(r) for r in args.rows.split(",")] if args.rows else ROWS):
            for rec in case(getattr(torch, dn), n, timer):
                rows.append(rec)
                base = rec["plans"]["torch"]
                for name, p in rec["plans"].items():
                    table.append([dn, n, rec["mode"], name, *(round(p[k], 1) if k in p else p.get("error")
                                                           for k in ("wall_us", "device_us", "peak_mib")),
                                  f"{p['rel_err']:.1e}" if "rel_err" in p else None,
                                  round(base["wall_us"] / p["wall_us"], 3) if "wall_us" in p and "wall_us" in base
                                  else None,
                                  round(base["device_us"] / p["device_us"], 3) if "device_us" in p
                                  and "device_us" in base else None])
    print(tabulate(table, headers=["dtype", "rows", "mode", "plan", "wall us", "device us", "peak MiB", "rel err",
                                   "x torch wall", "x torch device"]))
    choice = tuned(rows)
    print("from rows (per dtype, per mode):", json.dumps(choice))
    _write(args.json, {"environment": environment(timer.device),
                       "timing": "bench_kernels' wall (back-to-back calls, host time included) and device (GPU time, "
                                 "L2 flushed) timing, per call; train = forward + backward of input and weight",
                       "rows": rows, "tuned": choice})
    return 0


if __name__ == "__main__":
    sys.exit(main())
