"""Route ATen's CUDA softmax, log_softmax and layer_norm to the Triton kernels (opt-in, one switch).

:func:`route_aten_ops` registers implementations of ``aten::_softmax``, ``aten::_log_softmax`` and
``aten::native_layer_norm`` on the ``CUDA`` dispatch key with ``torch.library``, so every model
that calls ``torch.softmax``/``F.layer_norm``/``nn.LayerNorm`` on a CUDA tensor runs the Triton
forward without code changes; autograd is untouched (the ATen derivative formulas run torch's
backward kernels on the saved output or mean/rstd, which these kernels produce in ATen's layout).
Calls the kernels cannot take (float64, rows longer than the single-block limit for layer_norm)
are computed from other ATen ops on the device. Turned on by ``$HAL_CUDA_ROUTE_ATEN=1`` when the
CUDA backend registers its ops, or by calling :func:`route_aten_ops`; :func:`unroute_aten_ops`
restores torch's kernels. Not thread-safe against concurrent routing changes.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Iterator, Optional

import torch

from hal.backends.cuda.kernels._rows import MAX_BLOCK

_lib: Optional["torch.library.Library"] = None
#: how many calls each routed op served with a Triton kernel (for tests and reports)
CALLS = {"_softmax": 0, "_log_softmax": 0, "native_layer_norm": 0}
_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _softmax_impl(log: bool):
    def impl(x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
        from hal.backends.cuda.kernels.softmax import softmax_forward
        out_dtype = torch.float32 if half_to_float else x.dtype
        if x.numel() == 0 or x.dtype not in _KERNEL_DTYPES:
            z = x.to(out_dtype) - x.to(out_dtype).amax(dim, keepdim=True)
            return z - z.exp().sum(dim, keepdim=True).log() if log else z.exp() / z.exp().sum(dim, keepdim=True)
        CALLS["_log_softmax" if log else "_softmax"] += 1
        if x.dim() == 0:
            return softmax_forward(x.reshape(1), log, out_dtype).reshape(())
        dim = dim % x.dim()
        if dim == x.dim() - 1:
            return softmax_forward(x, log, out_dtype)
        return softmax_forward(x.movedim(dim, -1), log, out_dtype).movedim(-1, dim).contiguous()
    return impl


def _layer_norm_impl(x: torch.Tensor, normalized_shape, weight, bias, eps: float):
    from hal.backends.cuda.kernels.norms import norm_forward
    k = len(normalized_shape)
    n = 1
    for s in normalized_shape:
        n *= int(s)
    stat_shape = tuple(x.shape[: x.dim() - k]) + (1,) * k
    if x.dtype in _KERNEL_DTYPES and 0 < n <= MAX_BLOCK and x.numel():
        CALLS["native_layer_norm"] += 1
        y, _, mean, rstd = norm_forward(x, None, weight, bias, eps, False, n)
        return y, mean.view(stat_shape), rstd.view(stat_shape)
    dims = tuple(range(x.dim() - k, x.dim()))
    var, mean = torch.var_mean(x.float() if x.dtype != torch.float64 else x, dims, unbiased=False, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    y = (x - mean) * rstd
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y.to(x.dtype), mean, rstd


def route_aten_ops(dispatch_key: str = "CUDA") -> None:
    """Register the Triton kernels for ATen's softmax/log_softmax/layer_norm on ``dispatch_key``
    (idempotent). Only ``CUDA`` is meant for use; another key exists for Triton's CPU interpreter."""
    global _lib
    if _lib is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel" is the point
        lib.impl("_softmax", _softmax_impl(False), dispatch_key)
        lib.impl("_log_softmax", _softmax_impl(True), dispatch_key)
        lib.impl("native_layer_norm", _layer_norm_impl, dispatch_key)
    _lib = lib


def unroute_aten_ops() -> None:
    """Give ATen its own CUDA kernels back (idempotent)."""
    global _lib
    if _lib is not None:
        _lib._destroy()
        _lib = None


def is_routed() -> bool:
    return _lib is not None


@contextlib.contextmanager
def routed() -> Iterator[None]:
    """Route inside the ``with`` block only (restores the previous state)."""
    was = is_routed()
    route_aten_ops()
    try:
        yield
    finally:
        if not was:
            unroute_aten_ops()
