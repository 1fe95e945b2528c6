"""``hal.ops``: device-agnostic ops with torch's semantics, dispatched through the op registry.

Each public function (``hal.ops.softmax`` ...) takes torch's arguments plus a keyword-only
``fallback=`` policy, picks the implementation registered for the first argument's (a tensor's) device type and dtype
(cached after the first call: a cached call reads a few tensor attributes and looks up a dict, which
``benchmarks/bench_dispatch.py`` measures against calling torch directly; an implementation that
carries the attribute ``hal_checks_own_args`` is cached and called directly, with no per-call
predicate chain, since it takes every call of its op itself), and otherwise applies
the fallback policy of :mod:`hal.ops.fallback`: the CPU implementation runs on host copies of the
inputs, the outputs are copied back, and the call is logged. A cached chain of predicates that no
candidate passes for a call applies the policy in force too; a call that passes ``fallback=`` takes
the uncached path, so its own policy applies.

A self-checking implementation may also say which calls it would hand to a plain function unchanged
because they are small: the attribute ``hal_size_route`` (:data:`SIZE_ROUTE`) = ``(floors, plain)``
means that a call whose first argument ``x`` has fewer elements than ``floors[(op, x.dtype, state)]`` is
exactly ``plain(*args, **kwargs)``, where ``state`` is the call's grad state: 0 with grad mode off, 1 with it on
and ``x`` not requiring grad, 2 with it on and ``x`` requiring grad (a dtype without all three keys has no size
route). The dispatcher then makes that call itself, in its own frame:
one Python call fewer on the path where a Python frame costs as much as the work it routes (on the
H200's host, 0.3-0.4 us against torch calls of 7-15 us). The dispatcher copies the three floors of a
dtype into its cache entry when it caches the implementation (a call under all of them reads neither
the grad state nor a dict): whoever changes ``floors`` calls :func:`invalidate_cache` after. The
implementation must give the same answer for those calls when called directly.

Raises NotSupportedError when the policy is ``error`` and no implementation fits.

The cache is per device *type* and dtype, as the registry is (implementations are registered per
device type, so every CUDA device shares the entry of ``cuda``). Its key avoids building a
``torch.device`` per call: CUDA and CPU tensors are told apart with ``Tensor.is_cuda`` /
``Tensor.is_cpu`` and looked up by dtype alone; any other device is keyed by ``(x.device, dtype)``
(one entry per device index there, each the device type's implementation), so different device types
never share an entry.
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable, Optional

import torch

from hal.backend import dtype_name
from hal.errors import NotSupportedError
from hal.ops import torch_impl
from hal.ops.fallback import (LOG as FALLBACK_LOG, POLICIES, FallbackRecord, HalFallbackWarning,
                              current_policy, fallback_policy)
from hal.ops.registry import REGISTRY, OpImpl, OpRegistry, Resolution

__all__ = ["REGISTRY", "OpRegistry", "OpImpl", "Resolution", "POLICIES", "fallback_policy", "current_policy",
           "SELF_CHECKING", "SIZE_ROUTE",
           "fallback_log", "fallback_totals", "clear_fallback_log", "resolve", "define_op", "invalidate_cache",
           "HalFallbackWarning",
           *torch_impl.OPS]

#: attribute of an implementation that checks its own arguments and takes every call of its op (it
#: calls torch's kernel itself for what it does not compute), so no per-call ``supports`` chain runs
SELF_CHECKING = "hal_checks_own_args"
#: attribute of a self-checking implementation: ``(floors, plain)``, calls with fewer elements in their
#: first argument ``x`` than ``floors[(op, x.dtype, grad state)]`` are ``plain``'s (the state: 0 grad mode off,
#: 1 on and ``x`` not requiring grad, 2 on and ``x`` requiring grad), and the dispatcher calls ``plain`` directly
SIZE_ROUTE = "hal_size_route"
_grad_enabled = torch.is_grad_enabled

_registered_device_types: set[str] = set()
_caches: list[dict] = []


def invalidate_cache() -> None:
    """Forget every op's cached resolution (the next call of each op resolves again). Called on every
    registry change, and by an implementation whose size-route floors changed. Not thread-safe against
    calls in flight (they finish with what they read)."""
    for c in _caches:
        c.clear()


REGISTRY.on_change(invalidate_cache)


def _ensure_backend_ops(device_type: str) -> None:
    """Let the backend of ``device_type`` register its implementations (once per process)."""
    if device_type in _registered_device_types:
        return
    _registered_device_types.add(device_type)
    from hal.discovery import list_backends  # late import: discovery is not needed to define ops
    for info in list_backends():
        if info.cls is not None and info.cls.device_type == device_type and info.available:
            from hal.discovery import get_backend
            get_backend(info.name).register_ops(REGISTRY)
            return


def resolve(op: str, device: "torch.device | str", dtype: Optional[torch.dtype]) -> Resolution:
    """How ``op`` would resolve for a tensor on ``device`` of ``dtype`` (no call is made)."""
    dev = torch.device(device)
    _ensure_backend_ops(dev.type)
    return REGISTRY.resolve(op, dev.type, dtype_name(dtype) if dtype is not None else None)


def _tensors(obj: Any, out: list) -> None:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _tensors(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _tensors(o, out)


def _move(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_move(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _move(v, device) for k, v in obj.items()}
    return obj


def _guarded(op: str, chain: list[OpImpl]) -> Callable[..., Any]:
    """A callable that checks each candidate's ``supports`` predicate per call, best first; a call no
    candidate takes gets the fallback policy in force, as an uncached call would."""
    def call(*args: Any, **kwargs: Any) -> Any:
        for impl in chain:
            if impl.supports is None or not impl.supports(*args, **kwargs):
                return impl.fn(*args, **kwargs)
        x = args[0]
        res = REGISTRY.resolve(op, x.device.type, dtype_name(x.dtype), args, kwargs)
        return _run_fallback(op, res, current_policy(), args, kwargs)
    return call


def _run_fallback(op: str, res: Resolution, policy: str, args: tuple, kwargs: dict) -> Any:
    device = args[0].device
    reason = "; ".join(res.rejected) or "no implementation"
    if policy == "error":
        raise NotSupportedError(f"hal.ops.{op}", device.type, list(res.rejected))
    reference = REGISTRY.get(op).reference
    if reference is None:
        raise NotSupportedError(f"hal.ops.{op}", device.type, [*res.rejected, "no reference implementation to fall back to"])
    cpu = torch.device("cpu")
    inputs: list[torch.Tensor] = []
    _tensors((args, kwargs), inputs)
    t0 = time.perf_counter()
    out = reference(*_move(args, cpu), **_move(kwargs, cpu))
    out = _move(out, device)
    seconds = time.perf_counter() - t0
    outputs: list[torch.Tensor] = []
    _tensors(out, outputs)
    moved = sum(t.numel() * t.element_size() for t in inputs + outputs if t.device.type != "cpu")
    rec = FallbackRecord(op, device.type, tuple(dtype_name(t.dtype) for t in inputs),
                         tuple(tuple(t.shape) for t in inputs), moved, seconds, reason)
    if FALLBACK_LOG.add(rec, warn=policy == "warn"):
        warnings.warn(f"hal.ops.{op} has no {device.type} implementation for {rec.dtypes[0]} and ran on the CPU "
                      f"({reason})", HalFallbackWarning, stacklevel=3)
    return out


def define_op(name: str, aten: str, reference: Callable[..., Any], reaches: tuple[str, ...] = (),
              register_cpu: bool = True) -> Callable[..., Any]:
    """Define an op and return its dispatcher (what ``hal.ops.<name>`` is for the built-in ops).

    ``reference`` implements it with torch's own kernels; it is the CPU implementation (unless
    ``register_cpu`` is False) and what a fallback runs. Backends add faster implementations with
    ``REGISTRY.register(name, device_type, fn, ...)``."""
    REGISTRY.define(name, aten, reference, doc=reference.__doc__ or "", reaches=reaches)
    if register_cpu:
        REGISTRY.register(name, "cpu", reference, impl="torch")
    return _make(name)


def _make(op: str) -> Callable[..., Any]:
    # the resolution cache (see the module docstring): dtype -> entry for CUDA and for CPU tensors,
    # (torch.device, dtype) -> entry for every other device type; an entry is (implementation, plain,
    # low, high, (floor of each grad state: grad mode off, on with x not requiring grad, on with x requiring it)):
    # with a size route (SIZE_ROUTE) for the dtype, low and high are the smallest and largest floor; without one
    # plain and the floors are None and high is 0
    cuda: dict = {}
    cpu: dict = {}
    other: dict = {}
    _caches.extend((cuda, cpu, other))

    def store(device: torch.device, dtype: torch.dtype, fn: Callable[..., Any]) -> None:
        floors, plain = getattr(fn, SIZE_ROUTE, (None, None))
        keys = ((op, dtype, 0), (op, dtype, 1), (op, dtype, 2))
        if floors is None or any(k not in floors for k in keys):
            entry = (fn, None, 0, 0, None)
        else:
            by_grad = tuple(floors[k] for k in keys)
            entry = (fn, plain, min(by_grad), max(by_grad), by_grad)
        if device.type == "cuda":
            cuda[dtype] = entry
        elif device.type == "cpu":
            cpu[dtype] = entry
        else:
            other[(device, dtype)] = entry

    def slow(x: torch.Tensor, args: tuple, kwargs: dict, fallback: Optional[str]) -> Any:
        device = x.device
        device_type = device.type
        _ensure_backend_ops(device_type)
        chain = [i for i in REGISTRY.implementations(op, device_type)
                 if i.dtypes is None or dtype_name(x.dtype) in i.dtypes]
        if chain and getattr(chain[0].fn, SELF_CHECKING, False):
            store(device, x.dtype, chain[0].fn)  # it takes every call: no predicate chain per call
            return chain[0].fn(*args, **kwargs)
        res = REGISTRY.resolve(op, device_type, dtype_name(x.dtype), args, kwargs)
        if res.impl is None:
            return _run_fallback(op, res, current_policy(fallback), args, kwargs)
        upto = chain[: chain.index(res.impl) + 1] if res.impl in chain else [res.impl]
        if all(i.supports is None for i in upto):
            store(device, x.dtype, res.impl.fn)
        else:
            store(device, x.dtype, _guarded(op, chain))
        return res.impl.fn(*args, **kwargs)

    def dispatch(*args: Any, fallback: Optional[str] = None, **kwargs: Any) -> Any:
        # The hot path is the cached call. ``*args`` whole (not ``x, *args``) is passed on as it came, with
        # no tuple rebuilt, and no ``**kwargs`` when there are none (an empty one still costs torch's
        # argument parser); is_cuda / is_cpu are bools, where x.device would build a torch.device per call.
        try:
            x = args[0]
        except IndexError:  # the input passed as ``x=``, as the signature ``(x, *args, ...)`` allowed
            if "x" not in kwargs:
                raise TypeError(f"{op}() missing 1 required positional argument: 'x'") from None
            x = kwargs.pop("x")
            args = (x,)
        if x.is_cuda:
            entry = cuda.get(x.dtype)
        elif x.is_cpu:
            entry = cpu.get(x.dtype)
        else:
            entry = other.get((x.device, x.dtype))  # not x.device.type: building that str costs more
        if entry is None or fallback is not None:  # a per-call policy is honoured by the uncached path
            return slow(x, args, kwargs, fallback)
        fn, plain, low, high, by_grad = entry
        if high:  # the size route, in this frame; the grad state is read only between the floors
            n = x.numel()
            if n < low or (n < high and n < by_grad[_grad_enabled() and 1 + x.requires_grad]):
                fn = plain
        if kwargs:
            return fn(*args, **kwargs)
        return fn(*args)

    opdef = REGISTRY.get(op)
    dispatch.__name__ = op
    dispatch.__qualname__ = op
    ref = opdef.reference
    dispatch.__doc__ = (f"``{opdef.aten}`` through the HAL op registry with torch's semantics"
                        + (f" (reference: ``{ref.__module__}.{ref.__name__}``)" if ref is not None else "")
                        + ".\n\nKeyword ``fallback``: 'cpu' | 'warn' | 'error' for this call.")
    return dispatch


for _name, (_aten, _reaches, _fn) in torch_impl.OPS.items():
    globals()[_name] = define_op(_name, _aten, _fn, _reaches, register_cpu=False)


def fallback_log() -> list[FallbackRecord]:
    """The most recent fallbacks that ran (bounded)."""
    return FALLBACK_LOG.records()


def fallback_totals() -> dict:
    """``{(op, device_type): FallbackTotals}`` since the last clear (never truncated)."""
    return FALLBACK_LOG.totals()


def clear_fallback_log() -> None:
    FALLBACK_LOG.clear()


def register_torch_impls(registry: OpRegistry, device_type: str, dtypes: Optional[dict] = None,
                         priority: int = 0) -> None:
    """Register the torch reference implementations for ``device_type``.

    ``dtypes`` maps op name -> dtype names computed natively (missing op: every dtype; an empty
    set: not registered at all, so the op falls back)."""
    for name, (_aten, _reaches, fn) in torch_impl.OPS.items():
        allowed = None if dtypes is None else dtypes.get(name)
        if allowed is not None and not allowed:
            continue
        registry.register(name, device_type, fn, impl="torch", dtypes=allowed, priority=priority)
