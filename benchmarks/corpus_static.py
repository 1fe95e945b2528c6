"""hal-audit's static audit against torch_gpu2mlu on fetched public programs, line by line.

For each program (a git checkout under ``--corpus``; its commit is recorded) the script copies the
``.py`` files (and counts ``.cu``/``.cuh``) into a temporary folder, then:

- runs ``hal-audit``'s static audit for ``mlu`` (the Python API, same code as the CLI) and takes the
  lines of its CUDA findings (rules in :data:`CUDA_RULES`; float64 / jit-script / triton notes are
  about numerics or tooling, not CUDA-only code, and are left out);
- runs torch_gpu2mlu (``--gpu2mlu``, Cambricon's script) on the copy with an empty stand-in
  ``torch_mlu`` module on ``PYTHONPATH``, in a temporary folder outside this repository, and takes
  the lines its ``report.md`` lists as changed (the added ``import torch_mlu`` lines are not counted);
- checks hal-audit's ``--fix-to device`` and ``--fix-to hal`` patches: ``git apply --check`` and ``patch -p1`` on a fresh copy,
  every patched file compiles, every ``torch.mlu.*``/``torch_mlu.*`` name on a ``+`` line exists in
  ``backends/mlu/mlu_api_symbols.txt``;
- compares both with the ground truth ``reports/corpus/ground_truth.tsv`` (``program path line verdict
  note``; verdict ``cuda`` = the program cannot run correctly on MLU unless that line changes,
  ``no`` = it can). How it was built is in reports/corpus/README.md. A line either tool reports that
  the ground truth lacks is listed as *unadjudicated* (``--draft`` writes them out for review).

Prints a table and writes ``static.json`` and ``static.md`` into ``--out``.

    python benchmarks/corpus_static.py --corpus /work/corpus --gpu2mlu PATH/torch_gpu2mlu.py \\
        [--programs nanoGPT,minGPT,examples,llm.c,DiT,mae] [--out reports/corpus] [--draft FILE]
"""
from __future__ import annotations

import argparse
import collections
import io
import json
import os
import pathlib
import py_compile
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tokenize

from tabulate import tabulate

ROOT = pathlib.Path(__file__).resolve().parents[1]
SKIP = {".git", "__pycache__", "node_modules", ".venv", "venv", "build", "dist"}
CUDA_RULES = {"device-string", "cuda-method", "is-cuda", "cuda-api", "cuda-api-unsupported", "cuda-amp",
              "capability-gate", "nccl-backend", "profiler-cuda", "cudnn-flag", "tf32-flag", "cuda-backend-flag",
              "cpp-extension", "cuda-source", "vendor-import", "to-int", "env-var", "env-var-unknown",
              "reduce-op", "dist-unsupported", "torch-too-new"}
_WORD = re.compile(r"cuda|nccl|gpu|accelerator|local_rank|cudnn|nvtx|cupy", re.I)


def copy_program(src: pathlib.Path, dst: pathlib.Path) -> dict:
    """Copy the .py and CUDA (.cu/.cuh) files of ``src`` to ``dst``; count them."""
    n = collections.Counter()
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP)
        for name in filenames:
            p = pathlib.Path(dirpath, name)
            rel = p.relative_to(src)
            if name.endswith(".py") and p.is_file():
                out = dst / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(p, out)
                n["py"] += 1
                n["lines"] += p.read_bytes().count(b"\n")
            elif name.endswith((".cu", ".cuh")) and p.is_file():
                out = dst / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(p, out)
                n["cu"] += 1
    return dict(n)


def hal_lines(tree: pathlib.Path):
    from hal.conformance.migration import audit_static
    t0 = time.perf_counter()
    res = audit_static(tree, "mlu")
    secs = time.perf_counter() - t0
    lines = {(f.path, f.line) for f in res.findings if f.rule in CUDA_RULES and not f.path.endswith((".cu", ".cuh"))}
    return res, lines, secs


def gpu2mlu_lines(tree: pathlib.Path, script: pathlib.Path, work: pathlib.Path):
    """Run torch_gpu2mlu on ``tree`` (a stand-in torch_mlu on PYTHONPATH); lines its report lists."""
    stub = work / "stub"
    (stub / "torch_mlu").mkdir(parents=True, exist_ok=True)
    (stub / "torch_mlu" / "__init__.py").write_text("")
    env = dict(os.environ, PYTHONPATH=str(stub))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, str(script), "-i", str(tree)], cwd=work, env=env, capture_output=True,
                       text=True, timeout=900)
    secs = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"torch_gpu2mlu failed: {r.stderr[-400:]}")
    report = pathlib.Path(str(tree) + "_mlu") / "report.md"
    lines = set()
    for row in report.read_text(encoding="utf-8", errors="replace").splitlines():
        cols = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cols) >= 3 and cols[0].isdigit() and "import torch_mlu" not in cols[2]:
            path, _, line = cols[1].rpartition(":")
            if line.isdigit():
                lines.add((path, int(line)))
    return lines, secs


def candidate_lines(tree: pathlib.Path) -> set:
    """Code lines (not comments) whose names or strings mention cuda/nccl/gpu/... (for the reviewer)."""
    out = set()
    for p in tree.rglob("*.py"):
        rel = p.relative_to(tree).as_posix()
        try:
            toks = list(tokenize.tokenize(io.BytesIO(p.read_bytes()).readline))
        except (tokenize.TokenError, SyntaxError, UnicodeDecodeError):
            continue
        for t in toks:
            if t.type in (tokenize.NAME, tokenize.STRING) and _WORD.search(t.string):
                if t.type == tokenize.STRING and t.string.lstrip("rbuRBUfF").startswith(('"""', "'''")):
                    continue  # docstrings
                out.add((rel, t.start[0]))
    return out


def check_patch(tree: pathlib.Path, res, work: pathlib.Path, symbols: frozenset, flavour: str = "device") -> dict:
    """Apply the ``flavour`` patch with git apply --check and patch -p1 on a copy; compile; check names."""
    from hal.conformance.migration.symbols import missing_symbols
    data = res.patch_bytes(flavour)
    pf = work / f"{flavour}.patch"
    pf.write_bytes(data)
    out = {"files": len(res.patched(flavour)), "bytes": len(data)}
    dst = work / f"patched-{flavour}"
    shutil.copytree(tree, dst)
    g = subprocess.run(["git", "apply", "--check", str(pf)], cwd=dst, capture_output=True, text=True)
    out["git_apply"] = g.returncode == 0
    p = subprocess.run(["patch", "-p1", "--batch", "-s", "-i", str(pf)], cwd=dst, capture_output=True, text=True)
    out["patch_p1"] = p.returncode == 0
    bad = []
    for rel in res.patched(flavour):
        try:
            py_compile.compile(str(dst / rel), doraise=True, cfile=str(work / "x.pyc"))
        except py_compile.PyCompileError as exc:
            bad.append(f"{rel}: {str(exc).splitlines()[-1][:120]}")
    # files that did not compile before the patch are not the patch's fault
    pre = []
    for rel in res.patched(flavour):
        try:
            py_compile.compile(str(tree / rel), doraise=True, cfile=str(work / "y.pyc"))
        except py_compile.PyCompileError:
            pre.append(rel)
    out["compile_errors"] = [b for b in bad if b.split(":")[0] not in pre]
    text = data.decode("utf-8", errors="replace")
    missing = sorted({m for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++")
                      for m in missing_symbols(ln, symbols)})
    out["missing_symbols"] = missing
    return out


def load_truth(path: pathlib.Path) -> dict:
    truth = {}
    if not path.exists():
        return truth
    for row in path.read_text(encoding="utf-8").splitlines():
        if not row.strip() or row.startswith("#"):
            continue
        cols = row.split("\t")
        truth[(cols[0], cols[1], int(cols[2]))] = (cols[3], cols[4] if len(cols) > 4 else "")
    return truth


def source_line(tree: pathlib.Path, rel: str, line: int) -> str:
    try:
        return tree.joinpath(rel).read_text(encoding="utf-8", errors="replace").splitlines()[line - 1].strip()
    except (OSError, IndexError):
        return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default="/work/corpus")
    ap.add_argument("--gpu2mlu", required=True, help="path to torch_gpu2mlu.py")
    ap.add_argument("--gpu2mlu-commit", default="", help="the torch_mlu commit the script was read from")
    ap.add_argument("--programs", default="nanoGPT,minGPT,examples,llm.c,DiT,mae")
    ap.add_argument("--truth", default=str(ROOT / "reports" / "corpus" / "ground_truth.tsv"))
    ap.add_argument("--out", default=str(ROOT / "reports" / "corpus"))
    ap.add_argument("--draft", help="write lines needing a verdict (tab-separated) to this file")
    args = ap.parse_args(argv)
    from hal.conformance.migration.rules import load_rules
    symbols = load_rules("mlu").api_symbols
    truth = load_truth(pathlib.Path(args.truth))
    rows, detail, drafts = [], {}, []
    tot = collections.Counter()
    for name in args.programs.split(","):
        src = pathlib.Path(args.corpus) / name
        commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        with tempfile.TemporaryDirectory(prefix="corpus_static_") as tmp:
            work = pathlib.Path(tmp)
            tree = work / name
            counts = copy_program(src, tree)
            res, hal, hal_s = hal_lines(tree)
            g2m, g2m_s = gpu2mlu_lines(tree, pathlib.Path(args.gpu2mlu), work)
            cands = candidate_lines(tree)
            patch = check_patch(tree, res, work, symbols, "device")
            patch_hal = check_patch(tree, res, work, symbols, "hal")
            cuda_truth = {(p, ln) for (prog, p, ln), (v, _) in truth.items() if prog == name and v == "cuda"}
            judged = {(p, ln) for (prog, p, ln) in truth if prog == name}
            for key in sorted((hal | g2m | cands) - judged):
                drafts.append("\t".join([name, key[0], str(key[1]),
                                         "hal" if key in hal else "", "gpu2mlu" if key in g2m else "",
                                         source_line(tree, *key)]))
            r = {"program": name, "commit": commit, "py_files": counts.get("py", 0),
                 "lines": counts.get("lines", 0), "cu_files": counts.get("cu", 0),
                 "cuda_lines": len(cuda_truth),
                 "hal_found": len(hal & cuda_truth), "hal_missed": len(cuda_truth - hal),
                 "hal_false": len({k for k in hal if truth.get((name, *k), ("?",))[0] == "no"}),
                 "g2m_found": len(g2m & cuda_truth), "g2m_missed": len(cuda_truth - g2m),
                 "g2m_false": len({k for k in g2m if truth.get((name, *k), ("?",))[0] == "no"}),
                 "unadjudicated": len((hal | g2m) - judged),
                 "hal_cu_flagged": sum(1 for f in res.findings if f.rule == "cuda-source"
                                       and f.path.endswith((".cu", ".cuh"))),
                 "patch": patch, "patch_hal": patch_hal, "hal_seconds": round(hal_s, 3), "g2m_seconds": round(g2m_s, 3)}
            detail[name] = {
                "hal_missed": sorted(f"{p}:{ln}  {source_line(tree, p, ln)}" for p, ln in cuda_truth - hal),
                "hal_false": sorted(f"{p}:{ln}  {source_line(tree, p, ln)}" for p, ln in hal
                                    if truth.get((name, p, ln), ("?",))[0] == "no"),
                "g2m_missed": sorted(f"{p}:{ln}" for p, ln in cuda_truth - g2m)}
            rows.append(r)
            for k in ("py_files", "lines", "cu_files", "cuda_lines", "hal_found", "hal_missed", "hal_false",
                      "g2m_found", "g2m_missed", "g2m_false", "unadjudicated", "hal_cu_flagged"):
                tot[k] += r[k]
    headers = ["program", "commit", ".py", "lines", ".cu (hal flags)", "CUDA lines", "hal found", "hal missed", "hal false",
               "gpu2mlu found", "gpu2mlu missed", "gpu2mlu false", "unjudged",
               "patch applies git/patch (device; hal)", "compiles (device; hal)", "symbols exist"]
    table = []
    for r in rows:
        p, ph = r["patch"], r["patch_hal"]
        table.append([r["program"], r["commit"][:10], r["py_files"], r["lines"], f'{r["cu_files"]} ({r["hal_cu_flagged"]})',
                      r["cuda_lines"],
                      r["hal_found"], r["hal_missed"], r["hal_false"], r["g2m_found"], r["g2m_missed"],
                      r["g2m_false"], r["unadjudicated"],
                      f"{p['git_apply']}/{p['patch_p1']}; {ph['git_apply']}/{ph['patch_p1']}",
                      f"{not p['compile_errors']}; {not ph['compile_errors']}", not p["missing_symbols"]])
    table.append(["total", "", tot["py_files"], tot["lines"], f'{tot["cu_files"]} ({tot["hal_cu_flagged"]})',
                  tot["cuda_lines"], tot["hal_found"],
                  tot["hal_missed"], tot["hal_false"], tot["g2m_found"], tot["g2m_missed"], tot["g2m_false"],
                  tot["unadjudicated"], "", "", ""])
    md = tabulate(table, headers, tablefmt="github")
    print(md)
    share = tot["hal_missed"] / tot["cuda_lines"] if tot["cuda_lines"] else 0.0
    print(f"hal-audit missed {tot['hal_missed']}/{tot['cuda_lines']} = {share:.1%}; "
          f"torch_gpu2mlu missed {tot['g2m_missed']}/{tot['cuda_lines']}")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from hal.environment import fingerprint
    doc = {"schema": "hal-corpus-static/1", "rows": rows, "totals": dict(tot), "missed_share": round(share, 4),
           "detail": detail, "gpu2mlu": {"script": str(args.gpu2mlu), "commit": args.gpu2mlu_commit},
           "environment": fingerprint()}
    (out / "static.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out / "static.md").write_text(
        "# Static audit on public programs: hal-audit vs torch_gpu2mlu\n\n"
        "Generated by `benchmarks/corpus_static.py`; ground truth and method in README.md.\n\n" + md + "\n")
    if args.draft:
        pathlib.Path(args.draft).write_text("\n".join(drafts) + "\n")
        print(f"{len(drafts)} lines need a verdict -> {args.draft}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
