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


def capability_query() -> tuple[Optional[Callable[..., Any]], str]:
    """``(op_status, "")`` or ``(None, reason)`` when the capability API is not installed."""
    try:
        from hal.capabilities import op_status
    except Exception as exc:  # ImportError, or a broken install: degrade, say why
        return None, f"capability query API not installed ({type(exc).__name__}: {exc})"
    return op_status, ""


def _query(query: Optional[Callable[..., Any]], missing: str, backend: str, op: str, dtypes: list[str]) -> dict:
    if query is None:
        return {"status": "unknown", "reason": missing, "dtype_notes": [], "via": None, "hints": []}
    try:
        st = query(backend, op, dtypes=tuple(dtypes))
    except Exception as exc:
        return {"status": "unknown", "reason": f"capability query failed: {type(exc).__name__}: {exc}",
                "dtype_notes": [], "via": None, "hints": []}
    return {"status": st.status, "reason": st.reason, "dtype_notes": list(getattr(st, "dtype_notes", []) or []),
            "via": list(getattr(st, "via", ()) or ()), "hints": list(getattr(st, "hints", ()) or ())}


def dtype_notes(backend: str, dtypes: list[str], existing: list[str]) -> list[str]:
    notes = list(existing)
    if backend == "mlu":
        for dt in dtypes:
            if dt in _64BIT and not any(dt in n for n in notes):
                notes.append(MLU_64BIT_NOTE.format(dt=dt, to=_64BIT[dt]))
    return notes


def build_ops(records: list[dict], backend: str, steps: int, measured: Optional[dict] = None,
              hal_fallbacks: Optional[list[dict]] = None) -> list[dict]:
    """The ``ops`` section. ``measured``: ``{"device_type", "mlu_fallbacks": {op: n}}`` when the
    run happened on the target itself, else None (everything predicted)."""
    query, missing = capability_query()
    per_step = max(int(steps or 0), 1)
    cache: dict[tuple, dict] = {}
    out = []
    for rec in records:
        captured_as = None
        if rec["op"] in HOST_CHOSEN and (measured is None or rec.get("device_type") != measured["device_type"]):
            captured_as = rec["op"]
            rec = dict(rec, op=HOST_CHOSEN[captured_as])
        key = (rec["op"], tuple(rec["dtypes"]))
        st = cache.get(key)
        if st is None:
            st = cache[key] = _query(query, missing, backend, rec["op"], rec["dtypes"])
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
                    "dtype_notes": dtype_notes(backend, rec["dtypes"], st["dtype_notes"]),
                    "verified": verified, "source": "capture", "via": st["via"], "hints": st["hints"]})
        if captured_as:
            out[-1]["captured_as"] = captured_as
            out[-1]["reason"] = (f"captured as {captured_as} (the CPU's choice inside {rec['op']}); on {backend}: "
                                 + str(out[-1]["reason"]))
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
