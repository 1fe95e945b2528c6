"""Reference implementations of the HAL ops with torch's own kernels.

These run on any device torch supports, so the CPU backend registers them for every dtype and a
device backend registers them for the dtypes its framework kernels handle natively. Semantics are
torch's (same arguments, same results); they use only APIs present in torch 2.4.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F


def softmax(input: torch.Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    return torch.softmax(input, dim, dtype=dtype)


def log_softmax(input: torch.Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    return torch.log_softmax(input, dim, dtype=dtype)


def layer_norm(input: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    return F.layer_norm(input, tuple(normalized_shape), weight, bias, eps)


def rms_norm(input: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor] = None,
             eps: Optional[float] = None) -> torch.Tensor:
    if hasattr(F, "rms_norm"):
        return F.rms_norm(input, tuple(normalized_shape), weight, eps)
    dims = tuple(range(-len(normalized_shape), 0))  # pragma: no cover - torch < 2.4
    e = torch.finfo(input.dtype).eps if eps is None else eps
    out = input * torch.rsqrt(input.pow(2).mean(dims, keepdim=True) + e)
    return out * weight if weight is not None else out


def add_rms_norm(input: torch.Tensor, residual: torch.Tensor, normalized_shape: Sequence[int],
                 weight: Optional[torch.Tensor] = None, eps: Optional[float] = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = input + residual``; returns ``(rms_norm(h), h)`` (the fused pre-norm residual step)."""
    h = input + residual
    return rms_norm(h, normalized_shape, weight, eps), h


def gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return F.gelu(input, approximate=approximate)


def silu(input: torch.Tensor) -> torch.Tensor:
    return F.silu(input)


def silu_and_mul(input: torch.Tensor) -> torch.Tensor:
    """``silu(a) * b`` where ``a, b = input.chunk(2, dim=-1)`` (the SwiGLU gate)."""
    a, b = input.chunk(2, dim=-1)
    return F.silu(a) * b


def matmul(input: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    return torch.matmul(input, other)


def cross_entropy(input: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor] = None,
                  ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor:
    return F.cross_entropy(input, target, weight=weight, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)


def embedding(input: torch.Tensor, weight: torch.Tensor, padding_idx: Optional[int] = None) -> torch.Tensor:
    return F.embedding(input, weight, padding_idx)


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None) -> torch.Tensor:
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale)


#: name -> (ATen overload it stands for, ATen overloads it reaches, implementation)
OPS = {
    "softmax": ("aten::softmax.int", ("aten::_softmax",), softmax),
    "log_softmax": ("aten::log_softmax.int", ("aten::_log_softmax",), log_softmax),
    "layer_norm": ("aten::layer_norm", ("aten::native_layer_norm",), layer_norm),
    "rms_norm": ("aten::rms_norm", ("aten::pow.Tensor_Scalar", "aten::mean.dim", "aten::add.Scalar",
                                    "aten::rsqrt", "aten::mul.Tensor"), rms_norm),
    "add_rms_norm": ("hal::add_rms_norm", ("aten::add.Tensor", "aten::pow.Tensor_Scalar", "aten::mean.dim",
                                           "aten::rsqrt", "aten::mul.Tensor"), add_rms_norm),
    "gelu": ("aten::gelu", ("aten::gelu",), gelu),
    "silu": ("aten::silu", ("aten::silu",), silu),
    "silu_and_mul": ("hal::silu_and_mul", ("aten::silu", "aten::mul.Tensor"), silu_and_mul),
    "matmul": ("aten::matmul", ("aten::mm", "aten::bmm"), matmul),
    "cross_entropy": ("aten::cross_entropy_loss", ("aten::_log_softmax", "aten::nll_loss_forward"), cross_entropy),
    "embedding": ("aten::embedding", ("aten::index_select",), embedding),
    "scaled_dot_product_attention": ("aten::scaled_dot_product_attention",
                                     ("aten::_scaled_dot_product_flash_attention_for_cpu",), scaled_dot_product_attention),
}
