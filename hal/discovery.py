"""Backend discovery over the ``hal.backends`` entry-point namespace (stevedore).

Contract (docs/writing-a-backend.md, "Discovery"):
- every installed entry point is listed; a plugin that fails to import or to probe is listed with
  its error and never breaks discovery of the others;
- ``HAL_BACKEND=name`` is an explicit choice: only that plugin is loaded and a failure raises
  :class:`~hal.errors.BackendUnavailableError` with the recorded reason;
- otherwise the available backend with the highest ``priority`` is the default;
- when a backend is unavailable but its device files exist, a warning says the hardware looks
  present (JAX's ``_suggest_missing_backends``).

Results are cached per process; :func:`refresh` drops this cache and stevedore's entry-point
cache (needed after installing a plugin into a running process). Thread-safe.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import warnings
from typing import Optional

from stevedore import ExtensionManager

from hal.backend import Availability, Backend
from hal.errors import BackendUnavailableError

NAMESPACE = "hal.backends"
ENV_BACKEND = "HAL_BACKEND"
LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BackendInfo:
    """What discovery found for one entry point.

    ``cls`` is None when the plugin failed to import; ``availability.reason`` then holds the error.
    ``target`` is the entry point's ``module:attr``; ``distribution`` the package that installed it.
    """

    name: str
    cls: Optional[type]
    availability: Availability
    priority: int
    target: str = ""
    distribution: str = ""
    error: str = ""

    @property
    def available(self) -> bool:
        return self.availability.available

    @property
    def reason(self) -> str:
        return self.availability.reason


_lock = threading.RLock()
_cache: Optional[dict[str, BackendInfo]] = None
_instances: dict[str, Backend] = {}


def _describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()


def _probe(name: str, cls: type, target: str, dist: str) -> BackendInfo:
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        err = f"entry point {target} is not a hal.Backend subclass"
        return BackendInfo(name, None, Availability.no(err), 0, target, dist, err)
    try:
        avail = cls.probe()
        if not isinstance(avail, Availability):
            raise TypeError(f"probe() returned {type(avail).__name__}, not Availability")
    except Exception as exc:  # a probe must never raise; if it does, record it
        err = f"probe raised {_describe_error(exc)}"
        return BackendInfo(name, cls, Availability.no(err), getattr(cls, "priority", 0), target, dist, err)
    return BackendInfo(name, cls, avail, cls.priority, target, dist)


def _load_all(names: Optional[list[str]] = None) -> dict[str, BackendInfo]:
    failures: dict[str, BaseException] = {}

    def on_failure(_manager, entrypoint, exc):
        failures[entrypoint.name] = exc
        LOG.debug("hal backend plugin %s failed to load", entrypoint.name, exc_info=exc)

    mgr = ExtensionManager(NAMESPACE, invoke_on_load=False, on_load_failure_callback=on_failure)
    found: dict[str, BackendInfo] = {}
    for ext in mgr.extensions:
        if names is not None and ext.name not in names:
            continue
        target = ext.entry_point.value
        dist = getattr(getattr(ext.entry_point, "dist", None), "name", "") or ""
        found[ext.name] = _probe(ext.name, ext.plugin, target, dist)
    for name, exc in failures.items():
        if names is not None and name not in names:
            continue
        err = f"plugin failed to import: {_describe_error(exc)}"
        found[name] = BackendInfo(name, None, Availability.no(err), 0, error=err)
    return _with_registered(found, names)


def _warn_missing(infos: dict[str, BackendInfo]) -> None:
    for info in infos.values():
        if info.cls is None or info.available:
            continue
        present = info.cls.hardware_present()
        if present:
            warnings.warn(
                f"hardware for backend {info.name!r} looks present ({', '.join(present[:3])}) "
                f"but the backend is unavailable: {info.reason}",
                RuntimeWarning, stacklevel=3)


def list_backends() -> list[BackendInfo]:
    """Every backend entry point installed, best first (available, then priority, then name)."""
    global _cache
    with _lock:
        if _cache is None:
            _cache = _load_all()
            _warn_missing(_cache)
        infos = list(_cache.values())
    return sorted(infos, key=lambda i: (not i.available, -i.priority, i.name))


def backend_errors() -> dict[str, str]:
    """``{name: reason}`` for every backend that is not usable here."""
    return {i.name: i.reason for i in list_backends() if not i.available}


def get_backend(name: Optional[str] = None) -> Backend:
    """The backend instance named ``name`` or, when None, ``$HAL_BACKEND`` or the best available.

    Raises BackendUnavailableError (with the recorded reason) when the named backend is not
    installed or not available. Instances are created once per process and shared.
    """
    explicit = name or os.environ.get(ENV_BACKEND) or None
    with _lock:
        if explicit is not None:
            key = explicit
            if key in _instances:
                return _instances[key]
            infos = _cache if _cache is not None else _load_all([explicit])
            info = infos.get(explicit)
            if info is None:
                installed = ", ".join(sorted(i.name for i in list_backends())) or "none"
                raise BackendUnavailableError(explicit, f"no such backend is installed (installed: {installed})")
            if not info.available or info.cls is None:
                raise BackendUnavailableError(explicit, info.reason)
        else:
            candidates = [i for i in list_backends() if i.available and i.cls is not None]
            if not candidates:
                raise BackendUnavailableError("any", "no backend is available: " + "; ".join(
                    f"{k}: {v}" for k, v in backend_errors().items()))
            info = candidates[0]
            key = info.name
            if key in _instances:
                return _instances[key]
        inst = info.cls()
        _instances[key] = inst
        return inst


def backend_for_device_type(device_type: str) -> Backend:
    """The available backend whose tensors live on ``device_type`` (e.g. "cuda")."""
    for info in list_backends():
        if info.cls is not None and info.cls.device_type == device_type and info.available:
            return get_backend(info.name)
    raise BackendUnavailableError(device_type, "no available backend has this device type: "
                                  + backend_errors().get(device_type, "not installed"))


# ---- in-process registration (tests, notebooks; DeepSpeed's set_accelerator) ----------------------
_registered: dict[str, type] = {}


def _with_registered(found: dict[str, BackendInfo], names: Optional[list[str]]) -> dict[str, BackendInfo]:
    """``found`` with the in-process registrations added (they replace an entry point of the same name)."""
    for name, cls in _registered.items():
        if names is None or name in names:
            found[name] = _probe(name, cls, f"{cls.__module__}:{cls.__qualname__}", "(registered in process)")
    return found


def register_backend(cls: type) -> BackendInfo:
    """Make backend class ``cls`` discoverable in this process under ``cls.name``, without an entry point.

    It is probed now, listed by :func:`list_backends`, returned by :func:`get_backend` and
    :func:`backend_for_device_type` like an installed plugin, replaces an installed plugin of the same
    name, and survives :func:`refresh`. Returns what discovery recorded (an unavailable class is
    registered too, with its probe's reason). Raises TypeError unless ``cls`` is a
    :class:`~hal.backend.Backend` subclass with a ``name``."""
    if not (isinstance(cls, type) and issubclass(cls, Backend)) or not getattr(cls, "name", ""):
        raise TypeError(f"register_backend needs a hal.Backend subclass with a name, not {cls!r}")
    global _cache
    with _lock:
        _registered[cls.name] = cls
        _instances.pop(cls.name, None)
        _cache = None
    return {i.name: i for i in list_backends()}[cls.name]


def unregister_backend(name: str) -> None:
    """Undo :func:`register_backend` for ``name`` (installed plugins of that name come back). No-op if absent."""
    global _cache
    with _lock:
        if _registered.pop(name, None) is not None:
            _instances.pop(name, None)
            _cache = None


def refresh() -> None:
    """Forget discovered backends and stevedore's in-process entry-point cache."""
    global _cache
    with _lock:
        _cache = None
        _instances.clear()
        ExtensionManager.ENTRY_POINT_CACHE.clear()
