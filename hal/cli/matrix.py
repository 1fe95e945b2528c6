"""``hal matrix``: run, merge or diff the compatibility matrix (see hal.conformance.matrix).

Exit codes: 0 the matrix was written (cells may fail: that is data, not an error); 2 bad input
(one line): an unknown device, model, mode, dtype or config, ``--steps``/``--timeout`` not finite
and in range, ``--out`` that exists and is not a folder or cannot be created or written.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from tabulate import tabulate

from hal.commandline import CliError, check_number, emit
from hal.cli.registry import subcommand


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--devices", default="cpu,cuda,mlu")
    p.add_argument("--models", default="gpt,cnn,moe",
                   help="comma-separated: gpt, cnn, moe, hf:<arch> (hf:llama, hf:mixtral, hf:whisper ...), or a set: "
                        "reference, real (every hf: architecture), all (default: gpt,cnn,moe)")
    p.add_argument("--jobs", type=int, default=1, help="cells run at once, each in its own process (default 1)")
    p.add_argument("--modes", default="train,infer")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--config", default="tiny", help="model config (default: tiny)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--arch", metavar="MAJOR[.MINOR]",
                   help="architecture of the predicted devices for dtype gates and TF32 notes (e.g. mlu590)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per cell")
    p.add_argument("--no-precision", action="store_true", help="skip the float64 precision check")
    p.add_argument("--no-collectives", action="store_true")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="merge matrices from several machines")
    p.add_argument("--diff", nargs=2, metavar=("OLD", "NEW"), help="list what changed between two matrices")
    p.add_argument("--out", help="output folder (compat-matrix.json/.md/.html/.svg)")
    p.add_argument("--format", choices=("text", "json"), default="text")


MAX_STEPS = 10**6
MAX_TIMEOUT_S = 1e6


def _check_out(path: str) -> None:
    """CliError unless ``path`` is a folder or could be created as one (nothing is created here)."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise CliError(f"--out {path}: exists and is not a folder")
    probe = out
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise CliError(f"--out {path}: cannot create folder: {probe} is not a folder")
    if probe.is_dir() and not os.access(probe, os.W_OK | os.X_OK):
        raise CliError(f"--out {path}: {probe} is not writable")


def _load(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise CliError(f"no such file: {path}")
    try:
        return json.loads(p.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CliError(f"{path} is not JSON: {exc}") from None


def write_outputs(doc: dict, out: Path) -> list[Path]:
    from hal.conformance.matrix import render
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"--out {out}: cannot create folder: {exc.strerror or exc}") from None
    files = {"compat-matrix.json": json.dumps(doc, indent=2, default=str) + "\n",
             "compat-matrix.md": render.to_markdown(doc), "compat-matrix.html": render.to_html(doc),
             "compat-matrix.svg": render.to_svg(doc)}
    paths = []
    for name, text in files.items():
        try:
            (out / name).write_text(text)
        except OSError as exc:
            raise CliError(f"--out {out}: cannot write {name}: {exc.strerror or exc}") from None
        paths.append(out / name)
    return paths


@subcommand("matrix", "compatibility matrix: backend x model x mode x dtype, crash-isolated")(_configure)
def cmd_matrix(args: argparse.Namespace) -> int:
    from hal.conformance.matrix import merge as mmerge
    from hal.conformance.matrix.runner import run_matrix
    if args.diff:
        try:
            rows = mmerge.diff(_load(args.diff[0]), _load(args.diff[1]))
        except ValueError as exc:
            raise CliError(str(exc)) from None
        if args.format == "json":
            emit(json.dumps(rows, indent=2))
            return 0
        emit(tabulate([[r["cell"], r["change"], r.get("old"), r.get("new")] for r in rows],
                      headers=["cell", "change", "old", "new"]) if rows else "no changes")
        ops = mmerge.op_changes(rows)
        if ops:
            emit("\nops that cells ran in only one of the two (cell counts; e.g. torch versions decompose differently):")
            emit(tabulate([[o["op"], o["only_old"], o["only_new"], ", ".join(o["models"])] for o in ops],
                          headers=["op", f"only in {args.diff[0]}", f"only in {args.diff[1]}", "models"]))
        return 0
    if not args.out:
        raise CliError("--out DIR is required to run or merge a matrix")
    check_number("--steps", args.steps, minimum=1, maximum=MAX_STEPS, what="a positive integer")
    check_number("--timeout", args.timeout, above=0, maximum=MAX_TIMEOUT_S, what="a number of seconds per cell")
    _check_out(args.out)
    arch = None
    if args.arch is not None:
        from hal.capabilities import parse_arch
        try:
            arch = parse_arch(args.arch)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    if args.merge:
        try:
            doc = mmerge.merge((p, _load(p)) for p in args.merge)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    else:
        import hal
        from hal.models import config_names, expand_models
        known = {i.name for i in hal.list_backends()}
        devices = _csv(args.devices)
        for d in devices:
            if d not in known:
                raise CliError(f"unknown device {d!r}; installed backends: {', '.join(sorted(known))}")
        try:
            models = expand_models(_csv(args.models))
        except ValueError as exc:
            raise CliError(f"--models: {exc} (or a set: reference, real, all)") from None
        check_number("--jobs", args.jobs, minimum=1, maximum=256, what="a positive integer")
        for m in models:
            if args.config not in config_names(m):
                raise CliError(f"unknown config {args.config!r} for model {m!r}; one of {', '.join(config_names(m))}")
        if not devices or not models or not _csv(args.modes) or not _csv(args.dtypes):
            raise CliError("--devices, --models, --modes and --dtypes must each name at least one value")
        for mode in _csv(args.modes):
            if mode not in ("train", "infer"):
                raise CliError(f"unknown mode {mode!r}; one of train, infer")
        import torch
        for dt in _csv(args.dtypes):
            if not isinstance(getattr(torch, dt, None), torch.dtype):
                raise CliError(f"unknown dtype {dt!r}")

        def progress(cell):
            how = "verified" if cell.verified else "predicted" if cell.status != "not-run" else ""
            emit(f"{cell.backend:6s} {cell.model:16s} {cell.mode:6s} {cell.dtype:9s} {cell.status:18s} {how:9s} "
                 f"{cell.seconds:6.1f}s  {cell.reason[:100]}")

        doc = run_matrix(devices, models, _csv(args.modes), _csv(args.dtypes), args.config, args.steps,
                         args.timeout, not args.no_precision, not args.no_collectives,
                         progress if args.format == "text" else None, arch=arch, jobs=args.jobs)
    paths = write_outputs(doc, Path(args.out))
    if args.format == "json":
        emit(json.dumps(doc, indent=2, default=str))
    else:
        emit(", ".join(f"{k}: {v}" for k, v in doc["summary"].items()))
        emit("wrote " + ", ".join(str(p) for p in paths))
    return 0
