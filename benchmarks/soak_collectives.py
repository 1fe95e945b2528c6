"""Soak `hal collectives`: run it N times and count hangs, failures and time per run.

A conformance command that hangs at random is worse than one that fails, so this script runs the
real command (`hal collectives --device DEV --world-size W --format json`) again and again, each in
its own process group with a wall-clock bound, and classifies every run:

- ``pass``  exit 0 and ``"passed": true`` in the JSON;
- ``fail``  the command finished but some row failed (the failing rows are kept);
- ``hang``  the command did not finish within ``--bound`` seconds (its process group is killed);
- ``error`` anything else (non-JSON output, a crash), with the tail of stderr;
- ``noise`` the command passed but wrote something unexpected to stderr, such as
  ``terminate called without an active exception`` at exit (counted separately, not a failure).

Usage::

    python benchmarks/soak_collectives.py --runs 50 [--device cpu] [--world-size 2] [--json out.json]

Prints a table (counts and run-time median/p90/max) and writes JSON with every run.
Exit code 0 when every run passed, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

from tabulate import tabulate

#: stderr lines that are expected on a passing run (torch's own warnings), never counted as noise
_BENIGN = ("UserWarning", "warnings.warn", "FutureWarning")


def _hal_command() -> list[str]:
    exe = shutil.which("hal", path=os.path.dirname(sys.executable)) or shutil.which("hal")
    return [exe] if exe else [sys.executable, "-m", "hal.cli.main"]


def one_run(cmd: list[str], bound: float) -> dict:
    """Run ``cmd`` once in a new session; returns ``{outcome, seconds, exit_code, detail}``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return {"outcome": "hang", "seconds": time.perf_counter() - t0, "exit_code": None,
                "detail": f"no exit within {bound:g} s"}
    seconds = time.perf_counter() - t0
    text = err.decode(errors="replace")
    noise = [ln for ln in text.splitlines() if ln.strip() and not any(b in ln for b in _BENIGN)
             and not ln.startswith("  ")]
    try:
        report = json.loads(out)
    except ValueError:
        return {"outcome": "error", "seconds": seconds, "exit_code": proc.returncode,
                "detail": (text.strip().splitlines() or ["no output"])[-1][:300]}
    if proc.returncode == 0 and report.get("passed"):
        outcome = "noise" if noise else "pass"
        return {"outcome": outcome, "seconds": seconds, "exit_code": 0, "detail": "; ".join(noise)[:300]}
    failed = [f"{r['collective']}/{r['dtype']}/{r['op']}: {r['detail']}" for r in report.get("rows", [])
              if r.get("status") == "fail"]
    return {"outcome": "fail", "seconds": seconds, "exit_code": proc.returncode, "detail": "; ".join(failed)[:300]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=50, help="how many runs (default: 50)")
    ap.add_argument("--device", default="cpu", help="backend (default: cpu)")
    ap.add_argument("--world-size", type=int, default=2, help="processes per run (default: 2)")
    ap.add_argument("--timeout", type=float, default=20.0,
                    help="the collectives' own --timeout in seconds (default: 20)")
    ap.add_argument("--bound", type=float, default=120.0,
                    help="seconds after which a run counts as hung and is killed (default: 120)")
    ap.add_argument("--json", help="write every run and the summary here")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.bound <= 0:
        ap.error("--runs must be >= 1 and --bound > 0")

    import torch  # only for the record of which torch ran
    cmd = _hal_command() + ["collectives", "--device", args.device, "--world-size", str(args.world_size),
                            "--timeout", str(args.timeout), "--format", "json"]
    runs = []
    for i in range(args.runs):
        r = one_run(cmd, args.bound)
        runs.append(r)
        print(f"run {i + 1:3d}/{args.runs}: {r['outcome']:5s} {r['seconds']:6.2f} s  {r['detail'][:100]}",
              flush=True)
    counts = {k: sum(r["outcome"] == k for r in runs) for k in ("pass", "noise", "fail", "hang", "error")}
    secs = sorted(r["seconds"] for r in runs)
    summary = {"runs": len(runs), **counts, "median_s": statistics.median(secs),
               "p90_s": secs[min(len(secs) - 1, int(0.9 * len(secs)))], "max_s": secs[-1]}
    print(tabulate([[f"{summary['runs']}", counts["pass"], counts["noise"], counts["fail"], counts["hang"],
                     counts["error"], f"{summary['median_s']:.2f}", f"{summary['p90_s']:.2f}",
                     f"{summary['max_s']:.2f}"]],
                   headers=["runs", "pass", "noise", "fail", "hang", "error", "median s", "p90 s", "max s"]))
    print(f"torch {torch.__version__}, device {args.device}, world size {args.world_size}, bound {args.bound:g} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"command": cmd, "torch": torch.__version__, "summary": summary, "runs": runs}, fh, indent=2)
    return 0 if counts["pass"] + counts["noise"] == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
