"""Start-up time of ``import hal``, ``hal backends`` and ``hal-audit x.py --device cpu`` (wall clock).

Each command runs as a fresh process: ``--warmup`` runs first (not timed; they also fill the plugin
probe cache), then ``--repeats`` timed runs; the table shows the median and the minimum. A command
still running after ``--limit`` seconds is killed and shown as a timeout. ``with hostile plugins``
rows put benchmarks/hostile_plugins.py's distributions (probe hangs, exits, prints, a second
``cpu``...) on PYTHONPATH.

    python benchmarks/bench_startup.py --label after [--out out/bench_startup-after.json]
    python benchmarks/bench_startup.py --compare out/bench_startup-before.json out/bench_startup-after.json
    python benchmarks/bench_startup.py --baseline /path/to/old/venv/bin/python --out out/bench_startup.json

``--baseline`` runs every command for that interpreter (another checkout's venv) and for this one,
alternating run by run so that both see the same machine load, and prints them side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import hostile_plugins  # noqa: E402

def _commands(tmp: Path, python: str = sys.executable) -> list[tuple[str, list[str], bool]]:
    BIN = Path(python).parent
    script = tmp / "x.py"
    script.write_text("import torch\nprint(torch.ones(2).sum().item())\n")
    out = str(tmp / "audit-out")
    return [
        ("python -c 'import torch' (the yardstick)", [python, "-c", "import torch"], False),
        ("hal --help", [str(BIN / "hal"), "--help"], False),
        ("hal-audit --help", [str(BIN / "hal-audit"), "--help"], False),
        ("import hal", [python, "-c", "import hal"], False),
        ("hal backends --format json", [str(BIN / "hal"), "backends", "--format", "json"], False),
        ("hal-audit x.py --device cpu --static-only", [str(BIN / "hal-audit"), str(script), "--device", "cpu",
                                                      "--static-only", "--out", out], False),
        ("hal-audit x.py --device cpu", [str(BIN / "hal-audit"), str(script), "--device", "cpu", "--out", out], False),
        ("import hal (with hostile plugins)", [python, "-c", "import hal"], True),
        ("hal backends --format json (with hostile plugins)", [str(BIN / "hal"), "backends", "--format", "json"],
         True),
        ("hal-audit x.py --device cpu (with hostile plugins)", [str(BIN / "hal-audit"), str(script), "--device",
                                                                "cpu", "--out", out], True),
    ]


FAILURES: list = []


def _time(cmd: list[str], env: dict, limit: float) -> float:
    t0 = time.perf_counter()
    try:
        # cwd: a neutral folder, so that `python -c` never imports a checkout's `hal/` from the cwd
        p = subprocess.run(cmd, env=env, capture_output=True, timeout=limit, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return float("inf")
    dt = time.perf_counter() - t0
    if p.returncode != 0:  # timed all the same; reported in the row's "failed" list
        FAILURES.append({"command": " ".join(cmd), "exit": p.returncode, "stderr": p.stderr.decode()[-300:]})
        print(f"warning: {' '.join(cmd)} exited {p.returncode}: {p.stderr.decode()[-300:]}", file=sys.stderr)
    return dt


def measure(label: str, warmup: int, repeats: int, limit: float, only: str = "") -> dict:
    rows = []
    with tempfile.TemporaryDirectory(prefix="hal-bench-startup-") as d:
        tmp = Path(d)
        site = hostile_plugins.build_site(tmp / "plugins")
        plain = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache")}
        hostile = hostile_plugins.site_env(site)
        for name, cmd, use_hostile in _commands(tmp):
            if only and only not in name:
                continue
            env = hostile if use_hostile else plain
            times = [_time(cmd, env, limit) for _ in range(warmup)]
            if times and times[-1] == float("inf"):
                rows.append({"command": name, "median_s": None, "min_s": None, "timeout": True, "n": 0})
                print(f"{name}: timed out after {limit} s", flush=True)
                continue
            times = [_time(cmd, env, limit) for _ in range(repeats)]
            finite = [t for t in times if t != float("inf")]
            rows.append({"command": name, "median_s": round(statistics.median(times), 3) if finite else None,
                         "min_s": round(min(finite), 3) if finite else None,
                         "timeout": len(finite) < len(times), "n": len(times)})
            print(f"{name}: median {rows[-1]['median_s']} s", flush=True)
    return {"label": label, "environment": {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                                            "loadavg": os.getloadavg()}, "results": rows}


def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    if r["median_s"] is None:
        return "timeout"
    return f"{r['median_s']:.3f} (min {r['min_s']:.3f})" + (" some timed out" if r["timeout"] else "")


def compare(paths: list[str]) -> None:
    from tabulate import tabulate
    docs = [json.loads(Path(p).read_text()) for p in paths]
    names = []
    for doc in docs:
        names += [r["command"] for r in doc["results"] if r["command"] not in names]
    table = [[n] + [_cell({r["command"]: r for r in doc["results"]}.get(n)) for doc in docs] for n in names]
    print(tabulate(table, headers=["command (seconds, median)"] + [d["label"] for d in docs]))


def measure_pair(baseline: str, warmup: int, repeats: int, limit: float, only: str = "") -> list[dict]:
    """Both interpreters, alternating run by run; returns two result documents (before, after)."""
    docs = []
    with tempfile.TemporaryDirectory(prefix="hal-bench-startup-") as d:
        tmp = Path(d)
        site = hostile_plugins.build_site(tmp / "plugins")
        for k in ("b", "a"):
            (tmp / k).mkdir()
        sides = {"before": _commands(tmp / "b", baseline), "after": _commands(tmp / "a", sys.executable)}
        rows: dict = {"before": [], "after": []}
        for i, (name, _cmd, use_hostile) in enumerate(sides["after"]):
            if only and only not in name:
                continue
            envs = {k: ({**hostile_plugins.site_env(site), "XDG_CACHE_HOME": str(tmp / k / "hcache")} if use_hostile
                        else {**os.environ, "XDG_CACHE_HOME": str(tmp / k / "cache")}) for k in sides}
            times: dict = {k: [] for k in sides}
            dead = {k: False for k in sides}
            for _ in range(warmup):
                for k in sides:
                    if not dead[k]:
                        dead[k] = _time(sides[k][i][1], envs[k], limit) == float("inf")
            for _ in range(repeats):
                for k in sides:
                    if not dead[k]:
                        times[k].append(_time(sides[k][i][1], envs[k], limit))
            for k in sides:
                finite = [t for t in times[k] if t != float("inf")]
                rows[k].append({"command": name, "median_s": round(statistics.median(times[k]), 3) if finite else None,
                                "min_s": round(min(finite), 3) if finite else None,
                                "timeout": dead[k] or len(finite) < len(times[k]), "n": len(times[k])})
            print(f"{name}: before {_cell(rows['before'][-1])}, after {_cell(rows['after'][-1])}", flush=True)
    env = {"python": platform.python_version(), "cpu_count": os.cpu_count(), "loadavg_end": os.getloadavg(),
           "baseline": baseline, "current": sys.executable, "limit_s": limit, "warmup": warmup, "repeats": repeats}
    for k in ("before", "after"):
        docs.append({"label": k, "environment": env, "results": rows[k], "failures": FAILURES})
    return docs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", default="current")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--limit", type=float, default=60.0, help="seconds before a run counts as a timeout")
    ap.add_argument("--only", default="", help="run only the commands whose name contains this text")
    ap.add_argument("--merge-into", metavar="JSON", help="replace/add these rows in an earlier result file")
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs="+", metavar="JSON")
    ap.add_argument("--baseline", metavar="PYTHON", help="also time another checkout's interpreter, interleaved")
    a = ap.parse_args()
    if a.compare:
        compare(a.compare)
        return
    if a.baseline:
        docs = measure_pair(a.baseline, a.warmup, a.repeats, a.limit, a.only)
        out = Path(a.out or "out/bench_startup.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        paths = []
        for doc in docs:
            p = out.with_name(f"{out.stem}-{doc['label']}{out.suffix}")
            p.write_text(json.dumps(doc, indent=2))
            paths.append(str(p))
        compare(paths)
        print("wrote " + ", ".join(paths))
        return
    doc = measure(a.label, a.warmup, a.repeats, a.limit, a.only)
    if a.merge_into:
        old = json.loads(Path(a.merge_into).read_text())
        new = {r["command"]: r for r in doc["results"]}
        doc["results"] = [new.pop(r["command"], r) for r in old["results"]] + list(new.values())
    out = Path(a.out or a.merge_into or f"out/bench_startup-{a.label}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2))
    compare([str(out)])
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
