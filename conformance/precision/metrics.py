"""Error statistics of one tensor against its float64 reference, in one fused pass.

:func:`error_stats` takes the target values and the reference values (same shape, any float
dtype; both are upcast to float64) and returns max absolute error, max relative error, mean
relative error (``sum|d| / sum|ref|``), RMS relative error (``sqrt(sum d^2 / sum ref^2)``),
cosine similarity, the element-rule mismatch fraction, NaN/Inf mismatches and, for 16-bit
target dtypes, max/mean ULP error. Large tensors are compared on a fixed pseudo-random sample of
``max_elements`` positions (:func:`sample_index`): the sample is a function of the shape only, so
the target and the reference pick the same positions. Pure functions; thread-safe.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch

#: default number of elements compared per tensor before sampling kicks in.
DEFAULT_MAX_ELEMENTS = 1 << 15
_MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7}
_index_cache: Dict[Tuple[Tuple[int, ...], int], Tuple[torch.Tensor, ...]] = {}


def sample_index(shape, max_elements: int = DEFAULT_MAX_ELEMENTS) -> Optional[Tuple[torch.Tensor, ...]]:
    """Multi-dimensional index of a fixed sample of ``max_elements`` positions, or None (all).

    Deterministic in (shape, max_elements): seeded by the element count, so independent runs
    and the target/reference pair compare the same positions.
    """
    shape = tuple(int(s) for s in shape)
    n = math.prod(shape) if shape else 1
    if n <= max_elements:
        return None
    key = (shape, max_elements)
    idx = _index_cache.get(key)
    if idx is None:
        g = torch.Generator().manual_seed(n % (2 ** 31))
        flat = torch.randint(0, n, (max_elements,), generator=g)
        idx = tuple(torch.unravel_index(flat, shape))
        if len(_index_cache) > 4096:
            _index_cache.clear()
        _index_cache[key] = idx
    return idx


def take_sample(t: torch.Tensor, max_elements: int = DEFAULT_MAX_ELEMENTS) -> torch.Tensor:
    """Flattened float64 CPU values of ``t`` at :func:`sample_index` positions (all if small).

    Always a copy: a float64 CPU tensor is never returned as a view of ``t``'s storage (a sample kept
    for later would otherwise change with ``t``: ``clip_grad_norm_`` scales in place the very tensor
    a backward op produced, since AccumulateGrad keeps it as ``.grad``)."""
    idx = sample_index(t.shape, max_elements)
    if idx is None:
        v = t.detach().reshape(-1)
    else:
        dev = t.device
        v = t.detach()[tuple(i.to(dev) for i in idx)]
    out = v.to("cpu", torch.float64)
    if out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
        out = out.clone()
    return out


def error_stats(target: torch.Tensor, ref: torch.Tensor, *, target_dtype: torch.dtype,
                rtol: float, atol: float, normwise: bool, rule: str = "element") -> Dict[str, float]:
    """Metrics of ``target`` against ``ref`` (flattened, same numel) plus a verdict.

    ``normwise`` selects the element-rule scale ``max(|ref|, rms(ref))`` instead of ``|ref|``.
    ``rule="element"``: ``exceeds`` when a NaN/Inf position differs or the element-rule mismatch
    fraction is over the allowed fraction (per-op acceptance, DIOPI style).
    ``rule="aggregate"``: ``exceeds`` when a NaN/Inf position differs, the RMS relative error is
    over ``rtol`` or the cosine similarity is under 0.99 (accumulated/inherited error), and some element's
    error is over ``atol`` (both measures are scale-free: under the floor they measure noise).
    Returns plain floats (JSON-ready).
    """
    from .thresholds import MISMATCH_FRACTION

    t = target.detach().reshape(-1).to("cpu", torch.float64)
    r = ref.detach().reshape(-1).to("cpu", torch.float64)
    n = t.numel()
    if n == 0:
        return {"n": 0, "max_abs": 0.0, "max_rel": 0.0, "mean_rel": 0.0, "rms_rel": 0.0,
                "cosine": 1.0, "mismatch_frac": 0.0, "nan_inf_mismatch": 0, "exceeds": False}
    all_finite = bool(torch.isfinite(torch.stack([t.sum(), r.sum()])).all()) and \
        bool(torch.isfinite(t).all()) and bool(torch.isfinite(r).all())
    if all_finite:
        nonfin_mismatch, both, tb, rb = 0, None, t, r
    else:
        t_fin, r_fin = torch.isfinite(t), torch.isfinite(r)
        both = t_fin & r_fin
        # non-finite in one but not the other, or different non-finite values
        nonfin_mismatch = int((t_fin != r_fin).sum()) + int(
            ((~t_fin) & (~r_fin) & ~((t == r) | (torch.isnan(t) & torch.isnan(r)))).sum())
        tb = torch.where(both, t, 0.0)
        rb = torch.where(both, r, 0.0)
    d = (tb - rb).abs_()
    ar = rb.abs()
    # one stacked reduction: sum|d|, sum d^2, sum|r|, sum r^2, sum t^2, sum t*r. Products are summed
    # with sum(), not torch.dot: BLAS dot goes multi-threaded even on a 4096-element sample and then
    # waits on a busy core (measured 2-3 ms a call on a loaded 2-core host, vs 3 us single-threaded);
    # sum() stays on one thread below torch's parallel grain size.
    sums = torch.stack([d.sum(), (d * d).sum(), ar.sum(), (rb * rb).sum(), (tb * tb).sum(),
                        (tb * rb).sum()]).tolist()
    sd, sd2, sr, sr2, st2, str_ = sums
    nb = n if both is None else max(1, int(both.sum()))
    rms_ref = math.sqrt(sr2 / nb)
    scale = torch.clamp(ar, min=rms_ref) if normwise else ar
    bad = d > scale.mul_(rtol).add_(atol) if normwise else d > ar * rtol + atol
    if both is not None:
        bad &= both
    mismatch = (int(bad.sum()) + nonfin_mismatch) / n
    rel = d / torch.where(ar > max(atol, 1e-300), ar, math.inf)
    max_rel = float(rel.max())
    denom = math.sqrt(st2) * math.sqrt(sr2)
    cosine = str_ / denom if denom > 0 else (1.0 if st2 == sr2 else 0.0)
    out = {
        "n": n,
        "max_abs": float(d.max()) if n else 0.0,
        "max_rel": max_rel,
        "mean_rel": sd / sr if sr > 0 else (0.0 if sd == 0 else math.inf),
        "rms_rel": math.sqrt(sd2 / sr2) if sr2 > 0 else (0.0 if sd2 == 0 else math.inf),
        "rms_abs": math.sqrt(sd2 / nb),
        "rms_ref": rms_ref,
        "cosine": cosine,
        "mismatch_frac": mismatch,
        "nan_inf_mismatch": nonfin_mismatch,
    }
    bits = _MANTISSA_BITS.get(target_dtype)
    if bits is not None:
        # ULP of the reference value in the target's format (normal range).
        _, e = torch.frexp(torch.where(ar > 0, ar, torch.ones_like(ar)))
        min_exp = -13 if target_dtype == torch.float16 else -125
        ulp = torch.ldexp(torch.ones_like(ar), (torch.clamp(e - 1, min=min_exp) - bits))
        u = d / ulp
        out["ulp_max"] = float(u.max())
        out["ulp_mean"] = float(u.mean())
    if rule == "aggregate":
        from .thresholds import MODULE_COSINE_MIN
        # rms_rel and cosine are scale-free: on a tensor whose every error is within atol (gradients of
        # ~1e-8 through masked attention, say) they measure noise, so they count only above the atol floor
        significant = out["max_abs"] > atol
        out["exceeds"] = bool(nonfin_mismatch > 0 or significant and (out["rms_rel"] > rtol + atol
                                                                      or cosine < MODULE_COSINE_MIN))
    else:
        out["exceeds"] = bool(nonfin_mismatch > 0 or mismatch > MISMATCH_FRACTION)
    out["rule"] = rule
    return out
