"""Precision and profile for ``hal-audit --precision/--profile``, run in a child process.

The parent (:func:`precision_and_profile`) writes a spec and runs ``python -m
hal.conformance.workload_audit SPEC`` through the runtime audit's bounded child runner, so a crash,
hang or ``os._exit`` in the workload (a user's ``file.py:func`` runs here) never takes the auditor
down: the sections then say what happened. Targets: reference-model names and ``file.py:func``
returning a workload (``build``/``example_batch``/``train_step``/``infer``). Script targets are
not supported (their model is not reachable from outside the program): the sections say so.

The device is the target when it is present; otherwise the CPU, and the section says that the
figures were measured on the CPU, not on the target (``verified`` false).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from typing import Any, Optional


def _not_run(reason: str) -> dict:
    return {"verdict": "not-run", "reason": reason, "verified": False}


def precision_and_profile(request: dict, fallback_ops: list[str]) -> dict:
    """``{"precision": ..., "profile": ...}`` for the sections the request asks for (None otherwise)."""
    want_p, want_f = bool(request.get("precision")), bool(request.get("profile"))
    out: dict[str, Any] = {"precision": None, "profile": None}
    if not (want_p or want_f):
        return out
    if request["kind"] not in ("model", "func"):
        why = (f"--precision/--profile need a workload target (a reference model name or file.py:func), "
               f"not a {request['kind']} target")
        return {"precision": _not_run(why) if want_p else None, "profile": _not_run(why) if want_f else None}
    from hal.conformance.runtime.runner import run_child
    work = request.get("out") or tempfile.mkdtemp(prefix="hal-audit-")
    os.makedirs(work, exist_ok=True)
    fd, spec_path = tempfile.mkstemp(prefix=".workload-spec-", suffix=".json", dir=work)
    result_path = spec_path.replace(".workload-spec-", ".workload-result-")
    spec = {**request, "result_path": result_path, "fallback_ops": fallback_ops}
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f)
    try:
        res = run_child(spec_path, result_path, request.get("timeout") or 900.0,
                        module="hal.conformance.workload_audit")
    finally:
        for p in (spec_path, result_path):
            if os.path.exists(p):
                os.remove(p)
    run = res.get("run", {})
    for key, wanted in (("precision", want_p), ("profile", want_f)):
        if not wanted:
            continue
        section = res.get(key)
        if section is None:
            tail = " | ".join(run.get("output_tail", [])[-5:])
            section = {"verdict": "error", "verified": False,
                       "error": f"{run.get('status', 'crashed')}: {run.get('error') or 'no result'}; last output: {tail}"}
        out[key] = section
    return out


def _workload(spec: dict):
    if spec["kind"] == "model":
        from hal.models import get_workload
        return get_workload(spec["target"], config=spec.get("config") or "tiny")
    from hal.conformance.runtime.child import _load_func
    w = _load_func(spec)()
    if not hasattr(w, "example_batch"):
        raise TypeError(f"{spec['target']} returned {type(w).__name__}; --precision/--profile need a workload "
                        "(build/example_batch/train_step/infer)")
    return w


def _child(spec: dict) -> dict:
    import torch

    import hal
    infos = {i.name: i for i in hal.list_backends()}
    info = infos[spec["device"]]
    device = spec["device"] if info.available else "cpu"
    note = "" if info.available else (f"{spec['device']} is not present here ({info.reason}); "
                                      f"measured on the CPU, not on {spec['device']}")
    result: dict = {}
    steps = spec.get("steps") or 2
    if spec.get("precision"):
        from hal.conformance.precision import compare_workload
        calib = "cuda" if device != "cuda" and infos.get("cuda") and infos["cuda"].available else None
        p = compare_workload(_workload(spec), device=device, dtype=torch.float32, steps=steps,
                             calibrate_with=calib).as_dict()
        p["verified"] = bool(info.available) and bool(p.get("verified", True))
        if note:
            p["note"] = note
        result["precision"] = p
    if spec.get("profile"):
        from hal.conformance.profiling import inference_load_matrix, profile_workload
        backend = hal.get_backend(device)
        w = _workload(spec)
        if getattr(w, "model", None) is None:
            w.build(backend.torch_device(), torch.float32, seed=0)
        prof = profile_workload(w, backend, steps=max(steps, 2), warmup=1, out_dir=spec.get("out"), mode="train",
                                fallback_ops=spec.get("fallback_ops") or ())
        if hasattr(w, "decode_step"):
            prof["inference"] = inference_load_matrix(w, backend, batches=(1,), prompt_lens=(16,), output_lens=(8,),
                                                      warmup=1, repeats=3)
        prof["verified"] = bool(info.available)
        if note:
            prof["note"] = note
        result["profile"] = prof
    return result


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        spec = json.load(f)
    from hal.conformance.runtime.runner import apply_memory_limit
    apply_memory_limit(spec.get("memory_limit_mb"))
    try:
        result = _child(spec)
        result["run"] = {"status": "ok", "steps": spec.get("steps") or 2, "error": None}
    except BaseException as exc:  # the workload's failure is reported, never raised at the parent
        traceback.print_exc()
        result = {"run": {"status": "error", "steps": 0, "error": f"{type(exc).__name__}: {exc}"[:2000]}}
    tmp = spec["result_path"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, default=str)
    os.replace(tmp, spec["result_path"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
