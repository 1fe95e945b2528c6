"""Probe third-party backend plugins in short-lived, bounded subprocesses, with a result cache.

Contract:
- :func:`probe_plugins` runs one child process per plugin (``python -m hal.plugin_probe``), all at
  once, and returns one :class:`ProbeRecord` per plugin; it never raises for anything a plugin does.
  A child may import the plugin, call ``probe()``, ``versions()``, ``hardware_present()`` and, when
  available, ``devices()`` -- nothing else of the plugin ever runs in the caller's process.
- The bound applies to plugin code: each child has ``timeout`` seconds from the moment it has
  imported ``hal`` (and torch) until it has answered; start-up itself gets a fixed allowance of
  :data:`STARTUP_ALLOWANCE_S`. A child past its bound is killed with its whole process group.
- What a plugin prints (stdout or stderr, Python or C level) goes into the child's files and from
  there to this module's logger at DEBUG level -- never to the caller's stdout. A plugin that writes
  to stdout while imported or probed is listed unavailable ("plugin wrote to stdout while imported
  or probed ..."): loaded in-process it would corrupt the output of ``--format json``.
- Outcomes become reasons: ``plugin import timed out after 10 s``, ``probe timed out after 10 s``,
  ``probe exited the process with code 1``, ``probe was killed by signal SIGSEGV``,
  ``probe raised SystemExit: 3``, ``plugin failed to import: ImportError: ...``.
- Results (all outcomes, failures included) are cached in ``$HAL_CACHE_DIR`` (default
  ``$XDG_CACHE_HOME/hal`` or ``~/.cache/hal``), keyed by the plugin's distribution and version, its
  entry point, the Python executable and version, the installed torch version and the environment
  variables that change what a probe sees (:data:`KEY_ENV`), for :data:`CACHE_TTL_S` seconds
  (``$HAL_PROBE_CACHE_TTL``; ``0`` disables the cache). An unwritable cache folder is ignored.
- The timeout is ``$HAL_PROBE_TIMEOUT`` seconds (default 10); a value that is not a finite positive
  number is ignored with a warning on the logger.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

LOG = logging.getLogger("hal.discovery")

DEFAULT_TIMEOUT_S = 10.0
STARTUP_ALLOWANCE_S = 60.0
CACHE_TTL_S = 3600.0
ENV_TIMEOUT = "HAL_PROBE_TIMEOUT"
ENV_TTL = "HAL_PROBE_CACHE_TTL"
CACHE_VERSION = 1
#: environment variables that can change a probe's answer (device visibility, library paths, HAL's own)
KEY_ENV = ("CUDA_VISIBLE_DEVICES", "MLU_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
           "PYTHONPATH", "NEUWARE_HOME", "CUDA_HOME")
_PHASES = {"start": "plugin start-up", "import": "plugin import", "probe": "probe",
           "versions": "versions()", "devices": "devices()", "done": "probe"}


@dataclasses.dataclass(frozen=True)
class PluginSpec:
    """One entry point to probe: ``target`` is ``module:attr``."""

    name: str
    target: str
    distribution: str = ""
    version: str = ""
    location: str = ""


@dataclasses.dataclass(frozen=True)
class ProbeRecord:
    """What a child found. ``loaded`` is False when the plugin could not be imported or checked."""

    available: bool
    reason: str
    loaded: bool = False
    priority: int = 0
    device_type: str = ""
    versions: dict = dataclasses.field(default_factory=dict)
    devices: list = dataclasses.field(default_factory=list)
    hardware: list = dataclasses.field(default_factory=list)
    cached: bool = False

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("cached")
        return d


def _positive_env(name: str, default: float, allow_zero: bool = False) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        val = float(raw)
    except ValueError:
        val = float("nan")
    if not math.isfinite(val) or val < 0 or (val == 0 and not allow_zero):
        LOG.warning("ignoring $%s=%r: not a finite %s number; using %g", name, raw,
                    "non-negative" if allow_zero else "positive", default)
        return default
    return val


def probe_timeout() -> float:
    """The per-plugin bound in seconds (``$HAL_PROBE_TIMEOUT`` or 10)."""
    return _positive_env(ENV_TIMEOUT, DEFAULT_TIMEOUT_S)


def _fmt_s(sec: float) -> str:
    return f"{sec:g} s"


# ----------------------------------------------------------------------------------------------- cache

def cache_dir() -> Path:
    """Where probe results are cached (see the module docstring)."""
    if os.environ.get("HAL_CACHE_DIR"):
        return Path(os.environ["HAL_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hal"


def _torch_version() -> str:
    from importlib import metadata
    try:
        return metadata.version("torch")
    except Exception:
        return "?"


def cache_key(spec: PluginSpec) -> str:
    """A stable key for one plugin in this environment (see the module docstring)."""
    loc_mtime = ""
    if spec.location:
        try:
            loc_mtime = str(os.stat(spec.location).st_mtime_ns)
        except OSError:
            pass
    parts = [CACHE_VERSION, spec.name, spec.target, spec.distribution, spec.version, spec.location, loc_mtime,
             sys.executable, sys.version, _torch_version(), [(k, os.environ.get(k)) for k in KEY_ENV]]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


def _cache_file() -> Path:
    return cache_dir() / "plugin-probes.json"


def _read_cache() -> dict:
    try:
        data = json.loads(_cache_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(entries: dict) -> None:
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".plugin-probes.", dir=path.parent)
        with os.fdopen(fd, "w") as fh:
            json.dump(entries, fh)
        os.replace(tmp, path)
    except OSError as exc:
        LOG.debug("plugin probe cache not written (%s)", exc)


def clear_cache() -> None:
    """Forget every cached probe result."""
    try:
        _cache_file().unlink()
    except OSError:
        pass


# ----------------------------------------------------------------------------------------------- parent

def _record_from(doc: dict) -> ProbeRecord:
    fields = {f.name for f in dataclasses.fields(ProbeRecord)} - {"cached"}
    return ProbeRecord(**{k: v for k, v in doc.items() if k in fields})


def _outcome(phase: str, rc: Optional[int], timed_out: bool, timeout: float) -> str:
    what = _PHASES.get(phase, "probe")
    if timed_out:
        return f"{what} timed out after {_fmt_s(timeout)}"
    if rc is not None and rc < 0:
        try:
            sig = signal.Signals(-rc).name
        except ValueError:
            sig = str(-rc)
        return f"{what} was killed by signal {sig}"
    return f"{what} exited the process with code {rc}"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - unkillable (D state)
        pass


def _read_phase(path: Path) -> tuple[str, Optional[float]]:
    try:
        lines = path.read_text().split()
    except OSError:
        return "start", None
    if not lines:
        return "start", None
    ready = next((float(t.split("=", 1)[1]) for t in lines if t.startswith("ready=")), None)
    phases = [t for t in lines if not t.startswith("ready=")]
    return (phases[-1] if phases else "start"), ready


def _run_children(specs: list[PluginSpec], timeout: float) -> dict[PluginSpec, ProbeRecord]:
    results: dict[PluginSpec, ProbeRecord] = {}
    with tempfile.TemporaryDirectory(prefix="hal-probe-") as tmp:
        running = []
        for i, spec in enumerate(specs):
            d = Path(tmp) / str(i)
            d.mkdir()
            log = open(d / "log", "wb")
            out = open(d / "stdout", "wb")
            env = {**os.environ, "HAL_PROBE_CHILD": "1", "PYTHONUNBUFFERED": "1"}
            try:
                proc = subprocess.Popen([sys.executable, "-m", "hal.plugin_probe", spec.name, spec.target, str(d)],
                                        stdin=subprocess.DEVNULL, stdout=out, stderr=log,
                                        env=env, start_new_session=True)
            except OSError as exc:
                results[spec] = ProbeRecord(False, f"probe could not start: {exc}")
                continue
            finally:
                log.close()
                out.close()
            running.append((spec, proc, d, time.monotonic()))
        while running:
            now = time.monotonic()
            still = []
            for spec, proc, d, t0 in running:
                rc = proc.poll()
                phase, ready = _read_phase(d / "phase")
                deadline = (ready + timeout) if ready is not None else (t0 + STARTUP_ALLOWANCE_S + timeout)
                if rc is None and now < deadline:
                    still.append((spec, proc, d, t0))
                    continue
                timed_out = rc is None
                if timed_out:
                    _kill_group(proc)
                else:  # the child is done; anything it left running in its session goes too
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                results[spec] = _finish(spec, d, phase, rc, timed_out, timeout)
            running = still
            if running:
                time.sleep(0.02)
    return results


def _finish(spec: PluginSpec, d: Path, phase: str, rc: Optional[int], timed_out: bool,
            timeout: float) -> ProbeRecord:
    def read(name: str) -> bytes:
        try:
            return (d / name).read_bytes()
        except OSError:
            return b""

    stdout, log = read("stdout"), read("log")
    for what, data in (("stdout", stdout), ("stderr", log)):
        if data.strip():
            LOG.debug("%s of backend plugin %s (%s) while probing:\n%s", what, spec.name, spec.target,
                      data[-4000:].decode("utf-8", "replace"))
    result = None
    if not timed_out and rc == 0:
        try:
            result = json.loads((d / "result.json").read_text())
        except (OSError, ValueError):
            result = None
    if result is not None:
        rec = _record_from(result)
        early = stdout[:int(result.get("stdout_bytes") or 0)]
        if rec.available and early.strip():  # it would corrupt the stdout of any command that loads it
            shown = " ".join(early.decode("utf-8", "replace").split())[:80]
            return dataclasses.replace(rec, available=False, devices=[],
                                       reason=f"plugin wrote to stdout while imported or probed ({len(early)} "
                                              f"bytes: {shown!r}); a backend must keep stdout clean")
        return rec
    return ProbeRecord(False, _outcome(phase, rc, timed_out, timeout))


def probe_plugins(specs: list[PluginSpec], timeout: Optional[float] = None,
                  use_cache: bool = True) -> dict[PluginSpec, ProbeRecord]:
    """One :class:`ProbeRecord` per spec, from the cache or from bounded child processes."""
    timeout = probe_timeout() if timeout is None else timeout
    ttl = _positive_env(ENV_TTL, CACHE_TTL_S, allow_zero=True)
    use_cache = use_cache and ttl > 0
    cache = _read_cache() if use_cache else {}
    now = time.time()
    result: dict[PluginSpec, ProbeRecord] = {}
    todo = []
    keys = {}
    for spec in specs:
        keys[spec] = key = cache_key(spec)
        hit = cache.get(key)
        if isinstance(hit, dict) and now - float(hit.get("at", 0)) < ttl and isinstance(hit.get("record"), dict):
            try:
                result[spec] = dataclasses.replace(_record_from(hit["record"]), cached=True)
                continue
            except TypeError:
                pass
        todo.append(spec)
    if todo:
        fresh = _run_children(todo, timeout)
        result.update(fresh)
        if use_cache:
            cache = {k: v for k, v in _read_cache().items()
                     if isinstance(v, dict) and now - float(v.get("at", 0)) < ttl}
            for spec, rec in fresh.items():
                cache[keys[spec]] = {"at": now, "plugin": spec.target, "record": rec.as_dict()}
            _write_cache(cache)
    return result


# ----------------------------------------------------------------------------------------------- child

def _child(name: str, target: str, folder: str) -> None:  # pragma: no cover - runs in the child process
    """Import and probe one plugin; write result.json. Plugin output goes to the log (fd 1 and 2)."""
    import importlib
    import traceback

    phase_file = open(os.path.join(folder, "phase"), "a")

    def phase(p: str) -> None:
        phase_file.write(p + "\n")
        phase_file.flush()

    def describe(exc: BaseException) -> str:
        return " ".join(f"{type(exc).__name__}: {exc}".split()).rstrip(": ")

    from hal.backend import Availability, Backend
    phase(f"ready={time.monotonic()}")
    rec: dict = {"available": False, "reason": "", "loaded": False}
    try:
        phase("import")
        try:
            mod_name, _, attr = target.partition(":")
            obj = importlib.import_module(mod_name)
            for part in filter(None, attr.split(".")):
                obj = getattr(obj, part)
        except BaseException as exc:
            traceback.print_exc()
            rec["reason"] = f"plugin failed to import: {describe(exc)}"
            return
        if not (isinstance(obj, type) and issubclass(obj, Backend)):
            rec["reason"] = f"entry point {target} is not a hal.Backend subclass"
            return
        rec.update(loaded=True, priority=int(getattr(obj, "priority", 0) or 0),
                   device_type=str(getattr(obj, "device_type", "") or name))
        phase("probe")
        try:
            avail = obj.probe()
            if not isinstance(avail, Availability):
                raise TypeError(f"probe() returned {type(avail).__name__}, not Availability")
            rec.update(available=bool(avail.available), reason=str(avail.reason))
        except BaseException as exc:
            traceback.print_exc()
            rec.update(available=False, reason=f"probe raised {describe(exc)}")
        sys.stdout.flush()
        rec["stdout_bytes"] = os.fstat(1).st_size  # what import and probe wrote to stdout
        phase("versions")
        try:
            rec["versions"] = {str(k): str(v) for k, v in dict(obj.versions()).items()}
        except BaseException as exc:
            rec["versions"] = {"error": describe(exc)}
        try:
            rec["hardware"] = [str(p) for p in obj.hardware_present()]
        except BaseException:
            rec["hardware"] = []
        if rec["available"]:
            phase("devices")
            try:
                rec["devices"] = [d.as_dict() for d in obj().devices()]
            except BaseException as exc:
                rec["devices"] = [{"error": describe(exc)}]
    finally:
        phase("done")
        with open(os.path.join(folder, "result.json.tmp"), "w") as fh:
            json.dump(rec, fh, default=str)
        os.replace(os.path.join(folder, "result.json.tmp"), os.path.join(folder, "result.json"))


if __name__ == "__main__":  # pragma: no cover - the child process
    try:
        _child(*sys.argv[1:4])
    except BaseException:
        os._exit(70)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the plugin's atexit handlers and non-daemon threads
