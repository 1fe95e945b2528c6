"""Static audit throughput: lines/s of the hal-audit scan and of patch generation, on one core.

Builds a large tree in a temporary folder from real-looking code: the bundled CUDA programs
(examples/cuda_train.py, examples/migration/*.py) replicated with renamed functions and varied
constants, mixed with real PyTorch source (torch/nn, torch/optim and torch/distributed modules of
the installed torch, which are large, idiomatic files with few CUDA calls). Then times, after a
warm-up, the median of ``--repeats`` runs of:

- ``ast.parse`` alone (the floor any parser-based audit pays),
- the full static audit (walk + read + parse + rules) = the scan figure,
- patch generation for ``--fix-to device`` and ``--fix-to hal`` (on the scanned result),
- libcst parse + QualifiedNameProvider/PositionProvider resolution on a sample (why the scan uses ast).

The process is pinned to one CPU core where the OS allows it. Prints a table, writes JSON.

    python benchmarks/bench_static_audit.py [--lines 60000] [--repeats 5] [--out out/bench_static_audit.json]
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

from tabulate import tabulate

ROOT = pathlib.Path(__file__).resolve().parents[1]


def big_file(n_lines: int) -> str:
    """A generated single module of about ``n_lines`` lines: a CUDA training step repeated, one in
    four lines needing a fix (device strings, .cuda(), torch.cuda.*, integer ranks, nccl)."""
    head = ("import os\nimport torch\nimport torch.distributed as dist\n\n"
            "local_rank = int(os.environ.get('LOCAL_RANK', '0'))\nbackend = 'nccl'\n\n")
    block = ("def step_{i}(model, x):\n"
             "    x = x.to('cuda:0')\n"
             "    y = model(x).cuda()\n"
             "    torch.cuda.synchronize()\n"
             "    z = y.to(local_rank)\n"
             "    w = z * {i}\n"
             "    v = w + 1\n"
             "    return v.sum()\n\n")
    n_blocks = max(1, (n_lines - 7) // 9)
    return head + "".join(block.format(i=i) for i in range(n_blocks)) + "dist.init_process_group(backend)\n"


def big_file_fix(n_lines: int, device: str, rules, rows: list) -> dict:
    """Time audit + patch of one generated ``n_lines`` file (the --fix cost must be linear in file size)."""
    from hal.conformance.migration import audit_static
    out = {}
    with tempfile.TemporaryDirectory(prefix="hal-bench-big-") as tmp:
        path = pathlib.Path(tmp, "big.py")
        for n in (n_lines // 4, n_lines):
            path.write_text(big_file(n))
            lines = path.read_text().count("\n")
            c0 = time.process_time()
            t0 = time.perf_counter()
            res = audit_static(path, device, rules)
            t1 = time.perf_counter()
            patch = res.patch_bytes("device")
            t2 = time.perf_counter()
            res.patch_bytes("hal")
            t3 = time.perf_counter()
            cpu = time.process_time() - c0
            out[str(lines)] = {"lines": lines, "findings": len(res.findings), "scan_s": t1 - t0, "cpu_s": cpu,
                               "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
                               "patch_device_s": t2 - t1, "patch_hal_s": t3 - t2, "total_s": t3 - t0,
                               "patch_bytes": len(patch)}
            rows.append([f"--fix on one {lines:,}-line file (scan + both patches; CPU {cpu:.1f} s)", lines,
                         f"{t3 - t0:.3f}", "", f"{lines / (t3 - t0):,.0f}"])
    big = out[max(out, key=int)]
    big["goal_s"] = 30.0
    big["meets_goal"] = big["total_s"] < 30.0
    big["meets_goal_cpu"] = big["cpu_s"] < 30.0
    return out


def build_tree(dest: pathlib.Path, target_lines: int) -> dict:
    """Write the benchmark tree; returns counts of files and lines per source kind."""
    import torch
    cuda_sources = [ROOT / "examples" / "cuda_train.py", *sorted((ROOT / "examples" / "migration").glob("*.py"))]
    torch_dir = pathlib.Path(torch.__file__).parent
    real_sources = sorted([*torch_dir.glob("nn/modules/*.py"), *torch_dir.glob("optim/*.py"),
                           *torch_dir.glob("distributed/*.py")])
    real_sources = [p for p in real_sources if p.stat().st_size < 400_000]
    counts = {"cuda_files": 0, "cuda_lines": 0, "torch_files": 0, "torch_lines": 0}
    total, i = 0, 0
    while total < target_lines:
        for src in cuda_sources:  # CUDA programs, renamed and varied per copy
            text = src.read_text()
            tree = ast.parse(text)
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    text = text.replace(f"def {node.name}(", f"def {node.name}_{i}(")
            text = text.replace("default=20", f"default={20 + i}").replace("lr=1e-3", f"lr={1e-3 * (1 + i % 7):.4g}")
            out = dest / f"project_{i:03d}" / "cuda" / src.name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
            n = text.count("\n")
            counts["cuda_files"] += 1
            counts["cuda_lines"] += n
            total += n
        for src in real_sources[i % len(real_sources):][:1]:  # about as many lines as the CUDA copies
            text = src.read_text()
            out = dest / f"project_{i:03d}" / "lib" / src.name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
            n = text.count("\n")
            counts["torch_files"] += 1
            counts["torch_lines"] += n
            total += n
        i += 1
    counts["files"] = counts["cuda_files"] + counts["torch_files"]
    counts["lines"] = counts["cuda_lines"] + counts["torch_lines"]
    return counts


def timed(fn, repeats: int, warmup: int = 1) -> list:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=60000, help="approximate size of the generated tree")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--libcst-lines", type=int, default=5000, help="size of the libcst comparison sample")
    ap.add_argument("--device", default="mlu")
    ap.add_argument("--out", default="out/bench_static_audit.json")
    ap.add_argument("--big-lines", type=int, default=200000,
                    help="also time --fix on one generated file of this many lines (0: skip)")
    args = ap.parse_args()

    pinned = None
    if hasattr(os, "sched_setaffinity"):
        try:
            core = min(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {core})
            pinned = core
        except OSError:
            pinned = None

    from hal.conformance.migration import audit_static, load_rules
    from hal.environment import fingerprint
    rules = load_rules(args.device)
    rows, result = [], {}
    with tempfile.TemporaryDirectory(prefix="hal-bench-audit-") as tmp:
        tree = pathlib.Path(tmp)
        counts = build_tree(tree, args.lines)
        files = sorted(tree.rglob("*.py"))
        sources = [p.read_text() for p in files]
        lines = sum(s.count("\n") for s in sources)

        parse_t = timed(lambda: [ast.parse(s) for s in sources], args.repeats)
        holder = {}

        def scan():
            holder["res"] = audit_static(tree, args.device, rules)

        scan_t = timed(scan, args.repeats)
        res = holder["res"]
        patch_dev_t = timed(lambda: res.patch("device"), args.repeats)
        patch_hal_t = timed(lambda: res.patch("hal"), args.repeats)
        patch_dev, patch_hal = res.patch("device"), res.patch("hal")

        libcst_row = None
        try:
            import libcst as cst
            from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider
            sample, n = [], 0
            for s in sources:
                if n >= args.libcst_lines:
                    break
                sample.append(s)
                n += s.count("\n")

            def libcst_resolve():
                for s in sample:
                    w = MetadataWrapper(cst.parse_module(s))
                    w.resolve(QualifiedNameProvider)
                    w.resolve(PositionProvider)

            lc_t = timed(libcst_resolve, max(1, min(3, args.repeats)))
            libcst_row = {"lines": n, "median_s": statistics.median(lc_t), "version": cst.__version__ if hasattr(
                cst, "__version__") else "unknown"}
        except ImportError as exc:  # pragma: no cover
            libcst_row = {"error": str(exc)}

    def row(name, ts, n):
        med = statistics.median(ts)
        rows.append([name, n, f"{med:.3f}", f"{min(ts):.3f}", f"{n / med:,.0f}"])
        return {"lines": n, "median_s": med, "min_s": min(ts), "runs_s": ts, "lines_per_s": n / med}

    result["ast_parse_only"] = row("ast.parse only (floor)", parse_t, lines)
    result["scan"] = row("static audit scan (walk+read+parse+rules)", scan_t, lines)
    result["patch_device"] = row("patch --fix-to device", patch_dev_t, lines)
    result["patch_hal"] = row("patch --fix-to hal", patch_hal_t, lines)
    if libcst_row and "median_s" in libcst_row:
        libcst_row["lines_per_s"] = libcst_row["lines"] / libcst_row["median_s"]
        rows.append(["libcst parse + qualified names + positions", libcst_row["lines"],
                     f"{libcst_row['median_s']:.3f}", "", f"{libcst_row['lines_per_s']:,.0f}"])
    result["libcst_metadata"] = libcst_row
    if args.big_lines:
        result["big_file_fix"] = big_file_fix(args.big_lines, args.device, rules, rows)
    print(tabulate(rows, headers=["stage", "lines", "median s", "min s", "lines/s"]))
    sev = {}
    for f in res.findings:
        sev[f.severity] = sev.get(f.severity, 0) + 1
    summary = {"tree": counts, "files_scanned": res.files, "lines_scanned": res.lines, "findings": len(res.findings),
               "by_severity": sev, "patch_bytes": {"device": len(patch_dev), "hal": len(patch_hal)},
               "goal_lines_per_s": 20000, "floor_lines_per_s": 5000,
               "meets_goal": result["scan"]["lines_per_s"] >= 20000}
    print(f"tree: {counts['files']} files, {counts['lines']} lines ({counts['cuda_lines']} CUDA-program lines, "
          f"{counts['torch_lines']} lines of torch's own source); {len(res.findings)} findings {sev}; "
          f"pinned to core {pinned}")
    print(f"scan: {result['scan']['lines_per_s']:,.0f} lines/s on one core (goal 20,000; floor 5,000)")
    payload = {"benchmark": "bench_static_audit", "device_rules": args.device, "repeats": args.repeats, "warmup": 1,
               "timing": "time.perf_counter, median of repeats after 1 warm-up run", "pinned_core": pinned,
               "results": result, "summary": summary, "environment": fingerprint(include_devices=False)}
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
