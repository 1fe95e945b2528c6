"""Overhead of --precision and --profile on a *program* target (a script run unchanged), issue 17.

Each repeat makes, interleaved (background load hits every variant alike), the real child runs of
``program_sections`` (float64 reference run, shadowed target run, profiled run) on the script:

* ``cold``: ``--precision --profile`` as the audit runs them: the compared window is the program's
  first step (first top-level forward to the first optimizer step: lazy initialisation, first
  allocations and, on a GPU, library handles and kernel loading are in it), next to the profile run's
  *first* plain step, which pays the same one-time costs, and its warmed-up plain steps;
* ``warm``: ``--precision`` with the window opened after one optimizer step (both runs), so the
  shadowed and compared step is a warmed-up one; its shadows are still the process's first (every float64
  kernel loads, every batched call is traced for the first time inside it);
* ``primed``: as ``warm``, and the target also shadows the warm-up step (``precision_prime``: its
  comparisons computed and thrown away), so the window is the second shadowed step: against the warmed-up
  plain step this is the steady-state cost of the comparison (goal <= 4x), as bench_precision.py measures
  it for workloads;
* on a device that computes float64 itself (``--device cuda``), where the float64 shadows and the
  statistics run by default, both windows again with ``HAL_PRECISION_SHADOW_DEVICE=cpu`` (on the CPU);
* profile: the median profiled step against the median plain step of the cold run's profile child
  (plain steps run first, before any profiler); goal <= 1.2x.

The window includes the batched statistics and the float64 shadows computed at its end (``statistics_ms``
and ``shadows_ms`` of it; the rest is the program and the per-op bookkeeping). ``--cprofile PATH`` runs the primed window under
cProfile (``$HAL_PRECISION_CPROFILE``; stats in ``PATH.<pid>``): where that time goes, at cProfile's own cost (its
ratio is then no overhead figure). Prints a tabulate table
(medians and minima over repeats) and writes JSON (``--out``, default
out/bench_program_sections.json). Default script: the CUDA autocast TransformerEncoder fixture,
redirected to the CPU here (``--device mlu``), on the GPU with ``--device cuda``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SCRIPT = os.path.join(HERE, os.pardir, "tests", "fixtures", "precision", "cuda_autocast_train.py")


def _sections(a, precision_warm_steps: int, profile: bool, env: dict, precision: bool = True,
              prime: bool = False) -> tuple:
    from hal.conformance.workload_audit import program_sections
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            s = program_sections({"target": a.script, "kind": "script", "device": a.device, "args": a.script_args,
                                  "steps": a.steps, "precision": precision, "profile": profile, "out": tmp,
                                  "timeout": 900, "precision_warm_steps": precision_warm_steps,
                                  "precision_prime": prime}, [])
            return s, time.perf_counter() - t0
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _timing(section: dict) -> dict:
    return section.get("target", {}).get("timing") or {}


def main(argv=None) -> int:
    from tabulate import tabulate

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--script", default=os.path.normpath(DEFAULT_SCRIPT))
    p.add_argument("--device", default="mlu")
    p.add_argument("--steps", type=int, default=3, help="profiled (and plain) steps; precision runs' bound")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="out/bench_program_sections.json")
    p.add_argument("--no-cpu-shadows", action="store_true",
                   help="on a device that computes float64, skip the windows with the float64 shadows on the CPU")
    p.add_argument("--profile-only", action="store_true",
                   help="only the profile section (its overhead ratio over more repeats, quicker)")
    p.add_argument("--cprofile", metavar="PATH",
                   help="the primed run's compared window under cProfile, its stats written to PATH.<pid> (pstats; "
                        "$HAL_PRECISION_CPROFILE): where its host time goes")
    p.add_argument("script_args", nargs="*", default=["--iters", "20", "--batch", "8", "--seq", "64"])
    a = p.parse_args(argv)
    from hal.conformance.precision.script import ENV_CPROFILE
    if not os.path.isfile(a.script):
        p.error(f"--script {a.script}: no such file")
    rows = []
    for i in range(a.repeats):
        if a.profile_only:
            pf = _sections(a, 0, True, {}, precision=False)[0]["profile"]
            if "step_ms" not in pf:
                p.exit(3, f"{p.prog}: the profile was not produced: {pf.get('error')}\n")
            plain, prof = pf["step_ms"], pf["profiled_step_ms"]
            rows.append({"repeat": i, "plain_step_ms_median": plain["median"], "profiled_step_ms_median": prof["median"],
                         "profile_ratio_median": prof["median"] / plain["median"],
                         "profile_ratio_min": prof["min"] / plain["min"],
                         "device_attribution": pf.get("device_attribution")})
            print(f"repeat {i}: {json.dumps(rows[-1])}", file=sys.stderr)
            continue
        cold, wall = _sections(a, 0, True, {})
        pr, pf = cold["precision"], cold["profile"]
        if "target" not in pr or "step_ms" not in pf:
            p.exit(3, f"{p.prog}: the sections were not produced: precision {pr.get('verdict')}: {pr.get('error')}; "
                      f"profile: {pf.get('error')}\n")
        warm, _ = _sections(a, 1, False, {})
        primed, _ = _sections(a, 1, False, {ENV_CPROFILE: a.cprofile} if a.cprofile else {}, prime=True)
        tc, tw, tp = _timing(pr), _timing(warm["precision"]), _timing(primed["precision"])
        first, plain, prof = pf["first_step_ms"], pf["step_ms"], pf["profiled_step_ms"]
        row = {"repeat": i, "wall_s": wall, "shadow_device": tw.get("shadow_device"),
               "precision_window_ms": tc.get("window_ms"), "statistics_ms": tc.get("statistics_ms"),
               "precision_warm_window_ms": tw.get("window_ms"), "warm_statistics_ms": tw.get("statistics_ms"),
               "plain_first_step_ms": first, "plain_step_ms_median": plain["median"], "plain_step_ms_min": plain["min"],
               "profiled_step_ms_median": prof["median"], "profiled_step_ms_min": prof["min"],
               "precision_vs_first_step": tc["window_ms"] / first,
               "precision_vs_plain_median": tc["window_ms"] / plain["median"],
               "precision_warm_vs_plain_median": tw["window_ms"] / plain["median"] if tw.get("window_ms") else None,
               "precision_primed_window_ms": tp.get("window_ms"), "primed_statistics_ms": tp.get("statistics_ms"),
               "primed_shadows_ms": tp.get("shadows_ms"), "warm_shadows_ms": tw.get("shadows_ms"),
               "precision_primed_vs_plain_median":
                   tp["window_ms"] / plain["median"] if tp.get("window_ms") else None,
               "profile_ratio_median": prof["median"] / plain["median"],
               "profile_ratio_min": prof["min"] / plain["min"],
               "precision_verdict": pr["verdict"], "precision_warm_verdict": warm["precision"].get("verdict"),
               "precision_primed_verdict": primed["precision"].get("verdict")}
        if a.device not in ("cpu", "mlu") and not a.no_cpu_shadows:  # a device that may compute float64: the CPU too
            for tag, env in (("cpu_shadow", {"HAL_PRECISION_SHADOW_DEVICE": "cpu"}),):
                for warm_steps, kind in ((1, "warm"), (0, "cold")):
                    v, _ = _sections(a, warm_steps, False, env)
                    tv = _timing(v["precision"])
                    row.update({f"{tag}_{kind}_window_ms": tv.get("window_ms"),
                                f"{tag}_{kind}_statistics_ms": tv.get("statistics_ms"),
                                f"precision_{kind}_{tag}_vs_plain_median":
                                    tv["window_ms"] / plain["median"] if tv.get("window_ms") else None})
        rows.append(row)
        print(f"repeat {i}: {json.dumps(row)}", file=sys.stderr)
    keys = [("precision_vs_first_step", "cold window / first plain step", ""),
            ("precision_vs_plain_median", "cold window / plain step", ""),
            ("precision_warm_vs_plain_median", "warm window / plain step", ""),
            ("precision_primed_vs_plain_median", "primed warm window (steady state) / plain step", "<= 4"),
            ("precision_warm_cpu_shadow_vs_plain_median", "warm window, float64 on the CPU / plain step", ""),
            ("precision_cold_cpu_shadow_vs_plain_median", "cold window, float64 on the CPU / plain step", ""),
            ("profile_ratio_median", "profiled / plain step (medians)", "<= 1.2"),
            ("profile_ratio_min", "profiled / plain step (minima)", "<= 1.2")]
    keys = [k for k in keys if any(r.get(k[0]) is not None for r in rows)]

    def vals(k):
        return [r[k] for r in rows if r.get(k) is not None]
    table = [[label, f"{statistics.median(vals(k)):.2f}", f"{min(vals(k)):.2f}", goal] for k, label, goal in keys]
    print(tabulate(table, headers=["ratio", f"median of {len(rows)}", "min", "goal"], tablefmt="github"))
    import torch
    doc = {"script": a.script, "args": a.script_args, "device": a.device, "steps": a.steps, "repeats": rows,
           "summary": {k: {"median": statistics.median(vals(k)), "min": min(vals(k))} for k, _, _ in keys},
           "environment": {"python": platform.python_version(), "torch": torch.__version__,
                           "platform": platform.platform(), "cpu_count": os.cpu_count(),
                           "load_avg": os.getloadavg()},
           "method": __doc__}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
