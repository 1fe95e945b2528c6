"""Generate capability manifests (data) from their sources. Command line::

    python -m hal.capabilities.generate optable [--out hal/capabilities/data/aten_ops.json]
    python -m hal.capabilities.generate mlu --kernels ../shared/data/mlu/torch_mlu_kernels.tsv \\
        --api ../shared/data/mlu/torch_mlu_api_support.tsv --env ../shared/data/mlu/env_map.tsv \\
        --out backends/mlu/manifest.json
    python -m hal.capabilities.generate cuda --out backends/cuda/manifest.json   # on a CUDA build of torch
    python -m hal.capabilities.generate cpu --out backends/cpu/manifest.json
    python -m hal.capabilities.generate torch-ops --yaml .../torchgen/packaged/ATen/native/native_functions.yaml \
        --version 2.4.0 --source "torch-2.4.0 wheel (PyPI), git e4ee3be"

``cuda`` and ``cpu`` read the live dispatcher of the installed torch: every ATen overload with a
kernel registered for the dispatch key (``--dispatch-key``, default the backend's own key). A
CPU-only torch registers no CUDA kernels, so ``cuda`` refuses to run there (exit 2) unless
``--dispatch-key`` names another key (used to test the same code path on the CPU). The command that
produced a manifest is recorded in its provenance. Exit codes: 0 written, 2 bad input.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import shlex
import sys
from typing import Optional, Sequence

from hal.capabilities.live import SCHEMA, build_live
from hal.capabilities.names import normalize_op

QUANTIZED = ("qint8", "quint8", "qint32", "quint4x2", "quint2x4")
_COMMIT_RE = re.compile(r"commit ([0-9a-f]{7,40})")
_BRANCH_RE = re.compile(r"branch ([\w.\-/]+)")


class InputError(Exception):
    """Bad input to a generator (missing file, unparsable line); exit code 2."""


def _command(argv: Sequence[str]) -> str:
    return "python -m hal.capabilities.generate " + " ".join(shlex.quote(a) for a in argv)


def _read_tsv(path: str, columns: int) -> tuple[list[str], list[list[str]]]:
    p = pathlib.Path(path)
    if not p.is_file():
        raise InputError(f"{path}: no such file")
    comments, rows = [], []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            comments.append(line[1:].strip())
            continue
        cells = line.split("\t")
        if len(cells) < columns:
            cells += [""] * (columns - len(cells))
        if not cells[0]:
            raise InputError(f"{path}:{n}: expected {columns} tab-separated columns")
        rows.append(cells[:columns])
    return comments, rows


def _source_of(comments: list[str]) -> dict:
    text = " ".join(comments)
    out: dict = {}
    m = _COMMIT_RE.search(text)
    if m:
        out["commit"] = m.group(1)
    m = _BRANCH_RE.search(text)
    if m:
        out["branch"] = m.group(1).rstrip(",")
    m = re.search(r"file ([\w./\-]+)", text)
    if m:
        out["file"] = m.group(1).rstrip(".")
    m = re.search(r"Source: ([\w./\-]+)", text)
    if m:
        out["repository"] = m.group(1).rstrip(",")
    return out


def _torch_version() -> str:
    import torch
    return torch.__version__


def build_mlu(kernels: str, api: str, env: str, argv: Sequence[str]) -> dict:
    """The MLU manifest from the three torch_mlu-derived TSV files (names only) and the documented
    semantics of torch_mlu r2.4 (../shared/reference/mlu.md sections 1, 3, 4)."""
    k_comments, k_rows = _read_tsv(kernels, 2)
    a_comments, a_rows = _read_tsv(api, 4)
    e_comments, e_rows = _read_tsv(env, 2)
    native: dict[str, list[str]] = {}
    for ns, op in k_rows:
        native.setdefault(ns, []).append(normalize_op(f"{ns}::{op}") if ns == "aten" else f"{ns}::{op}")
    api_support: dict[str, dict] = {}
    counts = {"rows": len(a_rows), "true": 0, "false": 0, "limitation_notes": 0}
    for _section, name, supported, note in a_rows:
        if supported not in ("true", "false"):
            raise InputError(f"{api}: SUPPORTED must be true/false, got {supported!r} for {name}")
        counts[supported] += 1
        counts["limitation_notes"] += note == "yes"
        prev = api_support.get(name)  # an API listed in two sections keeps the riskier flag
        flag = (supported == "true") and (prev is None or prev["s"])
        api_support[name] = {"s": flag, **({"n": True} if note == "yes" or (prev or {}).get("n") else {})}
    src = _source_of(k_comments)
    return {
        "schema": SCHEMA, "backend": "mlu", "dispatch_key": "PrivateUse1", "predicted": True,
        "provenance": {
            "source": src.get("repository", "github.com/Cambricon/torch_mlu"), "branch": src.get("branch", ""),
            "commit": src.get("commit", ""), "files": {"kernels": _source_of(k_comments).get("file", ""),
                                                       "api_support": _source_of(a_comments).get("file", ""),
                                                       "env_map": _source_of(e_comments).get("file", "")},
            "torch_pairing": "2.4", "torch_mlu_version": "1.22.0+torch2.4.0 (r2.4_develop)",
            "built_with_torch": _torch_version(), "generated_by": _command(argv),
            "semantics_source": "docs of torch_mlu r2.4_develop read from source, ../shared/reference/mlu.md; "
                                "nothing was run on MLU hardware",
        },
        "native": {ns: sorted(set(v)) for ns, v in sorted(native.items())},
        "fallback": {"env": "ENABLE_FALLBACK_TO_CPU", "default_enabled": True, "warns": "once per op name",
                     "warning": "The operator '{op}' is not currently supported on the MLU backend and will fall "
                                "back to run on the CPU. This may have performance implications.",
                     "disabled_error": "NotImplementedError: ... is not currently implemented for the MLU device",
                     "fail_fallback_env": "ENABLE_MLU_FAIL_FALLBACK", "fail_fallback_default": False,
                     "no_fallback_namespaces": ["custom", "torch_mlu"],
                     "implementation": "boxed PrivateUse1 fallback calling at::native::cpu_fallback "
                                       "(torch_mlu/csrc/aten/MLUFallback.cpp)"},
        "dtypes": {
            "native": ["float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
                       "complex64", "float8_e4m3fn", "float8_e5m2"],
            "downcasts": {"float64": "float32", "complex128": "complex64"},
            "downcast_note": "computed and stored 32-bit (cast in H2D/D2H copies), silently "
                             "(torch_mlu/csrc/aten/utils/accumulate_type.h, Note [Convert64BitTo32Bit])",
            "unsupported": list(QUANTIZED),
            "min_arch_major": {"bfloat16": 5, "float8_e4m3fn": 6, "float8_e5m2": 6},
            "bool_accumulate": "int",
        },
        "tf32_defaults": {"conv": True, "matmul": False, "custom": False,
                          "flags": {"conv": "torch.backends.cnnl.allow_tf32",
                                    "matmul": "torch.backends.mlu.matmul.allow_tf32",
                                    "custom": "torch.backends.mlu.custom.allow_tf32"},
                          "matmul_on_when": "torch.get_float32_matmul_precision() != 'highest' or "
                                            "TORCH_ALLOW_TF32_CNMATMUL_OVERRIDE=1",
                          "arch_min_major": 5,
                          "noop_after_import": ["torch.backends.cuda.matmul.allow_tf32",
                                                "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction"]},
        "collectives": {"dist_backend": "cncl",
                        "unsupported_reduce_ops": ["BAND", "BOR", "BXOR", "PREMUL_SUM"],
                        "avg": "SUM followed by a divide",
                        "dtypes": ["int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32"],
                        "downcasts": {"float64": "float32"}, "bool": "sent as uint8; SUM mapped to MAX",
                        "complex": "SUM/AVG only, through a real view",
                        "unsupported_apis": ["recv_anysource", "monitored_barrier", "send_object_list",
                                             "recv_object_list", "is_gloo_available"],
                        "pg_options": ["is_high_priority", "group_name", "backend", "_timeout"]},
        "env_map": {cuda: (mlu or None) for cuda, mlu in e_rows},
        "api_support": {"note": "torch_api.yaml flags; 'false' often means 'not validated on MLU' - a risk hint, "
                                "not ground truth", "counts": counts, "apis": api_support},
        "profiler_activity": "PrivateUse1",
        "autocast_device_type": "mlu",
    }


def _write(data: dict, out: Optional[str]) -> None:
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if out in (None, "-"):
        sys.stdout.write(text)
        return
    path = pathlib.Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path} ({len(text.encode()) / 1024:.0f} KiB)", file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m hal.capabilities.generate", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("optable", help="the device-independent ATen op table (composites and their callees)")
    s.add_argument("--out", default=str(pathlib.Path(__file__).parent / "data" / "aten_ops.json"))
    s.add_argument("--samples", type=int, default=3, help="OpInfo samples traced per op (with --opinfo)")
    s.add_argument("--opinfo", action="store_true",
                   help="also trace PyTorch's OpInfo samples (needs torch.testing._internal and expecttest); "
                        "default: inputs built from each op's schema only")
    s = sub.add_parser("mlu", help="the MLU manifest from torch_mlu's lists")
    s.add_argument("--kernels", required=True)
    s.add_argument("--api", required=True)
    s.add_argument("--env", required=True)
    s.add_argument("--out", default="-")
    s = sub.add_parser("torch-ops", help="the ATen op list of a torch release, from its native_functions.yaml")
    s.add_argument("--yaml", required=True)
    s.add_argument("--version", required=True)
    s.add_argument("--source", default="")
    s.add_argument("--out", default=None)
    for name, key in (("cuda", "CUDA"), ("cpu", "CPU")):
        s = sub.add_parser(name, help=f"the {name} manifest from the live dispatcher")
        s.add_argument("--dispatch-key", default=key)
        s.add_argument("--out", default="-")
    args = ap.parse_args(argv)
    try:
        if args.what == "optable":
            from hal.capabilities import optable, trace
            traced, redispatched = trace.trace_composites(args.samples) if args.opinfo else ({}, {})
            data = optable.build(traced, _command(argv), redispatched)
        elif args.what == "torch-ops":
            from hal.capabilities import versions
            y = pathlib.Path(args.yaml)
            if not y.is_file():
                raise InputError(f"{args.yaml}: no such file")
            ops = sorted(versions.ops_from_yaml(y.read_text(encoding="utf-8")))
            if not ops:
                raise InputError(f"{args.yaml}: no '- func:' entries (not a native_functions.yaml)")
            out = pathlib.Path(args.out) if args.out else versions.path_for(args.version)
            head = [f"# ATen overloads of torch {args.version}: every func and autogen entry of "
                    f"torchgen/packaged/ATen/native/native_functions.yaml"
                    + (f" from {args.source}" if args.source else ""),
                    f"# generated_by: {_command(argv)}"]
            out.write_text("\n".join(head + ops) + "\n", encoding="utf-8")
            print(f"wrote {out} ({len(ops)} ops)", file=sys.stderr)
            return 0
        elif args.what == "mlu":
            data = build_mlu(args.kernels, args.api, args.env, argv)
        else:
            import torch
            if args.what == "cuda" and args.dispatch_key == "CUDA" and not torch.backends.cuda.is_built():
                raise InputError(f"torch {torch.__version__} is a CPU-only build and registers no CUDA kernels; "
                                 "run this on a CUDA build of torch")
            data = build_live(args.what, args.dispatch_key, _command(argv))
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _write(data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
