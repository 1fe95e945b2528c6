"""Launching the Triton kernels with little host time: each compiled kernel's C launcher, called directly.

``kernel[grid](*args, **meta)`` runs Python on every call in Triton 3.6: it binds the arguments,
specialises each one (native code, once per argument), builds the cache key, builds launch metadata,
and its C launcher then calls two launch hooks back into Python, whether or not any hook is installed.
For the small and medium shapes the host time of that path decides the speed (issue 23;
``benchmarks/bench_host_path.py``). A :class:`Launcher` wraps one ``@triton.jit`` kernel: the first
launch for a *key* goes through Triton (compiling when needed) and keeps what the compiled kernel's C
launcher needs; later launches with that key call the launcher directly, with no hooks and no
metadata.

**The key** is the caller's, built from values it already holds, and is the contract: with the kernel,
it must determine everything Triton specialises the launch on.

- ``key[0]`` is the CUDA device index of the launch's tensors (``Tensor.get_device()``); a key whose
  first item is negative (CPU tensors: Triton's interpreter) always launches through Triton.
- The rest fixes every constexpr and launch option in ``meta`` (their values, or what they are
  computed from), each pointer argument's dtype, and each integer argument's value or
  :func:`int_class`. Pointers must be 16-byte aligned: the caller checks the tensors it was given
  (:func:`aligned`) and passes ``key=None`` for a call where one is not, and Triton launches it. Tensors
  the caller allocated itself on the device need no check: PyTorch's CUDA allocators hand out blocks
  aligned to at least 256 bytes (``check`` mode would catch one that is not).

``HAL_TRITON_LAUNCH`` (read at import; :data:`MODE` may be set later): ``bound`` (default) as above;
``check`` as ``bound``, and every direct launch first asks Triton which compiled kernel it would have
run and raises :class:`LaunchKeyError` when it is not the one the key found (what the GPU tests run
under, to prove every call site's key); ``triton`` launches everything through Triton.

Triton's own launch is used whenever a launch hook is installed (``triton.knobs.runtime``), the current
device is not the tensors' device, or the compiled kernel needs scratch memory or has a launcher of
another layout than Triton 3.6's. The kernel's globals are not re-checked on a direct launch (these
kernels read none that change), nor are ``TRITON_DEBUG`` changes after the first launch of a key.

Thread-safety: the cache is a dict per kernel (atomic get and set); two threads may both launch one
key through Triton first, which is harmless. Raises what Triton's launch raises.
"""
from __future__ import annotations

import inspect
import os
import weakref
from typing import Any, Optional

import torch

try:  # the kernel modules that use this import Triton anyway; the pure helpers below need none
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - exercised where Triton is absent
    _knobs = None

ENV = "HAL_TRITON_LAUNCH"
MODES = ("bound", "check", "triton")
#: how launches go (module docstring); an unknown value of the variable means "bound"
MODE = os.environ.get(ENV, "bound") if os.environ.get(ENV) in MODES else "bound"
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
#: a cached entry that says "this key always launches through Triton"
_TRITON = ()
#: keys kept per kernel: past it the cache starts again (a key holds int argument values, such as strides)
MAX_KEYS = 1024
#: every Launcher (weakly), for :func:`launch_counts`
_ALL: "weakref.WeakSet[Launcher]" = weakref.WeakSet()


class LaunchKeyError(RuntimeError):
    """``HAL_TRITON_LAUNCH=check``: a call site's key found a compiled kernel other than the one Triton
    would run for the call (the key misses something Triton specialises on)."""


def int_class(v: int) -> int:
    """What Triton 3.6 specialises an integer argument on, as one small int: whether it is 1, whether it
    is divisible by 16, and its type (int32, int64 or uint64 by range)."""
    if v == 1:
        return 1
    c = 2 if v % 16 == 0 else 0
    if v < _INT32_MIN or v > _INT32_MAX:
        c += 4 if v < (1 << 63) else 8
    return c


def aligned(*tensors: torch.Tensor) -> bool:
    """Whether every tensor's data pointer is 16-byte aligned (what Triton specialises pointers on)."""
    bits = 0
    for t in tensors:
        bits |= t.data_ptr()
    return not bits & 15


def _hooks_idle() -> bool:
    """Whether no launch hook is installed (Triton 3.6 keeps them as empty ``HookChain``s; a profiler
    such as proton adds to them). A direct launch passes no hooks, so it is taken only then."""
    rt = _knobs.runtime
    enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
    return (enter is None or not getattr(enter, "calls", True)) and (leave is None or not getattr(leave, "calls", True))


class Launcher:
    """One ``@triton.jit`` kernel, launched through its compiled form's C launcher (module docstring).

    ``launcher(grid, key, args, meta)`` does what ``kernel[grid](*args, **meta)`` does: ``grid`` is a
    3-tuple of ints, ``args`` the kernel's positional (runtime) arguments in order, ``meta`` its
    constexprs and launch options by name (read only when Triton launches), ``key`` as the module
    docstring says or None."""

    __slots__ = ("kernel", "_hits", "direct", "via_triton", "__weakref__")

    def __init__(self, kernel: Any):
        self.kernel = kernel
        self._hits: dict = {}
        #: launches that took the direct path, and those Triton launched (for tests and benchmarks)
        self.direct = self.via_triton = 0
        _ALL.add(self)

    def __call__(self, grid: tuple, key: Optional[tuple], args: tuple, meta: dict) -> None:
        hit = self._hits.get(key) if key is not None else None
        if hit and MODE != "triton" and key[0] == _current_device() and _hooks_idle():
            if MODE == "check":
                self._check(hit, args, meta)
            launch, function, packed, coop, pdl, tail, _ = hit
            launch(grid[0], grid[1], grid[2], _raw_stream(key[0]), function, coop, pdl, None, None, packed,
                   None, None, None, *args, *tail)
            self.direct += 1
            return
        self._slow(hit, grid, key, args, meta)

    def _slow(self, hit: Optional[tuple], grid: tuple, key: Optional[tuple], args: tuple, meta: dict) -> None:
        self.via_triton += 1
        if key is None or key[0] < 0 or MODE == "triton":
            self.kernel[grid](*args, **meta)
            return
        with torch.cuda.device(key[0]):
            compiled = self.kernel[grid](*args, **meta)
        if hit is None:
            if len(self._hits) >= MAX_KEYS:
                self._hits.clear()
            self._hits[key] = self._entry(compiled, len(args), meta)

    def _entry(self, compiled: Any, n_args: int, meta: dict) -> tuple:
        """What a direct launch needs from ``compiled``, or :data:`_TRITON` when it cannot be launched so."""
        run = getattr(compiled, "run", None)
        needed = ("launch", "launch_cooperative_grid", "launch_pdl", "global_scratch_size", "profile_scratch_size")
        if run is None or not all(hasattr(run, a) for a in needed) or run.global_scratch_size \
                or run.profile_scratch_size or not hasattr(compiled, "packed_metadata"):
            return _TRITON
        tail = []
        for p in self.kernel.params[n_args:]:
            if p.name in meta:
                tail.append(meta[p.name])
            elif p.default is not inspect.Parameter.empty:
                tail.append(p.default)
            else:
                return _TRITON
        return (run.launch, compiled.function, compiled.packed_metadata, run.launch_cooperative_grid,
                run.launch_pdl, tuple(tail), compiled)

    def _check(self, hit: tuple, args: tuple, meta: dict) -> None:
        from triton.runtime.jit import compute_cache_key
        kernel_cache, key_cache, _, _, binder = self.kernel.device_caches[_current_device()]
        # what JITFunction.run adds to the options before it binds
        kw = dict(meta, debug=meta.get("debug", self.kernel.debug) or _knobs.runtime.debug,
                  instrumentation_mode=_knobs.compilation.instrumentation_mode)
        _, specialization, options = binder(*args, **kw)
        want = kernel_cache.get(compute_cache_key(key_cache, specialization, options))
        if want is not hit[6]:
            raise LaunchKeyError(f"{self.kernel.fn.__name__}: the call site's key found a kernel compiled for another "
                                 f"specialisation than Triton's for this call ({specialization})")


def launch_counts() -> dict:
    """``{kernel name: {"direct": n, "via_triton": m}}`` over every :class:`Launcher` made so far (launches
    since it was made; kernels of one name are added up)."""
    out: dict = {}
    for run in list(_ALL):
        name = getattr(getattr(run.kernel, "fn", None), "__name__", None) or type(run.kernel).__name__
        c = out.setdefault(name, {"direct": 0, "via_triton": 0})
        c["direct"] += run.direct
        c["via_triton"] += run.via_triton
    return out


def _current_device() -> int:
    return torch._C._cuda_getDevice()


def _raw_stream(device: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device)
