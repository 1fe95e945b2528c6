"""Backend discovery over the ``hal.backends`` entry-point namespace.

Contract (docs/writing-a-backend.md, "Discovery"):
- every installed entry point is listed; a plugin that fails to import or to probe is listed with
  its reason and never breaks discovery of the others;
- **isolation:** HAL's own backends (entry points of the ``hal-portability`` distribution) are
  imported and probed in this process -- they are our code and stay cheap. Every third-party
  plugin is probed in a short-lived child process bounded by ``$HAL_PROBE_TIMEOUT`` seconds
  (default 10) through :mod:`hal.plugin_probe`, whose results are cached per plugin version and
  environment. A third-party plugin's code runs in this process only when that backend is actually
  requested (:func:`get_backend`, or :attr:`BackendInfo.cls`), and only if its probe said it is
  available; even then ``BaseException`` is caught and what it prints goes to stderr;
- **collisions:** when two distributions register the same name, HAL's own entry point wins,
  otherwise the first in ``sys.path`` order; the loser is not used and the collision is recorded on
  the winner (:attr:`BackendInfo.collisions`, naming both distributions) and logged as a warning;
- ``HAL_BACKEND=name`` is an explicit choice: only that plugin is probed and loaded, and a failure
  raises :class:`~hal.errors.BackendUnavailableError` with the recorded reason;
- otherwise the available backend with the highest ``priority`` is the default;
- when a backend is unavailable but its device files exist, a warning says the hardware looks
  present (JAX's ``_suggest_missing_backends``).

Results are cached per process; :func:`refresh` drops this cache and stevedore's entry-point
cache (needed after installing a plugin into a running process). Thread-safe.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import threading
import warnings
from typing import Any, Optional

from hal.backend import Availability, Backend
from hal.errors import BackendUnavailableError

NAMESPACE = "hal.backends"
ENV_BACKEND = "HAL_BACKEND"
OWN_DISTRIBUTION = "hal-portability"
LOG = logging.getLogger(__name__)


def _describe_error(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split()).rstrip(": ")


class BackendInfo:
    """What discovery found for one backend name.

    ``cls`` is the backend class. For HAL's own backends it is imported during discovery (None when
    that failed; ``reason`` then holds the error). For a third-party plugin it is imported in this
    process on first access, and only when the isolated probe found the plugin available
    (None otherwise, or when the in-process import fails -- ``error`` then says why).
    ``target`` is the entry point's ``module:attr``; ``distribution`` the package that installed it,
    ``version`` that package's version; ``isolated`` is True when the plugin was probed in a child
    process; ``collisions`` names every other distribution that registered the same name.
    """

    def __init__(self, name: str, cls: Optional[type], availability: Availability, priority: int,
                 target: str = "", distribution: str = "", error: str = "", *, device_type: str = "",
                 version: str = "", isolated: bool = False, versions: Optional[dict] = None,
                 devices: Optional[list] = None, hardware: Optional[list] = None, loadable: bool = False,
                 collisions: tuple[str, ...] = ()):
        self.name = name
        self._cls = cls
        self.availability = availability
        self.priority = priority
        self.target = target
        self.distribution = distribution
        self.error = error
        self.device_type = device_type or (getattr(cls, "device_type", "") if cls is not None else "") or name
        self.version = version
        self.isolated = isolated
        self._versions = versions
        self._devices = devices
        self.hardware = list(hardware or [])
        self._loadable = loadable
        self.collisions = tuple(collisions)
        self._load_lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"BackendInfo(name={self.name!r}, available={self.available}, reason={self.reason!r}, "
                f"target={self.target!r}, distribution={self.distribution!r})")

    @property
    def available(self) -> bool:
        return self.availability.available

    @property
    def reason(self) -> str:
        return self.availability.reason

    @property
    def cls(self) -> Optional[type]:
        """The backend class (imports an isolated plugin in this process on first access)."""
        if self._cls is None and self.isolated and self._loadable and self.available:
            with self._load_lock:
                if self._cls is None and self._loadable:
                    self._loadable = False
                    self._cls = _import_in_process(self)
        return self._cls

    def versions(self) -> dict:
        """Library versions the backend reports; never raises, never runs an isolated plugin here."""
        if self._versions is not None:
            return dict(self._versions)
        if self.isolated or self._cls is None:
            return {}
        try:
            return dict(self._cls.versions())
        except Exception as exc:  # versions() must not break a listing
            return {"error": _describe_error(exc)}

    def devices(self) -> list[dict]:
        """Device properties (as dicts) of an available backend; ``[]`` when unavailable; never raises."""
        if not self.available:
            return []
        if self.isolated:
            return list(self._devices or [])
        try:
            return [d.as_dict() for d in get_backend(self.name).devices()]
        except Exception as exc:
            return [{"error": _describe_error(exc)}]


def _import_in_process(info: BackendInfo) -> Optional[type]:
    """Import an isolated plugin's class here; BaseException is caught and recorded in ``info.error``."""
    mod_name, _, attr = info.target.partition(":")
    try:
        with contextlib.redirect_stdout(sys.stderr):
            obj: Any = importlib.import_module(mod_name)
            for part in filter(None, attr.split(".")):
                obj = getattr(obj, part)
    except BaseException as exc:  # a plugin must never end or break the hal process
        if isinstance(exc, KeyboardInterrupt):
            raise
        info.error = f"plugin failed to import in this process: {_describe_error(exc)}"
        LOG.warning("hal backend plugin %s: %s", info.name, info.error)
        return None
    if not (isinstance(obj, type) and issubclass(obj, Backend)):
        info.error = f"entry point {info.target} is not a hal.Backend subclass"
        return None
    return obj


_lock = threading.RLock()
_cache: Optional[dict[str, BackendInfo]] = None
_partial: dict[str, BackendInfo] = {}
_instances: dict[str, Backend] = {}
_entry_points: Optional[list] = None


def _probe(name: str, cls: type, target: str, dist: str, version: str = "") -> BackendInfo:
    """Probe one of HAL's own backend classes in this process (a raising probe is recorded)."""
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        err = f"entry point {target} is not a hal.Backend subclass"
        return BackendInfo(name, None, Availability.no(err), 0, target, dist, err, version=version)
    try:
        avail = cls.probe()
        if not isinstance(avail, Availability):
            raise TypeError(f"probe() returned {type(avail).__name__}, not Availability")
    except Exception as exc:  # a probe must never raise; if it does, record it
        err = f"probe raised {_describe_error(exc)}"
        return BackendInfo(name, cls, Availability.no(err), getattr(cls, "priority", 0), target, dist, err,
                           version=version)
    return BackendInfo(name, cls, avail, cls.priority, target, dist, version=version)


def _all_entry_points() -> list:
    """Every ``hal.backends`` entry point, in ``sys.path`` order, with its distribution."""
    global _entry_points
    if _entry_points is None:
        from importlib import metadata
        _entry_points = list(metadata.entry_points(group=NAMESPACE))
    return _entry_points


def _dist_of(ep) -> tuple[str, str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "", "", ""
    name = (dist.metadata["Name"] if dist.metadata else None) or getattr(dist, "name", "") or ""
    location = str(getattr(dist, "_path", "") or "")
    return name, getattr(dist, "version", "") or "", location


def _is_own(dist_name: str) -> bool:
    return dist_name.replace("_", "-").lower() == OWN_DISTRIBUTION


def _select(names: Optional[list[str]]) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Winning entry point per name, and the collision notes per name."""
    by_name: dict[str, list] = {}
    for ep in _all_entry_points():
        if names is None or ep.name in names:
            by_name.setdefault(ep.name, [])
            if all(e.value != ep.value or _dist_of(e)[0] != _dist_of(ep)[0] for e in by_name[ep.name]):
                by_name[ep.name].append(ep)
    chosen, notes = {}, {}
    for name, eps in by_name.items():
        eps = sorted(eps, key=lambda e: not _is_own(_dist_of(e)[0]))  # stable: sys.path order otherwise
        chosen[name] = eps[0]
        if len(eps) > 1:
            wd, wv, _ = _dist_of(eps[0])
            for loser in eps[1:]:
                ld, lv, _ = _dist_of(loser)
                msg = (f"backend name {name!r} is registered twice: {ld or '?'} {lv} ({loser.value}) is ignored; "
                       f"{wd or '?'} {wv} ({eps[0].value}) is used")
                notes.setdefault(name, []).append(msg)
                LOG.info(msg)
    return chosen, notes


def _load_all(names: Optional[list[str]] = None) -> dict[str, BackendInfo]:
    from hal import plugin_probe
    chosen, notes = _select(names)
    found: dict[str, BackendInfo] = {}
    isolated: dict[str, plugin_probe.PluginSpec] = {}
    for name, ep in chosen.items():
        dist, version, location = _dist_of(ep)
        if _is_own(dist):
            try:
                cls = ep.load()
            except Exception as exc:
                err = f"plugin failed to import: {_describe_error(exc)}"
                LOG.debug("hal backend plugin %s failed to load", name, exc_info=exc)
                found[name] = BackendInfo(name, None, Availability.no(err), 0, ep.value, dist, err, version=version)
                continue
            found[name] = _probe(name, cls, ep.value, dist, version)
        else:
            isolated[name] = plugin_probe.PluginSpec(name, ep.value, dist, version, location)
    if isolated:
        records = plugin_probe.probe_plugins(list(isolated.values()))
        for name, spec in isolated.items():
            rec = records[spec]
            avail = Availability.ok(rec.reason) if rec.available else Availability.no(rec.reason)
            found[name] = BackendInfo(name, None, avail, rec.priority, spec.target, spec.distribution,
                                      "" if rec.available else rec.reason, device_type=rec.device_type,
                                      version=spec.version, isolated=True, versions=rec.versions,
                                      devices=rec.devices, hardware=rec.hardware, loadable=rec.loaded)
    for name, msgs in notes.items():
        if name in found:
            found[name].collisions = tuple(msgs)
    return _with_registered(found, names)


def _warn_missing(infos: dict[str, BackendInfo]) -> None:
    for info in infos.values():
        if info.available:
            continue
        if info.isolated:
            present = info.hardware
        elif info.cls is not None:
            present = info.cls.hardware_present()
        else:
            continue
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
            _partial.clear()
            _warn_missing(_cache)
        infos = list(_cache.values())
    return sorted(infos, key=lambda i: (not i.available, -i.priority, i.name))


def installed_names() -> list[str]:
    """The names of every installed backend entry point (nothing is imported or probed)."""
    return sorted({ep.name for ep in _all_entry_points()})


def find_backend(name: str) -> Optional[BackendInfo]:
    """The :class:`BackendInfo` for ``name`` probing only that plugin, or None when not installed."""
    with _lock:
        if _cache is not None:
            return _cache.get(name)
        if name not in _partial:
            _partial.update(_load_all([name]))
        return _partial.get(name)


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
            info = find_backend(explicit)
            if info is None:
                installed = ", ".join(installed_names()) or "none"
                raise BackendUnavailableError(explicit, f"no such backend is installed (installed: {installed})")
            if not info.available:
                raise BackendUnavailableError(explicit, info.reason)
        else:
            candidates = [i for i in list_backends() if i.available]
            if not candidates:
                raise BackendUnavailableError("any", "no backend is available: " + "; ".join(
                    f"{k}: {v}" for k, v in backend_errors().items()))
            info = candidates[0]
            key = info.name
            if key in _instances:
                return _instances[key]
        cls = info.cls
        if cls is None:
            raise BackendUnavailableError(key, info.error or info.reason)
        try:
            with contextlib.redirect_stdout(sys.stderr):
                inst = cls()
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise BackendUnavailableError(key, f"backend failed to start: {_describe_error(exc)}") from None
        _instances[key] = inst
        return inst


def backend_for_device_type(device_type: str) -> Backend:
    """The available backend whose tensors live on ``device_type`` (e.g. "cuda")."""
    for info in list_backends():
        if info.device_type == device_type and info.available and info.cls is not None:
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
        _partial.pop(cls.name, None)
        _cache = None
    return {i.name: i for i in list_backends()}[cls.name]


def unregister_backend(name: str) -> None:
    """Undo :func:`register_backend` for ``name`` (installed plugins of that name come back). No-op if absent."""
    global _cache
    with _lock:
        if _registered.pop(name, None) is not None:
            _instances.pop(name, None)
            _partial.pop(name, None)
            _cache = None


def refresh() -> None:
    """Forget discovered backends and every entry-point cache (stevedore's and importlib's)."""
    global _cache, _entry_points
    with _lock:
        _cache = None
        _entry_points = None
        _partial.clear()
        _instances.clear()
        importlib.invalidate_caches()
        try:
            from stevedore import ExtensionManager
            ExtensionManager.ENTRY_POINT_CACHE.clear()
        except ImportError:  # pragma: no cover - stevedore is a dependency
            pass
