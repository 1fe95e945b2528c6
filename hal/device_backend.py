"""A generic backend over torch's per-device module: a new chip is a probe plus data.

:class:`TorchDeviceBackend` implements devices, memory statistics, streams, events and RNG once,
over the module ``torch.get_device_module(device_type)`` names (``torch.cuda``, ``torch.mlu``, ...; every module that
mirrors ``torch.cuda``'s API) and, where the running torch has it (torch >= 2.6), ``torch.accelerator``
for the current device and synchronisation. A device family subclasses it and sets class data::

    class MyChipBackend(TorchDeviceBackend):
        name = device_type = "mychip"
        torch_plugin = "torch_mychip"       # imported by the probe and at first use; None for built-ins
        priority = 250
        dist_backend = "mccl"
        visible_devices_env = "MYCHIP_VISIBLE_DEVICES"

and overrides only what really differs (dtype rules, allocation, ops). The probe imports
``torch_plugin`` and asks the device module ``is_available()`` / ``device_count()``: it never creates
a device context. Nothing here imports a vendor SDK at module import.

Thread-safety: stateless apart from torch's own per-thread current device and stream.
"""
from __future__ import annotations

import importlib
from typing import Any, ClassVar, Optional

import torch

from hal.backend import Availability, Backend, DeviceProperties
from hal.errors import NotSupportedError
from hal.memory import MemoryStats
from hal.streams import TorchEvent, TorchStream

#: dtypes a torch device module computes natively unless a backend says otherwise
DEFAULT_DEVICE_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
                         "bool", "complex64", "complex128")


def device_module(device_type: str, plugin: Optional[str] = None) -> Any:
    """``torch.<device_type>`` after importing ``plugin`` (raises ImportError naming what is missing).

    This is the module ``torch.get_device_module(device_type)`` returns, read as the attribute that
    function reads: ``get_device_module`` is ``functools.cache``d (it would pin a module replaced in
    process, such as a contract test's stand-in) and parses ``torch.device(device_type)``, which
    rejects a PrivateUse1 device whose plugin has not renamed it yet."""
    if plugin:
        importlib.import_module(plugin)
    mod = getattr(torch, device_type, None)
    if mod is None:
        raise ImportError(f"torch has no device module torch.{device_type}"
                          + (f" after importing {plugin} (the plugin does not match this torch?)" if plugin else ""))
    return mod


def _accelerator(device_type: str) -> Any:
    """``torch.accelerator`` when this torch has it and its current accelerator is ``device_type``."""
    acc = getattr(torch, "accelerator", None)
    if acc is None or not hasattr(acc, "current_accelerator"):
        return None
    try:
        cur = acc.current_accelerator()
    except Exception:
        return None
    return acc if cur is not None and cur.type == device_type else None


class TorchDeviceBackend(Backend):
    """Everything a device needs over torch's device module; subclasses add a probe's data and what differs.

    Hooks a subclass may override: :meth:`native_dtypes` (dtypes for a capability), :meth:`device_features`,
    :meth:`device_extra`, :meth:`device_peaks` (with provenance) and :meth:`availability_detail`."""

    #: a module to import before ``torch.<device_type>`` exists ("torch_mlu"); None for torch's own devices
    torch_plugin: ClassVar[Optional[str]] = None

    # ---- discovery ------------------------------------------------------------------------------
    @classmethod
    def module(cls) -> Any:
        """The torch device module (``torch.cuda``, ``torch.mlu``); raises ImportError when absent."""
        return device_module(cls.device_type, cls.torch_plugin)

    @classmethod
    def probe(cls) -> Availability:
        """Import the plugin, ask ``is_available()`` and ``device_count()``; never raises, no context."""
        if cls.torch_plugin:
            try:
                importlib.import_module(cls.torch_plugin)
            except Exception as exc:
                return Availability.no(f"{cls.torch_plugin} is not importable ({type(exc).__name__}: {exc})")
        try:
            mod = cls.module()
        except ImportError as exc:
            return Availability.no(str(exc))
        try:
            if not bool(mod.is_available()):
                hint = f" (check the driver and ${cls.visible_devices_env})" if cls.visible_devices_env else ""
                return Availability.no(f"torch.{cls.device_type}.is_available() is False "
                                       f"(torch {torch.__version__}){hint}")
            count = int(mod.device_count())
        except Exception as exc:
            return Availability.no(f"torch.{cls.device_type} raised {type(exc).__name__}: {exc}")
        if count < 1:
            return Availability.no(f"torch.{cls.device_type} reports no device")
        detail = cls.availability_detail()
        return Availability.ok(f"{count} {cls.name.upper()} device(s), torch {torch.__version__}"
                               + (f"; {detail}" if detail else ""))

    @classmethod
    def availability_detail(cls) -> str:
        """Extra words for the probe's reason (e.g. which optional kernels are missing and why)."""
        return ""

    @property
    def _mod(self) -> Any:
        return self.module()

    # ---- devices ----------------------------------------------------------------------------------
    def device_count(self) -> int:
        return int(self._mod.device_count())

    def current_device(self) -> int:
        acc = _accelerator(self.device_type)
        if acc is not None and hasattr(acc, "current_device_index"):
            return int(acc.current_device_index())
        return int(self._mod.current_device())

    def set_device(self, index: int) -> None:
        count = self.device_count()
        if not 0 <= int(index) < count:
            raise NotSupportedError(f"device index {index}", self.name, [f"{count} device(s) visible"])
        self._mod.set_device(int(index))

    def synchronize(self, device: Any = None) -> None:
        self._mod.synchronize(self._index(device))

    def native_dtypes(self, capability: Optional[tuple[int, int]]) -> tuple[str, ...]:
        """Dtypes computed natively by a device of ``capability`` (default: torch's usual set)."""
        return DEFAULT_DEVICE_DTYPES

    def device_features(self, capability: Optional[tuple[int, int]]) -> tuple[str, ...]:
        return ()

    def device_extra(self, props: Any) -> dict:
        return {k: getattr(props, k) for k in ("multi_processor_count",) if hasattr(props, k)}

    def device_peaks(self, index: int, props: Any) -> tuple[dict, str]:
        """``(peaks, provenance)`` for rooflines; default: none known."""
        return {}, "no published or measured peaks for this device"

    def downcasts(self) -> dict:
        return {}

    def device_properties(self, index: int = 0) -> DeviceProperties:
        count = self.device_count()
        if not 0 <= int(index) < count:
            raise IndexError(f"{self.name} has {count} device(s); no device {index}")
        p = self._mod.get_device_properties(int(index))
        cap = (int(p.major), int(p.minor)) if hasattr(p, "major") else None
        peaks, source = self.device_peaks(int(index), p)
        return DeviceProperties(index=int(index), name=str(p.name), total_memory=int(p.total_memory),
                                capability=cap, dtypes=tuple(self.native_dtypes(cap)), downcasts=self.downcasts(),
                                features=tuple(self.device_features(cap)), peaks=peaks, peaks_source=source,
                                extra=self.device_extra(p))

    # ---- memory -----------------------------------------------------------------------------------
    def memory_stats(self, device: Any = None) -> MemoryStats:
        m, idx = self._mod, self._index(device)
        free, total = m.mem_get_info(idx)
        peak_reserved = int(m.max_memory_reserved(idx)) if hasattr(m, "max_memory_reserved") else None
        return MemoryStats(allocated=int(m.memory_allocated(idx)), reserved=int(m.memory_reserved(idx)),
                           peak=int(m.max_memory_allocated(idx)), total=int(total), free=int(free),
                           peak_reserved=peak_reserved,
                           source=f"torch.{self.device_type} caching allocator (memory_allocated/memory_reserved/"
                                  "max_memory_allocated/mem_get_info)")

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self._mod.reset_peak_memory_stats(self._index(device))

    def empty_cache(self) -> None:
        self._mod.empty_cache()

    # ---- streams and events -----------------------------------------------------------------------
    def create_stream(self, device: Any = None, priority: int = 0) -> TorchStream:
        m = self._mod
        return TorchStream(m.Stream(device=self._index(device), priority=priority), m)

    def current_stream(self, device: Any = None) -> TorchStream:
        m = self._mod
        return TorchStream(m.current_stream(self._index(device)), m)

    def create_event(self, enable_timing: bool = False) -> TorchEvent:
        return TorchEvent(self._mod.Event(enable_timing=enable_timing))

    # ---- RNG --------------------------------------------------------------------------------------
    def manual_seed(self, seed: int, device: Any = None) -> None:
        m = self._mod
        with m.device(self._index(device)):
            m.manual_seed(int(seed))

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return self._mod.get_rng_state(self._index(device))

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        self._mod.set_rng_state(state, self._index(device))


__all__ = ["TorchDeviceBackend", "device_module", "DEFAULT_DEVICE_DTYPES"]
