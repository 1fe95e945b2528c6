"""Reference implementations of the HAL ops with torch's own kernels.

These run on any device torch supports, so the CPU backend registers them for every dtype and a
device backend registers them for the dtypes its framework kernels handle natively. Semantics are
torch's (same arguments, same results): where torch has the op, the reference *is* torch's function
(no wrapper frame on the dispatch path); the fused ops are written with torch ops. Only APIs
present in torch 2.4 are required.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F


def _rms_norm(input: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor] = None,
              eps: Optional[float] = None) -> torch.Tensor:
    """RMSNorm for a torch without ``F.rms_norm`` (it arrived in 2.4)."""
    dims = tuple(range(-len(normalized_shape), 0))
    e = torch.finfo(input.dtype).eps if eps is None else eps
    out = input * torch.rsqrt(input.pow(2).mean(dims, keepdim=True) + e)
    return out * weight if weight is not None else out


rms_norm = getattr(F, "rms_norm", _rms_norm)
#: ``torch.rms_norm`` where torch has it: ``F.rms_norm``'s arguments and result, one Python frame fewer
_rms_norm_direct = getattr(torch, "rms_norm", rms_norm)
_cross_entropy_loss = torch._C._nn.cross_entropy_loss
_REDUCTION = {"none": 0, "mean": 1, "sum": 2}  # torch.nn._reduction.get_enum's codes


def _cross_entropy_direct(input: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor] = None,
                          size_average: Optional[bool] = None, ignore_index: int = -100,
                          reduce: Optional[bool] = None, reduction: str = "mean",
                          label_smoothing: float = 0.0) -> torch.Tensor:
    """``F.cross_entropy`` with its arguments and result, calling ATen's ``cross_entropy_loss`` binding
    directly (which handles ``__torch_function__`` itself); the legacy ``size_average``/``reduce`` and
    an unknown ``reduction`` go to ``F.cross_entropy`` (its warnings and errors)."""
    code = _REDUCTION.get(reduction)
    if size_average is not None or reduce is not None or code is None:
        return F.cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)
    return _cross_entropy_loss(input, target, weight, code, ignore_index, label_smoothing)


def add_rms_norm(input: torch.Tensor, residual: torch.Tensor, normalized_shape: Sequence[int],
                 weight: Optional[torch.Tensor] = None, eps: Optional[float] = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = input + residual``; returns ``(rms_norm(h), h)`` (the fused pre-norm residual step)."""
    h = input + residual
    return _rms_norm_direct(h, normalized_shape, weight, eps), h


def silu_and_mul(input: torch.Tensor) -> torch.Tensor:
    """``silu(a) * b`` where ``a, b = input.chunk(2, dim=-1)`` (the SwiGLU gate)."""
    a, b = input.chunk(2, dim=-1)
    return F.silu(a) * b


def linear_cross_entropy(input: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         bias: Optional[torch.Tensor] = None, ignore_index: int = -100,
                         reduction: str = "mean") -> torch.Tensor:
    """``F.cross_entropy(input @ weight.T + bias, target)`` over the rows of ``input [..., hidden]``
    (``weight [vocab, hidden]``, ``target [...]`` class indices): the LM head and its loss. This
    reference materialises the full logits; backends may chunk them (same result). Rows already flat
    are not reshaped: a reshape is an autograd node, 15% of the host time of a small call's forward and
    backward."""
    logits = F.linear(input, weight, bias)
    if logits.dim() != 2:
        logits = logits.reshape(-1, logits.shape[-1])
    return _cross_entropy_direct(logits, target if target.dim() == 1 else target.reshape(-1), None, None,
                                 ignore_index, None, reduction)


#: name -> (ATen overload it stands for, ATen overloads it reaches, implementation). For ops that are
#: ATen ops themselves "reaches" is the op: the capability query expands composites per device (the
#: kernel SDPA or rms_norm lands on differs by device and torch version); the fused HAL ops list
#: the ATen ops their reference issues.
OPS = {
    "softmax": ("aten::softmax.int", ("aten::_softmax",), torch.softmax),
    "log_softmax": ("aten::log_softmax.int", ("aten::_log_softmax",), torch.log_softmax),
    "layer_norm": ("aten::layer_norm", ("aten::native_layer_norm",), F.layer_norm),
    "rms_norm": ("aten::rms_norm", ("aten::rms_norm",), rms_norm),
    "add_rms_norm": ("hal::add_rms_norm", ("aten::add.Tensor", "aten::pow.Tensor_Scalar", "aten::mean.dim",
                                           "aten::rsqrt", "aten::mul.Tensor"), add_rms_norm),
    "gelu": ("aten::gelu", ("aten::gelu",), F.gelu),
    "silu": ("aten::silu", ("aten::silu",), F.silu),
    "silu_and_mul": ("hal::silu_and_mul", ("aten::silu", "aten::mul.Tensor"), silu_and_mul),
    "matmul": ("aten::matmul", ("aten::mm", "aten::bmm"), torch.matmul),
    "cross_entropy": ("aten::cross_entropy_loss", ("aten::_log_softmax", "aten::nll_loss_forward"), F.cross_entropy),
    "linear_cross_entropy": ("hal::linear_cross_entropy", ("aten::mm", "aten::_log_softmax",
                                                           "aten::nll_loss_forward"), linear_cross_entropy),
    "embedding": ("aten::embedding", ("aten::index_select",), F.embedding),
    "scaled_dot_product_attention": ("aten::scaled_dot_product_attention",
                                     ("aten::scaled_dot_product_attention",), F.scaled_dot_product_attention),
}

#: name -> the cheapest callable that takes the reference's arguments and returns its result: torch's
#: builtin binding where the reference is a Python wrapper around it (``F.layer_norm`` calls
#: ``torch.layer_norm``, whose extra ``cudnn_enable`` argument ATen ignores). A builtin handles
#: ``__torch_function__`` itself, so a subclass or mode sees the builtin, not the ``F`` function, as
#: ``func``. What a size route (``hal.ops.SIZE_ROUTE``) calls: on the H200's host one Python frame is
#: 3-5% of a small call.
DIRECT = {"layer_norm": torch.layer_norm, "rms_norm": _rms_norm_direct, "cross_entropy": _cross_entropy_direct}


def direct(name: str):
    """:data:`DIRECT`'s callable for the op ``name``, else its reference (``OPS[name][2]``)."""
    return DIRECT.get(name) or OPS[name][2]
