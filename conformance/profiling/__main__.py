"""``python -m hal.conformance.profiling``: profile a reference workload and write the results.

Writes into ``--out``: ``profile.json`` (the audit.json ``profile`` section, plus ``load_matrix``
for ``--mode infer`` on gpt), ``trace.json`` (Chrome trace, opens in Perfetto) and ``profile.md``
(a Markdown summary), and prints the summary. Exit codes: 0 done; 2 bad input (unknown model,
config, device or dtype) with one line on stderr; 4 internal error (one line).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Any

from hal.commandline import CliError, emit, run_cli


def _ints(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hal.conformance.profiling", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gpt", help="reference workload (gpt, cnn, moe)")
    p.add_argument("--config", default="tiny", help="workload config (tiny, gpt2-small, ...)")
    p.add_argument("--device", default="cpu", help="HAL backend name (cpu, cuda, mlu, ...)")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16, float16")
    p.add_argument("--mode", choices=("train", "infer"), default="train")
    p.add_argument("--steps", type=int, default=3, help="profiled steps (default 3)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps (default 2)")
    p.add_argument("--batch-size", type=int, default=None, help="override the config's batch size")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--fallback-ops", default="", help="comma-separated ATen ops that fell back (from the audit)")
    p.add_argument("--matrix", choices=("auto", "on", "off"), default="auto",
                   help="inference load matrix (auto: on for --mode infer with gpt)")
    p.add_argument("--batches", type=_ints, default=(1, 4))
    p.add_argument("--prompt-lens", type=_ints, default=(16, 32))
    p.add_argument("--output-lens", type=_ints, default=(16,))
    p.add_argument("--repeats", type=int, default=3, help="load-matrix repeats per cell")
    p.add_argument("--out", default="out/profile", help="output folder (default out/profile)")
    return p


def _environment(backend: Any) -> dict:
    import torch
    return {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "backend": backend.name, "versions": backend.versions(), "threads": torch.get_num_threads(),
            "command": " ".join(["python -m hal.conformance.profiling"] + sys.argv[1:])}


def main(argv: "list[str] | None" = None) -> int:
    parser = _parser()

    def handle(args: argparse.Namespace) -> int:
        import torch
        import hal
        from hal.errors import HalError
        from hal.models import get_workload
        from hal.conformance.profiling import inference_load_matrix, markdown_summary, profile_workload
        if args.steps < 1 or args.warmup < 0 or args.repeats < 1:
            raise CliError("--steps and --repeats must be >= 1 and --warmup >= 0")
        if args.threads:
            torch.set_num_threads(args.threads)
        try:
            backend = hal.get_backend(args.device)
        except HalError as exc:
            raise CliError(f"device {args.device!r}: {exc}") from None
        overrides = {"batch_size": args.batch_size} if args.batch_size else {}
        try:
            w = get_workload(args.model, config=args.config, **overrides)
            w.build(backend.torch_device(), dtype=args.dtype, seed=0)
        except ValueError as exc:
            raise CliError(str(exc)) from None
        fallback = {x.strip() for x in args.fallback_ops.split(",") if x.strip()}
        run_matrix = args.matrix == "on" or (args.matrix == "auto" and args.mode == "infer" and hasattr(w, "decode_step"))
        if run_matrix and not hasattr(w, "decode_step"):
            raise CliError(f"--matrix on: {args.model!r} is not a KV-cache language model (use gpt)")
        prof = profile_workload(w, backend, steps=args.steps, warmup=args.warmup, out_dir=args.out,
                                mode=args.mode, fallback_ops=fallback)
        matrix = None
        if run_matrix:
            try:
                matrix = inference_load_matrix(w, backend, batches=args.batches, prompt_lens=args.prompt_lens,
                                               output_lens=args.output_lens, warmup=1, repeats=args.repeats)
            except ValueError as exc:
                raise CliError(str(exc)) from None
            prof["load_matrix"] = matrix
        prof["environment"] = _environment(backend)
        with open(os.path.join(args.out, "profile.json"), "w") as f:
            json.dump(prof, f, indent=1, default=str)
        text = markdown_summary(prof, matrix)
        with open(os.path.join(args.out, "profile.md"), "w") as f:
            f.write(text)
        emit(text)
        return 0

    return run_cli(lambda: parser.parse_args(argv), handle, "hal.conformance.profiling")


if __name__ == "__main__":
    sys.exit(main())
