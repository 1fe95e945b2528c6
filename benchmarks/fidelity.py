"""How good is an op-support prediction? Predict for CUDA from a CPU run, measure on a CUDA GPU, compare.

Each program is audited with ``hal.conformance.runtime.audit_target`` for ``--device cuda``: where no
CUDA device is present the program runs on the CPU and every op status is *predicted* (the method
the MLU audits rely on); on a CUDA machine the same audit runs on the GPU and the ops that ran there
are *measured*. Modes (one per run)::

    python benchmarks/fidelity.py --predict [--out reports/fidelity/predicted.json]   # any machine, no GPU
    python benchmarks/fidelity.py --measure [--out reports/fidelity/measured.json]    # on the GPU (< 4 min)
    python benchmarks/fidelity.py --compare [--predicted P] [--measured M] [--out reports/fidelity]

``--predict``/``--measure`` write ``{"schema": "hal-fidelity-capture/1", "mode", "environment",
"programs": {name: {"status", "steps", "seconds", "error", "ops": {op: status}}}}``; an op's status
is the one of its records that ran on the target device when there are any, else the worst.
``--compare`` writes ``fidelity.json`` (schema ``hal-fidelity/1``, the issue's contract: op_agreement
= |P ∩ M| / |P ∪ M| over distinct ATen ops, mean over programs; status_agreement = the share of
ops in both whose predicted status equals the measured one) and ``fidelity.md`` beside it.
Status equality is *strict*: both sides use the same words. A measured op is ``native`` when the
device's dispatch key has a kernel for it and ``composite`` when it ran through PyTorch's composite
kernel (``hal.conformance.runtime.predict.measured_status``), which is what the capability data
says for a prediction. ``status_agreement_support`` (native and composite both count as "runs") is
kept beside it to read captures made before measured runs spoke these words (every op measured
``native``); on new captures the two differ only where the capability data and the dispatcher do.

Programs: the reference models (gpt, cnn, moe: one training and one inference phase each),
``examples/cuda_train.py`` and the fixtures in ``benchmarks/fidelity_programs/`` (optimizers with
AdamW, AMP with a GradScaler, SDPA attention, LSTM and GRU, embeddings and losses, conv + batch norm).
Exit codes: 0 written; 2 bad usage or a missing input file (one line on stderr).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "benchmarks" / "fidelity_programs"
OUT = ROOT / "reports" / "fidelity"
SUPPORT = {"native": "runs", "composite": "runs"}  # support level: what a user of the verdict relies on
SEVERITY = ("unsupported", "fallback", "unknown", "composite", "native")

PROGRAMS = [
    {"name": "gpt (train+infer)", "kind": "model", "target": "gpt"},
    {"name": "cnn (train+infer)", "kind": "model", "target": "cnn"},
    {"name": "moe (train+infer)", "kind": "model", "target": "moe"},
    {"name": "examples/cuda_train.py", "kind": "script", "target": str(ROOT / "examples" / "cuda_train.py"),
     "args": ["--steps", "3"], "steps": 3},
] + [{"name": f"fixture {p}", "kind": "script", "target": str(FIXTURES / p)} for p in (
    "adamw_amp.py", "attention.py", "lstm_lm.py", "gru_seq.py", "embeddings_losses.py", "conv_bn.py")]


def op_statuses(ops: list[dict], device_type: str) -> dict[str, str]:
    """``{op: status}``: per distinct op, the status of its records that ran on ``device_type`` when
    there are any (measured there), else the worst of its records (predicted)."""
    by: dict[str, list[dict]] = {}
    for o in ops:
        by.setdefault(o["op"], []).append(o)
    out = {}
    for op, recs in by.items():
        on_dev = [r for r in recs if r.get("device_type") == device_type] or recs
        out[op] = min((r["status"] for r in on_dev), key=lambda s: SEVERITY.index(s) if s in SEVERITY else 9)
    return out


def capture(mode: str, timeout: float) -> dict:
    from hal.conformance.runtime import audit_target
    from hal.environment import fingerprint
    programs = {}
    for p in PROGRAMS:
        t0 = time.perf_counter()
        req = {"target": p["target"], "kind": p["kind"], "device": "cuda", "args": p.get("args", []),
               "steps": p.get("steps"), "timeout": timeout, "cwd": str(ROOT)}
        try:
            res = audit_target(req)
        except Exception as exc:  # a bad request: recorded, the other programs still run
            programs[p["name"]] = {"status": "error", "error": f"{type(exc).__name__}: {exc}", "ops": {}}
            continue
        run, target = res["run"], res["target"]
        programs[p["name"]] = {"status": run.get("status"), "steps": run.get("steps"), "error": run.get("error"),
                               "seconds": round(time.perf_counter() - t0, 2), "verified": target.get("verified"),
                               "ops": op_statuses(res["ops"], "cuda"),
                               "captured_as": sorted({f"{o['captured_as']} -> {o['op']}" for o in res["ops"]
                                                      if o.get("captured_as")})}
        print(f"{mode:8s} {p['name']:32s} {run.get('status'):8s} {len(programs[p['name']]['ops']):3d} ops "
              f"{programs[p['name']]['seconds']:6.1f} s", flush=True)
    return {"schema": "hal-fidelity-capture/1", "mode": mode, "environment": fingerprint(), "programs": programs}


def compare(pred: dict, meas: dict) -> dict:
    rows = []
    for name, m in meas["programs"].items():
        p = pred["programs"].get(name)
        if p is None or not m.get("ops") or not p.get("ops"):
            continue
        P, M = set(p["ops"]), set(m["ops"])
        both = sorted(P & M)
        mism = [{"op": op, "predicted": p["ops"][op], "measured": m["ops"][op]} for op in both
                if p["ops"][op] != m["ops"][op]]
        support = sum(SUPPORT.get(p["ops"][op], p["ops"][op]) == SUPPORT.get(m["ops"][op], m["ops"][op])
                      for op in both)
        rows.append({"name": name, "op_agreement": round(len(P & M) / len(P | M), 4),
                     "status_agreement": round(1 - len(mism) / len(both), 4) if both else 1.0,
                     "status_agreement_support": round(support / len(both), 4) if both else 1.0,
                     "only_predicted": sorted(P - M), "only_measured": sorted(M - P), "status_mismatches": mism,
                     "predicted_ops": len(P), "measured_ops": len(M), "ops_in_both": len(both),
                     "measured_run": m.get("status"), "predicted_run": p.get("status")})
    summary = {"programs": len(rows),
               "op_agreement": round(statistics.mean(r["op_agreement"] for r in rows), 4) if rows else None,
               "status_agreement": round(statistics.mean(r["status_agreement"] for r in rows), 4) if rows else None,
               "status_agreement_support": round(statistics.mean(r["status_agreement_support"] for r in rows), 4)
               if rows else None,
               "goal": {"op_agreement": 0.95, "status_agreement": 0.98}}
    return {"schema": "hal-fidelity/1", "environment": meas.get("environment"),
            "predicted_environment": pred.get("environment"), "programs": rows, "summary": summary}


def markdown(doc: dict) -> str:
    env = doc.get("environment") or {}
    s = doc["summary"]
    dev = next((d.get("name") for b in (env.get("backends") or {}).values() for d in (b.get("devices") or [])
                if b.get("available") and d.get("name") and "cuda" in str(b.get("reason", "")).lower()), "?")
    lines = ["# Op-support prediction fidelity: predicted for CUDA on the CPU vs measured on the GPU", "",
             f"Measured on {dev}, torch {env.get('torch', '?')}, commit {env.get('commit', '?')}; predicted on "
             f"{(doc.get('predicted_environment') or {}).get('cpu', '?')}, torch "
             f"{(doc.get('predicted_environment') or {}).get('torch', '?')}.", "",
             f"**{s['programs']} programs: op agreement {s['op_agreement']}, status agreement {s['status_agreement']}** "
             f"(support level, native = composite: {s['status_agreement_support']}; goal ≥ 0.95 and ≥ 0.98).", "",
             "op agreement = |predicted ∩ measured| / |predicted ∪ measured| over distinct ATen ops; status agreement "
             "= share of ops in both whose predicted status word is the measured one (measured: native where the "
             "device's dispatch key has a kernel, composite where PyTorch's composite kernel ran it).", "",
             "| program | predicted | measured | both | op agreement | status agreement | only predicted | "
             "only measured |", "|---|---:|---:|---:|---:|---:|---|---|"]
    for r in doc["programs"]:
        lines.append(f"| {r['name']} | {r['predicted_ops']} | {r['measured_ops']} | {r['ops_in_both']} | "
                     f"{r['op_agreement']:.3f} | {r['status_agreement']:.3f} | {', '.join(r['only_predicted']) or '-'} | "
                     f"{', '.join(r['only_measured']) or '-'} |")
    mism = [(r["name"], m) for r in doc["programs"] for m in r["status_mismatches"]]
    if mism:
        lines += ["", "Status mismatches:", ""] + [f"- {n}: `{m['op']}` predicted {m['predicted']}, measured "
                                                   f"{m['measured']}" for n, m in mism]
    lines += ["", "Regenerate: `python benchmarks/fidelity.py --predict` (CPU), `--measure` (GPU), `--compare`.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--predict", action="store_true", help="capture on the CPU, predicting --device cuda")
    g.add_argument("--measure", action="store_true", help="capture on the CUDA GPU (measured)")
    g.add_argument("--compare", action="store_true", help="write fidelity.json and fidelity.md")
    ap.add_argument("--predicted", default=str(OUT / "predicted.json"))
    ap.add_argument("--measured", default=str(OUT / "measured.json"))
    ap.add_argument("--out", help="output file (--predict/--measure) or folder (--compare)")
    ap.add_argument("--timeout", type=float, default=60.0, help="bound per program run, seconds")
    args = ap.parse_args(argv)
    if args.predict or args.measure:
        import torch
        if args.measure and not torch.cuda.is_available():
            print("fidelity.py: --measure needs a CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
            return 2
        if args.predict and torch.cuda.is_available():
            print("fidelity.py: --predict must run where CUDA is absent (it predicts from a CPU run)", file=sys.stderr)
            return 2
        mode = "measured" if args.measure else "predicted"
        doc = capture(mode, args.timeout)
        out = Path(args.out or (OUT / f"{mode}.json"))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"wrote {out}")
        return 0
    for f in (args.predicted, args.measured):
        if not os.path.isfile(f):
            print(f"fidelity.py: no such file: {f}", file=sys.stderr)
            return 2
    doc = compare(json.loads(Path(args.predicted).read_text()), json.loads(Path(args.measured).read_text()))
    out = Path(args.out or OUT)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fidelity.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "fidelity.md").write_text(markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
