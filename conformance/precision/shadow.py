"""Shadow execution: re-run one aten op in float64 on the target's actual inputs.

The shadow isolates the op's *own* error (DIPU autocompare style): its inputs are exactly the
target's inputs upcast, so any difference is introduced by this op. It runs where
:func:`float64_home` says: on the target device itself when its backend computes float64 natively
(an MLU computes float64 as float32, so a float64 shadow there would be no reference: the CPU then),
unless ``HAL_PRECISION_SHADOW_DEVICE=cpu`` keeps it on the CPU. Costs are kept down by

* an upcast cache (:class:`UpcastCache`) keyed by storage, offset, shape, stride, dtype and
  version, holding a strong reference to the source so the key cannot be recycled; bounded by
  bytes (LRU), cleared by the owner at the end of each step;
* sampling giant outputs, always on views (no gather; only the float64 copies of the sampled
  inputs cost a kernel, and the compared output is a view the tracer copies only if it is written):
  matrix products are shadowed on a fixed run of output rows x a run of columns (only those rows of
  A and columns of B are upcast), point-wise ops on a fixed block (one index of each leading dim, a
  run of the next, the rest whole), last-dim softmax (and its backward) on a run of rows. Everything else is shadowed
  in full, except outputs over ``HUGE_FACTOR x max_elements`` with no sampled variant, which are
  left to the reference-run comparison (recorded as unshadowed with the reason).

Everything here runs inside a tracer's ``__torch_dispatch__``, below autograd: nothing it computes
is recorded for the backward, so no tensor needs ``detach()``. Not thread-safe: one :class:`Shadow` per
tracer.
"""
from __future__ import annotations

import collections
import functools
import math
import os
from typing import Any, Dict, Optional, Tuple

import torch

from .argtree import map_leaves
from .metrics import DEFAULT_MAX_ELEMENTS, to_home

_F64 = torch.float64
_CPU = torch.device("cpu")
#: ``device``: run float64 shadows on the op's device where its backend computes float64 natively;
#: ``cpu`` (the default, also when unset): on the CPU
ENV_SHADOW_DEVICE = "HAL_PRECISION_SHADOW_DEVICE"
_HOMES: Dict[torch.device, torch.device] = {}


def float64_home(device: torch.device) -> torch.device:
    """Where float64 shadows (and the statistics) of ops on ``device`` run: the device itself when its
    HAL backend computes float64 natively there (``supports_dtype``: a silent downcast is not native,
    so never an MLU), else the CPU; ``$HAL_PRECISION_SHADOW_DEVICE=cpu`` keeps them on the CPU. On the
    H200 the device was 2-15x cheaper in steady state (at a562d9a: gpt tiny 5.9x a plain step against 15.8x
    on the CPU, gpt2-small shapes 7.1-9.6x against 106-125x). Decided once per device and cached; a backend that cannot
    be asked means the CPU. Thread-safe (idempotent cache writes)."""
    if device.type == "cpu":
        return _CPU
    home = _HOMES.get(device)
    if home is None:
        home = _CPU
        if os.environ.get(ENV_SHADOW_DEVICE, "device").strip().lower() != "cpu":
            try:
                from hal.discovery import get_backend
                if get_backend(device.type).supports_dtype(_F64, device):
                    home = device
            except Exception:  # no backend for this device type, or it cannot say: the CPU is safe
                pass
        _HOMES[device] = home
    return home


class UpcastCache:
    """float64 copies of tensors on their :func:`float64_home`, LRU-bounded by ``max_bytes``."""

    def __init__(self, max_bytes: int = 1 << 30):
        self.max_bytes = max_bytes
        self._d: "collections.OrderedDict[tuple, Tuple[torch.Tensor, torch.Tensor]]" = collections.OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, t: torch.Tensor) -> torch.Tensor:
        home = float64_home(t.device)
        if t.dtype == _F64 and t.device == home:
            return t
        try:
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
                   tuple(t.stride()), t.dtype, t.device, t._version)
        except (RuntimeError, NotImplementedError):
            return to_home(t, home, _F64)
        hit = self._d.get(key)
        if hit is not None:
            self._d.move_to_end(key)
            self.hits += 1
            return hit[1]
        self.misses += 1
        up = to_home(t, home, _F64)
        nbytes = up.numel() * 8
        if nbytes <= self.max_bytes // 4:
            self._d[key] = (t, up)
            self._bytes += nbytes
            while self._bytes > self.max_bytes and self._d:
                _, (_, old) = self._d.popitem(last=False)
                self._bytes -= old.numel() * 8
        return up

    def clear(self) -> None:
        self._d.clear()
        self._bytes = 0


def _float64_args(x: Any, cache: UpcastCache, home: torch.device) -> Any:
    """One argument of the float64 shadow running on ``home``."""
    if isinstance(x, torch.Tensor):
        if x.is_floating_point():
            return cache.get(x)
        return to_home(x, home)
    if isinstance(x, torch.dtype) and x.is_floating_point:
        return _F64
    if isinstance(x, torch.device):
        return home
    return x


def _span(n: int, m: int) -> slice:
    """A fixed run of ``min(n, m)`` of ``n`` consecutive positions: a function of ``n`` and ``m`` only, so an op
    of one shape is always compared at the same place."""
    m = max(1, min(n, m))
    start = (n * 7919 + m * 104729) % (n - m + 1)
    return slice(start, start + m)


@functools.lru_cache(maxsize=4096)
def _grid(n_rows: int, n_cols: int, max_elements: int) -> Tuple[slice, slice]:
    """A fixed run of rows and one of columns with about ``max_elements`` cells in all."""
    side = max(1, int(math.sqrt(max_elements)))
    nr = min(n_rows, max(side, max_elements // max(1, n_cols)))
    nc = min(n_cols, max(1, max_elements // nr))
    return _span(n_rows, nr), _span(n_cols, nc)


@functools.lru_cache(maxsize=4096)
def _block(shape: Tuple[int, ...], max_elements: int) -> Tuple[int, Tuple[int, ...], slice]:
    """Where a large point-wise output is compared: ``(d, fixed, run)``, every dim before ``d`` at one fixed
    index (``fixed``), a run of dim ``d``, every later dim whole: about ``max_elements`` elements, a view."""
    inner, d = 1, len(shape) - 1
    while d > 0 and inner * shape[d] <= max_elements:
        inner *= shape[d]
        d -= 1
    fixed = tuple(_span(shape[g], 1).start for g in range(d))
    return d, fixed, _span(shape[d], max(1, max_elements // inner))


def _block_of(x: torch.Tensor, shape: Tuple[int, ...], block: Tuple[int, Tuple[int, ...], slice]) -> torch.Tensor:
    """The part of ``x`` (which broadcasts to ``shape``) that meets :func:`_block`'s block: a view."""
    d, fixed, run = block
    off = len(shape) - x.dim()
    idx = []
    for j, size in enumerate(x.shape):
        g = j + off
        idx.append((0 if size == 1 else fixed[g]) if g < d else (run if g == d and size != 1 else slice(None)))
    return x[tuple(idx)]


def _broadcasts_to(shape, target) -> bool:
    """Whether a tensor of ``shape`` broadcasts to ``target`` without growing it (``torch.broadcast_shapes``
    without its Python cost: the samplers ask once per operand of every large point-wise op)."""
    if len(shape) > len(target):
        return False
    return all(a == 1 or a == b for a, b in zip(reversed(shape), reversed(target)))


#: outputs this many times over ``max_elements`` with no sampled variant are not shadowed.
HUGE_FACTOR = 64


class UnshadowedError(RuntimeError):
    """The op's output is too large to shadow in full and no sampled variant exists."""


_DEVICE_ATTENTION = {"_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_cudnn_attention"}


def _attention64(name, args, kwargs, cache) -> torch.Tensor:
    """float64 attention (on the inputs' float64 home) for a device-only SDPA kernel (output 0), math path."""
    import torch.nn.functional as F

    q, k, v = (cache.get(t) for t in args[:3])
    mask, causal = None, False
    if name == "_scaled_dot_product_flash_attention":
        causal = bool(args[4]) if len(args) > 4 else bool(kwargs.get("is_causal", False))
    else:  # efficient / cudnn: (q, k, v, attn_bias, compute_log_sumexp, dropout_p, is_causal, ...)
        bias = args[3] if len(args) > 3 else kwargs.get("attn_bias")
        mask = cache.get(bias) if isinstance(bias, torch.Tensor) else None
        causal = bool(args[6]) if len(args) > 6 else bool(kwargs.get("is_causal", False))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                          scale=kwargs.get("scale"))


class Shadow:
    """Runs float64 shadows of aten ops on :func:`float64_home` of the op's output device; returns
    (target values, shadow values, sampled)."""

    def __init__(self, max_elements: int = DEFAULT_MAX_ELEMENTS, cache_bytes: int = 1 << 30,
                 sample: bool = True):
        self.max_elements = max_elements
        self.sample = sample
        self.cache = UpcastCache(cache_bytes)
        #: the devices shadows ran on (``"cpu"``, ``"cuda:0"`` ...), for the report
        self.homes: set = set()

    def run(self, func, args, kwargs, out: torch.Tensor, out_index: int
            ) -> Tuple[torch.Tensor, torch.Tensor, str]:
        """Shadow of output ``out_index`` of ``func(*args, **kwargs)``.

        Returns (target values, float64 shadow values, sampling description). Raises whatever
        the op raises in float64 (the caller records it as an unshadowed op).
        """
        name = func.overloadpacket.__name__
        home = float64_home(out.device)
        self.homes.add(str(home))
        if name in _DEVICE_ATTENTION:
            if out_index != 0:
                raise UnshadowedError(f"{name} output {out_index} has no float64 CPU counterpart")
            return out, _attention64(name, args, kwargs, self.cache), "full"
        big = self.sample and out.numel() > self.max_elements
        if big and out_index == 0:
            fast = self._sampled(func, name, args, kwargs, out, home)
            if fast is not None:
                return fast
        if big and out.numel() > HUGE_FACTOR * self.max_elements:
            raise UnshadowedError(f"output of {out.numel()} elements has no sampled shadow; "
                                  "compared against the reference run only")
        a64 = map_leaves(lambda x: _float64_args(x, self.cache, home), args)
        k64 = map_leaves(lambda x: _float64_args(x, self.cache, home), kwargs)
        res = func(*a64, **k64)
        ref = res[out_index] if isinstance(res, (tuple, list)) else res
        return out, ref, "full"

    # -- sampled variants: views of the inputs and of the output, so only the float64 copies cost a kernel --
    def _sampled_rows(self, out: torch.Tensor) -> Optional[Tuple[slice, int, int]]:
        """A run of rows of ``out`` viewed as [n_rows, last] to compare: ``(rows, n_rows, last)``, or None when
        ``out`` is small enough to compare whole."""
        last = out.shape[-1]
        n_rows = out.numel() // max(1, last)
        if n_rows * last <= self.max_elements or n_rows <= 1:
            return None
        return _span(n_rows, self.max_elements // max(1, last)), n_rows, last

    def _sampled(self, func, name, args, kwargs, out, home):
        c = self.cache
        if name in ("mm", "addmm") and out.dim() == 2 and not kwargs.get("out_dtype", None):
            a = args[0] if name == "mm" else args[1]
            b = args[1] if name == "mm" else args[2]
            rs, cs = _grid(out.shape[0], out.shape[1], self.max_elements)
            a64, b64 = to_home(a[rs], home, _F64), to_home(b[:, cs], home, _F64)
            if name == "addmm":
                bias = args[0]
                if bias.dim() == 2 and bias.shape[0] == out.shape[0]:
                    bias = bias[rs]
                if bias.dim() >= 1 and bias.shape[-1] == out.shape[1]:
                    bias = bias[..., cs]
                prod = torch.addmm(to_home(bias, home, _F64), a64, b64, beta=kwargs.get("beta", 1),
                                   alpha=kwargs.get("alpha", 1))
            else:
                prod = a64 @ b64
            return out[rs, cs], prod, f"grid {prod.shape[0]}x{prod.shape[1]}/{out.shape[0]}x{out.shape[1]}"
        if name == "bmm" and out.dim() == 3:
            a, b = args[0], args[1]
            rs, cs = _grid(out.shape[1], out.shape[2], max(1, self.max_elements // out.shape[0]))
            prod = to_home(a[:, rs], home, _F64) @ to_home(b[:, :, cs], home, _F64)
            return out[:, rs, cs], prod, f"grid {prod.shape[1]}x{prod.shape[2]}/{out.shape[1]}x{out.shape[2]}"
        if name in ("_softmax_backward_data", "_log_softmax_backward_data") and args[2] in (-1, out.dim() - 1):
            g, o = args[0], args[1]
            sel = self._sampled_rows(out)
            if sel is None:
                return None
            rs, n_rows, last = sel
            ref = func(to_home(g.reshape(n_rows, last)[rs], home, _F64), to_home(o.reshape(n_rows, last)[rs], home, _F64),
                       -1, _F64)
            return out.reshape(n_rows, last)[rs], ref, f"rows {ref.shape[0]}/{n_rows}"
        if name in ("_softmax", "_log_softmax") and args[1] in (-1, out.dim() - 1):
            sel = self._sampled_rows(out)
            if sel is None:
                return None
            rs, n_rows, last = sel
            ref = func(to_home(args[0].reshape(n_rows, last)[rs], home, _F64), -1, False)
            return out.reshape(n_rows, last)[rs], ref, f"rows {ref.shape[0]}/{n_rows}"
        if torch.Tag.pointwise in func.tags and not kwargs:
            shape = tuple(out.shape)
            if not all(_broadcasts_to(a.shape, shape) for a in args if isinstance(a, torch.Tensor)):
                return None
            block = _block(shape, self.max_elements)

            def pick(x):
                if isinstance(x, torch.Tensor) and x.dim():
                    return to_home(_block_of(x, shape, block), home, _F64 if x.is_floating_point() else None)
                return _float64_args(x, c, home)

            ref = func(*[pick(a) for a in args])
            tv = _block_of(out, shape, block)
            return tv, ref, f"block {tv.numel()}/{out.numel()}"
        return None
