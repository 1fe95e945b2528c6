"""Benchmark HAL's kernels (through ``hal.ops``) against torch eager, Liger-Kernel and torch.compile.

Modes (one per run):

- ``--eager`` (default): for every kernel (softmax, log_softmax, layer_norm, rms_norm, add_rms_norm,
  silu_and_mul, cross_entropy, linear_cross_entropy), dtype (float32, bfloat16), size (small: a
  decode-sized batch; medium: 4096 rows; large: >= 64 MiB) and direction, one row
  ``{"kernel","dtype","shape","size","direction","timing","hal_us","torch_us","liger_us","compile_us",...}``.
  Columns: ``hal`` = ``hal.ops.<kernel>`` (the user path, routing included); ``torch`` = torch
  eager; ``liger`` = Liger-Kernel's op where it has one (``liger_kernel.transformers.functional``;
  its swiglu takes the two halves as separate contiguous tensors), else null; ``compile`` =
  ``torch.compile`` of the torch sequence (compiled once per case, warm; null past
  ``--compile-budget-s`` of compile time). Nothing runs in a CUDA graph.
  ``fwd`` times the forward under ``no_grad``. ``bwd`` times backward only: the forward runs once
  with ``requires_grad`` and ``torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=True)``
  is timed repeatedly -- except for cross_entropy and linear_cross_entropy, whose fused
  implementations (Liger's, HAL's chunked one) compute the gradients inside the forward: their
  ``bwd`` rows time forward + backward for every column (row field ``measures``) and carry the peak
  memory of one training step per column (``peak_mib``; at gpt2's LM-head size for the large
  linear_cross_entropy rows, summarised under ``linear_cross_entropy_memory``).
  Timing ``wall`` (small sizes, host-bound): CUDA events around N back-to-back calls divided by N,
  so the host time of each call is included; hal and torch are timed side by side (rounds alternating
  between them, :meth:`Timer.wall_pair`), and ``x_torch`` is the median of the rounds' ratios (quartiles
  in ``x_torch_paired``): host speed drifts by tens of percent between back-to-back timings. Timing ``device`` (medium, large): per call, the L2 is
  flushed and the GPU is held busy by ``torch.cuda._sleep`` while the host enqueues event, call,
  event, so the events bracket GPU time only; median of the repeats. ``tbps`` counts the fewest
  bytes the op must move; ``copy_ceiling_tbps`` is a device-to-device copy measured in the run.
- ``--graphs``: the previous CUDA-graph measurement of the forward (HAL vs torch GPU time only).
- ``--raw-triton``: the Triton kernels called directly (``hal.backends.cuda.kernels.load``, routing
  forced to the kernel) against torch over a row sweep, per op, dtype and mode (``infer`` = forward,
  ``train`` = forward + backward), wall timing as above, kernel and torch side by side
  (:meth:`Timer.wall_pair`, :data:`SWEEP_ROUNDS` rounds). A ``train`` unit is :data:`TRAIN_CALLS`
  independent calls (each on its own inputs) and one ``torch.autograd.grad`` over all of them, and the
  time per call is the unit's divided by that count (one call alone up from :data:`TRAIN_CHAIN_MAX_NUMEL`
  elements, where the host cost no longer matters), as in a model's training step: autograd hands the
  backward to the device's worker thread and back once per ``grad``/``backward`` call (about 60 us on
  the H200's host, ``benchmarks/bench_autograd_host.py``), not once per op, so a unit of one call would
  charge every op that start-up, the kernels' Python backward twice. Writes the routing table
  ``{"measured", "default", "ops": {op: {dtype: {"infer": min_numel, "train": min_numel}}}}`` (the
  format :mod:`hal.backends.cuda.kernels.routing` reads from ``HAL_CUDA_ROUTING``): the smallest
  measured numel from which Triton is at least as fast as torch at every larger measured size
  (0: at every size; null: at no size, route to torch), with the raw timings under ``"sweep"``. The whole
  sweep runs ``--sweeps`` times (default 3), one after the other, and each point is decided on the medians of
  its runs (``triton_us``, ``torch_us``; every run in ``*_us_runs``): one sweep moved thresholds by a row step
  either way, a slow stretch of the host falling on a few points (reports/cuda/README.md, 2026-12-03).

``--device cpu`` runs the same code with tiny shapes and host timers (a dry run proving the script
end to end; liger and compile columns null). Prints a tabulate table and writes ``--json``
(rewritten after every kernel, ``"complete": false`` until the end).

Usage:  python benchmarks/bench_kernels.py [--eager|--graphs|--raw-triton [--sweeps 3]] --json out.json
        [--dtypes float32,bfloat16] [--kernels softmax,...] [--sizes small,medium,large] [--device cpu]
Exit status: 0 ok, 2 no CUDA device (one line on stderr).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from hal.ops import torch_impl

MiB = 1 << 20
TARGET_TBPS = 3.8e12
KERNELS = ("softmax", "log_softmax", "layer_norm", "rms_norm", "add_rms_norm", "silu_and_mul", "cross_entropy",
           "linear_cross_entropy")
SIZES = ("small", "medium", "large")
#: (rows, cols) per size; silu_and_mul: input [rows, cols]; CE: [rows, classes]; LCE: (rows, hidden, vocab)
SHAPES = {
    "cuda": {"rows": {"small": (8, 4096), "medium": (4096, 4096), "large": (16384, 16384)},
             "silu_and_mul": {"small": (8, 8192), "medium": (4096, 8192), "large": (16384, 32768)},
             "cross_entropy": {"small": (8, 32000), "medium": (4096, 32000), "large": (8192, 128256)},
             "linear_cross_entropy": {"small": (8, 768, 50257), "medium": (4096, 768, 50257),
                                      "large": (8192, 768, 50257)}},
    "cpu": {"rows": {"small": (4, 64), "medium": (32, 256), "large": (64, 512)},
            "silu_and_mul": {"small": (4, 128), "medium": (32, 512), "large": (64, 1024)},
            "cross_entropy": {"small": (4, 100), "medium": (32, 1000), "large": (64, 2000)},
            "linear_cross_entropy": {"small": (4, 32, 100), "medium": (32, 64, 1000), "large": (64, 64, 2000)}},
}


# ---- timers -----------------------------------------------------------------------------------
def sleep_cycles_per_s(device: torch.device) -> float:
    """How many ``torch.cuda._sleep`` cycles the CUDA ``device`` spins per second (what holding it busy for a given
    time takes), measured over a 20 M-cycle sleep."""
    torch.cuda._sleep(1000)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    torch.cuda._sleep(20_000_000)
    torch.cuda.synchronize(device)
    return 20_000_000 / (time.perf_counter() - t0)


class Timer:
    """Per-call microseconds of a callable on one device: ``wall`` (back-to-back calls, host time
    included) and ``device`` (GPU time only; host timers on the CPU)."""

    def __init__(self, device: torch.device, repeats: int = 7, target_ms: float = 3.0):
        self.device, self.repeats, self.target_ms = device, repeats, target_ms
        self.cuda = device.type == "cuda"
        self._flush = torch.empty(256 * MiB, dtype=torch.uint8, device=device) if self.cuda else None
        self._cycles_per_s = sleep_cycles_per_s(device) if self.cuda else 0.0

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _calls(self, fn: Callable[[], Any]) -> int:
        for _ in range(3):
            fn()
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        one = time.perf_counter() - t0
        return int(min(200, max(3, self.target_ms / 1e3 / max(one, 1e-7))))

    def _per_call(self, fn: Callable[[], Any], calls: int) -> float:
        """Microseconds per call of ``calls`` back-to-back calls of ``fn`` (CUDA events; host timers on the CPU)."""
        if self.cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(calls):
                fn()
            e1.record()
            e1.synchronize()
            return e0.elapsed_time(e1) * 1e3 / calls
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) * 1e6 / calls

    def wall(self, fn: Callable[[], Any]) -> float:
        calls = self._calls(fn)
        return statistics.median(self._per_call(fn, calls) for _ in range(self.repeats))

    def wall_pair(self, a: Callable[[], Any], b: Callable[[], Any], rounds: int = 21) -> tuple[float, float, list]:
        """:meth:`wall` of ``a`` and ``b`` side by side: ``rounds`` rounds, each timing N back-to-back calls of
        one then N of the other (the order alternating by round, so drift of the host's speed falls on both),
        N the same for both. Returns ``(median us of a, median us of b, per-round ratios b / a)``."""
        calls = min(self._calls(a), self._calls(b))
        ta, tb = [], []
        for r in range(rounds):
            for fn, out in (((a, ta), (b, tb)) if r % 2 == 0 else ((b, tb), (a, ta))):
                out.append(self._per_call(fn, calls))
        return statistics.median(ta), statistics.median(tb), [y / x for x, y in zip(ta, tb)]

    def device_time(self, fn: Callable[[], Any]) -> float:
        if not self.cuda:
            return self.wall(fn)
        for _ in range(3):
            fn()
        self.sync()
        t0 = time.perf_counter()
        fn()  # host time of one call (the GPU may still be running it)
        host = time.perf_counter() - t0
        self.sync()
        cycles = int(self._cycles_per_s * (2 * host + 50e-6))
        pairs = []
        for _ in range(self.repeats):
            self._flush.zero_()
            torch.cuda._sleep(cycles)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            pairs.append((e0, e1))
        self.sync()
        return statistics.median(e0.elapsed_time(e1) * 1e3 for e0, e1 in pairs)


# ---- cases ------------------------------------------------------------------------------------
@dataclasses.dataclass
class Case:
    """One kernel at one shape: ``make()`` returns the inputs; ``diff`` indexes the inputs that get
    gradients; each impl maps the inputs to the output (tensor or tuple); ``bytes_fwd``/``bytes_bwd``
    are the fewest bytes each direction must move."""

    kernel: str
    shape: tuple
    make: Callable[[], tuple]
    diff: tuple
    hal: Callable
    torch: Callable
    liger: Optional[Callable]
    bytes_fwd: int
    bytes_bwd: int
    grads_in_forward: bool = False
    #: the inputs Liger's op takes, made from ``make()``'s outside the timing (None: the same), and their diff
    liger_args: Optional[Callable[[tuple], tuple]] = None
    liger_diff: Optional[tuple] = None


def _liger(device: torch.device):
    """``liger_kernel.transformers.functional`` on CUDA when importable, else None."""
    if device.type != "cuda":
        return None
    try:
        import liger_kernel.transformers.functional as LF
        return LF
    except Exception:
        return None


def build_case(kernel: str, size: str, dtype: torch.dtype, device: torch.device) -> Case:
    """The :class:`Case` of ``kernel`` at ``size`` (see ``SHAPES``) in ``dtype`` on ``device``."""
    import hal.ops as H
    LF = _liger(device)
    e = torch.empty((), dtype=dtype).element_size()
    table = SHAPES["cuda" if device.type == "cuda" else "cpu"]
    shape = table.get(kernel, table["rows"])[size]

    def rnd(*s):
        return torch.randn(*s, device=device, dtype=dtype)

    if kernel in ("softmax", "log_softmax"):
        m, n = shape
        tfn = torch.softmax if kernel == "softmax" else torch.log_softmax
        hfn = H.softmax if kernel == "softmax" else H.log_softmax
        lig = (lambda x: LF.liger_softmax(x)) if LF is not None and kernel == "softmax" else None
        return Case(kernel, shape, lambda: (rnd(m, n),), (0,), lambda x: hfn(x, -1), lambda x: tfn(x, -1), lig,
                    2 * m * n * e, 3 * m * n * e)
    if kernel == "layer_norm":
        m, n = shape
        return Case(kernel, shape, lambda: (rnd(m, n), rnd(n), rnd(n)), (0, 1, 2),
                    lambda x, w, b: H.layer_norm(x, (n,), w, b, 1e-5),
                    lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5),
                    (lambda x, w, b: LF.liger_layer_norm(x, w, b, 1e-5)) if LF else None,
                    2 * m * n * e, 3 * m * n * e)
    if kernel == "rms_norm":
        m, n = shape
        return Case(kernel, shape, lambda: (rnd(m, n), rnd(n)), (0, 1),
                    lambda x, w: H.rms_norm(x, (n,), w, 1e-6), lambda x, w: F.rms_norm(x, (n,), w, 1e-6),
                    (lambda x, w: LF.liger_rms_norm(x, w, 1e-6)) if LF else None, 2 * m * n * e, 3 * m * n * e)
    if kernel == "add_rms_norm":
        m, n = shape
        return Case(kernel, shape, lambda: (rnd(m, n), rnd(m, n), rnd(n)), (0, 1, 2),
                    lambda x, r, w: H.add_rms_norm(x, r, (n,), w, 1e-6),
                    lambda x, r, w: torch_impl.add_rms_norm(x, r, (n,), w, 1e-6),
                    (lambda x, r, w: LF.liger_fused_add_rms_norm(x, r, w, 1e-6)) if LF else None,
                    4 * m * n * e, 5 * m * n * e)
    if kernel == "silu_and_mul":
        m, n = shape
        # Liger's swiglu takes the halves as two contiguous tensors (its kernel has one row stride):
        # they are split and copied outside the timing
        return Case(kernel, shape, lambda: (rnd(m, n),), (0,), lambda x: H.silu_and_mul(x), torch_impl.silu_and_mul,
                    (lambda a, b: LF.liger_swiglu(a, b)) if LF else None, 3 * m * n // 2 * e, 5 * m * n // 2 * e,
                    liger_args=lambda args: tuple(t.contiguous() for t in args[0].chunk(2, -1)), liger_diff=(0, 1))
    if kernel == "cross_entropy":
        m, v = shape
        return Case(kernel, shape, lambda: (rnd(m, v), torch.randint(0, v, (m,), device=device)), (0,),
                    lambda x, t: H.cross_entropy(x, t), lambda x, t: F.cross_entropy(x, t),
                    (lambda x, t: LF.liger_cross_entropy(x, t)) if LF else None, m * v * e + 8 * m,
                    2 * m * v * e + 8 * m, grads_in_forward=True)
    if kernel == "linear_cross_entropy":
        m, h, v = shape
        ensure_linear_cross_entropy(device, dtype)

        def make():
            return (rnd(m, h), rnd(v, h) * 0.02, torch.randint(0, v, (m,), device=device))
        return Case(kernel, shape, make, (0, 1), lambda x, w, t: H.linear_cross_entropy(x, w, t),
                    lambda x, w, t: F.cross_entropy(F.linear(x, w), t),
                    (lambda x, w, t: LF.liger_fused_linear_cross_entropy(x, w, t)) if LF else None,
                    (m * h + v * h) * e, 2 * (m * h + v * h) * e, grads_in_forward=True)
    raise ValueError(f"unknown kernel {kernel!r}; one of {', '.join(KERNELS)}")


def ensure_linear_cross_entropy(device: torch.device, dtype: torch.dtype) -> str:
    """Register the chunked linear_cross_entropy for ``device`` unless a non-torch one already resolves
    (the CUDA backend registers it; a CPU dry run needs this); returns the label of what resolves."""
    import hal.ops as H
    from hal.backends.cuda.kernels import linear_cross_entropy as lce
    res = H.resolve("linear_cross_entropy", device, dtype)
    if res.impl is None or res.impl.impl == "torch":
        H.REGISTRY.register("linear_cross_entropy", device.type, lce.linear_cross_entropy, impl="chunked",
                            priority=10, supports=lce.supports)
        res = H.resolve("linear_cross_entropy", device, dtype)
    return res.impl.label if res.impl else "none"


def _outs(out: Any) -> list:
    return [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]


def runner(fn: Callable, args: tuple, case: Case, direction: str, diff: Optional[tuple] = None) -> Callable[[], Any]:
    """A no-argument callable doing one timed unit of ``fn`` on ``args`` in ``direction``
    (gradients for the inputs ``diff``, default ``case.diff``)."""
    diff = case.diff if diff is None else diff
    if direction == "fwd":
        def fwd():
            with torch.no_grad():
                return fn(*args)
        return fwd
    leaves = tuple(a.detach().requires_grad_() if i in diff else a for i, a in enumerate(args))
    inputs = [leaves[i] for i in diff]
    if case.grads_in_forward:
        return lambda: torch.autograd.grad(fn(*leaves), inputs)
    outs = [o for o in _outs(fn(*leaves)) if o.requires_grad]
    gos = [torch.randn_like(o) if o.dim() else torch.ones_like(o) for o in outs]
    return lambda: torch.autograd.grad(outs, inputs, gos, retain_graph=True)


class Compiler:
    """``torch.compile`` per case within a total compile-time budget (seconds)."""

    def __init__(self, budget_s: float, enabled: bool):
        self.budget_s, self.enabled, self.spent_s = budget_s, enabled, 0.0
        if enabled:
            import torch._dynamo as dynamo
            for name in ("cache_size_limit", "recompile_limit"):
                if hasattr(dynamo.config, name):
                    setattr(dynamo.config, name, 1024)

    def compile(self, fn: Callable) -> Optional[Callable]:
        if not self.enabled or self.spent_s >= self.budget_s:
            return None
        return torch.compile(fn, dynamic=False)


def _peak_mib(fn: Callable[[], Any], timer: Timer) -> Optional[float]:
    if not timer.cuda:
        return None
    timer.sync()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    timer.sync()
    return (torch.cuda.max_memory_allocated() - base) / MiB


def run_case(case: Case, dtype: torch.dtype, size: str, timer: Timer, compiler: Compiler, directions: list[str],
             ceiling: Optional[float]) -> list[dict]:
    """The rows (one per direction) of one case; errors of one column are recorded, not raised."""
    import hal.ops as H
    args = case.make()
    timing = "wall" if size == "small" else "device"
    measure = timer.wall if timing == "wall" else timer.device_time
    rows = []
    for direction in directions:
        row = {"kernel": case.kernel, "dtype": str(dtype).replace("torch.", ""), "shape": list(case.shape),
               "size": size, "direction": direction, "timing": timing,
               "measures": ("fwd+bwd" if case.grads_in_forward and direction == "bwd" else direction),
               "hal_impl": H.resolve(case.kernel, args[0].device, dtype).impl.label
               if H.resolve(case.kernel, args[0].device, dtype).impl else None, "errors": {}}
        peaks = {}
        paired = None
        if timing == "wall":  # hal and torch side by side: their ratio is the row's verdict
            try:
                paired = timer.wall_pair(runner(case.hal, args, case, direction), runner(case.torch, args, case, direction))
                q = statistics.quantiles(paired[2], n=4)
                row["x_torch_paired"] = {"median": statistics.median(paired[2]), "q1": q[0], "q3": q[2],
                                         "rounds": len(paired[2])}
            except Exception as exc:
                row["errors"]["paired"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        for col, fn in (("hal", case.hal), ("torch", case.torch), ("liger", case.liger), ("compile", "compile")):
            row[f"{col}_us"] = None
            if fn is None:
                continue
            if paired is not None and col in ("hal", "torch"):
                row[f"{col}_us"] = paired[0] if col == "hal" else paired[1]
                if not (case.grads_in_forward and direction == "bwd"):
                    continue
            try:
                if fn == "compile":
                    t0 = time.perf_counter()
                    fn = compiler.compile(case.torch)
                    if fn is None:
                        continue
                    unit = runner(fn, args, case, direction)
                    unit()
                    timer.sync()
                    compiler.spent_s += time.perf_counter() - t0
                elif col == "liger" and case.liger_args is not None:
                    unit = runner(fn, case.liger_args(args), case, direction, case.liger_diff)
                else:
                    unit = runner(fn, args, case, direction)
                if row[f"{col}_us"] is None:
                    row[f"{col}_us"] = measure(unit)
                if case.grads_in_forward and direction == "bwd":
                    peaks[col] = _peak_mib(unit, timer)
            except Exception as exc:  # one column failing must not lose the row
                row["errors"][col] = f"{type(exc).__name__}: {str(exc)[:300]}"
            finally:
                unit = None
        nbytes = case.bytes_fwd if direction == "fwd" else case.bytes_bwd
        if row["measures"] == "fwd+bwd":
            row["peak_mib"] = peaks
            if case.kernel == "linear_cross_entropy":
                nbytes = None  # matmul-bound: bandwidth is not the figure of merit
        row["min_bytes"] = nbytes
        row["tbps"] = nbytes / (row["hal_us"] * 1e-6) / 1e12 if nbytes and row["hal_us"] else None
        row["pct_of_copy"] = 100 * row["tbps"] * 1e12 / ceiling if row["tbps"] and ceiling else None
        for col in ("torch", "liger", "compile"):
            row[f"x_{col}"] = row[f"{col}_us"] / row["hal_us"] if row["hal_us"] and row[f"{col}_us"] else None
        if "x_torch_paired" in row:  # the median of the rounds' ratios, not the ratio of the two medians
            row["x_torch"] = row["x_torch_paired"]["median"]
        rows.append(row)
        print(f"{case.kernel:20s} {row['dtype']:8s} {size:6s} {direction} {timing:6s} hal {_f(row['hal_us'])} torch "
              f"{_f(row['torch_us'])} liger {_f(row['liger_us'])} compile {_f(row['compile_us'])} us "
              f"x_torch {_f(row['x_torch'], 2)}" + (f" errors {row['errors']}" if row["errors"] else ""), flush=True)
    return rows


def _f(v: Optional[float], nd: int = 1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


# ---- the copy ceiling, environment, targets ----------------------------------------------------------
def copy_ceiling(timer: Timer) -> Optional[float]:
    """Device-to-device copy bandwidth (read + write bytes per second) of a 1 GiB buffer."""
    if not timer.cuda:
        return None
    src = torch.empty(1024 * MiB, dtype=torch.uint8, device=timer.device).random_(0, 255)
    dst = torch.empty_like(src)
    us = timer.device_time(lambda d=dst, s=src: d.copy_(s))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * 1024 * MiB / (us * 1e-6)


def environment(device: torch.device) -> dict:
    """Versions (torch, triton, liger), GPU name, date, the checkout's commit, the routing table in use."""
    from importlib.metadata import PackageNotFoundError, version

    from hal.environment import git_commit
    env: dict = {"torch": torch.__version__, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                 "device": str(device), "python": sys.version.split()[0]}
    for mod in ("triton", "liger_kernel"):
        try:
            env[mod] = version(mod.replace("_", "-"))
        except PackageNotFoundError:
            env[mod] = None
    env["gpu"] = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    env["commit"] = git_commit()
    env["HAL_CUDA_ROUTING"] = os.environ.get("HAL_CUDA_ROUTING")
    return env


def targets(rows: list[dict]) -> dict:
    """The issue's goals checked on the rows: no row below 0.97x torch, >= 3.8 TB/s at >= 64 MiB,
    >= 1.0x Liger."""
    def miss(pred):
        return [(r["kernel"], r["dtype"], r["size"], r["direction"]) for r in rows if pred(r)]
    slow = miss(lambda r: r["x_torch"] is not None and r["x_torch"] < 0.97)
    bw = miss(lambda r: r["size"] == "large" and r["tbps"] is not None and r["tbps"] * 1e12 < TARGET_TBPS)
    lig = miss(lambda r: r["x_liger"] is not None and r["x_liger"] < 1.0)
    return {">=0.97x_torch": {"pass": not slow, "misses": slow},
            ">=3.8TB/s_large": {"pass": not bw, "misses": bw},
            ">=1.0x_liger": {"pass": not lig, "misses": lig}}


TIMING = ("wall (small sizes): CUDA events around N back-to-back calls / N, host time included; hal and torch are "
          "timed side by side (21 rounds, the order alternating; x_torch is the median of the rounds' ratios, "
          "x_torch_paired has its quartiles); device (medium, "
          "large): L2 flushed, GPU held busy by torch.cuda._sleep while event-call-event are enqueued, so the events "
          "bracket GPU time only; median of repeats; no CUDA graph. bwd: autograd.grad(outs, inputs, grad_outs, "
          "retain_graph=True) after one forward (cross_entropy, linear_cross_entropy: forward + backward, field measures)")


def _write(path: Optional[str], doc: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(doc, f, indent=1, default=str)


def eager(args: argparse.Namespace, device: torch.device) -> dict:
    """The ``--eager`` table (see the module docstring)."""
    from tabulate import tabulate
    timer = Timer(device)
    compiler = Compiler(args.compile_budget_s, enabled=device.type == "cuda" and not args.no_compile)
    ceiling = copy_ceiling(timer)
    doc = {"mode": "eager", "environment": environment(device), "copy_ceiling_tbps": ceiling and ceiling / 1e12,
           "timing": TIMING,
           "command": " ".join(sys.argv), "complete": False, "rows": []}
    for kernel in args.kernels:
        for dtype in args.dtypes:
            for size in args.sizes:
                try:
                    case = build_case(kernel, size, dtype, device)
                    doc["rows"] += run_case(case, dtype, size, timer, compiler, args.directions, ceiling)
                except Exception as exc:  # e.g. out of memory: record and go on
                    print(f"{kernel} {dtype} {size}: {type(exc).__name__}: {exc}", flush=True)
                    doc.setdefault("case_errors", []).append(
                        {"kernel": kernel, "dtype": str(dtype), "size": size, "error": f"{type(exc).__name__}: {exc}"})
                case = None
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        doc["compile_seconds"] = compiler.spent_s
        _write(args.json, doc)
    doc["targets"] = targets(doc["rows"])
    doc["linear_cross_entropy_memory"] = {
        f"{r['dtype']} {'x'.join(map(str, r['shape']))}": {**r["peak_mib"], "unit": "MiB, one fwd+bwd, over the inputs"}
        for r in doc["rows"] if r["kernel"] == "linear_cross_entropy" and r["size"] == "large" and "peak_mib" in r}
    doc["complete"] = True
    _write(args.json, doc)
    print(tabulate([[r["kernel"], r["dtype"], "x".join(map(str, r["shape"])), r["direction"], r["timing"],
                     _f(r["hal_us"]), _f(r["torch_us"]), _f(r["liger_us"]), _f(r["compile_us"]),
                     _f(r["x_torch"], 2), _f(r["x_liger"], 2), _f(r["tbps"], 2)] for r in doc["rows"]],
                   headers=["kernel", "dtype", "shape", "dir", "timing", "hal us", "torch us", "liger us",
                            "compile us", "x torch", "x liger", "hal TB/s"]))
    for name, c in doc["targets"].items():
        print(f"{'PASS' if c['pass'] else 'MISS'} {name}" + (f"  misses: {c['misses']}" if c["misses"] else ""))
    return doc


# ---- raw Triton sweep and routing table -------------------------------------------------------------
SWEEP_ROWS = {"cuda": (1, 8, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536), "cpu": (1, 4, 16)}
SWEEP_WIDTH = {"cuda": {"silu_and_mul": 8192, "cross_entropy": 32000, None: 4096},
               "cpu": {"silu_and_mul": 64, "cross_entropy": 100, None: 32}}
#: rounds of the sweep's side-by-side timing (Timer.wall_pair)
SWEEP_ROUNDS = 11
#: calls per backward in a training-mode sweep unit (see the module docstring), up to this many elements
TRAIN_CALLS, TRAIN_CHAIN_MAX_NUMEL = 8, 1 << 24


def train_unit(fn: Callable, inputs: tuple, diff: tuple, calls: int) -> Callable[[], Any]:
    """A no-argument callable: ``calls`` calls of ``fn``, each on its own copy of ``inputs`` (the ``diff``
    ones leaves that require grad), then one ``torch.autograd.grad`` of all their outputs (grad outputs of
    ones, made here) with respect to all those leaves."""
    sets = [tuple(a.detach().clone().requires_grad_() if i in diff else a for i, a in enumerate(inputs))
            for _ in range(calls)]
    wrt = [s[i] for s in sets for i in diff]
    gos = [torch.ones_like(o) for s in sets for o in _outs(fn(*s)) if o.requires_grad]

    def unit():
        outs = [o for s in sets for o in _outs(fn(*s)) if o.requires_grad]
        return torch.autograd.grad(outs, wrt, gos)
    return unit


def min_numel(points: list[tuple[int, float, float]]) -> Optional[int]:
    """``points`` = (numel, triton_us, torch_us); the smallest numel from which Triton is at least as
    fast at every larger measured numel (0 if at all of them, None if not at the largest)."""
    points = sorted(points)
    best: Optional[int] = None
    for numel, tri, tor in reversed(points):
        if tri is None or tor is None or tri > tor:
            break
        best = numel
    if best is not None and best == points[0][0]:
        return 0
    return best


def _sweep_args(op: str, rows: int, width: int, dtype: torch.dtype, device: torch.device):
    """(inputs, diff indices, triton-call adapter, torch fn) for ``op`` at ``rows x width``."""
    def rnd(*s):
        return torch.randn(*s, device=device, dtype=dtype)
    if op in ("softmax", "log_softmax"):
        tfn = torch.softmax if op == "softmax" else torch.log_softmax
        return (rnd(rows, width),), (0,), lambda k, x: k(x, -1), lambda x: tfn(x, -1)
    if op == "layer_norm":
        return ((rnd(rows, width), rnd(width), rnd(width)), (0, 1, 2), lambda k, x, w, b: k(x, (width,), w, b, 1e-5),
                lambda x, w, b: F.layer_norm(x, (width,), w, b, 1e-5))
    if op == "rms_norm":
        return ((rnd(rows, width), rnd(width)), (0, 1), lambda k, x, w: k(x, (width,), w, 1e-6),
                lambda x, w: F.rms_norm(x, (width,), w, 1e-6))
    if op == "add_rms_norm":
        return ((rnd(rows, width), rnd(rows, width), rnd(width)), (0, 1, 2),
                lambda k, x, r, w: k(x, r, (width,), w, 1e-6),
                lambda x, r, w: torch_impl.add_rms_norm(x, r, (width,), w, 1e-6))
    if op == "silu_and_mul":
        return (rnd(rows, width),), (0,), lambda k, x: k(x), torch_impl.silu_and_mul
    if op == "cross_entropy":
        return ((rnd(rows, width), torch.randint(0, width, (rows,), device=device)), (0,),
                lambda k, x, t: k(x, t), lambda x, t: F.cross_entropy(x, t))
    raise ValueError(op)


def raw_triton(args: argparse.Namespace, device: torch.device) -> dict:
    """The ``--raw-triton`` sweep and routing table (see the module docstring)."""
    from tabulate import tabulate

    from hal.backends.cuda.kernels import load, routing
    timer = Timer(device, repeats=5, target_ms=2.0)
    key = "cuda" if device.type == "cuda" else "cpu"
    table: dict = {}
    sweep: list[dict] = []
    # routing.py's table format; ops the sweep does not cover keep the shipped table's default
    doc = {"measured": f"{environment(device)}; wall time per call (events around back-to-back calls), "
                       "triton kernel (routing forced to it) vs torch eager, side by side; train: forward + backward, "
                       f"{TRAIN_CALLS} calls per torch.autograd.grad up to {TRAIN_CHAIN_MAX_NUMEL} elements; "
                       f"{args.sweeps} whole sweeps one after the other, each point's times the medians over them",
           "default": routing.table()["thresholds"].get("softmax/float32/infer"), "ops": table, "sweep": sweep}
    kernels: dict = {}
    with routing.using("triton"):  # the kernels themselves, whatever the shipped table says
        for op in [o for o in args.kernels if o in routing.OPS]:  # the ops the routing table decides
            try:
                kernels[op] = load(op)[0]
            except Exception as exc:
                doc.setdefault("errors", {})[op] = f"{type(exc).__name__}: {exc}"
        points: dict = {}  # (op, dtype, mode, rows) -> the record, its times a list per sweep
        for rep in range(args.sweeps):  # whole sweeps in turn: a slow stretch of the host hits one sweep's points
            for op, kern in kernels.items():
                width = SWEEP_WIDTH[key].get(op, SWEEP_WIDTH[key][None])
                for dtype in args.dtypes:
                    dn = str(dtype).replace("torch.", "")
                    for mode in ("infer", "train"):
                        for rows in SWEEP_ROWS[key]:
                            rec = points.setdefault((op, dn, mode, rows), {
                                "op": op, "dtype": dn, "mode": mode, "rows": rows, "width": width,
                                "numel": rows * width, "triton_us_runs": [], "torch_us_runs": []})
                            _sweep_point(rec, kern, dtype, device, timer)
                            print(f"raw {rep} {op:14s} {dn:8s} {mode:5s} rows {rows:6d} "
                                  f"triton {_f(rec['triton_us_runs'][-1] if rec['triton_us_runs'] else None)} "
                                  f"torch {_f(rec['torch_us_runs'][-1] if rec['torch_us_runs'] else None)} us"
                                  + (f" {rec['error']}" if "error" in rec else ""), flush=True)
                _decide(points, sweep, table)  # on the runs so far: a time limit keeps what was measured
                _write(args.json, doc)
    print(tabulate([[op, dn, m["infer"], m["train"]] for op, d in table.items() for dn, m in d.items()],
                   headers=["op", "dtype", "infer min numel", "train min numel"]))
    return doc


def _decide(points: dict, sweep: list, table: dict) -> None:
    """Refill ``sweep`` (the records) and ``table`` (the thresholds) from ``points``: each point's times are the
    medians of its runs so far, each (op, dtype, mode)'s threshold :func:`min_numel` of those."""
    sweep.clear()
    table.clear()
    by_case: dict = {}
    for (op, dn, mode, _rows), rec in points.items():
        for side in ("triton", "torch"):
            runs = rec[f"{side}_us_runs"]
            rec[f"{side}_us"] = statistics.median(runs) if runs else None
        sweep.append(rec)
        by_case.setdefault((op, dn, mode), []).append((rec["numel"], rec["triton_us"], rec["torch_us"]))
    for (op, dn, mode), pts in by_case.items():
        table.setdefault(op, {}).setdefault(dn, {})[mode] = min_numel(pts)


def _sweep_point(rec: dict, kern: Callable, dtype: torch.dtype, device: torch.device, timer: "Timer") -> None:
    """One side-by-side timing of the kernel and torch at ``rec``'s point, appended to its ``*_us_runs`` (an
    error is kept in ``rec["error"]``)."""
    op, mode, rows, width = rec["op"], rec["mode"], rec["rows"], rec["width"]
    try:
        inputs, diff, call, tfn = _sweep_args(op, rows, width, dtype, device)
        case = Case(op, (rows, width), lambda: inputs, diff, None, None, None, 0, 0)

        def tri(*a, _k=kern, _c=call):
            return _c(_k, *a)
        calls = 1 if mode == "infer" or rows * width > TRAIN_CHAIN_MAX_NUMEL else TRAIN_CALLS
        rec["calls_per_unit"] = calls
        units = [runner(fn, inputs, case, "fwd") if mode == "infer" else train_unit(fn, inputs, diff, calls)
                 for fn in (tri, tfn)]
        # side by side (rounds alternating), as the eager table's small rows
        tri_us, tor_us, _ = timer.wall_pair(*units, rounds=SWEEP_ROUNDS)
        rec["triton_us_runs"].append(tri_us / calls)
        rec["torch_us_runs"].append(tor_us / calls)
    except Exception as exc:
        rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"


# ---- CUDA-graph mode (GPU time, forward) -------------------------------------------------------------------
def graph_us(fn: Callable[[], Any], reps: int = 20) -> float:
    """Median GPU microseconds of ``fn`` captured in a CUDA graph (launch overhead excluded)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(times)


def graphs(args: argparse.Namespace, device: torch.device) -> dict:
    """``--graphs``: forward GPU time of hal vs torch in CUDA graphs, medium and large sizes."""
    rows = []
    for kernel in args.kernels:
        for dtype in args.dtypes:
            for size in [s for s in args.sizes if s != "small"]:
                case = build_case(kernel, size, dtype, device)
                a = case.make()
                row = {"kernel": kernel, "dtype": str(dtype).replace("torch.", ""), "shape": list(case.shape),
                       "size": size, "direction": "fwd", "timing": "cuda graph"}
                for col, fn in (("hal", case.hal), ("torch", case.torch)):
                    try:
                        row[f"{col}_us"] = graph_us(runner(fn, a, case, "fwd"))
                    except Exception as exc:
                        row[f"{col}_us"] = None
                        row.setdefault("errors", {})[col] = f"{type(exc).__name__}: {exc}"
                rows.append(row)
                print(row, flush=True)
                a = case = None
                torch.cuda.empty_cache()
    doc = {"mode": "graphs", "environment": environment(device), "rows": rows}
    _write(args.json, doc)
    return doc


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--eager", dest="mode", action="store_const", const="eager", help="eager table (default)")
    mode.add_argument("--graphs", dest="mode", action="store_const", const="graphs", help="CUDA-graph forward times")
    mode.add_argument("--raw-triton", dest="mode", action="store_const", const="raw",
                      help="Triton kernels vs torch over a size sweep -> routing table")
    p.set_defaults(mode="eager")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--sweeps", type=int, default=3, help="--raw-triton: whole sweeps; each point's median decides")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a tiny dry run")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--sizes", default=",".join(SIZES))
    p.add_argument("--directions", default="fwd,bwd")
    p.add_argument("--compile-budget-s", type=float, default=90.0,
                   help="total seconds spent compiling; later cases get compile_us null")
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args(argv)
    args.dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    args.kernels = args.kernels.split(",")
    args.sizes = args.sizes.split(",")
    args.directions = args.directions.split(",")
    bad = [k for k in args.kernels if k not in KERNELS] + [s for s in args.sizes if s not in SIZES]
    if bad:
        p.error(f"unknown kernel/size {bad}")
    return args


def tuning_start(prog: str, doc: str, quick: tuple, argv=None,
                 options: Optional[Callable[[argparse.ArgumentParser], None]] = None):
    """The tuning scripts' shared start: their options (``--json``, ``--dtypes``, ``--quick``, and what
    ``options`` adds to the parser), then the GPU check. Returns ``(args, timer, liger functional or None)``, or
    exit status 2 after printing the line of :func:`triton_gpu_missing`."""
    ap = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--quick", action="store_true", help=f"shapes {quick} only")
    if options is not None:
        options(ap)
    args = ap.parse_args(argv)
    why = triton_gpu_missing(prog)
    if why:
        print(why, file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    return args, Timer(dev, repeats=7), _liger(dev)


def tuning_cases(args: argparse.Namespace, shapes, variants, case: Callable[..., dict], timer: "Timer", liger: Any):
    """The tuning scripts' case loop: for each dtype of ``--dtypes``, shape ``(m, n)`` of ``shapes`` and variant (an
    op or a direction), yields ``(dtype name, m, n, variant, record)`` with ``record = case(variant, dtype, m, n,
    timer, liger)``; when the caller is done with it, prints the record's JSON line (its plans left out) and frees
    the CUDA cache before the next case."""
    for dn in args.dtypes.split(","):
        dtype = getattr(torch, dn)
        for m, n in shapes:
            for variant in variants:
                rec = case(variant, dtype, m, n, timer, liger)
                yield dn, m, n, variant, rec
                print(json.dumps({k: v for k, v in rec.items() if k != "plans"}), flush=True)
                torch.cuda.empty_cache()


def tuning_end(args: argparse.Namespace, timer: "Timer", rows: list, tuned: dict, label: str) -> int:
    """The tuning scripts' end: prints ``label: <tuned as JSON>`` and writes ``--json`` (environment, timing, the
    case records, the choice). Returns exit status 0."""
    print(f"{label}:", json.dumps(tuned))
    _write(args.json, {"environment": environment(timer.device), "timing": "GPU us per call (bench_kernels device "
                       "timing)", "rows": rows, "tuned": tuned})
    return 0


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max |a - b| / max |b|`` in float64 (a tuning plan's result against the reference plan's)."""
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def time_plans(run: Callable[[Any], Any], named_plans, error: Callable[[Any], float], timer: "Timer",
               nbytes: Optional[int] = None) -> dict:
    """The tuning scripts' plan loop: ``{name: {"us", "rel_err"[, "tbps"]}}`` for each ``(name, plan)``: ``run(plan)``'s
    result checked by ``error`` (its relative error against the reference plan's), then its GPU time
    (:meth:`Timer.device_time`); ``tbps`` when ``nbytes`` (the fewest bytes the op moves) is given. A plan that raises
    gets ``{"error": "<type>: <message>"}`` instead: one failing plan must not lose the others."""
    out: dict = {}
    for name, plan in named_plans:
        try:
            err = error(run(plan))
            us = timer.device_time(lambda _p=plan: run(_p))
            out[name] = {"us": us, "rel_err": err, **({} if nbytes is None else {"tbps": nbytes / us / 1e6})}
        except Exception as exc:
            out[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return out


def candidates(plans: dict, rel_err_ok: float) -> dict:
    """``{plan name: us}`` of a tuning case's plans that ran (``us``) and agree with the reference plan
    (``rel_err`` under ``rel_err_ok``)."""
    return {k: v["us"] for k, v in plans.items() if "us" in v and v["rel_err"] < rel_err_ok}


def geomean_choice(cases: list[tuple[str, dict]]) -> dict:
    """``{group: plan name}`` from ``(group, {plan name: us})`` cases: per group, the plan with the lowest
    geometric mean of time / best time over the group's cases, among the plans timed in all of them (the
    tuning scripts' choice)."""
    import math
    groups: dict = {}
    for key, ok in cases:
        if not ok:
            continue
        best = min(ok.values())
        g = groups.setdefault(key, {})
        for name, us in ok.items():
            g.setdefault(name, []).append(math.log(us / best))
    out = {}
    for key, g in groups.items():
        n_cases = max(len(v) for v in g.values())
        out[key] = min((k for k, v in g.items() if len(v) == n_cases), key=lambda k: sum(g[k]))
    return out


def triton_gpu_missing(prog: str) -> Optional[str]:
    """The one-line reason ``prog`` (a benchmark of the Triton kernels themselves) cannot run here, or
    None: it needs a CUDA device and an importable Triton (the scripts then exit 2)."""
    if not torch.cuda.is_available():
        return f"{prog}: no CUDA device (torch.cuda.is_available() is False)"
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"{prog}: no Triton ({exc})"
    return None


def main(argv=None) -> int:
    args = parse(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_kernels: no CUDA device (torch.cuda.is_available() is False); use --device cpu for a dry run",
              file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if args.device == "cuda":
        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
    torch.manual_seed(0)
    {"eager": eager, "graphs": graphs, "raw": raw_triton}[args.mode](args, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
