"""The :class:`MluBackend` class (see the package docstring)."""
from __future__ import annotations

import contextlib
import importlib
from typing import Any, Optional

import torch

from hal.device_backend import TorchDeviceBackend, device_module
from hal.errors import NotSupportedError

#: dtypes every MLU computes natively; bfloat16 and float8 depend on the architecture (see MluBackend.native_dtypes)
_BASE_DTYPES = ("float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool", "complex64")


def mlu_module() -> Any:
    """``torch.mlu`` after ``import torch_mlu`` (raises ImportError naming torch_mlu when absent)."""
    return device_module("mlu", "torch_mlu")


def _manifest():
    from hal.capabilities import load_manifest
    return load_manifest("mlu")


class MluBackend(TorchDeviceBackend):
    """See the package docstring. Raises NotSupportedError for what CNCL/torch_mlu cannot do.

    Devices, memory, streams, events and RNG are :class:`~hal.device_backend.TorchDeviceBackend`'s
    over ``torch.mlu``; what differs is below: dtypes by architecture (from the manifest), autocast,
    the profiler activity, and which HAL ops run natively."""

    name = "mlu"
    device_type = "mlu"
    torch_plugin = "torch_mlu"
    priority = 300
    dist_backend = "cncl"
    profiler_activity = "PrivateUse1"
    device_files = ("/dev/cambricon_dev*", "/dev/cambricon_ctl")
    unsupported_reduce_ops = frozenset({"BAND", "BOR", "BXOR", "PREMUL_SUM"})
    visible_devices_env = "MLU_VISIBLE_DEVICES"

    @classmethod
    def availability_detail(cls) -> str:
        return f"torch_mlu {getattr(importlib.import_module('torch_mlu'), '__version__', '?')}"

    @classmethod
    def versions(cls) -> dict[str, str]:
        v = {"torch": torch.__version__}
        try:
            import torch_mlu
            v["torch_mlu"] = str(getattr(torch_mlu, "__version__", "unknown"))
            for lib in ("cnnl", "cncl", "cnrt"):
                ver = getattr(getattr(torch.version, "mlu", None) or object(), lib, None)
                if ver:
                    v[lib] = str(ver)
        except Exception:
            pass
        return v

    @property
    def _mlu(self) -> Any:
        return self._mod

    # ---- devices: what differs ------------------------------------------------------------------
    def native_dtypes(self, capability: Optional[tuple[int, int]]) -> tuple[str, ...]:
        """bfloat16 from architecture major 5 (MLU500), float8 from 6 (rules from the manifest)."""
        major = capability[0] if capability else 0
        rules = _manifest().dtypes.get("min_arch_major", {"bfloat16": 5, "float8_e4m3fn": 6, "float8_e5m2": 6})
        return _BASE_DTYPES + tuple(d for d, need in sorted(rules.items(), key=lambda kv: kv[1]) if major >= need)

    def downcasts(self) -> dict:
        return dict(_manifest().dtypes.get("downcasts", {}))

    def device_features(self, capability: Optional[tuple[int, int]]) -> tuple[str, ...]:
        return ("tf32",) if capability and capability[0] >= 5 else ()

    def device_extra(self, props: Any) -> dict:
        extra = {k: getattr(props, k) for k in ("isa_version", "multi_processor_count", "cluster_count",
                                                "core_num_per_cluster", "supports_linear_memory") if hasattr(props, k)}
        extra["capability_meaning"] = "MLU architecture generation (not a CUDA SM version)"
        return extra

    # ---- autocast and profiling ----------------------------------------------------------------
    def autocast(self, dtype: torch.dtype = torch.float16, enabled: bool = True):
        """``torch.amp.autocast("mlu", dtype)``; bfloat16 needs architecture major >= 5."""
        if enabled and dtype == torch.bfloat16 and self.device_count() and \
                not self.supports_dtype(torch.bfloat16, self.current_device()):
            raise NotSupportedError("autocast(bfloat16)", self.name,
                                    ["bfloat16 needs MLU architecture major >= 5 (MLU500 series)"])
        return torch.amp.autocast("mlu", dtype=dtype, enabled=enabled)

    def profiler_activities(self) -> list:
        """``[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]`` (torch_mlu's MLU activity)."""
        from torch.profiler import ProfilerActivity
        return [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]

    # ---- data ---------------------------------------------------------------------------------
    @classmethod
    def env_map(cls) -> dict[str, Optional[str]]:
        """CUDA environment variable -> MLU counterpart (None: no equivalent), from the manifest."""
        return _manifest().env_map

    # ---- ops ----------------------------------------------------------------------------------
    def register_ops(self, registry: Any) -> None:
        """Register torch's kernels for the HAL ops whose every reached ATen op is native on the
        MLU (per the manifest, for the dtypes natively computed here); the others are left out so
        :mod:`hal.ops` falls back with the recorded reason."""
        from hal.ops import register_torch_impls
        major = None
        with contextlib.suppress(Exception):
            major = self.device_properties(self.current_device()).capability[0]
        register_torch_impls(registry, "mlu", dtypes=native_dtypes_for_hal_ops(registry, major))


def native_dtypes_for_hal_ops(registry: Any, arch_major: Optional[int]) -> dict[str, set[str]]:
    """``{hal op: dtypes computed natively on the MLU}``, from :func:`hal.capabilities.op_status`.

    A dtype counts when the op's own ATen overload (``OpDef.aten``) has an MLU kernel, or else when
    every ATen op it ``reaches`` has one; an empty set means "not native" (hal.ops falls back).
    float64/complex128 are never native (torch_mlu computes them 32-bit)."""
    from hal.capabilities import op_status
    candidates = _BASE_DTYPES + ("bfloat16", "float8_e4m3fn", "float8_e5m2")
    out: dict[str, set[str]] = {}
    for name in registry.names():
        opdef = registry.get(name)
        allowed: set[str] = set()
        for dt in candidates:
            if op_status("mlu", opdef.aten, (dt,), arch_major).status == "native" or \
                    all(op_status("mlu", op, (dt,), arch_major).status == "native" for op in opdef.reaches):
                allowed.add(dt)
        out[name] = allowed
    return out
