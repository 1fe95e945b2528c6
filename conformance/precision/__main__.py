"""``python -m hal.conformance.precision``: precision report of a reference workload.

Example (CPU, bfloat16 autocast against float64)::

    python -m hal.conformance.precision --model gpt --device cpu --autocast bfloat16 \\
        --out reports/precision/cpu-gpt.json

Writes the JSON (the audit.json ``precision`` section plus ``checkpoint``) and a markdown summary
next to it (same path, ``.md``). Exit codes: 0 pass/warning, 1 verdict fail with
``--fail-on-fail``, 2 bad input (one line on stderr), 4 internal error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from hal.commandline import CliError, emit, run_cli

_DTYPES = ("float32", "bfloat16", "float16", "float64")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hal.conformance.precision",
                                description="Compare a workload on a device with a float64 CPU reference.")
    p.add_argument("--model", required=True, help="workload name: gpt, cnn or moe")
    p.add_argument("--config", default="tiny", help="workload config (default: tiny)")
    p.add_argument("--device", default="cpu", help="target device, e.g. cpu, cuda, cuda:0")
    p.add_argument("--dtype", default="float32", choices=_DTYPES, help="parameter dtype (default float32)")
    p.add_argument("--autocast", default=None, choices=("bfloat16", "float16"),
                   help="run the target's forward under torch.autocast with this dtype")
    p.add_argument("--steps", type=int, default=3, help="training steps for the drift curve (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calibrate-with", default=None, help="second device for calibrated verdicts, e.g. cuda")
    p.add_argument("--checkpoint-to", default=None,
                   help="also check checkpoint portability from --device to this device")
    p.add_argument("--max-elements", type=int, default=1 << 15,
                   help="elements compared per tensor before sampling (default 32768)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for CPU runs")
    p.add_argument("--out", required=True, help="JSON output path (markdown written next to it)")
    p.add_argument("--fail-on-fail", action="store_true", help="exit 1 when the verdict is fail")
    return p


def _handle(args) -> int:
    import torch

    from hal.errors import HalError

    from . import check_checkpoint_portability, compare_workload
    if args.steps < 1:
        raise CliError("--steps must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    autocast = getattr(torch, args.autocast) if args.autocast else None
    try:
        from hal.models import config_names, workload_class
        workload_class(args.model)
        if args.config not in config_names(args.model):
            raise CliError(f"unknown {args.model} config {args.config!r}; one of "
                           f"{', '.join(config_names(args.model))}")
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        res = compare_workload(args.model, device=args.device, dtype=dtype, autocast=autocast,
                               steps=args.steps, seed=args.seed, calibrate_with=args.calibrate_with,
                               config=args.config, max_elements=args.max_elements)
        ckpt = None
        if args.checkpoint_to:
            ckpt = check_checkpoint_portability(args.model, args.device, args.checkpoint_to,
                                                dtype=dtype, seed=args.seed, config=args.config)
    except HalError as exc:
        raise CliError(str(exc)) from None
    except RuntimeError as exc:
        # the workload itself failed on this device/dtype: report it, one line
        raise CliError(f"{args.model} failed under the comparison: {str(exc).splitlines()[0]}", code=3) from None
    doc = res.as_dict()
    doc["workload"] = {"name": args.model, "config": args.config}
    doc["checkpoint"] = ckpt
    doc["command"] = "python -m hal.conformance.precision " + " ".join(sys.argv[1:])
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    md_path = os.path.splitext(args.out)[0] + ".md"
    md = res.to_markdown(title=f"Precision: {args.model} ({args.config}) on {args.device}")
    if ckpt:
        md += (f"\n## Checkpoint portability\n\n{ckpt['src']} -> {ckpt['dst']}: match {ckpt['match']} "
               f"(max relative loss deviation {ckpt['max_rel_dev']:.3g}, tolerance {ckpt['tolerance']:g})\n")
    md += f"\nCommand: `{doc['command']}`\n"
    with open(md_path, "w") as f:
        f.write(md)
    fd = res.first_divergence
    emit(f"{args.model}: verdict {res.verdict}; first divergence: "
         + (f"{fd['module']}:{fd['op']} ({fd['kind']}, {fd['metric']}={fd['value']})" if fd else "none")
         + f"; drift max rel {res.drift['max_rel_dev']:.3g}; wrote {args.out} and {md_path}")
    return 1 if (args.fail_on_fail and res.verdict == "fail") else 0


def main(argv=None) -> int:
    return run_cli(lambda: _parser().parse_args(argv), _handle, "precision")


if __name__ == "__main__":
    sys.exit(main())
