"""The comparison engine: one target step against a float64 CPU reference, blame, drift, verdict.

Entry points (contract used by ``hal-audit --precision``):

* :func:`compare_module` - any ``nn.Module`` factory and inputs;
* :func:`compare_workload` - a reference workload from :mod:`hal.models` (or an object with the
  same interface: ``build(device, dtype, seed)``, ``model``, ``optimizer``, ``example_batch()``,
  ``forward_loss(batch)``).

How it works: the target model is built, then deep-copied (model and optimizer together, so the
copy's optimizer holds the copy's parameters) and converted to float64 on the CPU: identical
weights, inputs upcast (integer inputs unchanged). Step 0 runs the reference under a
:class:`StepTracer` (samples of every op output), then the target under a tracer that compares
each op output with the reference (*total* error) and with a float64 shadow of the op on its
actual inputs (*local* error). Gradients and parameters after the optimizer step are compared per
parameter; the remaining ``steps - 1`` steps only record losses (training drift). Dropout modules
are set to p=0 in both copies: a low-precision and a float64 run cannot share random masks.

Blame (``first_divergence``): in execution order, the first op whose output exceeds its threshold
while every recorded producer of its inputs was within tolerance, and whose float64 shadow
confirms the error is its own (``kind="introduced"``). If none qualifies, the first op whose own
error exceeds with inputs already off (``introduced``, ``inputs_within=False``), then the first op
that merely amplified in-tolerance inputs beyond tolerance (``kind="amplified"``). A linear reduction (a sum, a mean,
a norm's saved mean) cannot amplify: over tolerance with in-tolerance inputs and its own error within, and its error
within what its inputs' errors sum to, its result cancelled (status ``cancelled``, within tolerance:
:func:`cancelled`). An op that could
not be shadowed (``local`` None) and exceeds against the reference run with in-tolerance (or
unrecorded) inputs is where the error is first seen (``kind="first-seen"``, with a ``note``), not
proof that it introduced it. Only an ``introduced`` divergence fails the verdict.

Raises :class:`hal.errors.HalError` subclasses for an unusable device; everything else propagates.
Not thread-safe (models are mutated by training steps).
"""
from __future__ import annotations

import contextlib
import copy
import math
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch.utils._pytree import tree_map

from hal.backend import dtype_name
from hal.errors import BackendUnavailableError

from . import thresholds as th
from .calibration import calibrate, device_available
from .drift import drift_stats, relative_deviations
from .metrics import DEFAULT_MAX_ELEMENTS, StatsRequest, error_stats_many, take_samples
from .result import PrecisionResult
from .tracer import EXACT_CAST, OpRecord, StepTracer, Widen64Mode, module_to

_REF_DEVICE = torch.device("cpu")


class _Side:
    """One copy being trained: model, optimizer, loss closure, device, autocast dtype."""

    def __init__(self, model, optimizer, loss_fn, device, autocast=None, widen=False):
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.device, self.autocast, self.widen = torch.device(device), autocast, widen

    def autocast_ctx(self):
        if self.widen:
            return Widen64Mode()
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast)


def to_reference(batch: Any) -> Any:
    """Floating tensors -> float64 CPU copies; other tensors -> CPU; everything else unchanged."""
    def conv(x):
        if isinstance(x, torch.Tensor):
            return x.detach().to(_REF_DEVICE, torch.float64 if x.is_floating_point() else x.dtype)
        return x
    return tree_map(conv, batch)


#: float attributes through which models apply dropout functionally (``F.dropout(x, p=self.dropout, ...)``,
#: T5's ``dropout_rate``, Hugging Face's ``attention_dropout``/``activation_dropout``, LayerDrop's ``layerdrop``)
_FUNCTIONAL_DROPOUT = re.compile(r"(dropout|layerdrop|drop_prob)", re.IGNORECASE)


def disable_dropout(model: torch.nn.Module) -> int:
    """Set every dropout module's p to 0, and every float dropout probability a module keeps for functional
    dropout (an attribute named like ``dropout``, ``attention_dropout``, ``dropout_rate``, ``layerdrop``) to 0.0;
    returns how many were changed.

    Dropout draws from the device's generator, which a float64 reference on another device cannot replay: left
    on, every output after it differs by the mask (a T5 attention dropout on CUDA, say), not by arithmetic."""
    n = 0
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p != 0:
            m.p = 0.0
            n += 1
        for name, value in list(vars(m).items()):
            if type(value) is float and value > 0 and _FUNCTIONAL_DROPOUT.search(name):
                setattr(m, name, 0.0)
                n += 1
    return n


def widen_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """Move an optimizer's per-parameter state to float64 on the CPU (scalar step counters kept)."""
    for st in opt.state.values():
        for k, v in list(st.items()):
            if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() > 0:
                st[k] = v.detach().to(_REF_DEVICE, torch.float64)
            elif isinstance(v, torch.Tensor):
                st[k] = v.detach().to(_REF_DEVICE)


def _check_device(device) -> torch.device:
    dev = torch.device(device)
    reason = device_available(str(dev))
    if reason is not None:
        raise BackendUnavailableError(dev.type, reason)
    return dev


# -- one traced step ---------------------------------------------------------------------------
def _traced_step(side: _Side, batch, tracer: StepTracer) -> torch.Tensor:
    side.optimizer.zero_grad(set_to_none=True)
    with tracer:
        with side.autocast_ctx():
            loss = side.loss_fn(batch)
        loss.backward()
    return loss.detach()


def _plain_step(side: _Side, batch) -> float:
    side.optimizer.zero_grad(set_to_none=True)
    with side.autocast_ctx():
        loss = side.loss_fn(batch)
    if side.widen:
        with Widen64Mode():
            loss.backward()
    else:
        loss.backward()
    side.optimizer.step()
    return float(loss.detach())


def _tensor_rows(kind: str, pairs, compute_dtype, max_elements, step_floor: float = 0.0) -> List[Dict[str, Any]]:
    """Rows for gradients, parameters and the loss (aggregate rule). For parameters after the
    optimizer step, ``step_floor`` (the largest learning rate) is added to the allowed RMS
    absolute error: a normalising optimizer (Adam) moves every coordinate by about lr even when
    its gradient is pure rounding noise (attention key biases, whose exact gradient is zero), so
    a sign flip of such an update is within the optimizer's resolution, not a precision defect."""
    pairs = [(name, t, r) for name, t, r in pairs if t is not None and r is not None]
    samples = take_samples([t for _, t, _ in pairs] + [r for *_, r in pairs], max_elements)
    todo = []
    for (name, t, _), ts, rs in zip(pairs, samples, samples[len(pairs):]):
        dt = th.loosest([t.dtype, compute_dtype] if compute_dtype else [t.dtype])
        thr = th.threshold_for("sum" if kind == "gradient" else "param", dt, 1)
        todo.append((name, t, thr, StatsRequest(ts, rs, t.dtype, thr["rtol_eff"], thr["atol"], True, "aggregate")))
    rows = []
    for (name, t, thr, _), stats in zip(todo, error_stats_many([q for *_, q in todo])):
        if kind == "parameter" and stats["nan_inf_mismatch"] == 0:
            stats["rule"] = "parameter"
            stats["step_floor"] = step_floor
            stats["exceeds"] = bool(stats["rms_abs"] > thr["rtol_eff"] * stats["rms_ref"] + thr["atol"] + step_floor)
        module, _, leaf = name.rpartition(".")
        rows.append({"kind": kind, "phase": "backward" if kind == "gradient" else "optimizer",
                     "module": module or "<root>", "op": leaf, "occurrence": 0, "out_index": 0,
                     "dtype": dtype_name(t.dtype), "shape": list(t.shape), "threshold": thr,
                     "total_threshold": thr, "local": None, "total": stats, "sampling": "full",
                     "shadow_error": None, "status": "exceeds" if stats["exceeds"] else "ok"})
    return rows


# -- blame -------------------------------------------------------------------------------------
def _overflowed(rec: OpRecord) -> bool:
    """Whether every comparison of ``rec`` that exceeds does so by NaN/Inf positions (and one does)."""
    bad = [s for s in (rec.local, rec.total) if s is not None and s["exceeds"]]
    return bool(bad) and all(s["nan_inf_mismatch"] > 0 for s in bad)


#: linear reductions, by op, and the output of each that is one (a norm's saved mean): their error is the sum (or the
#: mean) of their terms' errors, whatever the terms
LINEAR_REDUCTIONS = {"sum": 0, "mean": 0, "native_layer_norm": 1, "native_group_norm": 1, "native_batch_norm": 1}
#: room for the sampled estimates of :func:`cancelled`'s bound (each side's RMS is measured on a sample)
CANCELLATION_SLACK = 2.0


def cancelled(rec: OpRecord, records: Sequence[OpRecord]) -> bool:
    """Whether ``rec``, over tolerance against the reference run, is a linear reduction (:data:`LINEAR_REDUCTIONS`)
    whose error is within what its inputs' errors make: RMS error at most ``CANCELLATION_SLACK x`` (K for a sum, 1 for
    a mean) x the largest RMS error of its recorded inputs, plus its own. By Cauchy-Schwarz a sum of K terms each
    off by e is off by at most K e (a mean by e): its relative error can grow only because its result is small
    against its terms. An HF BERT loop's key-bias gradient (a sum exactly zero in exact arithmetic: rms_rel 1e13) and a
    LayerNorm's saved mean of near-zero-mean rows (rms_rel 0.031 > 0.016) were "amplified" so. False when an input
    was not compared against the reference run (no error to bound with)."""
    if (LINEAR_REDUCTIONS.get(rec.op) != rec.out_index or rec.total is None or rec.total["nan_inf_mismatch"]
            or not rec.inputs):
        return False
    errs = [records[p].total for p in rec.inputs]
    if any(e is None for e in errs):
        return False
    terms = rec.threshold.get("k", 1) if rec.op == "sum" else 1
    own = rec.local["rms_abs"] if rec.local is not None else 0.0
    bound = CANCELLATION_SLACK * terms * max(e["rms_abs"] for e in errs) + own
    return rec.total["rms_abs"] <= bound


def mark_cancelled_tensors(rows: List[Dict[str, Any]], grad_producers: Dict[str, Optional[int]],
                           records: Sequence[OpRecord], status: Sequence[str]) -> None:
    """Status ``cancelled`` for the gradient rows over threshold whose gradient is the output of an op whose result
    cancelled (:func:`cancelled`), or a cast of one (autocast's, to a float32 parameter's dtype): the same values,
    judged there; and for the parameter rows over threshold that such a gradient updated (their error is the
    update's of that gradient). ``grad_producers``: parameter name -> the record index of its gradient
    (:meth:`StepTracer.producer`); ``status``: the records' statuses. An attention key bias's gradient is zero in
    exact arithmetic and rounding noise in 16 bits."""
    def source(i: int) -> int:
        while records[i].op == "_to_copy" and len(records[i].inputs) == 1:
            i = records[i].inputs[0]
        return i
    names = {n for n, i in grad_producers.items() if i is not None and status[source(i)] == "cancelled"}
    for r in rows:
        name = r["op"] if r["module"] == "<root>" else f"{r['module']}.{r['op']}"
        if r["kind"] in ("gradient", "parameter") and r["status"] == "exceeds" and name in names \
                and not r["total"]["nan_inf_mismatch"]:
            r["status"] = "cancelled"


def classify(records: Sequence[OpRecord], scaled_overflow: bool = False
             ) -> Tuple[List[str], Optional[Dict[str, Any]]]:
    """Status per record and the first divergence (see module docstring). ``scaled_overflow``: the step's
    GradScaler found Inf/NaN in the scaled gradients and skipped the step, so a backward op whose only fault is
    NaN/Inf is the loss scale's overflow, which the scaler exists to catch: status ``overflow``, counted as within
    tolerance (never the first divergence). A linear reduction whose result cancelled (:func:`cancelled`): status
    ``cancelled``, within tolerance too."""
    within: List[bool] = []
    status: List[str] = []
    tier1 = tier2 = tier3 = None
    for i, rec in enumerate(records):
        inputs_ok = all(within[p] for p in rec.inputs)
        loc = None if rec.local is None else bool(rec.local["exceeds"])
        tot = None if rec.total is None else bool(rec.total["exceeds"])
        if rec.kind == "module":
            out_ok = not tot if tot is not None else True
            within.append(out_ok)
            status.append("ok" if out_ok else "exceeds")
            continue
        if scaled_overflow and rec.phase == "backward" and _overflowed(rec):
            within.append(True)
            status.append("overflow")
            continue
        out_ok = (not tot) if tot is not None else (inputs_ok and not loc)
        within.append(out_ok)
        out_bad = (tot is True) or (tot is None and loc is True)
        if loc:
            st = "introduced"
            if inputs_ok and out_bad and tier1 is None:
                tier1 = i
            elif tier2 is None:
                tier2 = i
        elif out_bad and inputs_ok and loc is False and cancelled(rec, records):
            within[-1] = True
            st = "cancelled"
        elif out_bad and inputs_ok:
            st = "amplified" if loc is False else "exceeds"
            if loc is None and tier1 is None:
                tier1 = i
            elif tier3 is None:
                tier3 = i
        elif out_bad:
            st = "inherited"
        else:
            st = "ok" if rec.total is not None or rec.local is not None else "unchecked"
        status.append(st)
    pick = tier1 if tier1 is not None else tier2 if tier2 is not None else tier3
    if pick is None:
        return status, None
    rec = records[pick]
    use_local = rec.local is not None and rec.local["exceeds"]
    stats, thr = (rec.local, rec.threshold) if use_local else (rec.total, rec.total_threshold)
    metric, value, limit = exceeded_metric(stats, thr)
    # an op whose own error was not isolated (no float64 shadow) and whose total exceeds is where the error is
    # first seen, not proof that it introduced it: its producers may be ops the tracer did not record
    kind = "amplified" if status[pick] == "amplified" else "introduced" if rec.local is not None else "first-seen"
    fd = {"module": rec.module, "op": rec.op, "phase": rec.phase, "occurrence": rec.occurrence,
          "metric": metric, "value": value, "threshold": limit, "kind": kind,
          "inputs_within": all(within[p] for p in rec.inputs),
          "compared_against": "float64 shadow of the op on its actual inputs" if use_local
          else "float64 reference run", "max_abs": stats["max_abs"], "rms_rel": stats["rms_rel"],
          "rtol_eff": thr["rtol_eff"], "atol": thr["atol"], "index": pick}
    if kind == "first-seen":
        fd["note"] = (f"its own error was not isolated ({rec.shadow_error or 'no float64 shadow'}); "
                      + ("its inputs come from ops that were not recorded" if not rec.inputs
                         else "its recorded inputs were within tolerance"))
    return status, fd


def divergence_reason(fd: Dict[str, Any]) -> str:
    """One line for the verdict's reasons: what ``first_divergence`` says about ``fd``'s op."""
    where = f"{fd['module']}:{fd['op']}"
    if fd["kind"] == "introduced":
        return f"{where} introduced error beyond its threshold"
    if fd["kind"] == "first-seen":
        return (f"{where} is the first op over its threshold against the float64 reference run; "
                f"{fd.get('note', 'its own error was not isolated')}")
    return f"{where} amplified in-tolerance inputs beyond tolerance"


#: the verdict reason's opening for :func:`largest_divergence` (the terminal's precision line looks for it)
LARGEST = "largest divergence: "


def largest_divergence(rows: Sequence[Dict[str, Any]], fd: Dict[str, Any]) -> Optional[str]:
    """``"largest divergence: MODULE:OP STATUS (METRIC VALUE > LIMIT)"`` (``<`` for the cosine): of the op rows
    where an error arises or grows beyond tolerance (status ``introduced``, ``amplified`` or ``exceeds``), the one
    furthest over its limit, when that is not the first divergence ``fd`` (``rows`` in record order, as
    ``fd["index"]`` counts); else None. The first divergence can be an op just over its threshold well before the op
    that makes the loss differ (pytorch/examples siamese_network: a batch norm at 1.1x its limit, then BCELoss at
    68,000x)."""
    best, best_i, best_ratio = None, None, 1.0
    for i, r in enumerate(rows):
        if r.get("kind") != "op" or r.get("status") not in ("introduced", "amplified", "exceeds"):
            continue
        own = r["status"] == "introduced" and r.get("local") is not None
        stats, thr = (r["local"], r["threshold"]) if own else (r.get("total"), r.get("total_threshold"))
        if not stats or not thr:
            continue
        metric, value, limit = exceeded_metric(stats, thr)
        if metric == "nan_inf_mismatch":
            ratio = math.inf
        elif metric == "cosine":  # smaller is worse
            ratio = (1.0 - value) / max(1.0 - limit, 1e-300)
        else:
            ratio = value / max(limit, 1e-300)
        if ratio > best_ratio:
            best, best_i, best_ratio = (r, metric, value, limit), i, ratio
    if best is None or best_i == fd.get("index"):
        return None
    r, metric, value, limit = best
    return (f"{LARGEST}{r['module']}:{r['op']} {r['status']} "
            f"({metric} {value:.3g} {'<' if metric == 'cosine' else '>'} {limit:.3g})")


def exceeded_metric(stats: Dict[str, Any], thr: Dict[str, Any]) -> Tuple[str, Any, Any]:
    """(metric, value, limit) that made ``stats`` exceed under its rule."""
    if stats["nan_inf_mismatch"] > 0:
        return "nan_inf_mismatch", stats["nan_inf_mismatch"], 0
    if stats.get("rule") == "parameter":
        return "rms_abs", stats["rms_abs"], thr["rtol_eff"] * stats["rms_ref"] + thr["atol"] + stats["step_floor"]
    if stats.get("rule") == "aggregate":
        if stats["cosine"] < th.MODULE_COSINE_MIN:
            return "cosine", stats["cosine"], th.MODULE_COSINE_MIN
        return "rms_rel", stats["rms_rel"], thr["rtol_eff"] + thr["atol"]
    return "mismatch_frac", stats["mismatch_frac"], th.MISMATCH_FRACTION


def _record_row(rec: OpRecord, status: str) -> Dict[str, Any]:
    return {"kind": rec.kind, "phase": rec.phase, "module": rec.module, "op": rec.op,
            "occurrence": rec.occurrence, "out_index": rec.out_index, "dtype": rec.dtype,
            "shape": list(rec.shape), "threshold": rec.threshold, "total_threshold": rec.total_threshold,
            "local": rec.local, "total": rec.total, "sampling": rec.sampling,
            "shadow_error": rec.shadow_error, "inputs": list(rec.inputs), "status": status}


# -- the engine --------------------------------------------------------------------------------
def _compare_sides(target: _Side, ref: _Side, batches: Callable[[int], Tuple[Any, Any]], steps: int,
                   *, shadow: bool, max_elements: int, sample: bool, compute_dtype) -> Dict[str, Any]:
    tb, rb = batches(0)
    ref_tracer = StepTracer(ref.model, "reference", max_elements=max_elements, sample=sample)
    ref_loss = _traced_step(ref, rb, ref_tracer)
    tgt_tracer = StepTracer(target.model, "target", reference_samples=ref_tracer.samples,
                            reference_shapes=ref_tracer.sample_shapes,
                            shadow=shadow, max_elements=max_elements, sample=sample,
                            compute_dtype=compute_dtype)
    tgt_loss = _traced_step(target, tb, tgt_tracer)
    if tgt_tracer.tf32_ops:  # gradients, parameters and the loss come from ops the device ran in TF32
        compute_dtype = th.loosest([compute_dtype, th.TF32])
    status, fd = classify(tgt_tracer.records)
    rows = [_record_row(r, s) for r, s in zip(tgt_tracer.records, status)]
    tparams = dict(target.model.named_parameters())
    rparams = dict(ref.model.named_parameters())
    rows += _tensor_rows("gradient", [(n, tparams[n].grad, rparams[n].grad) for n in tparams if n in rparams],
                         compute_dtype, max_elements)
    grad_producers = {n: tgt_tracer.producer(p.grad) for n, p in tparams.items()}
    target.optimizer.step()
    ref.optimizer.step()
    rows += _tensor_rows("parameter", [(n, tparams[n].detach(), rparams[n].detach()) for n in tparams
                                       if n in rparams], compute_dtype, max_elements,
                         step_floor=max((float(g.get("lr", 0.0)) for g in target.optimizer.param_groups),
                                        default=0.0))
    mark_cancelled_tensors(rows, grad_producers, tgt_tracer.records, status)
    rows += _tensor_rows("loss", [("loss", tgt_loss.reshape(1), ref_loss.reshape(1))],
                         compute_dtype, max_elements)
    lt, lr = [float(tgt_loss)], [float(ref_loss)]
    for s in range(1, steps):
        tb, rb = batches(s)
        lt.append(_plain_step(target, tb))
        lr.append(_plain_step(ref, rb))
    return {"rows": rows, "first_divergence": fd, "drift": drift_stats(lt, lr), "compute_dtype": compute_dtype,
            "tf32": tgt_tracer.tf32_note(), "records": tgt_tracer.records,
            "cache": {"hits": tgt_tracer.shadow.cache.hits, "misses": tgt_tracer.shadow.cache.misses}
            if tgt_tracer.shadow else None}


def _verdict(out: Dict[str, Any], compute_dtype) -> Tuple[str, List[str]]:
    reasons = []
    fd = out["first_divergence"]
    rows = out["rows"]
    if fd is not None and fd["kind"] == "introduced":
        reasons.append(divergence_reason(fd))
    if any((r.get("total") or {}).get("nan_inf_mismatch", 0) for r in rows if r["kind"] == "loss"):
        reasons.append("loss is NaN/Inf where the reference is finite")
    if reasons:
        return "fail", reasons
    if fd is not None:
        reasons.append(divergence_reason(fd))
        big = largest_divergence(rows, fd)
        if big is not None:
            reasons.append(big)
    for kind in ("module", "gradient", "parameter", "loss"):
        bad = [r for r in rows if r["kind"] == kind and r["status"] not in ("ok", "cancelled")]
        if bad:
            reasons.append(f"{len(bad)} {kind} comparison(s) over threshold (first: {bad[0]['module']}"
                           f"{'.' + bad[0]['op'] if kind in ('gradient', 'parameter') else ''})")
    dr = out["drift"]
    rtol = th.base_tolerance(compute_dtype)[0]
    drift_tol = max(10 * rtol, 1e-6)
    if not math.isfinite(dr["max_rel_dev"]) or dr["max_rel_dev"] > drift_tol:
        reasons.append(f"loss drift {dr['max_rel_dev']:.3g} > {drift_tol:g}{_drift_start(dr, drift_tol)}")
    return ("warning" if reasons else "pass"), reasons


def _drift_start(dr: Dict[str, Any], tol: float) -> str:
    """Where the loss curve first leaves ``tol`` (relative), for the drift reason: ``" (from loss k)"``, and when the
    drift's ``loss_steps`` (a program target's: the optimizer step of each loss) put that loss in another step than the
    compared one (``compared_step``), which ``hal-audit --precision-step`` compares op by op."""
    devs = relative_deviations(dr["losses_target"], dr["losses_reference"])
    first = next((i for i, d in enumerate(devs) if d > tol), None)
    if first is None:
        return ""
    steps = dr.get("loss_steps") or []
    if first < len(steps) and steps[first] != dr.get("compared_step"):
        return (f" (from loss {first + 1}, in optimizer step {steps[first]}: --precision-step {steps[first]} "
                "compares that step op by op)")
    return f" (from loss {first + 1})"


def _summary(rows, cache) -> Dict[str, Any]:
    ops = [r for r in rows if r["kind"] == "op"]
    return {"ops": len(ops), "shadowed": sum(1 for r in ops if r["local"] is not None),
            "shadow_failed": sum(1 for r in ops if r["shadow_error"]),
            "matched_reference": sum(1 for r in ops if r["total"] is not None),
            "sampled": sum(1 for r in ops if r["sampling"] not in ("full", EXACT_CAST)
                           or (r["total"] is not None and r["total"]["n"] < math.prod(r["shape"]))),
            "exact_casts": sum(1 for r in ops if r["sampling"] == EXACT_CAST),
            "modules": sum(1 for r in rows if r["kind"] == "module"),
            "gradients": sum(1 for r in rows if r["kind"] == "gradient"),
            "parameters": sum(1 for r in rows if r["kind"] == "parameter"),
            "status_counts": {s: sum(1 for r in rows if r["status"] == s)
                              for s in sorted({r["status"] for r in rows})},
            "upcast_cache": cache}


def _run(build: Callable[[torch.device], Tuple[_Side, _Side, Callable]], device, dtype, autocast, steps,
         calibrate_with, shadow, max_elements, sample, target_info) -> PrecisionResult:
    dev = _check_device(device)
    compute_dtype = th.loosest([dtype] + ([autocast] if autocast is not None else []))
    target, ref, batches = build(dev)
    out = _compare_sides(target, ref, batches, steps, shadow=shadow, max_elements=max_elements,
                         sample=sample, compute_dtype=compute_dtype)
    verdict, reasons = _verdict(out, out["compute_dtype"])
    calibration, calib_reason = None, None
    if calibrate_with:
        calib_reason = device_available(calibrate_with)
        if calib_reason is None and torch.device(calibrate_with) == dev:
            calib_reason = "calibration device is the target device"
        if calib_reason is None:
            ct, cr, cb = build(torch.device(calibrate_with))
            cout = _compare_sides(ct, cr, cb, 1, shadow=True, max_elements=max_elements, sample=sample,
                                  compute_dtype=compute_dtype)
            calibration = calibrate(out["rows"], cout["rows"], str(torch.device(calibrate_with)))
            if calibration["counts"]["error"] and verdict == "pass":
                verdict = "warning"
            if calibration["counts"]["error"]:
                reasons.append(f"{calibration['counts']['error']} op(s) worse than {calibrate_with} "
                               "beyond msprobe's ratio limits and over threshold")
    summary = _summary(out["rows"], out["cache"])
    summary["verdict_reasons"] = reasons
    if out["tf32"]:
        summary["tf32"] = out["tf32"]
    target_info = dict(target_info, device=str(dev), dtype=dtype_name(dtype),
                       autocast=dtype_name(autocast) if autocast is not None else None, steps=steps,
                       shadow=shadow, sample_max_elements=max_elements if sample else None)
    if dev.type == "cpu":
        target_info["cpu_threads"] = torch.get_num_threads()
    elif dev.type == "cuda":
        target_info["device_name"] = torch.cuda.get_device_name(dev)
    thresholds = th.thresholds_summary()
    thresholds["sampling"] = (f"outputs over {max_elements} elements are compared on a fixed pseudo-random "
                              f"sample of {max_elements} positions (seeded by the element count); matrix "
                              "products and last-dim softmax are shadowed on a fixed subset of rows"
                              if sample else "off: every element compared")
    return PrecisionResult(reference={"device": "cpu", "dtype": "float64"}, target=target_info,
                           metrics=out["rows"], first_divergence=out["first_divergence"],
                           drift=out["drift"], calibration=calibration, verdict=verdict,
                           thresholds=thresholds, verified=True, summary=summary,
                           calibration_reason=calib_reason)


def default_loss(output: Any) -> torch.Tensor:
    """Mean of squares over every floating tensor of ``output`` (computed in float32 or wider)."""
    from torch.utils._pytree import tree_flatten

    ts = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not ts:
        raise ValueError("the module's output has no floating-point tensor to build a loss from")
    return sum(t.float().pow(2).mean() if t.dtype != torch.float64 else t.pow(2).mean() for t in ts)


def compare_module(module_factory: Callable[[], torch.nn.Module], inputs: Union[torch.Tensor, Sequence[Any]],
                   device="cpu", dtype: torch.dtype = torch.float32, autocast: Optional[torch.dtype] = None,
                   loss_fn: Optional[Callable[[Any], torch.Tensor]] = None, steps: int = 1, seed: int = 0,
                   calibrate_with: Optional[str] = None,
                   optimizer_factory: Optional[Callable[[Any], torch.optim.Optimizer]] = None,
                   shadow: bool = True, max_elements: int = DEFAULT_MAX_ELEMENTS,
                   sample: bool = True) -> PrecisionResult:
    """Compare ``module_factory()`` on ``device`` (``dtype``, optional autocast) with float64 on CPU.

    ``inputs``: a tensor or a sequence of positional arguments (floating tensors are cast to
    ``dtype`` for the target, float64 for the reference). ``loss_fn(output) -> scalar`` defaults
    to :func:`default_loss`; ``optimizer_factory(params)`` defaults to SGD(lr=1e-2). The same
    inputs are used for every one of ``steps`` steps. Raises BackendUnavailableError if
    ``device`` cannot be used.
    """
    args = tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
    loss_fn = loss_fn or default_loss
    opt_factory = optimizer_factory or (lambda ps: torch.optim.SGD(ps, lr=1e-2))

    def build(dev):
        torch.manual_seed(seed)
        model = module_to(module_factory(), dev, dtype)
        disable_dropout(model)
        model.train()
        opt = opt_factory(model.parameters())
        ref_model, ref_opt = copy.deepcopy((model, opt))
        module_to(ref_model, _REF_DEVICE, torch.float64, torch.complex128)
        widen_optimizer_state(ref_opt)
        ref_opt = _rebind_optimizer(ref_opt, ref_model, opt_factory)
        targs = tree_map(lambda x: x.to(dev, dtype) if isinstance(x, torch.Tensor) and x.is_floating_point()
                         else (x.to(dev) if isinstance(x, torch.Tensor) else x), args)
        rargs = to_reference(targs)
        t = _Side(model, opt, lambda b: loss_fn(model(*b)), dev, autocast)
        r = _Side(ref_model, ref_opt, lambda b: loss_fn(ref_model(*b)), _REF_DEVICE, None, widen=True)
        return t, r, lambda step: (targs, rargs)

    name = getattr(module_factory, "__name__", type(module_factory).__name__)
    return _run(build, device, dtype, autocast, steps, calibrate_with, shadow, max_elements, sample,
                {"model": name})


def _rebind_optimizer(opt_copy, model_copy, factory):
    """The deep-copied optimizer must point at the copied model's parameters (it does when the
    copy was made together); after ``.to()`` moved them, rebuild if the identities drifted."""
    params = {id(p) for p in model_copy.parameters()}
    if all(id(p) in params for g in opt_copy.param_groups for p in g["params"]):
        return opt_copy
    return factory(model_copy.parameters())


def compare_workload(workload: Any, device="cpu", dtype: torch.dtype = torch.float32,
                     autocast: Optional[torch.dtype] = None, steps: int = 3, seed: int = 0,
                     calibrate_with: Optional[str] = None, config: str = "tiny", shadow: bool = True,
                     max_elements: int = DEFAULT_MAX_ELEMENTS, sample: bool = True) -> PrecisionResult:
    """Compare a reference workload (name for :func:`hal.models.get_workload`, or an unbuilt
    workload object) trained ``steps`` steps on ``device`` against float64 on the CPU.

    The workload is built on the target device, then deep-copied whole and its model converted to
    float64 on the CPU (the copy's ``device``/``dtype`` attributes are updated when present).
    Raises BackendUnavailableError for an unusable device, KeyError/ValueError from
    ``get_workload`` for an unknown name or config.
    """
    def make():
        if isinstance(workload, str):
            from hal.models import get_workload
            return get_workload(workload, config=config)
        return copy.deepcopy(workload)

    def build(dev):
        w = make()
        w.build(dev, dtype, seed=seed)
        disable_dropout(w.model)
        w.model.train()
        # share (do not copy) the HAL backend object: it may hold device handles or modules
        memo = {id(v): v for k, v in vars(w).items() if k in ("backend", "comm") and v is not None}
        ref_w = copy.deepcopy(w, memo)
        module_to(ref_w.model, _REF_DEVICE, torch.float64, torch.complex128)
        widen_optimizer_state(ref_w.optimizer)
        for attr, val in (("device", _REF_DEVICE), ("dtype", torch.float64)):
            if hasattr(ref_w, attr):
                try:
                    setattr(ref_w, attr, val)
                except AttributeError:
                    pass
        for attr in ("autocast", "amp_dtype"):
            if getattr(ref_w, attr, None) is not None:
                setattr(ref_w, attr, None)
        cache: Dict[int, Tuple[Any, Any]] = {}
        torch.manual_seed(seed)

        def batches(step):
            if step not in cache:
                tb = w.example_batch()
                cache.clear()
                cache[step] = (tb, to_reference(tb))
            return cache[step]
        t = _Side(w.model, w.optimizer, w.forward_loss, dev, autocast)
        r = _Side(ref_w.model, ref_w.optimizer, ref_w.forward_loss, _REF_DEVICE, None, widen=True)
        return t, r, batches

    name = workload if isinstance(workload, str) else type(workload).__name__
    return _run(build, device, dtype, autocast, steps, calibrate_with, shadow, max_elements, sample,
                {"model": name, "config": config if isinstance(workload, str) else None})
