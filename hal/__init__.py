"""HAL: a device-agnostic layer for PyTorch workloads (memory, streams/events, collectives, ops).

The façade:

- :func:`list_backends` / :func:`backend_errors` — every installed backend plugin, with the reason
  each unusable one was refused;
- :func:`get_backend` — the backend named, ``$HAL_BACKEND``, or the best available one;
- :func:`register_backend` — add a backend class in process (tests, notebooks), no entry point needed;
- :class:`TorchDeviceBackend` — the generic backend over torch's device module a new chip subclasses;
- :mod:`hal.ops` — ops with torch's semantics dispatched per device with a fallback policy;
- :class:`hal.collectives.Communicator` — collectives on torch.distributed.

The core never imports a vendor SDK; backends do, inside their probe or at first use.
"""
from __future__ import annotations

import importlib
from typing import Any

# torch-free, imported eagerly; everything else is imported on first use (``import hal`` and
# ``hal --help`` cost a fraction of a torch import; see benchmarks/bench_startup.py)
from hal.errors import (BackendUnavailableError, CollectiveError, CollectiveTimeoutError, HalError,
                        NotSupportedError, OpNotFoundError)

#: public name -> the module that defines it (imported by :func:`__getattr__` on first access)
_LAZY = {
    **dict.fromkeys(("Availability", "Backend", "DeviceProperties", "dtype_name"), "hal.backend"),
    **dict.fromkeys(("BackendInfo", "backend_errors", "backend_for_device_type", "get_backend",
                     "list_backends", "refresh", "register_backend", "unregister_backend"), "hal.discovery"),
    "TorchDeviceBackend": "hal.device_backend",
    "MemoryStats": "hal.memory",
    **dict.fromkeys(("Event", "HostEvent", "HostStream", "Stream"), "hal.streams"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hal' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
    "Availability", "Backend", "BackendInfo", "DeviceProperties", "MemoryStats", "Stream", "Event",
    "HostStream", "HostEvent", "HalError", "BackendUnavailableError", "NotSupportedError", "OpNotFoundError",
    "CollectiveError", "CollectiveTimeoutError", "list_backends", "backend_errors", "get_backend",
    "backend_for_device_type", "refresh", "dtype_name", "__version__", "TorchDeviceBackend", "register_backend",
    "unregister_backend",
]
