"""``profile_callable`` / ``profile_workload``: where a step's time and memory go, per ATen op.

Procedure (the order is the contract; every figure in the result comes from one of these passes):

1. **Warm-up**: ``warmup`` untimed steps, then ``backend.synchronize()``.
2. **Plain timing**: ``steps`` steps, each between two backend events (device events on an
   accelerator, host clock on the CPU) and synchronised: ``step_ms``.
3. **Profiled steps**: ``torch.profiler``, one profiler warm-up step and ``steps`` recorded, timed
   steps, no shapes, stacks or memory (the cheap configuration): ``profiled_step_ms``. On the CPU
   (no device activity) they record the CPU activity: per-op calls, inclusive and self host time,
   runtime sync calls, the Chrome trace ``trace.json``. On an accelerator
   (``backend.profiler_activity``: ``CUDA``, ``PrivateUse1`` for MLU) they record the device
   activity only (kernels, memcpy events), and one more untimed *attribution step* records the
   CPU and device activities: per-op calls and host times, runtime sync calls, ``trace.json``, and
   the kernel -> op links that give each op its device time of the timed steps
   (:mod:`.attribution`; ``device_attribution`` in the result).
4. **Analysis step** (:mod:`.analysis`): one step under FlopCounterMode and a dispatch mode for
   FLOPs, bytes and dtype per op, and the host-device copies and sync points with their module and
   source line (stack capture here costs the timed steps nothing).
5. **Memory step** (:func:`hal.models.measure.measure_peak`): the measured peak of one step beside
   the estimate, when one is given.

Times in ``ops`` are totals over the ``steps`` profiled steps (host times on an accelerator: over the
attribution step; ``definitions`` says which); ``flops``/``bytes`` are per step;
``share`` is the op's self time (device when recorded, else host) over the summed step time.
Nothing here touches ``torch.cuda``: timing, synchronisation and memory go through the backend.
Not thread-safe (the profiler is per process).
"""
from __future__ import annotations

import contextlib
import os
import statistics
from typing import Any, Callable, Iterable, Optional

import torch

from hal.backend import Backend
from hal.conformance.profiling import attribution
from hal.conformance.profiling.analysis import analyse_step
from hal.conformance.profiling.roofline import resolve_peaks, roofline_row

TRACE_FILE = "trace.json"
#: profiler range around the harness's own synchronisation (left out of the sync count)
HARNESS_RANGE = "[hal profiling] harness sync"

DEFINITIONS = {
    "calls": "number of calls over the profiled steps",
    "total_ms": "host time inclusive of child ops, summed over the profiled steps",
    "self_ms": "host time in the op itself (dispatch, argument checks, launch; the whole kernel on the CPU)",
    "host_ms": "same as self_ms: host-side time the op itself costs",
    "device_ms": "device (kernel) time the op launched, summed over the profiled steps; null when the "
                 "profiler had no device activity (CPU-only run)",
    "share": "op time (device_ms when recorded, else self_ms) / summed step time of the profiled steps",
    "flops": "FLOPs of the op in one step (torch.utils.flop_counter.FlopCounterMode); 0 for ops it "
             "does not count, null for ops the analysis step did not see: composites decomposed above "
             "the dispatch mode (aten::linear -> aten::addmm) and ops that ran only inside another "
             "op's kernel (aten::copy_ inside aten::_to_copy); the op that was seen carries the figures",
    "bytes": "input + output tensor bytes of the op in one step (views and aliases: 0)",
    "intensity": "flops / bytes",
    "roofline_pct": "max(flops / peak FLOP/s[dtype], bytes / peak copy bandwidth) / measured op time "
                    "per step x 100 (device self time when recorded, else host self time)",
    "copies": "host<->device copies (aten::_to_copy / aten::copy_ across devices) in the analysis step, "
              "located by module and first source line outside torch",
    "syncs": "ops that block the host until the device catches up (item/float/bool on a device tensor, "
             "nonzero, masked_select, blocking device->host copies), located like copies; plus "
             "runtime_calls, the device runtime's synchronize calls over the profiled steps (the harness's own "
             "per-step synchronisation excluded)",
    "fallback": "ms_per_step: device (else host) self time of the fallback ops per step; "
                "copy_ms_per_step: their input+output bytes per step / host<->device bandwidth "
                "(the copies a CPU fallback makes; 0 when the device is the host)",
    "memory": "estimate_bytes: the workload's analytic peak; peak_bytes: measured over one step "
              "(see peak_source); error_pct = (estimate - peak) / peak x 100",
    "step_ms": "plain (unprofiled) step time between backend events, synchronised, after warm-up",
    "overhead_ratio": "median profiled step / median plain step (a program's: fastest over fastest when its plain "
                      "steps were unsteady, see notes)",
}


#: what changes in ``DEFINITIONS`` when the timed steps recorded the device activity only
_DEVICE_TIMED = {
    "calls": "number of calls in the attribution step (one untimed step recorded with the CPU and device "
             "activities, after the timed profiled steps)",
    "total_ms": "host time inclusive of child ops in the attribution step",
    "self_ms": "host time in the op itself in the attribution step (dispatch, argument checks, launch)",
    "device_ms": "device time of the kernels the op launched, summed over the timed profiled steps (which "
                 "recorded the device activity only): each kernel name's time split over the ops that "
                 "launched it in the attribution step, in proportion (see device_attribution)",
    "syncs": "ops that block the host until the device catches up (item/float/bool on a device tensor, "
             "nonzero, masked_select, blocking device->host copies), located like copies; plus "
             "runtime_calls, the device runtime's synchronize calls in the attribution step (the harness's "
             "own synchronisation excluded)",
}


def definitions(device: Optional[dict]) -> dict:
    """The ``definitions`` of a profile section; ``device``: :func:`device_split`'s dict when the
    timed steps recorded the device activity only (else None)."""
    return dict(DEFINITIONS, **(_DEVICE_TIMED if device is not None else {}))


def device_attribution(device: Optional[dict], timed: list[str]) -> dict:
    """The section's ``device_attribution``: how ops got their device time. ``timed``: the
    activities of the timed steps."""
    if device is None:
        return {"method": "no device activity: an op's time is its host self time in the timed profiled steps",
                "timed_activities": timed, "attribution_steps": 0}
    unattributed = device["unattributed_us"]
    top = sorted(unattributed, key=lambda k: -unattributed[k])[:10]
    total = device["total_us"]
    return {"method": "timed steps: device activity only; each kernel name's device time split over the ops "
                      "that launched it in one untimed attribution step (CPU + device activities)",
            "timed_activities": timed, "attribution_steps": 1,
            "device_ms_total": total / 1e3,
            "unattributed_ms": sum(unattributed.values()) / 1e3,
            "attributed_pct": (100.0 * (1 - sum(unattributed.values()) / total)) if total > 0 else None,
            "unattributed_kernels": [{"name": k[:200], "ms": unattributed[k] / 1e3} for k in top]}


def overhead_note(device_timed: bool) -> str:
    """What the timed profiled steps recorded and where the rest of the figures come from."""
    if device_timed:
        return ("timed profiled steps ran under torch.profiler with the device activity only (no operator "
                "events, shapes, stacks or memory); host times per op and the kernel -> op links come from one "
                "untimed attribution step (CPU + device activities), FLOPs, bytes and source locations from one "
                "separate analysis step")
    return ("timed profiled steps ran under torch.profiler with the CPU activity only (no shapes, stacks or "
            "memory); FLOPs, bytes and source locations come from one separate analysis step")


def _activities(backend: Backend) -> tuple[list, list[str], str]:
    from torch.profiler import ProfilerActivity
    acts, names, note = [ProfilerActivity.CPU], ["CPU"], ""
    name = getattr(backend, "profiler_activity", None)
    if name:
        act = getattr(ProfilerActivity, str(name), None)
        if act is not None and act in torch.profiler.supported_activities():
            acts.append(act)
            names.append(str(name))
        else:
            note = f"device activity {name!r} not supported by this torch build: host times only"
    return acts, names, note


def timed_steps(step_fn: Callable[[], Any], backend: Backend, n: int,
                around: Optional[Callable[[], None]] = None, mark: bool = False) -> list[float]:
    """Milliseconds of each of ``n`` calls of ``step_fn`` between two backend timing events, each
    followed by a synchronisation; ``around`` (if given) runs after each step, untimed. ``mark``
    wraps the harness's own synchronisation in a profiler range (``HARNESS_RANGE``) so that a
    profile can leave it out of the program's sync count."""
    out = []
    for _ in range(n):
        start, end = backend.create_event(enable_timing=True), backend.create_event(enable_timing=True)
        start.record()
        step_fn()
        end.record()
        with torch.profiler.record_function(HARNESS_RANGE) if mark else contextlib.nullcontext():
            end.synchronize()
            backend.synchronize()
        out.append(start.elapsed_time(end))
        if around is not None:
            around()
    return out


def _runtime_syncs(events: Iterable[Any]) -> dict[str, int]:
    """Device-runtime synchronize calls (``cudaStreamSynchronize`` ...) outside the harness range."""
    out: dict[str, int] = {}
    for e in events:
        name = e.name
        if "Synchronize" not in name or "::" in name:
            continue
        parent, ours = e.cpu_parent, False
        while parent is not None:
            if parent.name == HARNESS_RANGE:
                ours = True
                break
            parent = parent.cpu_parent
        if not ours:
            out[name] = out.get(name, 0) + 1
    return out


def profiled_steps(step_fn: Callable[[], Any], backend: Backend, steps: int, acts: list,
                   trace_path: Optional[str] = None) -> dict:
    """Pass 3 of the module docstring: one profiler warm-up step and ``steps`` recorded, timed
    steps under ``torch.profiler``. With the CPU activity alone (``acts`` of one), those steps give
    everything. With a device activity too, the timed steps record the device activity only and one
    more, untimed attribution step records both (:mod:`.attribution`: operator events cost the host
    a few µs per op, most of the profiler's overhead on a host-bound accelerator step).

    Returns ``{"averages": key averages (of the attribution step when there is one),
    "runtime_syncs": {runtime call: count} (the harness's own excluded; attribution step),
    "step_ms": [...], "device": :func:`device_split`'s dict or None}``. Writes the Chrome trace
    (the attribution step's, else the timed steps') to ``trace_path`` when given."""
    from torch.profiler import profile, schedule
    captured: dict = {}
    timed_acts = acts[1:] if len(acts) > 1 else acts

    def ready(prof: Any) -> None:
        captured["averages"] = prof.key_averages()
        captured["events"] = prof.events()
        if trace_path and len(acts) == 1:
            prof.export_chrome_trace(trace_path)

    with profile(activities=timed_acts, schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
                 on_trace_ready=ready) as prof:
        step_fn()
        backend.synchronize()
        prof.step()
        times = timed_steps(step_fn, backend, steps, around=prof.step, mark=True)
    if "averages" not in captured:  # pragma: no cover - schedule did not complete
        ready(prof)
    if len(acts) == 1:
        return {"averages": captured["averages"], "runtime_syncs": _runtime_syncs(captured["events"]),
                "step_ms": times, "device": None}
    with profile(activities=acts) as full:
        step_fn()
        with torch.profiler.record_function(HARNESS_RANGE):
            backend.synchronize()
    if trace_path:
        full.export_chrome_trace(trace_path)
    events = full.events()
    return {"averages": full.key_averages(), "runtime_syncs": _runtime_syncs(events), "step_ms": times,
            "device": device_split(captured["events"], events)}


def device_split(timed_events: Iterable[Any], attribution_events: Iterable[Any]) -> dict:
    """Device time of the timed steps (device activity only) per operator, through the attribution
    step's kernel -> operator links (:mod:`.attribution`): ``{"per_op_us", "unattributed_us" (per
    kernel name), "total_us", "memcpy" ({name: count} in the timed steps)}``."""
    times = attribution.device_event_times(timed_events)
    per_op, unattributed = attribution.attribute(times, attribution.kernel_owners(attribution_events))
    return {"per_op_us": per_op, "unattributed_us": unattributed,
            "total_us": sum(r["us"] for r in times.values()), "memcpy": attribution.memcpy_counts(times)}


def _host_device_bandwidth(backend: Backend, peaks: dict) -> tuple[float, str]:
    """Bytes/s of host<->device copies (0 on the CPU backend, where no copy happens)."""
    if backend.device_type == "cpu":
        return 0.0, "device is the host: a CPU fallback copies nothing"
    if peaks.get("host_device_bytes_per_s"):
        return float(peaks["host_device_bytes_per_s"]), "backend peaks host_device_bytes_per_s"
    nbytes = 64 << 20
    import time
    host = torch.ones(nbytes // 4)
    backend.to_device(host)
    backend.synchronize()
    t0 = time.perf_counter()
    dev = backend.to_device(host)
    backend.synchronize()
    backend.to_host(dev)
    secs = time.perf_counter() - t0
    return 2.0 * nbytes / secs, "measured now: 64 MiB pageable host->device + device->host round trip"


def _op_rows(averages: Iterable[Any], step_total_ms: float, device: Optional[dict]) -> tuple[list, dict]:
    """Operator rows of ``averages`` (``key_averages()``) and ``{"memcpy_events", "memcpy_names"}``.
    ``device``: :func:`device_split`'s dict when the timed steps recorded the device activity (``device_ms``
    and the memcpy counts come from it), None on the CPU (``device_ms`` null, the host self time is the op's)."""
    rows, runtime = [], {"memcpy_events": 0, "memcpy_names": {}}
    if device is not None:
        runtime = {"memcpy_events": sum(device["memcpy"].values()), "memcpy_names": dict(device["memcpy"])}
    for a in averages:
        key = a.key
        if device is None and key.startswith(attribution.MEMCPY):
            runtime["memcpy_events"] += int(a.count)
            runtime["memcpy_names"][key] = int(a.count)
        if not attribution.OP_NAME.match(key):
            continue
        self_ms = float(a.self_cpu_time_total) / 1e3
        dev = device["per_op_us"].get(key, 0.0) / 1e3 if device is not None else None
        op_time = dev if device is not None else self_ms
        rows.append({"op": key, "calls": int(a.count), "total_ms": float(a.cpu_time_total) / 1e3,
                     "self_ms": self_ms, "device_ms": dev, "host_ms": self_ms,
                     "share": (op_time / step_total_ms) if step_total_ms > 0 else None})
    rows.sort(key=lambda r: -(r["share"] or 0))
    return rows, runtime


def annotate_rows(rows: list, analysis: dict, peaks: Any, has_device: bool, steps: int) -> None:
    """Give each op row (in place) its FLOPs, bytes and dtype from ``analysis`` and its roofline
    figures from the per-step time (device time where measured, else host self time)."""
    for r in rows:
        a = analysis["ops"].get(r["op"])
        r["flops"] = int(a["flops"]) if a else None
        r["bytes"] = int(a["bytes"]) if a else None
        r["dtype"] = a["dtype"] if a else None
        op_ms = r["device_ms"] if has_device else r["self_ms"]
        r["intensity"], r["roofline_pct"] = roofline_row(r["flops"], r["bytes"], r["dtype"],
                                                         (op_ms or 0) / steps, peaks)


def profile_callable(step_fn: Callable[[], Any], backend: Backend, steps: int = 3, warmup: int = 2,
                     out_dir: Optional[str] = None, model: Optional[torch.nn.Module] = None,
                     fallback_ops: Optional[Iterable[str]] = None, memory_estimate: Optional[dict] = None,
                     live: Iterable[Any] = (), top: int = 10, measure_peaks: bool = True) -> dict:
    """Profile ``step_fn`` (one training or inference step, no arguments) on ``backend``.

    ``model`` (optional) attributes copies and sync points to its modules; ``fallback_ops``: ATen
    names that fell back (from the capture audit); ``memory_estimate``: an itemised estimate with
    ``total_bytes`` (and ``lower_bound``) to check against the measured peak; ``live``: objects
    whose tensors exist before a step (model, optimizer, batch), needed for the CPU peak.
    Writes ``trace.json`` into ``out_dir`` when given. Returns the audit.json ``profile`` section
    (see the module docstring and ``definitions``). Raises ValueError for steps < 1 or warmup < 0,
    and whatever ``step_fn`` raises.
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps must be >= 1 and warmup >= 0 (got steps={steps}, warmup={warmup})")
    acts, act_names, act_note = _activities(backend)
    has_device = len(act_names) > 1
    for _ in range(warmup):
        step_fn()
    backend.synchronize()
    plain = timed_steps(step_fn, backend, steps)

    trace_rel, trace_path = None, None
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        trace_rel, trace_path = TRACE_FILE, os.path.join(out_dir, TRACE_FILE)
    recorded = profiled_steps(step_fn, backend, steps, acts, trace_path)
    profiled = recorded["step_ms"]
    rows, runtime = _op_rows(recorded["averages"], sum(profiled), recorded["device"])

    analysis = analyse_step(step_fn, model)
    dtypes = {r["dtype"] for r in analysis["ops"].values() if r.get("dtype")}
    peaks, peaks_source = resolve_peaks(backend, dtypes, measure=measure_peaks)
    annotate_rows(rows, analysis, peaks, has_device, steps)

    fb_names = set(fallback_ops or ())
    fb_rows = [r for r in rows if r["op"] in fb_names]
    for r in rows:
        r["fallback"] = r["op"] in fb_names
    bw, bw_note = _host_device_bandwidth(backend, peaks) if fb_rows else (0.0, "no fallback ops")
    fb_bytes = sum(r["bytes"] or 0 for r in fb_rows)
    fallback = {
        "ms_per_step": sum((r["device_ms"] if has_device else r["self_ms"]) or 0 for r in fb_rows) / steps,
        "copy_ms_per_step": (fb_bytes / bw * 1e3) if bw else 0.0, "copy_bytes_per_step": fb_bytes,
        "bandwidth_bytes_per_s": bw or None, "bandwidth_source": bw_note,
        "ops": sorted(r["op"] for r in fb_rows),
        "not_seen": sorted(fb_names - {r["op"] for r in fb_rows}),
    }

    memory = _memory_section(step_fn, backend, memory_estimate, live)
    plain_med, prof_med = statistics.median(plain), statistics.median(profiled)
    return {
        "device": backend.device_properties(0).name or backend.name,
        "backend": backend.name,
        "activities": act_names,
        "activity_note": act_note or ("device activity recorded" if has_device else
                                      "CPU only: device_ms is null, host self time is the op time"),
        "steps": steps, "warmup": warmup,
        "step_ms": {"median": plain_med, "all": plain},
        "profiled_step_ms": {"median": prof_med, "all": profiled},
        "overhead_ratio": prof_med / plain_med if plain_med > 0 else None,
        "ops": rows,
        "hotspots": [r["op"] for r in rows[:top]],
        "copies": dict(analysis["copies"], profiler_memcpy_events=runtime["memcpy_events"],
                       profiler_memcpy=runtime["memcpy_names"]),
        "syncs": dict(analysis["syncs"], runtime_calls=sum(recorded["runtime_syncs"].values()),
                      runtime=recorded["runtime_syncs"]),
        "fallback": fallback,
        "memory": memory,
        "roofline": {"peaks": peaks, "peaks_source": peaks_source,
                     "dtypes": sorted(dtypes),
                     "missing": sorted(f"flops_per_s.{d}" for d in dtypes if f"flops_per_s.{d}" not in peaks)},
        "trace": trace_rel,
        "overhead_note": overhead_note(has_device) + "; memory from one separate measured step",
        "timing": {"method": "backend events around each step, backend.synchronize() after",
                   "warmup": warmup, "repeats": steps, "statistic": "median"},
        "device_attribution": device_attribution(recorded["device"], act_names[1:] or act_names),
        "definitions": definitions(recorded["device"]),
    }


def _memory_section(step_fn: Callable[[], Any], backend: Backend, estimate: Optional[dict],
                    live: Iterable[Any]) -> dict:
    from hal.models.measure import measure_peak
    device = backend.torch_device()
    measured = measure_peak(step_fn, device, backend, live=live)
    peak = measured.get("peak_bytes")
    est = int(estimate["total_bytes"]) if estimate and estimate.get("total_bytes") is not None else None
    items = {k: v for k, v in (estimate or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)
             and k != "total_bytes" and not k.endswith("_tokens")}  # items are bytes; counts go to detail
    return {"estimate_bytes": est, "peak_bytes": peak,
            "error_pct": (100.0 * (est - peak) / peak) if est is not None and peak else None,
            "items": items, "lower_bound": bool((estimate or {}).get("lower_bound", False)),
            "peak_source": measured.get("source"), "baseline_bytes": measured.get("baseline_bytes"),
            "estimate_detail": {k: v for k, v in (estimate or {}).items() if k not in items and k != "total_bytes"}}


def profile_workload(workload: Any, backend: Backend, steps: int = 3, warmup: int = 2,
                     out_dir: Optional[str] = None, mode: str = "train",
                     fallback_ops: Optional[Iterable[str]] = None, top: int = 10,
                     measure_peaks: bool = True) -> dict:
    """Profile a built :class:`hal.models.workload.Workload` (``mode`` ``"train"``: ``train_step``;
    ``"infer"``: ``infer``) on ``backend``; the memory estimate is ``workload.estimates(...)``.

    Returns :func:`profile_callable`'s dict plus ``workload`` {name, config, mode, dtype,
    batch_size, seq_len}. Raises ValueError for another mode or an unbuilt workload."""
    if mode not in ("train", "infer"):
        raise ValueError(f"mode must be 'train' or 'infer', not {mode!r}")
    if getattr(workload, "model", None) is None:
        raise ValueError(f"{workload!r} is not built: call build() first")
    batch = workload.example_batch()
    if mode == "train":
        step_fn = lambda: workload.train_step(batch)  # noqa: E731
    else:
        step_fn = lambda: workload.infer(batch)  # noqa: E731
    cfg = workload.config
    bsz, seq = int(getattr(cfg, "batch_size", 0) or 0), getattr(cfg, "seq_len", None)
    try:
        est = workload.estimates(bsz, seq, mode=mode)
    except TypeError:
        est = workload.estimates(bsz, seq) if mode == "train" else None
    result = profile_callable(step_fn, backend, steps=steps, warmup=warmup, out_dir=out_dir,
                              model=workload.model, fallback_ops=fallback_ops,
                              memory_estimate=(est or {}).get("memory"),
                              live=(workload.model, workload.optimizer, batch), top=top,
                              measure_peaks=measure_peaks)
    from hal.backend import dtype_name
    result["workload"] = {"name": workload.name, "config": workload.config_name, "mode": mode,
                          "dtype": dtype_name(workload.dtype), "batch_size": bsz, "seq_len": seq,
                          "estimated_flops_per_step": (est or {}).get("flops_per_step")}
    return result
