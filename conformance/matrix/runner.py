"""Run the matrix: every cell in its own subprocess with a time bound.

A cell that crashes the interpreter (a signal, ``os._exit``), runs out of memory or hangs is
marked ``crashed`` or ``timeout`` with what it printed last, and the run goes on. The child is
``python -m hal.conformance.matrix.cell``; it gets its request as JSON on the command line and
writes its result to a file; the parent kills its whole process group at the deadline.

Fault injection for tests: ``$HAL_MATRIX_INJECT`` = ``backend/model/mode/dtype=crash|hang|raise``
(comma-separated) makes the named cells fail that way inside the child, exercising the real
isolation path. It has no other effect.
"""
from __future__ import annotations

import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Optional

from hal.conformance.matrix.schema import Cell, document

INJECT_ENV = "HAL_MATRIX_INJECT"


def _tail(text: str, n: int = 8) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-n:])[-600:]


def run_cell(request: dict, timeout_s: float) -> Cell:
    """Evaluate one cell in a child process; never raises for what happens inside the child."""
    cell = Cell(request["backend"], request["model"], request["mode"], request["dtype"])
    with tempfile.TemporaryDirectory(prefix="hal-cell-") as tmp:
        result = Path(tmp) / "cell.json"
        cmd = [sys.executable, "-m", "hal.conformance.matrix.cell", json.dumps(request), str(result)]
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            cell.status, cell.reason = "timeout", f"no result within {timeout_s:g} s; last output: {_tail(out or '')}"
            cell.seconds = time.monotonic() - t0
            return cell
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # nothing the cell started outlives it
            except (ProcessLookupError, PermissionError):
                pass
        cell.seconds = time.monotonic() - t0
        if result.is_file():
            done = Cell.from_dict(json.loads(result.read_text()))
            done.seconds = cell.seconds
            return done
        rc = proc.returncode
        how = f"killed by signal {signal.Signals(-rc).name}" if rc < 0 else f"exited with code {rc} before writing a result"
        cell.status, cell.reason = "crashed", f"{how}; last output: {_tail(out or '')}"
        return cell


def collectives_row(backend: str, world_size: int = 2, timeout_s: float = 120.0) -> dict:
    """The backend's collectives conformance row (run for real where the devices are present)."""
    import hal
    from hal.testing import collectives
    info = {i.name: i for i in hal.list_backends()}.get(backend)
    if info is None:
        return {"backend": backend, "status": "not-run", "verified": False, "reason": "backend not installed"}
    limits = sorted(getattr(info.cls, "unsupported_reduce_ops", ()) or ()) if info.cls else []
    note = f"; engine {info.cls.dist_backend} lacks {', '.join(limits)}" if limits else ""
    if not info.available:
        return {"backend": backend, "status": "not-run", "verified": False,
                "reason": f"{info.reason}{note} (predicted from the manifest)"}
    b = hal.get_backend(backend)
    if backend != "cpu" and b.device_count() < world_size:
        return {"backend": backend, "status": "not-run", "verified": False,
                "reason": f"needs {world_size} devices, {b.device_count()} visible{note}"}
    rows = collectives.run(backend, world_size, timeout_s)
    failed = [r for r in rows if r.status == "fail"]
    return {"backend": backend, "status": "fail" if failed else "pass", "verified": True,
            "world_size": world_size, "passed": sum(r.status == "pass" for r in rows), "failed": len(failed),
            "reason": "; ".join(f"{r.collective}/{r.dtype}/{r.op}: {r.detail}" for r in failed)[:500] or note.lstrip("; ")}


def environment_entry() -> dict:
    from hal.environment import fingerprint
    env = fingerprint()
    accel = [d.get("name") for name, b in env["backends"].items() if name != "cpu" and b.get("available")
             for d in b.get("devices", [])]
    env["id"] = f"{(accel[0] if accel else env['cpu'])} @ {platform.node() or 'host'} {env['utc']}"
    return env


def run_matrix(devices: Iterable[str], models: Iterable[str], modes: Iterable[str], dtypes: Iterable[str],
               config: str = "tiny", steps: int = 3, timeout_s: float = 300.0, precision: bool = True,
               with_collectives: bool = True, progress: Optional[Callable[[Cell], None]] = None,
               arch: Optional[int] = None, jobs: int = 1) -> dict:
    """Run every cell and return the ``hal-compat-matrix/1`` document. ``arch``: the architecture
    major of the predicted devices (dtype gates, TF32 notes), None when not given. ``jobs``: cells
    run at once, each in its own process (step times of verified cells are then measured beside
    other cells: the document records ``jobs``). ``progress`` is called once per finished cell, from
    one thread at a time.

    Raises ValueError before running anything when ``steps`` is not a positive integer or
    ``timeout_s`` not a finite positive number (a cell would otherwise pass on zero steps or time out
    at once)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, not {steps!r}")
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a finite number of seconds > 0, not {timeout_s!r}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, not {jobs!r}")
    env = environment_entry()
    requests = [{"backend": backend, "model": model, "mode": mode, "dtype": dtype, "config": config,
                 "steps": steps, "precision": precision, "arch": arch}
                for backend in devices for model in models for mode in modes for dtype in dtypes]
    cells = []
    lock = threading.Lock()

    def one(req: dict) -> None:
        cell = run_cell(req, timeout_s)
        cell.env = env["id"]
        with lock:
            cells.append(cell)
            if progress:
                progress(cell)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, requests))
    colls = []
    if with_collectives:
        for backend in devices:
            row = collectives_row(backend)
            row["env"] = env["id"]
            colls.append(row)
    return document(cells, colls, [env], {"config": config, "steps": steps, "arch": arch, "jobs": jobs})
