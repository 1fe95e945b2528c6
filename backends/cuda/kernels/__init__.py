"""Triton kernels for the HAL op registry on CUDA, and the predicates that say which calls they take.

Importing this package does not import Triton: :func:`register` does, and raises ImportError when
Triton is missing (the backend then keeps torch's kernels only). Each predicate returns None when
the kernel takes the call, else the reason it does not (the registry records it and tries the
next implementation, torch's own CUDA kernel), so every call has a device implementation.

The public kernel functions (``norms.rms_norm`` ...) take every call of their op: they run the
predicate themselves and call torch's function for what the kernel does not take or what
:mod:`~hal.backends.cuda.kernels.routing` sends to torch (inputs too small for a launch to pay off),
so :mod:`hal.ops` caches them and calls them directly (``hal_checks_own_args``); the predicates stay
registered for :func:`hal.ops.resolve` and its reasons.

The kernels follow torch's semantics and dtypes: float32, float16 and bfloat16 storage with
float32 arithmetic; outputs have the input's dtype (softmax's ``dtype=`` argument aside).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from hal.backend import dtype_name
from hal.backends.cuda.kernels import _rows
from hal.backends.cuda.kernels._rows import KERNEL_DTYPES, KERNEL_TORCH_DTYPES, MAX_BLOCK

#: HAL op name -> (module, function, predicate name)
KERNELS = {
    "softmax": ("softmax", "softmax", "supports_softmax"),
    "log_softmax": ("softmax", "log_softmax", "supports_softmax"),
    "layer_norm": ("norms", "layer_norm", "supports_layer_norm"),
    "rms_norm": ("norms", "rms_norm", "supports_rms_norm"),
    "add_rms_norm": ("norms", "add_rms_norm", "supports_add_rms_norm"),
    "silu_and_mul": ("silu_and_mul", "silu_and_mul", "supports_silu_and_mul"),
    "cross_entropy": ("cross_entropy", "cross_entropy", "supports_cross_entropy"),
    "linear_cross_entropy": ("linear_cross_entropy", "linear_cross_entropy", "supports_linear_cross_entropy"),
}
#: ops whose CUDA implementation is not a Triton kernel, and the engine :func:`hal.ops.resolve` names
IMPL = {"linear_cross_entropy": "chunked"}
PRIORITY = 10


# The predicates run on every call of a kernel wrapper: their accepting path uses the cheapest tensor
# queries (``is_cuda`` and ``get_device()`` instead of ``device`` objects, ``shape[-1]`` for one dim).

def _on_kernel_device(x: torch.Tensor) -> bool:
    dev = _rows.KERNEL_DEVICE
    return x.is_cuda if dev == "cuda" else x.device.type == dev


def _same_device(p: torch.Tensor, x: torch.Tensor) -> bool:
    return p.get_device() == x.get_device() if x.is_cuda else p.device == x.device


def _tensor_reason(x: Any) -> Optional[str]:
    if not isinstance(x, torch.Tensor):
        return "input is not a tensor"
    if not _on_kernel_device(x):
        return f"input is on {x.device.type}, not {_rows.KERNEL_DEVICE}"
    if x.dtype not in KERNEL_TORCH_DTYPES:
        return f"dtype {dtype_name(x.dtype)} is not one of {sorted(KERNEL_DTYPES)}"
    if x.dim() == 0 or x.numel() == 0:
        return "0-d or empty input"
    return None


def supports_softmax(input: Any, dim: int = -1, dtype: Optional[torch.dtype] = None, **_: Any) -> Optional[str]:
    why = _tensor_reason(input)
    if why:
        return why
    if dim not in (-1, input.dim() - 1):
        return f"softmax over dim {dim}, not the last dim (the kernel reduces contiguous rows)"
    if dtype is not None and dtype not in KERNEL_TORCH_DTYPES:
        return f"output dtype {dtype_name(dtype)} is not one of {sorted(KERNEL_DTYPES)}"
    return None


def _trailing(input: torch.Tensor, normalized_shape: Sequence[int], *params: Any) -> Optional[str]:
    k = len(normalized_shape)
    if k == 1:
        n = normalized_shape[0]
        ok = input.shape[-1] == n
    else:
        ok = k > 0 and input.shape[-k:] == tuple(normalized_shape)
        n = 1
        for s in normalized_shape:
            n *= s
    if not ok:
        return f"normalized_shape {tuple(normalized_shape)} does not match the trailing dims of {tuple(input.shape)}"
    if n > MAX_BLOCK:
        return f"rows of {n} elements exceed the single-block kernel's {MAX_BLOCK}"
    for p in params:
        if p is None:
            continue
        if not isinstance(p, torch.Tensor) or not _same_device(p, input) or p.numel() != n:
            return "weight/bias is not a tensor of normalized_shape on the input's device"
        if p.dtype not in KERNEL_TORCH_DTYPES:
            return f"weight/bias dtype {dtype_name(p.dtype)} is not one of {sorted(KERNEL_DTYPES)}"
    return None


def supports_layer_norm(input: Any, normalized_shape: Sequence[int] = (), weight: Any = None, bias: Any = None,
                        eps: float = 1e-5, **_: Any) -> Optional[str]:
    return _tensor_reason(input) or _trailing(input, normalized_shape, weight, bias)


def supports_rms_norm(input: Any, normalized_shape: Sequence[int] = (), weight: Any = None,
                      eps: Optional[float] = None, **_: Any) -> Optional[str]:
    return _tensor_reason(input) or _trailing(input, normalized_shape, weight)


def supports_add_rms_norm(input: Any, residual: Any = None, normalized_shape: Sequence[int] = (),
                          weight: Any = None, eps: Optional[float] = None, **_: Any) -> Optional[str]:
    why = _tensor_reason(input) or _trailing(input, normalized_shape, weight)
    if why:
        return why
    if not isinstance(residual, torch.Tensor) or residual.shape != input.shape or residual.dtype != input.dtype \
            or not _same_device(residual, input):
        return "residual does not have the input's shape, dtype and device"
    return None


def supports_silu_and_mul(input: Any, **_: Any) -> Optional[str]:
    why = _tensor_reason(input)
    if why:
        return why
    if input.shape[-1] % 2:
        return f"last dim {input.shape[-1]} is odd"
    return None


def supports_cross_entropy(input: Any, target: Any = None, weight: Any = None, ignore_index: int = -100,
                           reduction: str = "mean", label_smoothing: float = 0.0, **_: Any) -> Optional[str]:
    why = _tensor_reason(input)
    if why:
        return why
    if input.dim() != 2:
        return f"input has {input.dim()} dims; the kernel takes [rows, classes]"
    if not isinstance(target, torch.Tensor) or target.dim() != 1 or target.shape[0] != input.shape[0] \
            or target.dtype not in (torch.int64, torch.int32) or target.device != input.device:
        return "target is not a class-index tensor [rows] (int64/int32) on the input's device"
    if weight is not None:
        return "class weights are not implemented in the kernel"
    if label_smoothing:
        return "label smoothing is not implemented in the kernel"
    if reduction not in ("mean", "sum", "none"):
        return f"unknown reduction {reduction!r}"
    return None


#: linear_cross_entropy calls whose logits (rows x vocab) have fewer elements go to torch's reference (one
#: matmul and cross_entropy): on the H200 (6eabf5a) the chunked head was 0.25-0.41x torch at 8 x 768 x 50257
#: (host-bound: a handful of launches and Python per chunk) and 0.97-1.02x at 4096 x 768 x 50257, where the
#: memory it saves starts to matter; sizes in between were not measured
TORCH_BELOW_LOGITS = 1 << 24
_SMALL_HEAD = f"logits under {TORCH_BELOW_LOGITS} elements (rows x vocab): torch's reference is faster " \
    "(TORCH_BELOW_LOGITS)"


def supports_linear_cross_entropy(input: Any, weight: Any = None, target: Any = None, bias: Any = None,
                                  ignore_index: int = -100, reduction: str = "mean", **kw: Any) -> Optional[str]:
    # the size first: every call of a small head runs this predicate (hal.ops' guarded chain) before torch's
    # reference takes it, so its answer costs two attribute reads, not the full check
    try:
        if input.numel() // input.shape[-1] * weight.shape[0] < TORCH_BELOW_LOGITS:
            return _SMALL_HEAD
    except (AttributeError, IndexError, TypeError, ZeroDivisionError):
        pass  # not tensors, 0-d or empty: the full check says which
    from hal.backends.cuda.kernels.linear_cross_entropy import supports
    return _tensor_reason(input) or supports(input, weight, target, bias, ignore_index, reduction, **kw)


def load(op: str):
    """``(kernel function, predicate)`` for HAL op ``op`` (imports Triton)."""
    import importlib
    module, fn, pred = KERNELS[op]
    mod = importlib.import_module(f"hal.backends.cuda.kernels.{module}")
    return getattr(mod, fn), globals()[pred]


def register(registry: Any) -> list[str]:
    """Register every Triton kernel into ``registry`` for device type ``cuda``; returns the op names.

    Raises ImportError when Triton is not importable (nothing is registered then)."""
    import triton  # noqa: F401  (fail before registering anything)
    done = []
    for op in KERNELS:
        fn, pred = load(op)
        registry.register(op, "cuda", fn, impl=IMPL.get(op, "triton"), dtypes=KERNEL_DTYPES, priority=PRIORITY,
                          supports=pred)
        done.append(op)
    return done
