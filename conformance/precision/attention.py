"""Float64 forms of the fused attention kernels, for their shadows, and where a large one is compared.

A device attention kernel (CUDA flash, efficient, cudnn) has no float64 form of its own that is a reference (the
efficient kernel's backward, called in float64 on the H200, gave NaN and inf gradients): its shadow is the math
attention, ``F.scaled_dot_product_attention`` in float64. The CPU's flash kernel computes float64 itself, so a small
one is shadowed by a float64 call of the kernel (the generic path), a large one like the device kernels, sampled.
Every attention backward (the CPU's too) is shadowed by the math attention's gradients written out
(:func:`math_attention_grads`), which also gives the magnitudes its local comparison scales with
(:data:`GRADIENTS`; ``docs/precision.md``, Thresholds):

* **forward** (:func:`sampled_attention`): the output rows of a block of :func:`blocks.block` with the last dim
  whole: one index of the leading dims (batch, and heads but for a run of them) and, when one head's rows are more
  than ``max_elements``, a run of query rows. A row of the output depends on its own query row and every key and
  value row of its head alone, so the float64 math attention of those query rows is their reference; a causal mask
  becomes the explicit mask of those rows (``j <= i``, torch's top-left causal mask).
* **backward** (:func:`sampled_attention_backward`): the gradients of a slab of whole heads (every query row of a
  head enters each of its key and value gradients): one index of the leading dims but a run of one of them, about
  ``max_elements`` elements of the query gradient. Its float64 work is bounded by :data:`ATTENTION_WORK_LIMIT`
  (multiply-adds); a longer sequence is left to the reference-run comparison, with the reason.

A dropout (``dropout_p`` > 0) draws a random mask with no float64 counterpart: :class:`blocks.UnshadowedError`.
Pure functions (they read the arguments and return views of them); thread-safe.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Tuple

import torch

from .argtree import named_arguments
from .blocks import UnshadowedError, block, block_slices

_DEVICE_ATTENTION = {"_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_cudnn_attention"}
#: every fused attention kernel (the device ones and the CPU's flash kernel), and their backwards: sampled when large
ATTENTION_FORWARD = frozenset(_DEVICE_ATTENTION | {"_scaled_dot_product_flash_attention_for_cpu"})
ATTENTION_BACKWARD = frozenset(n + "_backward" for n in ATTENTION_FORWARD)
#: multiply-adds one sampled backward's float64 math form may take (a slab of heads x L x S x (E + Ev), about 0.1 s on
#: one CPU core): past it the gradients are compared against the reference run only
ATTENTION_WORK_LIMIT = 1 << 27
#: the gradients an attention backward's shadow compares (query, key, value): :func:`math_attention_grads` with
#: ``magnitudes=True`` returns them, then their magnitudes in the same order
GRADIENTS = 3


def _math_attention_args(name: str, named: Dict[str, Any]) -> Tuple[tuple, dict]:
    """``(query, key, value)`` and the math attention's keywords for an attention kernel's arguments (the device
    kernels' ``attn_bias``, the CPU kernel's ``attn_mask``). Raises :class:`UnshadowedError` for a dropout (its
    random mask has no float64 counterpart)."""
    if named.get("dropout_p"):
        raise UnshadowedError(f"{name} with dropout_p={named['dropout_p']} draws a random mask: no float64 counterpart")
    bias = named.get("attn_bias", named.get("attn_mask"))
    return ((named["query"], named["key"], named["value"]),
            {"attn_mask": bias if isinstance(bias, torch.Tensor) else None,
             "is_causal": bool(named.get("is_causal", False)), "scale": named.get("scale")})


def attention_call(func, name, args, kwargs) -> Tuple[Any, tuple, dict]:
    """``(fn, args, kwargs)`` of the float64 math-path attention standing for an SDPA kernel (output 0): ``fn`` is
    ``F.scaled_dot_product_attention``."""
    import torch.nn.functional as F

    qkv, kw = _math_attention_args(name, named_arguments(func, args, kwargs))
    return F.scaled_dot_product_attention, qkv, kw


def math_attention_grads(grad_out, query, key, value, out=None, attn_mask=None, is_causal=False, scale=None,
                         magnitudes=False):
    """``(d query, d key, d value)`` of ``F.scaled_dot_product_attention(query, key, value, attn_mask, is_causal,
    scale)`` for the incoming ``grad_out``, written out as a fused kernel's backward computes them
    (``P = softmax(scale * Q K^T + mask)``, ``dV = P^T dO``, ``dS = P * (dO V^T - D)``, ``dQ = scale * dS K``,
    ``dK = scale * dS^T Q``), each summed to its operand's shape (broadcast heads). ``D`` is ``rowsum(dO * out)`` of
    the forward output ``out`` the kernel was given, as the kernel computes it (the forward's own rounding of ``out``
    is the forward's error, judged there; ``dS`` cancels, so recomputing ``D`` exactly made a correct 16-bit kernel's
    gradients differ by more than its tolerance: ``benchmarks/study_attention_tolerance.py``); without ``out``, the
    exact ``rowsum(dP * P)``.

    ``magnitudes``: also return, after the three gradients, the magnitudes their rounding errors scale with,
    ``|scale| * |dS| |K|``, ``|scale| * |dS|^T |Q|`` and ``P^T |dO|`` (the classical bound of a product whose factors
    carry relative rounding: a kernel rounds ``P`` and ``dS`` to the operand dtype, and a cancelling ``dS @ K`` can
    be far smaller than its terms). No autograd (the shadows may run inside a dispatch, below it)."""
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    s = (query @ key.transpose(-2, -1)) * scale
    if is_causal:  # F.scaled_dot_product_attention's causal mask: the lower triangle from the top left
        keep = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
    p = torch.softmax(s, -1)
    dp = grad_out @ value.transpose(-2, -1)
    d = (grad_out * out).sum(-1, keepdim=True) if out is not None else (dp * p).sum(-1, keepdim=True)
    ds = p * (dp - d)
    pt = p.transpose(-2, -1)
    grads = ((ds @ key) * scale, (ds.transpose(-2, -1) @ query) * scale, pt @ grad_out)
    shapes = (query.shape, key.shape, value.shape)
    grads = tuple(g.sum_to_size(n) for g, n in zip(grads, shapes))
    if not magnitudes:
        return grads
    a = ds.abs()
    mags = ((a @ key.abs()) * abs(scale), (a.transpose(-2, -1) @ query.abs()) * abs(scale), pt @ grad_out.abs())
    return grads + tuple(m.sum_to_size(n) for m, n in zip(mags, shapes))


def _grad_out(named: Dict[str, Any]) -> torch.Tensor:
    return named["grad_out"] if "grad_out" in named else named["grad_out_"]


def attention_backward_call(func, name, args, kwargs) -> Tuple[Any, tuple, dict]:
    """``(fn, args, kwargs)`` standing for an attention kernel's backward (outputs 0-2: the gradients of query, key
    and value; 3-5 their magnitudes): :func:`math_attention_grads` on the kernel's ``out``."""
    named = named_arguments(func, args, kwargs)
    qkv, kw = _math_attention_args(name, named)
    return math_attention_grads, (_grad_out(named), *qkv), {**kw, "out": named.get("out"), "magnitudes": True}


def _heads(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Tuple[int, ...]:
    """The leading (batch, heads) dims that query, key and value share. Raises :class:`UnshadowedError` where they
    differ (broadcast batch, grouped-query heads): no sampled form for those here."""
    lead = tuple(q.shape[:-2])
    if q.dim() < 3 or tuple(k.shape[:-2]) != lead or tuple(v.shape[:-2]) != lead:
        raise UnshadowedError(f"{name} with query {tuple(q.shape)}, key {tuple(k.shape)}, value {tuple(v.shape)}: "
                              "no sampled shadow for broadcast or grouped heads; compared against the reference run only")
    return lead


def _mask_part(mask: torch.Tensor, n_idx: int, idx: Tuple[slice, ...]) -> torch.Tensor:
    """The part of an attention mask (which broadcasts to ``[*lead, L, S]``, ``n_idx`` = ``len(lead) + 1``) at
    ``idx`` (keep-dim slices of the leading dims and, when given, the query rows): a view."""
    off = n_idx + 1 - mask.dim()
    pick = []
    for j, size in enumerate(mask.shape):
        g = j + off
        pick.append(idx[g] if g < len(idx) and size != 1 else slice(None))
    return mask[tuple(pick)]


def _count(idx: Tuple[slice, ...], shape: Tuple[int, ...]) -> int:
    return math.prod(len(range(*s.indices(n))) for s, n in zip(idx, shape))


def sampled_attention(func, name, args, kwargs, out: torch.Tensor, max_elements: int
                      ) -> Tuple[Any, tuple, dict, torch.Tensor, str]:
    """``(fn, args, kwargs, target, how)`` of a large attention output (output 0): the float64 math attention of
    the query rows of the sampled block (module docstring) and ``target``, those rows of ``out`` (a view). Raises
    :class:`UnshadowedError` for a dropout and for broadcast or grouped heads."""
    import torch.nn.functional as F

    (q, k, v), kw = _math_attention_args(name, named_arguments(func, args, kwargs))
    lead = _heads(name, q, k, v)
    n = len(lead)
    shape = tuple(out.shape)
    where = block(shape, max(max_elements, shape[-1]))  # the last dim whole: d <= n, the query rows' dim
    idx = block_slices(where, n + 1)
    mask, causal = kw["attn_mask"], kw["is_causal"]
    if mask is not None:
        mask = _mask_part(mask, n + 1, idx)
    rows = idx[n]
    if causal and rows != slice(None):  # torch's causal mask (top left) of these query rows, written out
        i = torch.arange(*rows.indices(q.size(-2)), device=q.device)
        mask, causal = torch.arange(k.size(-2), device=q.device) <= i[:, None], False
    target = out[idx]
    call = (q[idx], k[idx[:n]], v[idx[:n]])
    return (F.scaled_dot_product_attention, call, {"attn_mask": mask, "is_causal": causal, "scale": kw["scale"]},
            target, f"block {target.numel()}/{out.numel()}")


def sampled_attention_backward(func, name, args, kwargs, max_elements: int
                               ) -> Tuple[Any, tuple, dict, Tuple[slice, ...], str]:
    """``(fn, args, kwargs, heads, how)`` of a large attention backward: the float64 math gradients and their
    magnitudes (:func:`math_attention_grads`) of a slab of whole heads, and ``heads``, the keep-dim slices of the leading
    dims that pick the slab from each of the three gradients. Raises :class:`UnshadowedError` for a dropout, for
    broadcast or grouped heads and when the slab's float64 work is over :data:`ATTENTION_WORK_LIMIT`."""
    named = named_arguments(func, args, kwargs)
    (q, k, v), kw = _math_attention_args(name, named)
    lead = _heads(name, q, k, v)
    n = len(lead)
    L, S, E, Ev = q.size(-2), k.size(-2), q.size(-1), v.size(-1)
    unit = L * E  # one head's query gradient: the slab is whole heads
    heads = block_slices(block(lead + (unit,), max(max_elements, unit)), n)
    count = _count(heads, lead)
    work = count * L * S * (E + Ev)
    if work > ATTENTION_WORK_LIMIT:
        raise UnshadowedError(f"{name}: the float64 gradients of {count} head(s) of {L}x{S} take {work} multiply-adds, "
                              f"over {ATTENTION_WORK_LIMIT}; compared against the reference run only")
    mask = kw["attn_mask"]
    if mask is not None:
        mask = _mask_part(mask, n + 1, heads)
    out = named.get("out")
    call = (_grad_out(named)[heads], q[heads], k[heads], v[heads])
    return (math_attention_grads, call, {"out": None if out is None else out[heads], "attn_mask": mask,
                                         "is_causal": kw["is_causal"], "scale": kw["scale"], "magnitudes": True},
            heads, f"heads {count}/{math.prod(lead)}")
