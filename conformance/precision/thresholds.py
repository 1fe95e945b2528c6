"""Tolerances of the precision comparison: per dtype, per op class, written into every report.

Rule (documented in docs/precision.md):

* Base ``(rtol, atol)`` per output dtype are torch.testing.assert_close's defaults.
* Element rule: an element passes when ``|out - ref| <= atol + rtol_eff * scale`` where
  ``scale = |ref|`` for element-wise ops and ``scale = max(|ref|, rms(ref))`` for reductions
  (their rounding error is bounded by the sum of magnitudes, not by the possibly cancelled result)
  and for *total* (inherited) comparisons of any op.
* Reductions over ``K`` elements (matmul, sum/mean, softmax, norms, attention) get
  ``rtol_eff = rtol + K * eps_acc``; ``eps_acc`` is float32's epsilon for 16-bit outputs (CPU and
  CUDA kernels accumulate 16-bit inputs in float32) and the output dtype's epsilon otherwise.
* An op's *local* (introduced) error, against a float64 shadow of the op on its actual inputs,
  exceeds when any NaN/Inf position differs or more than ``MISMATCH_FRACTION`` (DIOPI's 1e-3)
  of the elements fail the element rule; the op is judged at the dtype of its least precise
  operand (input or output).
* A *total* error (against the float64 reference run: inherited plus introduced), and every
  module output, gradient, parameter and loss, exceeds when a NaN/Inf position differs, the RMS
  relative error is over ``rtol_eff + atol`` or the cosine similarity is under 0.99 while some
  element's error is over ``atol`` (aggregate rule: accumulated rounding fails the element rule on a
  predictable share of elements; the two scale-free measures need the atol floor, or they judge noise). The
  tolerance dtype of a total comparison is the least precise dtype on the data path that
  produced it (inherited through the op graph), or the autocast dtype.
* A float32 convolution or matmul the target device computed in TF32 (``hal.capabilities.tf32``: CUDA's cuDNN
  convolutions by default from compute capability 8.0, matmuls when allowed) is judged in the format ``"tf32"``
  (:data:`TF32`), which then takes a dtype's place on the data path: rtol 5e-3, PyTorch's own tolerance for TF32
  convolutions and matmuls (``tf32_on_and_off(0.005)`` in its test suite). Not float16's 1e-3, though TF32 has
  float16's mantissa: the kernel rounds its float32 *inputs* to TF32, inside the op, where the float64 shadow
  computed on the op's actual (float32) inputs does not see it; a 16-bit op's inputs are 16-bit already.

Everything here is pure data and pure functions (thread-safe).
"""
from __future__ import annotations

import functools
import math
from typing import Dict, Optional, Tuple, Union

import torch

#: TensorFloat-32, a compute format and no torch dtype: what a float32 convolution or matmul runs in where the device
#: has TF32 switched on for it (see the module docstring). It stands in a dtype's place for the tolerance functions.
TF32 = "tf32"
Format = Union[torch.dtype, str]

#: torch.testing.assert_close defaults, (rtol, atol); TF32's from PyTorch's TF32 tests.
DTYPE_TOLERANCES: Dict[Format, Tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    TF32: (5e-3, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}
#: DIOPI's mismatch_ratio_threshold: share of elements allowed to fail the element rule.
MISMATCH_FRACTION = 1e-3
#: Cambricon's op acceptance bound for mean/RMS relative error of reductions and activations
#: (reported next to each row as a reference figure, not used for the verdict).
CAMBRICON_MEAN_RMS_REL = 3e-3
#: msprobe network-compare bound, used for module outputs and the loss.
MODULE_COSINE_MIN = 0.99

#: op name prefixes (aten overload packet names) that reduce over K elements, and how K is found.
REDUCTION_OPS = {
    "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "dot", "mv", "addmv",
    "convolution", "convolution_backward", "_convolution",
    "sum", "mean", "var", "std", "var_mean", "norm", "linalg_vector_norm", "_foreach_norm",
    "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
    "native_layer_norm", "native_layer_norm_backward", "native_batch_norm",
    "native_batch_norm_backward", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_cudnn_attention", "scaled_dot_product_attention",
    "scaled_dot_product_attention_backward", "cumsum", "logsumexp", "nll_loss_forward",
    "nll_loss_backward", "nll_loss2d_forward", "mse_loss", "embedding_dense_backward",
}


def op_class(op_name: str) -> str:
    """``"reduction"`` or ``"elementwise"`` for an aten op packet name (``aten.mm`` -> ``mm``)."""
    return "reduction" if op_name in REDUCTION_OPS else "elementwise"


def base_tolerance(dtype: Format) -> Tuple[float, float]:
    """(rtol, atol) for an output dtype (or :data:`TF32`); non-float dtypes compare exactly (0, 0)."""
    return DTYPE_TOLERANCES.get(dtype, (0.0, 0.0))


def format_name(fmt: Format) -> str:
    """``"float32"``, ``"tf32"``: a dtype's name without ``torch.``, or the format's."""
    return str(fmt).replace("torch.", "")


def format_named(name: Optional[str]) -> Optional[Format]:
    """The dtype (or :data:`TF32`) :func:`format_name` wrote as ``name``; None for None or an unknown name."""
    if name == TF32:
        return TF32
    dt = getattr(torch, name, None) if name else None
    return dt if isinstance(dt, torch.dtype) else None


def accumulation_eps(dtype: Format) -> float:
    if dtype == TF32:  # products of TF32-rounded inputs, accumulated in float32
        return torch.finfo(torch.float32).eps
    if not dtype.is_floating_point:
        return 0.0
    if dtype in (torch.float16, torch.bfloat16):
        return torch.finfo(torch.float32).eps
    if dtype.is_floating_point:
        return torch.finfo(dtype).eps
    return 0.0


def reduction_length(op_name: str, args, out_shape, out_index: int = 0) -> int:
    """Best-effort K (elements reduced per output element) for a reduction op (output ``out_index`` of it); 1 if
    unknown."""
    try:
        if op_name == "_foreach_norm":  # one norm per tensor of the list (clip_grad_norm_'s, every parameter's grad)
            return max(1, int(args[0][out_index].numel()))
        ts = [a for a in args if isinstance(a, torch.Tensor)]
        if op_name in ("mm", "bmm", "matmul", "dot", "mv"):
            return int(ts[0].shape[-1])
        if op_name in ("addmm", "baddbmm", "addmv"):
            return int(ts[1].shape[-1])
        if op_name in ("linear",):
            return int(ts[0].shape[-1])
        if op_name.startswith("convolution") or op_name == "_convolution":
            w = ts[1]
            return int(math.prod(w.shape[1:]))
        if "attention" in op_name:  # QK^T over the head dim, then PV over the key length
            return int(max(ts[0].shape[-1], ts[1].shape[-2]))
        if "softmax" in op_name or "layer_norm" in op_name:
            return int(ts[0].shape[-1])
        if ts and out_shape is not None:
            n_in, n_out = ts[0].numel(), max(1, math.prod(out_shape))
            return max(1, n_in // n_out)
    except (IndexError, TypeError, ValueError):
        pass
    return 1


@functools.lru_cache(maxsize=8192)
def threshold_for(op_name: str, dtype: Format, k: int = 1) -> Dict[str, float]:
    """The threshold row for one comparison: rtol, atol, rtol_eff, K, class, mismatch fraction (and ``"format":
    "tf32"`` for :data:`TF32`). Cached (the tracers ask once per op output): the dict is shared, read it, never
    change it."""
    rtol, atol = base_tolerance(dtype)
    cls = op_class(op_name)
    rtol_eff = rtol + (k * accumulation_eps(dtype) if cls == "reduction" else 0.0)
    row = {"rtol": rtol, "atol": atol, "rtol_eff": rtol_eff, "k": int(k), "class": cls,
           "mismatch_fraction": MISMATCH_FRACTION}
    if dtype == TF32:
        row["format"] = TF32
    return row


def thresholds_summary() -> Dict[str, object]:
    """The rules as data, for the report's ``thresholds`` section."""
    return {
        "dtype_tolerances": {str(k).replace("torch.", ""): {"rtol": v[0], "atol": v[1]}
                             for k, v in DTYPE_TOLERANCES.items()},
        "element_rule": "|out-ref| <= atol + rtol_eff*scale; scale=|ref| (element-wise ops, local), "
                        "max(|ref|, rms(ref)) (reductions, and every total/inherited comparison)",
        "reduction_rule": "rtol_eff = rtol + K*eps_acc (eps_acc = float32 eps for 16-bit outputs and TF32)",
        "tf32_rule": "a float32 convolution or matmul the device ran in TF32 (its switch on: torch.backends.cudnn."
                     "allow_tf32, on by default, torch.backends.cuda.matmul.allow_tf32) is judged at rtol 5e-3 "
                     "(PyTorch's TF32 test tolerance): the kernel rounds its inputs to TF32 where the float64 shadow "
                     "does not see it",
        "attention_backward_rule": "an attention backward's gradients (local): shadowed by the float64 math "
                                   "gradients on the kernel's own inputs (D = rowsum(dO * out) of the forward output "
                                   "it was given), element scale at least the products' magnitudes |scale|*|dS||K|, "
                                   "|scale|*|dS|^T|Q|, P^T|dO| (dS cancels; the kernel rounds P and dS)",
        "cancellation_rule": "a linear reduction (sum, mean, a norm's saved mean) over tolerance with in-tolerance "
                             "inputs and its own error within is 'cancelled' (within) when its RMS error is at most "
                             "2 x (K for a sum, 1 for a mean) x its inputs' largest RMS error, plus its own",
        "mismatch_fraction": MISMATCH_FRACTION,
        "local_rule": "element rule at the least precise operand dtype; exceeds if NaN/Inf mismatch "
                      "or mismatch fraction > 1e-3",
        "total_rule": "aggregate: exceeds if NaN/Inf mismatch, or some |out-ref| > atol and (rms_rel > rtol_eff + atol "
                      "or cosine < 0.99); "
                      "dtype = least precise on the data path (or the autocast dtype)",
        "parameter_rule": "parameters after the optimizer step: exceeds if NaN/Inf mismatch or "
                          "rms(|p-p_ref|) > rtol_eff*rms(p_ref) + atol + lr (the optimizer's per-step resolution)",
        "nan_inf": "any NaN/Inf position differing from the reference exceeds",
        "module_cosine_min": MODULE_COSINE_MIN,
        "cambricon_mean_rms_rel": CAMBRICON_MEAN_RMS_REL,
    }


def loosest(dtypes) -> Format:
    """The floating dtype (or :data:`TF32`) with the largest default rtol among ``dtypes`` (float64 if none)."""
    best, best_rtol = torch.float64, -1.0
    for d in dtypes:
        if d in DTYPE_TOLERANCES and DTYPE_TOLERANCES[d][0] > best_rtol:
            best, best_rtol = d, DTYPE_TOLERANCES[d][0]
    return best
