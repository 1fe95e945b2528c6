"""Run the audit child in its own process group, bounded in time and in memory.

:func:`run_child` starts ``python -m hal.conformance.runtime.child SPEC`` with
``start_new_session=True``, tails its merged stdout/stderr through a reader thread into a bounded
deque (the last :data:`TAIL_LINES` lines, each cut to :data:`MAX_LINE` characters: megabytes of
output never accumulate), enforces the timeout (SIGTERM to the whole group, so the child writes
its partial result, then SIGKILL after a grace period), stops it the same way when the audit is interrupted
(Ctrl-C, or SIGTERM as :class:`hal.commandline.Terminated`: the partial result is kept, ``run.interrupted`` names
the signal, and no later child of this process starts, :func:`interruption`), and always kills the group before
returning so no process the program started outlives the audit; descendants that left the group
(``setsid`` daemons) are found by a per-run token in their environment, killed, and listed in
``run.escaped_processes`` (``run.surviving_processes`` for any that could not be killed). It classifies how the child
ended: its own result file when it wrote one, else the exit status (a signal -> ``crashed`` with
the signal's name). Never raises for a failing program.
"""
from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Optional

from hal.commandline import Terminated

TAIL_LINES = 40
MAX_LINE = 400
TERM_GRACE_S = 3.0
RUN_TOKEN = "HAL_AUDIT_RUN_TOKEN"  # in the child's environment: finds descendants that left the group
#: how each interrupt is named in ``run.error``
INTERRUPTS = {"SIGINT": "Ctrl-C", "SIGTERM": "SIGTERM"}
_interrupted: list[str] = []  # the first interrupt that stopped a child run of this process


def interruption() -> Optional[str]:
    """``"SIGINT"`` or ``"SIGTERM"`` once an interrupt stopped a child run of this process (:func:`run_child`), else
    None. From then on :func:`run_child` starts nothing (the audit writes its report with what ran; its exit code
    says it was interrupted). Process-wide; set from the main thread, read anywhere."""
    return _interrupted[0] if _interrupted else None


def clear_interruption() -> None:
    """Forget an earlier interrupt (a command starting a new audit in the same process)."""
    _interrupted.clear()


class _Tail:
    def __init__(self, stream) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.bytes_seen = 0
        self._partial = b""
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            if not chunk:
                break
            self.bytes_seen += len(chunk)
            data = self._partial + chunk
            parts = data.split(b"\n")
            self._partial = parts.pop()[-4 * MAX_LINE:]
            for p in parts[-TAIL_LINES:]:
                self.lines.append(self._text(p))
        if self._partial:
            self.lines.append(self._text(self._partial))

    @staticmethod
    def _text(raw: bytes) -> str:
        s = raw.decode("utf-8", "replace").rstrip("\r")
        return s if len(s) <= MAX_LINE else s[:MAX_LINE] + " [...]"

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def apply_memory_limit(limit_mb: Optional[float]) -> None:
    """In a child: cap its data segment (heap and anonymous mappings, Linux >= 4.7) at ``limit_mb``.

    An allocation past the cap fails inside the program (MemoryError / torch's "can't allocate
    memory"), which the audit reports as the run's error instead of the machine swapping or the
    OOM killer picking a victim. No-op where ``resource`` or RLIMIT_DATA is missing."""
    if not limit_mb:
        return
    try:
        import resource
        cap = int(limit_mb * 2**20)
        _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        soft = cap if hard == resource.RLIM_INFINITY else min(cap, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
    except (ImportError, AttributeError, ValueError, OSError):
        pass


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_escaped(token: str) -> tuple[list[dict], list[dict]]:
    """Kill every process still carrying this run's token in its environment (the program's
    descendants that left the process group: ``setsid`` daemons, double forks). Returns
    ``(killed, survivors)`` as ``[{pid, cmdline}]``; survivors are those still alive 2 s later."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency
        return [], []
    found = []
    me = os.getpid()
    for p in psutil.process_iter(["pid"]):
        if p.pid == me:
            continue
        try:
            if p.environ().get(RUN_TOKEN) == token:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    killed = []
    for p in found:
        try:
            killed.append({"pid": p.pid, "cmdline": " ".join(p.cmdline())[:200]})
            p.kill()
        except (psutil.Error, OSError):
            pass
    _gone, alive = psutil.wait_procs(found, timeout=2.0)
    survivors = [k for k in killed if any(a.pid == k["pid"] for a in alive)]
    return killed, survivors


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the child's group (the child writes its partial result), SIGKILL after :data:`TERM_GRACE_S`."""
    _kill_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid, signal.SIGKILL)
        proc.wait()


def run_child(spec_path: str, result_path: str, timeout: Optional[float], env: Optional[dict] = None,
              module: str = "hal.conformance.runtime.child") -> dict:
    """Run ``python -m module spec_path`` as the child; return ``{"run": {...}, plus the child's
    result keys when it wrote them}``. The child writes ``result_path`` (named in its spec).

    Interrupted while it waits (KeyboardInterrupt, :class:`Terminated`), it stops the child as at the timeout (the
    child writes what it saw), returns that result with ``run.status`` "error" and ``run.interrupted``, and records
    the interrupt (:func:`interruption`); a second interrupt while the child stops propagates (the group is still
    killed). After an interrupt it runs nothing: ``run.status`` "skipped", ``run.interrupted`` set."""
    if _interrupted:
        why = INTERRUPTS[_interrupted[0]]
        return {"run": {"status": "skipped", "steps": 0, "seconds": 0.0, "interrupted": _interrupted[0],
                        "error": f"the audit was interrupted ({why}) before it started"}}
    cmd = [sys.executable, "-m", module, spec_path]
    t0 = time.perf_counter()
    token = uuid.uuid4().hex
    env = dict(os.environ if env is None else env, **{RUN_TOKEN: token})
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)
    tail = _Tail(proc.stdout)
    timed_out, interrupted = False, None
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _stop(proc)
    except (KeyboardInterrupt, Terminated) as exc:
        interrupted = "SIGINT" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
        _interrupted[:] = [interrupted]
        _stop(proc)
    finally:
        _kill_group(proc.pid, signal.SIGKILL)  # whatever the program left behind in its group
        if proc.poll() is None:
            proc.wait()
        escaped, survivors = _kill_escaped(token)  # ... and outside it (setsid daemons)
    tail.join(5.0)
    if not tail._thread.is_alive():  # a survivor may hold the pipe: closing under a blocked reader deadlocks
        proc.stdout.close()
    seconds = round(time.perf_counter() - t0, 3)
    result: dict = {}
    if os.path.exists(result_path):
        try:
            with open(result_path) as f:
                result = json.load(f)
        except (OSError, ValueError):
            result = {}
    run = dict(result.get("run") or {})
    rc = proc.returncode
    if interrupted:
        steps = run.get("steps") or 0
        run.update(status="error", interrupted=interrupted, exit_code=None,
                   error=f"the audit was interrupted ({INTERRUPTS[interrupted]}) and the program was stopped after "
                         f"{steps} step{'' if steps == 1 else 's'}: the report covers what ran until then")
    elif timed_out:
        where = " (in its atexit handlers)" if run.get("at_exit") else ""
        run.update(status="timeout", error=f"the program did not finish within the {timeout:g} s timeout{where} "
                                           f"and was stopped", exit_code=None)
    elif rc is not None and rc < 0:
        run.update(status="crashed", error=f"the program was killed by {_signal_name(-rc)}", exit_code=rc)
    elif not run:
        run.update(status="crashed", error=f"the program ended with exit code {rc} before the audit could record "
                                           "a result", exit_code=rc)
    run.setdefault("steps", 0)
    if escaped:
        run["escaped_processes"] = escaped
    if survivors:
        run["surviving_processes"] = survivors
    run["seconds"] = seconds
    run["output_tail"] = list(tail.lines)
    run["output_bytes"] = tail.bytes_seen
    result["run"] = run
    return result
