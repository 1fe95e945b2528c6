"""Which float32 ops a device computes in TensorFloat-32, from its manifest's ``tf32_defaults``.

TF32 keeps float32's range with a 10-bit mantissa: a float32 convolution or matmul that runs in it rounds its inputs
to float16's precision inside the kernel and accumulates in float32. Whether it does is a backend fact (CUDA from
compute capability 8.0: convolutions by default, ``torch.backends.cudnn.allow_tf32``; matmuls when
``torch.backends.cuda.matmul.allow_tf32`` is set, as ``torch.set_float32_matmul_precision("high")`` does; the MLU:
convolutions by default, ``torch.backends.cnnl.allow_tf32``), kept as data in the manifest: which op families, which
flag switches each, the first architecture that has it. The flags are read when asked (programs set them at any
time), the manifest and the device's architecture once per device.

Pure lookups; thread-safe (the caches are ``functools.lru_cache``). Nothing here raises for an unknown device type,
a missing manifest or a flag the installed torch lacks: no rule means no TF32.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

#: ATen op packet names whose float32 math a TF32 switch covers, by the manifest's ``tf32_defaults`` key.
TF32_OPS = {
    "conv": frozenset({"convolution", "convolution_backward", "_convolution", "conv1d", "conv2d", "conv3d",
                       "cudnn_convolution", "cudnn_convolution_transpose", "conv_transpose1d", "conv_transpose2d",
                       "conv_transpose3d"}),
    "matmul": frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addbmm", "_addmm_activation"}),
}
_FAMILY = {op: family for family, ops in TF32_OPS.items() for op in ops}


def tf32_family(op: str) -> Optional[str]:
    """``"conv"`` or ``"matmul"`` for an ATen op packet name (``"mm"``; an ``aten::`` prefix is dropped) a TF32
    switch covers, else None."""
    return _FAMILY.get(op[6:] if op.startswith("aten::") else op)


@functools.lru_cache(maxsize=None)
def tf32_rule(device_type: str) -> Optional[dict]:
    """The manifest's ``tf32_defaults`` of a device type (``"cuda"``, ``"mlu"``), None when it has none. Shared:
    read it, never change it."""
    if device_type in ("cpu", "meta"):  # no shipped manifest (the CPU's is built from the dispatcher, seconds); no rule
        return None
    try:
        from hal.capabilities.manifest import load_manifest
        return load_manifest(device_type).tf32_defaults or None
    except Exception:  # no manifest (an unknown type), or an unreadable one: no TF32 rule
        return None


def arch_gate(device_type: str, arch: Optional[int]) -> str:
    """The phrase a TF32 prediction for ``device_type`` adds when its rule holds only from an architecture on:
    ``" from architecture N"``, and ``" (architecture not given)"`` after it when ``arch`` is None; '' for a rule
    without a gate (or no rule)."""
    need = (tf32_rule(device_type) or {}).get("arch_min_major")
    if need is None:
        return ""
    return f" from architecture {need}" + ("" if arch is not None else " (architecture not given)")


@functools.lru_cache(maxsize=None)
def _arch_major(device: torch.device) -> Optional[int]:
    module = getattr(torch, device.type, None)
    try:
        return int(module.get_device_capability(device)[0])
    except Exception:  # no device module, or no capability query: the architecture is unknown
        return None


def _flag_value(path: str) -> Optional[bool]:
    """The value of a dotted ``torch.`` flag (``torch.backends.cudnn.allow_tf32``), None when this torch lacks it."""
    head, _, rest = path.partition(".")
    if head != "torch":
        return None
    obj = torch
    try:
        for part in rest.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        return None
    return bool(obj) if isinstance(obj, bool) else None


def tf32_switch(device: torch.device, op: str) -> Optional[str]:
    """Why ``op``'s float32 math runs in TF32 on ``device`` now: the flag that is on (``"torch.backends.cudnn.
    allow_tf32"``), or ``"<type> default"`` where the manifest names none. None when it does not: an op outside the
    TF32 families, a device type without a rule, an architecture before the rule's first, or the flag off."""
    family = tf32_family(op)
    if family is None:
        return None
    rule = tf32_rule(device.type)
    if not rule:
        return None
    need = rule.get("arch_min_major")
    if need is not None:
        major = _arch_major(device)
        if major is None or major < need:
            return None
    flag = (rule.get("flags") or {}).get(family)
    value = _flag_value(flag) if flag else None
    on = bool(rule.get(family, False)) if value is None else value
    return (flag or f"{device.type} default") if on else None


def default_switch(backend: str, op: str, arch: Optional[int] = None) -> Optional[str]:
    """The flag under which ``op``'s float32 math runs in TF32 on ``backend`` *by default* (its manifest, not the flags
    of this process: a prediction for a device that is not here), None when it does not: no TF32 family, no rule,
    off by default, or ``arch`` (when given) before the rule's first architecture."""
    family = tf32_family(op)
    rule = tf32_rule(backend) if family is not None else None
    if not rule or not rule.get(family):
        return None
    need = rule.get("arch_min_major")
    if arch is not None and need is not None and arch < need:
        return None
    return (rule.get("flags") or {}).get(family) or f"{backend} default"
