"""Device time per operator when the timed steps record the device activity only.

Why: on an accelerator the CPU activity's operator events cost the host a few µs per op. On a
host-bound step that is most of the profiler's overhead (H200, a ~7 ms step of ~1000 kernels:
CPU + CUDA activities 1.36x a plain step, the CUDA activity alone 1.08x;
``benchmarks/bench_profiler_configs.py``). So the timed profiled steps record the device activity
alone (kernels, memcpy and memset, with their names and device times), and operators get that time
through one more, untimed step recorded with both activities, the *attribution step*: there the
profiler links each device event to the innermost operator that launched it
(``FunctionEvent.kernels``), which says, per kernel name, which operators launched it and for how
much of its time. Each kernel name's time in the timed steps is split over those operators in
that proportion (exact when the steps launch the same kernels, as a training loop's do). Kernel
names the attribution step did not launch stay apart, as unattributed device time.

Pure functions over ``torch.profiler`` events (``prof.events()``); nothing here starts a profiler.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

#: an operator row of the profiler ("aten::addmm", "hal::rms_norm"); kernel names are not ops
OP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z0-9_.]+$")
MEMCPY = ("Memcpy HtoD", "Memcpy DtoH", "Memcpy HtoH", "Memcpy DtoD")


def _on_device(event: Any) -> bool:
    from torch.autograd import DeviceType
    return getattr(event, "device_type", DeviceType.CPU) != DeviceType.CPU


def device_event_times(events: Iterable[Any]) -> dict[str, dict[str, float]]:
    """``{name: {"count", "us"}}`` of the device events (kernels, memcpy, memset) in ``events``,
    their device time summed per name. Host-side events (operators, runtime calls) are left out."""
    out: dict[str, dict[str, float]] = {}
    for e in events:
        if not _on_device(e):
            continue
        row = out.setdefault(e.name, {"count": 0, "us": 0.0})
        row["count"] += 1
        row["us"] += float(e.time_range.elapsed_us())
    return out


def kernel_owners(events: Iterable[Any]) -> dict[str, dict[str, float]]:
    """``{kernel name: {operator: device µs}}`` from a profile that recorded the CPU activity and a
    device activity: each device event counted at the innermost operator that launched it (the
    operator's own device time, as ``key_averages()``'s self device time counts it)."""
    owners: dict[str, dict[str, float]] = {}
    for e in events:
        if _on_device(e) or not OP_NAME.match(e.name):
            continue
        for k in getattr(e, "kernels", ()) or ():
            per_op = owners.setdefault(k.name, {})
            per_op[e.name] = per_op.get(e.name, 0.0) + float(k.duration)
    return owners


def attribute(times: dict[str, dict[str, float]],
              owners: dict[str, dict[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """``(device µs per operator, device µs per unattributed kernel name)``: each kernel name's time in
    ``times`` (:func:`device_event_times` of the timed steps) split over its ``owners``
    (:func:`kernel_owners` of the attribution step) in proportion to the time each launched there.
    The two results together add up to the total of ``times``."""
    per_op: dict[str, float] = {}
    unattributed: dict[str, float] = {}
    for name, row in times.items():
        own = owners.get(name)
        total = sum(own.values()) if own else 0.0
        if total <= 0:
            unattributed[name] = unattributed.get(name, 0.0) + row["us"]
            continue
        for op, us in own.items():
            per_op[op] = per_op.get(op, 0.0) + row["us"] * us / total
    return per_op, unattributed


def memcpy_counts(times: dict[str, dict[str, float]]) -> dict[str, int]:
    """``{memcpy event name: count}`` among :func:`device_event_times`' rows."""
    return {name: int(row["count"]) for name, row in times.items() if name.startswith(MEMCPY)}
