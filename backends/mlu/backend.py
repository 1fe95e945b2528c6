"""The :class:`MluBackend` class (see the package docstring)."""
from __future__ import annotations

import contextlib
import importlib
from typing import Any, Optional

import torch

from hal.backend import Availability, Backend, DeviceProperties
from hal.errors import NotSupportedError
from hal.memory import MemoryStats
from hal.streams import TorchEvent, TorchStream

#: dtypes every MLU computes natively; bfloat16 and float8 depend on the architecture (see _dtypes)
_BASE_DTYPES = ("float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool", "complex64")


def mlu_module() -> Any:
    """``torch.mlu`` after ``import torch_mlu`` (raises ImportError naming torch_mlu when absent)."""
    importlib.import_module("torch_mlu")
    mod = getattr(torch, "mlu", None)
    if mod is None:
        raise ImportError("torch_mlu was imported but did not register torch.mlu")
    return mod


def _manifest():
    from hal.capabilities import load_manifest
    return load_manifest("mlu")


class MluBackend(Backend):
    """See the package docstring. Raises NotSupportedError for what CNCL/torch_mlu cannot do."""

    name = "mlu"
    device_type = "mlu"
    priority = 300
    dist_backend = "cncl"
    profiler_activity = "PrivateUse1"
    device_files = ("/dev/cambricon_dev*", "/dev/cambricon_ctl")
    unsupported_reduce_ops = frozenset({"BAND", "BOR", "BXOR", "PREMUL_SUM"})

    # ---- discovery ----------------------------------------------------------------------------
    @classmethod
    def probe(cls) -> Availability:
        try:
            import torch_mlu  # noqa: F401
        except Exception as exc:
            return Availability.no(f"torch_mlu is not importable ({type(exc).__name__}: {exc})")
        mod = getattr(torch, "mlu", None)
        if mod is None:
            return Availability.no("torch_mlu imported but torch.mlu is missing (torch_mlu does not match this torch)")
        try:
            ok = bool(mod.is_available())
        except Exception as exc:
            return Availability.no(f"torch.mlu.is_available() raised {type(exc).__name__}: {exc}")
        if not ok:
            return Availability.no("torch_mlu is installed but torch.mlu.is_available() is False "
                                   "(no visible MLU: check the driver, MLU_VISIBLE_DEVICES / CN_VISIBLE_DEVICES)")
        try:
            n = int(mod.device_count())
        except Exception:
            n = 0
        return Availability.ok(f"torch_mlu {getattr(importlib.import_module('torch_mlu'), '__version__', '?')}, "
                               f"{n} MLU device(s)")

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
        return mlu_module()

    # ---- devices ------------------------------------------------------------------------------
    def device_count(self) -> int:
        return int(self._mlu.device_count())

    def current_device(self) -> int:
        return int(self._mlu.current_device())

    def set_device(self, index: int) -> None:
        if not 0 <= index < self.device_count():
            raise NotSupportedError(f"device index {index}", self.name, [f"{self.device_count()} MLU(s) visible"])
        self._mlu.set_device(index)

    def synchronize(self, device: Any = None) -> None:
        self._mlu.synchronize(self._index(device))

    def _index(self, device: Any) -> int:
        if device is None:
            return self.current_device()
        if isinstance(device, torch.device):
            return device.index if device.index is not None else self.current_device()
        return int(device)

    @staticmethod
    def _dtypes(major: int) -> tuple[str, ...]:
        """Natively computed dtypes for architecture ``major``: bfloat16 from 5 (MLU500), float8 from 6."""
        rules = _manifest().dtypes.get("min_arch_major", {"bfloat16": 5, "float8_e4m3fn": 6, "float8_e5m2": 6})
        return _BASE_DTYPES + tuple(d for d, need in sorted(rules.items(), key=lambda kv: kv[1]) if major >= need)

    def device_properties(self, index: int = 0) -> DeviceProperties:
        count = self.device_count()
        if not 0 <= index < count:
            raise IndexError(f"MLU index {index} out of range ({count} device(s))")
        p = self._mlu.get_device_properties(index)
        major, minor = int(p.major), int(p.minor)
        extra = {k: getattr(p, k) for k in ("isa_version", "multi_processor_count", "cluster_count",
                                            "core_num_per_cluster", "supports_linear_memory") if hasattr(p, k)}
        extra["capability_meaning"] = "MLU architecture generation (not a CUDA SM version)"
        features = ["tf32"] if major >= 5 else []
        return DeviceProperties(
            index=index, name=str(p.name), total_memory=int(p.total_memory), capability=(major, minor),
            dtypes=self._dtypes(major), downcasts=dict(_manifest().dtypes.get("downcasts", {})),
            features=tuple(features), extra=extra)

    def supports_dtype(self, dtype: torch.dtype, device: Any = None) -> bool:
        return super().supports_dtype(dtype, None if device is None else self._index(device))

    # ---- memory -------------------------------------------------------------------------------
    def memory_stats(self, device: Any = None) -> MemoryStats:
        m, idx = self._mlu, self._index(device)
        free, total = m.mem_get_info(idx)
        return MemoryStats(allocated=int(m.memory_allocated(idx)), reserved=int(m.memory_reserved(idx)),
                           peak=int(m.max_memory_allocated(idx)), total=int(total), free=int(free),
                           source="torch.mlu caching allocator (memory_allocated/memory_reserved/"
                                  "max_memory_allocated/mem_get_info)")

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self._mlu.reset_peak_memory_stats(self._index(device))

    def empty_cache(self) -> None:
        self._mlu.empty_cache()

    # ---- streams and events -------------------------------------------------------------------
    def create_stream(self, device: Any = None, priority: int = 0) -> TorchStream:
        m = self._mlu
        return TorchStream(m.Stream(device=self._index(device), priority=priority), m)

    def current_stream(self, device: Any = None) -> TorchStream:
        m = self._mlu
        return TorchStream(m.current_stream(self._index(device)), m)

    def create_event(self, enable_timing: bool = False) -> TorchEvent:
        return TorchEvent(self._mlu.Event(enable_timing=enable_timing))

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
