"""Turn captured op records into the audit's ``ops`` section: status on the target, dtype risks, cost.

Status comes from the capability query API (:func:`hal.capabilities.op_status`): native |
composite | fallback | unsupported | unknown, with its reason. When that API is not installed every
op is ``unknown`` with the reason saying so. Measured facts override predictions, and only those are
``verified``:

- on a present target, ops that ran on the target's tensors ran natively there (``native``,
  verified) unless torch_mlu's warning said it fell back (``fallback``, verified) -- the warning
  counts only when the run device is an MLU; a run on any other device never yields a verified
  MLU fallback;
- ``hal.ops`` fallbacks that ran (from :func:`hal.ops.fallback_log`) are ``fallback``, verified.

Cost of a fallback: ``calls_per_step = count / steps`` and ``bytes_per_step`` = the bytes of every
input and output tensor per step (inputs go to the host, outputs come back).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

MLU_64BIT_NOTE = "{dt} is computed as {to} on MLU (torch_mlu casts 64-bit tensors to 32-bit silently)"
_64BIT = {"float64": "float32", "complex128": "complex64"}
PHASE_ORDER = ("forward", "backward", "optimizer", "inference")

#: Kernels the *host* picked inside a composite that picks per backend: a CPU trace shows the CPU's
#: choice, the target picks its own. The record names the portable op the program called (what the
#: capability API decides for the target) and keeps the captured kernel in ``captured_as``.
HOST_CHOSEN = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": "aten::scaled_dot_product_attention",
}

_RNN = {"aten::mkldnn_rnn_layer": "aten::_cudnn_rnn", "aten::mkldnn_rnn_layer_backward": "aten::_cudnn_rnn_backward"}
_SDPA_CPU = "aten::_scaled_dot_product_flash_attention_for_cpu"
_BN = {"aten::native_batch_norm": "aten::cudnn_batch_norm",
       "aten::native_batch_norm_backward": "aten::cudnn_batch_norm_backward"}
#: CUDA architecture assumed when none is given (the H200 the CUDA manifest was generated on).
DEFAULT_CUDA_ARCH = 9


def _cuda_sdpa(dtypes: list[str], shapes: list, arch: Optional[int]) -> str:
    """The kernel torch's CUDA ``_fused_sdp_choice`` picks (torch 2.11 on sm90, as measured on the
    H200): half types without a mask -> cuDNN attention (sm >= 9) or flash (sm 8); float32, or any
    mask -> memory-efficient attention."""
    masked = any(len(s) >= 4 for s in shapes or [])
    half = bool(dtypes) and all(d in ("float16", "bfloat16") for d in dtypes)
    if half and not masked:
        return ("aten::_scaled_dot_product_cudnn_attention" if (arch or DEFAULT_CUDA_ARCH) >= 9
                else "aten::_scaled_dot_product_flash_attention")
    return "aten::_scaled_dot_product_efficient_attention"


def target_kernel(op: str, dtypes: list[str], shapes: list, backend: str,
                  arch: Optional[int] = None) -> Optional[tuple[str, str]]:
    """``(op the target dispatches, why)`` for a kernel the *host* picked inside a call whose kernel
    each backend picks for itself, or None when ``op`` is what the target runs too. Used only for
    ops captured on another device than the target (predictions); the record keeps ``captured_as``.

    - ``mkldnn_rnn_layer[_backward]`` (the CPU's LSTM) -> ``_cudnn_rnn[_backward]`` on cuda (cuDNN)
      and mlu (torch_mlu registers ``aten::lstm.input`` and runs ``_cudnn_rnn`` through CNNL);
    - the CPU's flash SDPA kernel -> on cuda the kernel ``_fused_sdp_choice`` picks there
      (:func:`_cuda_sdpa`); elsewhere the portable ``scaled_dot_product_attention`` (the capability
      query resolves which fused kernel the target registers);
    - ``native_batch_norm[_backward]`` -> ``cudnn_batch_norm[_backward]`` on cuda where cuDNN runs it
      (input of >= 3 dims, not bfloat16/float64); torch_mlu keeps ``native_batch_norm``."""
    if op in _RNN and backend in ("cuda", "mlu"):
        return _RNN[op], "the CPU's oneDNN LSTM layer; " + (
            "cuDNN runs the LSTM as _cudnn_rnn" if backend == "cuda" else
            "torch_mlu registers aten::lstm.input and runs it as _cudnn_rnn (CNNL)")
    if op in (_SDPA_CPU, _SDPA_CPU + "_backward"):
        if backend == "cuda":
            k = _cuda_sdpa(dtypes, shapes, arch)
            return (k if op == _SDPA_CPU else k + "_backward"), \
                "the CPU's choice inside scaled_dot_product_attention; CUDA's _fused_sdp_choice picks " + k
        return HOST_CHOSEN[op], f"the CPU's choice inside {HOST_CHOSEN[op]}"
    if op in _BN and backend == "cuda":
        first = (shapes or [[[]]])[0]
        ndim = len(first[0]) if first and first[0] is not None else 0
        if ndim >= 3 and not any(d in ("bfloat16", "float64") for d in dtypes):
            return _BN[op], "the CPU's batch norm; cuDNN runs batch norm of >= 3-d float32/float16 input"
    return None


def capability_query() -> tuple[Optional[Callable[..., Any]], str]:
    """``(op_status, "")`` or ``(None, reason)`` when the capability API is not installed."""
    try:
        from hal.capabilities import op_status
    except Exception as exc:  # ImportError, or a broken install: degrade, say why
        return None, f"capability query API not installed ({type(exc).__name__}: {exc})"
    return op_status, ""


def _query(query: Optional[Callable[..., Any]], missing: str, backend: str, op: str, dtypes: list[str],
           arch: Optional[int] = None) -> dict:
    if query is None:
        return {"status": "unknown", "reason": missing, "dtype_notes": [], "via": None, "hints": []}
    try:
        st = query(backend, op, dtypes=tuple(dtypes), arch=arch)
    except Exception as exc:
        return {"status": "unknown", "reason": f"capability query failed: {type(exc).__name__}: {exc}",
                "dtype_notes": [], "via": None, "hints": []}
    return {"status": st.status, "reason": st.reason, "dtype_notes": list(getattr(st, "dtype_notes", []) or []),
            "via": list(getattr(st, "via", ()) or ()), "hints": list(getattr(st, "hints", ()) or ())}


#: ATen ops whose float32 math a TF32 default covers, by the manifest's ``tf32_defaults`` key.
TF32_OPS = {
    "conv": ("aten::convolution", "aten::convolution_backward", "aten::_convolution", "aten::conv2d",
             "aten::conv1d", "aten::conv3d", "aten::cudnn_convolution"),
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
               "aten::addbmm", "aten::_addmm_activation"),
}


def precision_notes(backend: str, op: str, dtypes: list[str], arch: Optional[int] = None) -> list[str]:
    """Predicted precision notes from ``backend``'s manifest (never a measurement): float32 ops that
    run in TF32 by default there (``tf32_defaults``: conv and/or matmul, only from architecture
    ``arch_min_major`` on)."""
    if "float32" not in dtypes:
        return []
    try:
        from hal.capabilities import load_manifest
        tf = load_manifest(backend).tf32_defaults
    except Exception:  # no manifest: nothing to predict from
        return []
    need = tf.get("arch_min_major")
    out = []
    for key, ops in TF32_OPS.items():
        if op in ops and tf.get(key):
            flag = (tf.get("flags") or {}).get(key, "")
            gate = ""
            if need is not None:
                if arch is not None and arch < need:
                    continue
                gate = f" on architecture >= {need}" + ("" if arch is not None else " (architecture not given)")
            out.append(f"float32 {key} runs in TF32 by default on {backend}{gate} ({flag}=True): precision "
                       "like cuDNN's TF32 convolutions (predicted, not measured)")
    return out


def dtype_notes(backend: str, dtypes: list[str], existing: list[str], op: str = "",
                arch: Optional[int] = None) -> list[str]:
    notes = list(existing)
    if backend == "mlu":
        for dt in dtypes:
            if dt in _64BIT and not any(dt in n for n in notes):
                notes.append(MLU_64BIT_NOTE.format(dt=dt, to=_64BIT[dt]))
    if op and backend != "cpu":
        notes.extend(n for n in precision_notes(backend, op, dtypes, arch) if n not in notes)
    return notes


def _equivalent(backend: str, op: str) -> Optional[tuple[str, str]]:
    try:
        from hal.capabilities import target_equivalent, target_torch
    except Exception:  # capability API absent: the query says so per op
        return None
    try:
        eq = target_equivalent(backend, op)
    except Exception:
        return None
    if eq is None:
        return None
    return eq[0], (f"version skew: the running torch emits {op}, which torch {target_torch(backend)} "
                   f"(the {backend} manifest's pairing) does not have; {eq[1]}")


def build_ops(records: list[dict], backend: str, steps: int, measured: Optional[dict] = None,
              hal_fallbacks: Optional[list[dict]] = None, arch: Optional[int] = None) -> list[dict]:
    """The ``ops`` section. ``measured``: ``{"device_type", "mlu_fallbacks": {op: n}}`` when the
    run happened on the target itself, else None (everything predicted). ``arch``: the target's
    architecture major (dtype gates, TF32 notes), None when not given.

    A record captured on another device than the target is renamed to what the target dispatches,
    keeping the captured name in ``captured_as`` and saying why in ``reason``: kernels the host
    picked (:func:`target_kernel`) and ops of the running torch that the target's torch lacks
    (``hal.capabilities.target_equivalent``: ``_safe_softmax`` -> ``_softmax`` for torch 2.4)."""
    query, missing = capability_query()
    per_step = max(int(steps or 0), 1)
    cache: dict[tuple, dict] = {}
    out = []
    for rec in records:
        captured_as, why = None, ""
        if measured is None or rec.get("device_type") != measured["device_type"]:
            mapped = target_kernel(rec["op"], rec["dtypes"], rec.get("shapes", []), backend, arch) \
                or _equivalent(backend, rec["op"])
            if mapped is not None:
                captured_as, why = rec["op"], mapped[1]
                rec = dict(rec, op=mapped[0])
        key = (rec["op"], tuple(rec["dtypes"]))
        st = cache.get(key)
        if st is None:
            st = cache[key] = _query(query, missing, backend, rec["op"], rec["dtypes"], arch)
        status, reason, verified = st["status"], st["reason"], False
        if measured is not None and rec.get("device_type") == measured["device_type"]:
            verified = True
            # torch_mlu's own warning is a measurement only when the run device is an MLU: the same
            # text printed on any other device (a stand-in, a copied log line) proves nothing there
            if measured["device_type"] == "mlu" and _warned(rec["op"], measured.get("mlu_fallbacks", {})):
                status, reason = "fallback", "torch_mlu warned that it fell back to the CPU (measured)"
            else:
                status, reason = "native", f"ran on {measured['device_type']} (measured)"
        fallback = status in ("fallback",)
        out.append({"op": rec["op"], "count": rec["count"], "dtypes": rec["dtypes"], "status": status,
                    "reason": reason, "phase": rec["phase"], "modules": rec.get("modules", []),
                    "shapes": rec.get("shapes", []), "device_type": rec.get("device_type"),
                    "calls_per_step": round(rec["count"] / per_step, 3),
                    "bytes_per_step": int(rec["bytes"] / per_step) if fallback else 0,
                    "dtype_notes": dtype_notes(backend, rec["dtypes"], st["dtype_notes"], rec["op"], arch),
                    "verified": verified, "source": "capture", "via": st["via"], "hints": st["hints"]})
        if captured_as:
            out[-1]["captured_as"] = captured_as
            out[-1]["reason"] = (f"captured as {captured_as} ({why}); on {backend}: " + str(out[-1]["reason"]))
    for fb in hal_fallbacks or []:
        out.append({"op": fb["op"], "count": fb["calls"], "dtypes": fb["dtypes"], "status": "fallback",
                    "reason": f"hal.ops.{fb['hal_op']} ran on the CPU: {fb['reason']}", "phase": "forward",
                    "modules": [], "shapes": fb["shapes"], "device_type": fb["device_type"],
                    "calls_per_step": round(fb["calls"] / per_step, 3),
                    "bytes_per_step": int(fb["bytes"] / per_step), "dtype_notes": dtype_notes(backend, fb["dtypes"], []),
                    # measured only when the run happened on the target device itself
                    "verified": measured is not None and fb["device_type"] == measured["device_type"],
                    "source": "hal.ops"})
    out.sort(key=lambda o: (_severity(o["status"]), -o["bytes_per_step"], -o["count"], o["op"],
                            PHASE_ORDER.index(o["phase"]) if o["phase"] in PHASE_ORDER else 9))
    return out


def _warned(op: str, warned: dict) -> bool:
    """Whether torch_mlu's fallback warnings name ``op``. The warning prints the operator name as the
    dispatcher does (``aten::nanmedian`` for the default overload, ``aten::nanmedian.dim`` otherwise),
    the spelling of captured ops too; a trailing ``.default`` is dropped."""
    return any((name[: -len(".default")] if name.endswith(".default") else name) == op for name in warned)


def _severity(status: str) -> int:
    return {"unsupported": 0, "fallback": 1, "unknown": 2, "composite": 3, "native": 4}.get(status, 5)
