"""Runtime audit: run a program, capture every op it dispatches, and say what falls back on the target.

Entry point for ``hal-audit`` (the CLI owns argument parsing and report writing)::

    sections = audit_target(request)

``request`` keys: ``target`` (a path, ``file.py:func``, a reference-model name, a ``.onnx`` file,
a ``.ipynb`` notebook or a module name), ``kind`` (``script`` | ``func`` | ``model`` | ``onnx`` |
``notebook`` | ``module``: run like ``python -m`` from ``cwd``, default the current folder), ``device`` (the target backend),
``args`` (argv for a script), ``steps`` (optimizer steps / forward passes; None: a script runs to
its end, a func or model runs 2), ``timeout`` (seconds; None: :data:`DEFAULT_TIMEOUT_S`),
``precision``, ``profile`` (other audits: reported as None here), ``out`` (a directory: the only
place this function writes: the child's spec and result live in a folder of their own inside it,
unique to the run and removed afterwards; None: a temporary directory), plus optional ``threads`` (torch CPU threads in the child), ``config`` (model
config, default ``tiny``) and ``arch`` (the target's architecture: an int or ``--arch`` text such as
``mlu590``; dtype gates and TF32 notes).

``progress`` (optional) is called as ``progress(phase, **counts)``: ``"run"`` when the child starts
and then with ``steps`` and ``ops`` (distinct ops seen) as the child reports them (it writes a small
progress file in its working folder about twice a second; the parent polls it), ``"capture"`` when
the run ended and its records are read, ``"predict"`` while op statuses are looked up. A raising
callback is ignored (progress never fails an audit).

Returns ``{"run", "ops", "findings", "target", "precision", "profile"}`` (see DESIGN's audit.json
contract). The program always runs in a child process (:mod:`.child`, :mod:`.runner`), so a raise,
hang, ``os._exit`` or crash shows up as ``run.status`` (error | timeout | crashed) with the last
lines it printed — never as an exception here. Raises ``ValueError`` (or a :mod:`hal.errors`
error) only for a bad request: unknown kind or device, a missing file, ONNX support missing.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading

from hal.conformance.runtime.predict import build_ops

KINDS = ("script", "func", "model", "onnx", "module", "notebook")
DEFAULT_TIMEOUT_S = 600.0
__all__ = ["audit_target", "KINDS", "DEFAULT_TIMEOUT_S"]


def target_info(device: str) -> dict:
    """``{device, available, verified (False until a run there), reason, device_type}`` for a backend name."""
    from hal.discovery import list_backends
    infos = {i.name: i for i in list_backends()}
    info = infos.get(device)
    if info is None:
        raise ValueError(f"unknown device {device!r}; installed backends: {', '.join(sorted(infos)) or 'none'}")
    device_type = info.cls.device_type if info.cls is not None else device
    return {"device": device, "available": bool(info.available), "verified": False, "reason": info.reason,
            "device_type": device_type}


def _validate(request: dict) -> dict:
    req = dict(request)
    kind = req.get("kind")
    if kind not in KINDS:
        raise ValueError(f"unknown audit kind {kind!r}; one of {', '.join(KINDS)}")
    target = req.get("target")
    if not target or not isinstance(target, str):
        raise ValueError("request has no target")
    path = target.rpartition(":")[0] if kind == "func" else target
    if kind in ("script", "func", "onnx", "notebook") and not os.path.isfile(path):
        raise ValueError(f"no such file: {path}")
    if kind == "func" and not target.rpartition(":")[2].isidentifier():
        raise ValueError(f"{target!r}: expected file.py:function_name")
    if req.get("arch") is not None and not isinstance(req["arch"], int):
        from hal.capabilities import parse_arch
        req["arch"] = parse_arch(req["arch"])  # ValueError: a bad request
    steps = req.get("steps")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ValueError(f"steps must be a positive integer, not {steps!r}")
    timeout = req.get("timeout")
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
    req.setdefault("args", [])
    return req


PROGRESS_POLL_S = 0.25


def _safe(progress):
    """``progress`` wrapped so that it never raises (None: a no-op)."""
    def call(phase: str, **counts) -> None:
        if progress is not None:
            try:
                progress(phase, **counts)
            except Exception:  # a display problem never fails the audit
                pass
    return call


def audit_target(request: dict, progress=None) -> dict:
    """Run the audit described by ``request`` (see the module docstring) and return its sections."""
    progress = _safe(progress)
    req = _validate(request)
    target = target_info(req.get("device") or "cpu")
    if req["kind"] == "onnx":
        from hal.conformance.runtime.onnx_audit import audit_onnx
        return audit_onnx(req["target"], target)
    if req["kind"] == "model":
        from hal.models import workload_class
        workload_class(req["target"])  # ValueError naming the choices
    out = req.get("out")
    if out:
        os.makedirs(out, exist_ok=True)
        return _audit_in(req, target, out, progress)
    with tempfile.TemporaryDirectory(prefix="hal-audit-") as tmp:
        return _audit_in(req, target, tmp, progress)


def _warm_capabilities(device: str) -> None:
    from hal.conformance.runtime.predict import capability_query
    query, _ = capability_query()
    if query is not None:
        try:
            query(device, "aten::add.Tensor", dtypes=("float32",))
        except Exception:  # reported per op later, with the reason
            pass


def _audit_in(req: dict, target: dict, out: str, progress=None) -> dict:
    # this run's own working folder inside out: concurrent runs never share a file, and files the user
    # keeps in out (even ones named like ours) are never read, replaced or removed
    progress = progress or _safe(None)
    workdir = tempfile.mkdtemp(prefix=".hal-audit-run-", dir=out)
    try:
        return _audit_with(req, target, workdir, progress)
    finally:
        if not os.environ.get("HAL_DEBUG"):  # HAL_DEBUG=1 keeps the child's spec and result
            shutil.rmtree(workdir, ignore_errors=True)


def _poll_progress(path: str, progress, stop: threading.Event) -> None:
    """Pass the child's ``{"steps", "ops"}`` progress file to ``progress("run", ...)`` until ``stop``."""
    last = None
    while not stop.wait(PROGRESS_POLL_S):
        try:
            with open(path) as f:
                seen = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(seen, dict) and seen != last:
            last = seen
            progress("run", steps=seen.get("steps"), ops=seen.get("ops"))


def _audit_with(req: dict, target: dict, workdir: str, progress=None) -> dict:
    progress = progress or _safe(None)
    run_device = target["device_type"] if target["available"] else "cpu"
    spec_path = os.path.join(workdir, "runtime-child-spec.json")
    result_path = os.path.join(workdir, "runtime-child-result.json")
    mode = {"model": "train+infer", "func": "workload", "module": "module", "notebook": "notebook"}.get(
        req["kind"], "script")
    spec = {"target": os.path.abspath(req["target"]) if req["kind"] in ("script", "notebook") else
            (os.path.abspath(req["target"].rpartition(":")[0]) + ":" + req["target"].rpartition(":")[2]
             if req["kind"] == "func" else req["target"]),
            "kind": req["kind"], "args": [str(a) for a in req["args"]], "steps": req.get("steps"),
            "timeout": req.get("timeout") or DEFAULT_TIMEOUT_S, "run_device": run_device,
            "redirect_cuda": run_device != "cuda" and req["kind"] != "model", "result_path": result_path, "mode": mode,
            "threads": req.get("threads"),
            "target_paths": None if target["available"] else target["device_type"], "config": req.get("config"),
            "memory_limit_mb": req.get("memory_limit_mb"), "devices": req.get("devices"),
            "cwd": req.get("cwd") or os.getcwd(),
            "progress_path": os.path.join(workdir, "runtime-child-progress.json")}
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    from hal.conformance.runtime.runner import run_child
    # load the target's capability data while the child runs (the two overlap on a multi-core host)
    warm = threading.Thread(target=_warm_capabilities, args=(target["device"],), daemon=True)
    warm.start()
    progress("run")
    stop = threading.Event()
    poll = threading.Thread(target=_poll_progress, args=(spec["progress_path"], progress, stop), daemon=True)
    poll.start()
    try:
        result = run_child(spec_path, result_path, spec["timeout"], env=env)
    finally:
        stop.set()
        poll.join()
    progress("capture", steps=(result.get("run") or {}).get("steps"), ops=len({o.get("op") for o in result.get("ops", [])}))
    warm.join()
    run = result["run"]
    run.setdefault("mode", mode)
    run["device"] = run_device
    measured = None
    if target["available"] and run.get("status") in ("ok", "error", "timeout", "crashed") and result.get("ops"):
        measured = {"device_type": run_device, "mlu_fallbacks": result.get("mlu_fallbacks", {})}
        target["verified"] = True
        target["reason"] = f"ran on {run_device}: results marked verified were measured there"
    else:
        target["reason"] = (f"{target['device']} is not available here ({target['reason']}); the program ran on "
                            f"{run_device} and every op status is predicted from the capability data")
    progress("predict")
    ops = build_ops(result.get("ops", []), target["device"], run.get("steps") or 1, measured,
                    result.get("hal_fallbacks"), arch=req.get("arch"))
    findings = result.get("findings", [])
    return {"run": run, "ops": ops, "findings": findings, "target": target, "precision": None, "profile": None}
