"""Evaluate one matrix cell (run as ``python -m hal.conformance.matrix.cell REQUEST_JSON RESULT_PATH``).

Where the backend is present the workload runs there: op capture (every op that ran on the device
is native, measured), median step time after a warm-up (synchronised through the backend), peak
memory from the backend's allocator statistics, and the precision verdict against float64; the
cell is ``verified``. Where it is not present the workload runs on the CPU to record the op mix,
and each op's status on the target comes from the capability manifest: the cell is *predicted*
and carries no time, memory or precision figures.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from hal.conformance.matrix.runner import INJECT_ENV
from hal.conformance.matrix.schema import OP_STATUS_ORDER, Cell


def _inject(cell: Cell) -> None:
    """Test hook: fail the named cells the way ``$HAL_MATRIX_INJECT`` asks (see runner)."""
    key = "/".join(cell.key)
    for item in os.environ.get(INJECT_ENV, "").split(","):
        name, _, how = item.partition("=")
        if name.strip() != key:
            continue
        if how == "crash":
            import ctypes
            ctypes.string_at(0)  # SIGSEGV: the interpreter dies
        elif how == "hang":
            time.sleep(10**6)
        elif how == "raise":
            raise RuntimeError("injected failure")


def _precision_verdict(req: dict, device: str):
    try:
        from hal.conformance.precision import compare_workload
    except ImportError as exc:  # pragma: no cover - precision package absent
        return None, f"precision check unavailable: {exc}"
    import torch
    dtype = getattr(torch, req["dtype"])
    res = compare_workload(req["model"], device=device, dtype=dtype, steps=2, seed=0)
    d = res.as_dict()
    fd = d.get("first_divergence")
    why = (f"first divergence at {fd.get('module')} / {fd.get('op')} ({fd.get('phase')}, {fd.get('metric')} "
           f"{fd.get('value'):.3g} > {fd.get('threshold'):.3g})") if fd else ""
    verdict = d.get("verdict")
    if req["mode"] == "infer" and fd and fd.get("phase") != "forward":
        # the comparison runs a training step; inference only uses the forward pass
        forward_bad = [m for m in d.get("metrics") or [] if m.get("phase") == "forward"
                       and ((m.get("local") or {}).get("exceeds") or (m.get("total") or {}).get("exceeds"))]
        if not forward_bad:
            verdict, why = "pass", f"forward pass within tolerance ({why}: not used by inference)"
        else:  # name what inference runs, not the backward op the training step blamed first
            m = forward_bad[0]
            which = "local" if (m.get("local") or {}).get("exceeds") else "total"
            why = (f"forward divergence at {m.get('module')} / {m.get('op')} output {m.get('out_index', 0)} "
                   f"({m.get('status')}, {which} error over its threshold; {len(forward_bad)} forward output(s) "
                   f"over; the first divergence overall was in the backward pass: {why})")
    return verdict, why


def evaluate(req: dict) -> Cell:
    import torch

    import hal
    import hal.ops
    from hal.conformance.runtime.capture import ModuleTracker, OpCapture
    from hal.conformance.runtime.predict import build_ops
    from hal.models import get_workload

    cell = Cell(req["backend"], req["model"], req["mode"], req["dtype"])
    _inject(cell)
    infos = {i.name: i for i in hal.list_backends()}
    info = infos.get(cell.backend)
    if info is None:
        cell.reason = "backend not installed"
        return cell
    present = info.available
    runner = hal.get_backend(cell.backend if present else "cpu")
    dtype = getattr(torch, cell.dtype)
    if present and not runner.supports_dtype(dtype):
        cell.status, cell.verified = "fail", True
        cell.reason = f"{cell.backend} does not compute {cell.dtype} natively"
        return cell
    w = get_workload(cell.model, config=req.get("config", "tiny"))
    w.build(runner.torch_device(), dtype, seed=0)
    batch = w.example_batch()
    step = (lambda: w.train_step(batch)) if cell.mode == "train" else (lambda: w.infer(batch))
    step()  # warm-up: first-call costs stay out of the figures and out of the op counts
    hal.ops.clear_fallback_log()
    tracker = ModuleTracker()
    tracker.install()
    try:
        # predicting: the CPU run takes the target's code paths (foreach optimizers, fused dropout...)
        with OpCapture(tracker, target=None if present else cell.backend) as cap:
            step()
    finally:
        tracker.remove()
    measured = {"device_type": runner.device_type} if present else None
    ops = build_ops(cap.records(), cell.backend, 1, measured, arch=req.get("arch"))
    cell.ops = {}
    for o in ops:
        cur = cell.ops.get(o["op"])
        if cur is None or OP_STATUS_ORDER.index(o["status"]) > OP_STATUS_ORDER.index(cur):
            cell.ops[o["op"]] = o["status"]
    fallback = sorted(op for op, st in cell.ops.items() if st == "fallback")
    unsupported = sorted(op for op, st in cell.ops.items() if st == "unsupported")
    risks = sorted({n for o in ops for n in o.get("dtype_notes", [])})
    figs = cell.figures
    figs.update({"ops": len(cell.ops), "fallback_ops": fallback, "unsupported_ops": unsupported,
                 "fallback_bytes_per_step": sum(o["bytes_per_step"] for o in ops if o["status"] == "fallback"),
                 "not_native": _not_native_detail(ops), "dtype_notes": risks})
    if present:
        cell.verified = True
        times = []
        for _ in range(max(int(req.get("steps", 3)), 1)):
            runner.synchronize()
            t0 = time.perf_counter()
            step()
            runner.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        runner.synchronize()
        runner.reset_peak_memory_stats()
        step()
        runner.synchronize()
        mem = runner.memory_stats()
        figs.update({"step_ms": statistics.median(times), "step_ms_all": times, "peak_bytes": mem.peak,
                     "peak_source": mem.source})
        if req.get("precision", True):
            verdict, why = _precision_verdict(req, cell.backend)
            figs["precision"] = verdict
            if verdict == "fail":
                cell.status, cell.reason = "precision-fail", why
            elif why:
                figs["precision_note"] = why
    if not present:
        return _predicted(cell, unsupported, fallback, risks, info.reason)
    if cell.status == "not-run":
        if unsupported:
            cell.status = "fail"
            cell.reason = f"{len(unsupported)} op(s) unsupported: {', '.join(unsupported[:5])}"
        elif fallback:
            cell.status = "pass-with-fallback"
            cell.reason = f"{len(fallback)} op(s) fall back to the CPU: {', '.join(fallback[:5])}"
        else:
            cell.status = "pass"
    how = (f"measured on {runner.device_properties(0).name}" if present else
           f"predicted from the {cell.backend} capability manifest (op mix recorded on the CPU): {info.reason}")
    cell.reason = "; ".join(p for p in (cell.reason, how, *risks[:2]) if p)
    return cell


def _not_native_detail(ops: list) -> list:
    """One row per op that falls back or cannot run: ``{"op", "status", "calls_per_step",
    "bytes_per_step"}`` summed over its phases and dtypes, worst status kept; biggest traffic first."""
    rows: dict[str, dict] = {}
    for o in ops:
        if o["status"] not in ("fallback", "unsupported"):
            continue
        r = rows.setdefault(o["op"], {"op": o["op"], "status": o["status"], "calls_per_step": 0, "bytes_per_step": 0})
        if o["status"] == "unsupported":
            r["status"] = "unsupported"
        r["calls_per_step"] += o.get("calls_per_step") or 0
        r["bytes_per_step"] += o.get("bytes_per_step") or 0
    return sorted(rows.values(), key=lambda r: (-r["bytes_per_step"], r["op"]))


def _predicted(cell: Cell, unsupported: list, fallback: list, notes: list, why_absent: str) -> Cell:
    """A predicted cell states op support only (``ops-supported`` | ``ops-fallback`` |
    ``ops-unsupported``): never a measured cell's words, no time, memory or precision figures; the
    manifest's precision notes (TF32 defaults, float64 computed as float32, dtype gates) ride along
    in ``figures.precision_notes`` and the reason."""
    if unsupported:
        cell.status = "ops-unsupported"
        head = f"{len(unsupported)} op(s) cannot run: {', '.join(unsupported[:5])}"
    elif fallback:
        cell.status = "ops-fallback"
        head = f"{len(fallback)} op(s) fall back to the CPU: {', '.join(fallback[:5])}"
    else:
        cell.status = "ops-supported"
        head = "ops supported"
    cell.verified = False
    cell.figures["precision"] = "not measured"
    cell.figures["precision_notes"] = notes
    cell.reason = "; ".join([f"{head}, precision not measured (predicted from the {cell.backend} capability manifest, "
                             f"op mix recorded on the CPU: {why_absent})", *notes[:3]])
    return cell


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    req, out = json.loads(argv[0]), Path(argv[1])
    try:
        cell = evaluate(req)
    except Exception as exc:  # the workload raised: the cell failed, with the reason
        import hal
        present = any(i.name == req["backend"] and i.available for i in hal.list_backends())
        cell = Cell(req["backend"], req["model"], req["mode"], req["dtype"], status="fail", verified=present,
                    reason=f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}")
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(cell.as_dict(), default=str))
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
