"""Fuzz the static analyser with generated and mutated Python sources.

Inputs: mutations of real sources (the bundled CUDA examples, the test programs, and torch's own
modules) — line deletion, duplication, swaps, identifier replacement with CUDA names, insertion of
CUDA snippets, truncation, byte flips, splicing two files — plus sources generated from a small
grammar of device-specific expressions. For every input that Python parses, the properties are:
the scan never raises; both patches (``--fix-to device`` and ``--fix-to hal``) are produced without
raising and the patched file still parses. Inputs that do not parse must be rejected by the same
``ast.parse`` the audit uses (reported as a syntax error, never a crash).

    python benchmarks/fuzz_static.py [--n 20000] [--seed 0] [--out out/fuzz_static.json]
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import random
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CUDA_WORDS = ["cuda", "torch.cuda", "nccl", "'cuda:0'", '"cuda"', "torch.cuda.synchronize", "x.cuda()",
              "torch.float64", "torch.double", "dist.ReduceOp.BXOR", "os.environ['CUDA_VISIBLE_DEVICES']",
              "torch.backends.cudnn.benchmark", "apex", "flash_attn", "torch.cuda.amp.autocast"]
SNIPPETS = [
    "x = torch.ones(3, device='cuda:1')", "y = x.cuda(non_blocking=True)", "torch.cuda.synchronize()",
    "with torch.cuda.amp.autocast(dtype=torch.bfloat16):\n    pass", "scaler = torch.cuda.amp.GradScaler()",
    "dist.init_process_group('nccl', init_method='env://')", "z = x.to(0)", "w = x.double()",
    "os.environ['NCCL_DEBUG'] = 'INFO'", "from torch.utils.cpp_extension import CUDAExtension",
    "import apex.optimizers as ao", "if torch.cuda.get_device_capability()[0] >= 8:\n    pass",
    "s = torch.cuda.Stream(); e = torch.cuda.Event(enable_timing=True)", "m = torch.jit.script(m)",
    "torch.backends.cuda.matmul.allow_tf32 = True", "dist.all_reduce(t, op=dist.ReduceOp.BAND)",
    "t = torch.tensor([1.0], dtype=torch.float64, device=f'cuda:{rank}')", "g = torch.cuda.CUDAGraph()",
    "cuda = 'not a device'  # cuda", "def use_cuda(cuda_flag='cuda'):\n    '''docstring: .cuda() here'''\n    return cuda_flag",
    "lambda d='cuda': torch.zeros(1, device=d)", "x = [t.cuda() for t in xs if t.is_cuda]",
    "print(f'{x.cuda()}')", "async def f():\n    await g(torch.cuda.current_device())",
    "match dev:\n    case 'cuda':\n        pass", "x: torch.Tensor = torch.empty(0).cuda() if ok else None",
]


def seeds() -> list[str]:
    files = sorted((ROOT / "examples").rglob("*.py")) + sorted((ROOT / "tests" / "fixtures").rglob("*.py"))
    try:
        import torch
        tdir = Path(torch.__file__).parent
        files += sorted((tdir / "nn" / "modules").glob("*.py"))[:25] + sorted((tdir / "optim").glob("*.py"))[:10]
        files += sorted((tdir / "cuda").glob("*.py"))[:10] + sorted((tdir / "distributed").glob("*.py"))[:10]
    except ImportError:
        pass
    out = []
    for f in files:
        try:
            text = f.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if len(text) < 200_000:
            out.append(text)
    return out


def generated(rng: random.Random) -> str:
    lines = ["import torch", "import torch.distributed as dist", "import os"]
    indent = ""
    for _ in range(rng.randint(1, 25)):
        r = rng.random()
        if r < 0.15 and not indent:
            lines.append(f"def fn_{rng.randint(0, 99)}(x, dev='cuda'):")
            indent = "    "
            lines.append(indent + rng.choice(["pass", "return x.cuda()", "'''.cuda() in a docstring'''"]))
        elif r < 0.2 and indent:
            indent = ""
        else:
            for ln in rng.choice(SNIPPETS).split("\n"):
                lines.append(indent + ln)
    return "\n".join(lines) + "\n"


def mutate(src: str, rng: random.Random, pool: list[str]) -> str:
    lines = src.splitlines(keepends=True) or ["\n"]
    op = rng.randrange(8)
    i = rng.randrange(len(lines))
    if op == 0:
        del lines[i]
    elif op == 1:
        lines.insert(i, lines[i])
    elif op == 2:
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif op == 3:
        words = [w for w in lines[i].replace("(", " ").replace(")", " ").split() if w.isidentifier()]
        if words:
            lines[i] = lines[i].replace(rng.choice(words), rng.choice(CUDA_WORDS), 1)
    elif op == 4:
        lead = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        lines.insert(i, "".join(lead + ln + "\n" for ln in rng.choice(SNIPPETS).split("\n")))
    elif op == 5:
        return src[: rng.randrange(len(src) + 1)]
    elif op == 6:
        b = bytearray(src.encode("utf-8", "surrogatepass"))
        if b:
            b[rng.randrange(len(b))] = rng.randrange(32, 127)
        return b.decode("utf-8", "replace")
    else:
        other = rng.choice(pool)
        return src[: len(src) // 2] + other[len(other) // 2:]
    return "".join(lines)


def check(source: str, rules_by_device: dict) -> str | None:
    """None when every property holds, else a description of the failure."""
    from hal.conformance.migration.patch import patched_source
    from hal.conformance.migration.scanner import scan_source
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None  # rejected by the parser, as the audit reports it
    for device, rules in rules_by_device.items():
        try:
            scan = scan_source(source, "fuzz.py", rules, tree)
            for flavour in ("device", "hal"):
                out = patched_source(scan, source, flavour, rules.import_module)
                try:
                    ast.parse(out)
                except SyntaxError as exc:
                    return f"{device}/{flavour} patch does not parse: {exc}"
        except Exception:
            return f"{device}: {traceback.format_exc(limit=3)}"
    return None


def fuzz(n: int, seed: int = 0, save_failures: Path | None = None) -> dict:
    from hal.conformance.migration import load_rules
    rng = random.Random(seed)
    pool = seeds()
    rules = {d: load_rules(d) for d in ("mlu", "cuda", "cpu")}
    failures, parsed = [], 0
    t0 = time.perf_counter()
    for k in range(n):
        src = generated(rng) if k % 4 == 0 else rng.choice(pool)
        for _ in range(rng.randint(0, 4)):
            src = mutate(src, rng, pool)
        try:
            ast.parse(src)
            parsed += 1
        except (SyntaxError, ValueError):
            pass
        why = check(src, rules)
        if why:
            failures.append({"input": k, "why": why})
            if save_failures is not None:
                save_failures.mkdir(parents=True, exist_ok=True)
                (save_failures / f"failure_{k}.py").write_text(src)
    return {"inputs": n, "parsed": parsed, "rejected_by_parser": n - parsed, "failures": failures,
            "seeds": len(pool), "seed": seed, "seconds": round(time.perf_counter() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="out/fuzz_static.json")
    a = ap.parse_args()
    res = fuzz(a.n, a.seed, Path(os.path.dirname(a.out) or ".") / "fuzz_failures")
    print(f"inputs tried: {res['inputs']} ({res['parsed']} parse, {res['rejected_by_parser']} rejected by the parser), "
          f"seeds: {res['seeds']}, failures: {len(res['failures'])}, {res['seconds']} s")
    for f in res["failures"][:10]:
        print(" ", f["input"], f["why"].splitlines()[-1][:200])
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
