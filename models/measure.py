"""Measured peak memory of one step, to compare with the estimators in :mod:`hal.models.estimate`.

What "peak" means per device:

- **An accelerator with a HAL backend**: ``backend.reset_peak_memory_stats()`` before the step and
  ``backend.memory_stats().peak`` after it (the NVIDIA backend reports torch's
  ``max_memory_allocated``): bytes held by live tensors at the worst moment, allocator caching
  excluded.
- **CPU**: torch's CPU allocator keeps no peak statistic and process RSS includes the Python heap
  and freed-but-cached pages, so we count the same thing as on an accelerator: the bytes of every
  tensor alive before the step (parameters, buffers, gradients, optimizer state, the batch; each
  storage once) plus the highest net total of the CPU allocator's allocations during the step, as
  recorded by ``torch.profiler`` with ``profile_memory=True`` (every ``alloc``/``free`` the
  allocator reports, in order).
- **A device whose HAL backend is unavailable**: not measured (``peak_bytes`` is None and
  ``source`` says why).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch

from hal.backend import Backend


def _tensors(obj: Any) -> Iterable[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


def live_tensor_bytes(*objs: Any, device_type: str = "cpu") -> int:
    """Bytes of the distinct storages of ``device_type`` reachable from ``objs`` (modules, optimizers,
    dicts, lists, tensors). A module contributes parameters, their gradients and buffers; a DTensor its local
    shard; a tensor subclass with no storage of its own nothing."""
    seen: set[int] = set()
    total = 0
    for obj in objs:
        if isinstance(obj, torch.nn.Module):
            items: list[Any] = list(obj.parameters()) + [p.grad for p in obj.parameters() if p.grad is not None]
            items += list(obj.buffers())
        elif isinstance(obj, torch.optim.Optimizer):
            items = list(obj.state.values())
        else:
            items = [obj]
        for t in _tensors(items):
            t = getattr(t, "_local_tensor", t)  # a DTensor (tensor parallelism): this rank's shard
            if t.device.type != device_type:
                continue
            try:
                st = t.untyped_storage()
                key = st.data_ptr()
            except (RuntimeError, NotImplementedError):  # another subclass without plain memory of its own
                continue
            if key in seen or st.nbytes() == 0:
                continue
            seen.add(key)
            total += st.nbytes()
    return total


def _allocator_peak_delta(prof: Any) -> tuple[int, int]:
    """(peak, final) of the net CPU allocations recorded by a finished profiler."""
    records: list[tuple[int, int]] = []

    def walk(node: Any) -> None:
        extra = node.extra_fields
        if type(extra).__name__ == "_ExtraFields_Allocation" and extra.device.type == "cpu":
            records.append((node.start_time_ns, int(extra.alloc_size)))
        for child in node.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    records.sort()
    cur = peak = 0
    for _, size in records:
        cur += size
        peak = max(peak, cur)
    return peak, cur


def measure_peak(fn: Callable[[], Any], device: torch.device, backend: Optional[Backend],
                 live: Iterable[Any] = ()) -> dict:
    """Run ``fn`` once and return ``{"peak_bytes", "baseline_bytes", "source"}`` (see module doc).

    ``live``: the objects whose tensors exist before ``fn`` (model, optimizer, batch) — used on the
    CPU only. Raises whatever ``fn`` raises."""
    if device.type == "cpu":
        from torch.profiler import ProfilerActivity, profile
        baseline = live_tensor_bytes(*live)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        peak, _ = _allocator_peak_delta(prof)
        return {"peak_bytes": baseline + peak, "baseline_bytes": baseline,
                "source": "live tensors before the step + peak net CPU allocator allocations "
                          "(torch.profiler profile_memory)"}
    if backend is None:
        fn()
        return {"peak_bytes": None, "baseline_bytes": None,
                "source": f"not measured: no available HAL backend for device type {device.type!r}"}
    from hal.errors import HalError
    try:
        backend.synchronize(device)
        backend.reset_peak_memory_stats(device)
    except HalError as exc:  # the backend has no memory statistics (yet)
        fn()
        return {"peak_bytes": None, "baseline_bytes": None,
                "source": f"not measured: {backend.name} backend: {exc}"}
    fn()
    backend.synchronize(device)
    stats = backend.memory_stats(device)
    return {"peak_bytes": int(stats.peak), "baseline_bytes": None,
            "source": f"{backend.name} backend memory_stats().peak ({stats.source})"}
