"""Turn captured op records into the audit's ``ops`` section: status on the target, dtype risks, cost.

Status comes from the capability query API (:func:`hal.capabilities.op_status`): native |
composite | fallback | unsupported | unknown, with its reason. When that API is not installed every
op is ``unknown`` with the reason saying so. Measured facts override predictions, and only those are
``verified``:

- on a present target, ops that ran on the target's tensors ran there (verified): ``native`` when
  the device's dispatch key has a kernel for the op, ``composite`` when PyTorch's composite kernel
  ran it (:func:`measured_status`: the words a prediction uses), unless torch_mlu's warning said it
  fell back (``fallback``, verified) -- the warning
  counts only when the run device is an MLU; a run on any other device never yields a verified
  MLU fallback;
- ``hal.ops`` fallbacks that ran (from :func:`hal.ops.fallback_log`) are ``fallback``, verified.

Cost of a fallback: ``calls_per_step = count / steps`` and ``bytes_per_step`` = the bytes of every
input and output tensor per step (inputs go to the host, outputs come back).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from hal.capabilities.tf32 import arch_gate, default_switch, tf32_family

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


_CELLS = {"gru": ("aten::_thnn_fused_gru_cell", "aten::_thnn_fused_gru_cell_backward"),
          "lstm": ("aten::_thnn_fused_lstm_cell", "aten::_thnn_fused_lstm_cell_backward_impl")}
_SIMPLE = {"rnn_tanh": ("aten::tanh", "aten::tanh_backward"), "rnn_relu": ("aten::relu", "aten::threshold_backward")}


def rnn_target_ops(backend: str, call: str, cudnn: bool = True, dtype: str = "float32") -> dict:
    """What ``backend`` dispatches for one recurrent call ``call`` (``aten::gru.input``,
    ``aten::lstm.data``, ``aten::rnn_tanh.input``, ...), which a CPU run decomposes into per-step
    linear/sigmoid/tanh ops (or ``mkldnn_rnn_layer`` for LSTM). Returns ``{"forward": [(op, per)],
    "backward": [(op, per)], "dropout_init": [op], "why": str}``: ``per`` = 0 for once per call, else
    that many per time step, layer and direction. From PyTorch's RNN.cpp (2.4 to 2.11) and cudnn/RNN.cpp;
    the CUDA sets were checked on an H200 (torch 2.11.0+cu130, cuDNN 9.19, reports/fidelity/README.md):

    - cuda with cuDNN enabled (float16/bfloat16/float32/float64): ``_cudnn_rnn`` once per call (its
      weight buffer is viewed through ``empty`` + ``set_.source_Storage``), ``_cudnn_rnn_backward``;
      train-mode dropout initialises cuDNN's dropout state once (``_cudnn_init_dropout_state``);
    - mlu LSTM: torch_mlu registers ``aten::lstm.input``/``lstm.data`` and runs them as ``_cudnn_rnn``
      (CNNL), backward ``_cudnn_rnn_backward``;
    - otherwise (mlu GRU/RNN: torch_mlu registers no ``gru.input``/``rnn_*``; cuda with cuDNN off):
      PyTorch's composite runs on the device's tensors step by step: GRU/LSTM as matmul (``mm``) +
      ``_thnn_fused_gru_cell``/``_thnn_fused_lstm_cell`` (the branch for CUDA, XPU and PrivateUse1
      tensors), vanilla RNN as ``addmm`` + ``add_`` + ``tanh``/``relu``."""
    kind = call.split("::", 1)[-1].split(".", 1)[0]
    if backend == "cuda" and cudnn and dtype in ("float16", "bfloat16", "float32", "float64"):
        return {"forward": [("aten::_cudnn_rnn", 0), ("aten::empty.memory_format", 0),
                            ("aten::set_.source_Storage", 0)],
                "backward": [("aten::_cudnn_rnn_backward", 0)],
                "dropout_init": ["aten::_cudnn_init_dropout_state", "aten::random_", "aten::_local_scalar_dense"],
                "why": "cuDNN runs the whole call as one _cudnn_rnn (backward _cudnn_rnn_backward)"}
    if backend == "mlu" and kind == "lstm":
        return {"forward": [("aten::_cudnn_rnn", 0)], "backward": [("aten::_cudnn_rnn_backward", 0)],
                "why": f"torch_mlu registers aten::lstm.input and aten::lstm.data and runs {call} as _cudnn_rnn (CNNL)"}
    who = ("torch_mlu registers no " + call if backend == "mlu" else
           "cuDNN is disabled" if backend == "cuda" else f"no {call} kernel is known for {backend}")
    if kind in _CELLS:
        cell, cell_bw = _CELLS[kind]
        return {"forward": [(cell, 1), ("aten::mm", 2), ("aten::t", 2), ("aten::unbind.int", 0), ("aten::stack", 0)],
                "backward": [(cell_bw, 1), ("aten::mm", 2), ("aten::t", 2)],
                "why": f"{who}: PyTorch's composite runs it on the device's tensors step by step as matmul + "
                       f"{cell.split('::')[1]}"}
    act, act_bw = _SIMPLE.get(kind, _SIMPLE["rnn_tanh"])
    return {"forward": [("aten::addmm", 2), ("aten::t", 2), ("aten::add_.Tensor", 1), (act, 1),
                        ("aten::unbind.int", 0), ("aten::stack", 0)],
            "backward": [(act_bw, 1), ("aten::mm", 2), ("aten::t", 2), ("aten::sum.dim_IntList", 2)],
            "why": f"{who}: PyTorch's composite runs it on the device's tensors step by step as addmm + add_ + "
                   f"{act.split('::')[1]}"}


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


def precision_notes(backend: str, op: str, dtypes: list[str], arch: Optional[int] = None) -> list[str]:
    """Predicted precision notes from ``backend``'s manifest (never a measurement): float32 ops that
    run in TF32 by default there (``tf32_defaults``: conv and/or matmul, only from architecture
    ``arch_min_major`` on)."""
    flag = default_switch(backend, op, arch) if "float32" in dtypes else None
    if flag is None:
        return []
    return [f"float32 {tf32_family(op)} runs in TF32 by default on {backend}{arch_gate(backend, arch)} ({flag}=True): precision "
            "like cuDNN's TF32 convolutions (predicted, not measured)"]


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
        captured_as, why = rec.get("captured_as"), rec.get("why", "")
        if captured_as is None and (measured is None or rec.get("device_type") != measured["device_type"]):
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
                status, reason = measured_status(rec["op"], measured["device_type"])
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


#: The dispatch key of each device type's own kernels (out-of-tree devices such as torch_mlu's MLU
#: register theirs under PrivateUse1).
DISPATCH_KEYS = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "mps": "MPS", "hpu": "HPU", "meta": "Meta",
                 "lazy": "Lazy", "ipu": "IPU", "mtia": "MTIA"}


def measured_status(op: str, device_type: str) -> tuple[str, str]:
    """``(status, reason)`` of ``op`` that ran on a present ``device_type`` (verified), in the words
    of a prediction: ``native`` when the running torch's dispatcher has a kernel registered for the
    device's dispatch key (:data:`DISPATCH_KEYS`), ``composite`` when it ran through a
    CompositeExplicitAutograd[NonFunctional] / CompositeImplicitAutograd kernel (an op that PyTorch
    implements for every backend in other ops), else ``native`` with the reason saying that neither
    is registered (a fallthrough or the key's backend fallback ran it), and ``native`` when the key
    has no backend loaded at all (no ``empty`` kernel: a stand-in device). From
    ``torch._C._dispatch_has_kernel_for_dispatch_key`` in the dispatcher's precedence
    (:func:`hal.capabilities.trace.kernel_kind`)."""
    key = DISPATCH_KEYS.get(device_type, "PrivateUse1")
    if _kernel_kind("aten::empty.memory_format", key) != "kernel":
        # every real backend registers empty: a key without it has no backend loaded in this process
        # (a stand-in device), so the dispatcher cannot say which kernel ran on the device
        return "native", f"ran on {device_type} (measured); no {key} kernels are registered in this process"
    kind = _kernel_kind(op, key)
    if kind == "kernel":
        return "native", f"ran on {device_type} (measured): a {key} kernel is registered for {op}"
    if kind in ("cea", "cia"):
        which = "CompositeImplicitAutograd" if kind == "cia" else "CompositeExplicitAutograd"
        return "composite", f"ran on {device_type} (measured) through PyTorch's {which} kernel of {op}"
    return "native", (f"ran on {device_type} (measured); the dispatcher has no {key} or composite kernel "
                      f"registered for {op} (a fallthrough or the {key} fallback ran it)")


_KINDS: dict[tuple[str, str], str] = {}


def _kernel_kind(op: str, key: str) -> str:
    kind = _KINDS.get((op, key))
    if kind is None:
        try:
            from hal.capabilities.trace import kernel_kind
            kind = kernel_kind(op, key)
        except Exception:  # an op name the dispatcher rejects: no kernel known
            kind = "-"
        _KINDS[(op, key)] = kind
    return kind


def _warned(op: str, warned: dict) -> bool:
    """Whether torch_mlu's fallback warnings name ``op``. The warning prints the operator name as the
    dispatcher does (``aten::nanmedian`` for the default overload, ``aten::nanmedian.dim`` otherwise),
    the spelling of captured ops too; a trailing ``.default`` is dropped."""
    return any((name[: -len(".default")] if name.endswith(".default") else name) == op for name in warned)


def _severity(status: str) -> int:
    return {"unsupported": 0, "fallback": 1, "unknown": 2, "composite": 3, "native": 4}.get(status, 5)
