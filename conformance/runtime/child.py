"""The audit's child process: ``python -m hal.conformance.runtime.child SPEC.json``.

Reads the spec the parent wrote (target, kind, run device, steps, result path), installs the step
limiter, the device redirect (when CUDA must be sent elsewhere), the op capture and the same for
the program's ``mp.spawn`` workers (:mod:`.spawned`, merged into the result), runs the program,
and writes ``{"run", "ops", "findings", "mlu_fallbacks", "hal_fallbacks"}`` to the result path
atomically (temp file + rename) — also when the program raises, calls ``sys.exit`` or
``os._exit``, or receives SIGTERM from the parent's timeout. Only a hard crash (a signal such as
SIGSEGV, or SIGKILL) leaves no result; the parent then reports from the exit status alone.
Everything the program prints goes to this process's stdout/stderr, which the parent tails; the
child's own I/O (the result file, its traceback copy on a duplicate of fd 2) never depends on the
program's ``sys.stdout``/``sys.stderr`` or fds, which the program may replace or close.
"""
from __future__ import annotations

import json
import os
import re
import runpy
import signal
import sys
import threading
import time
import traceback
import warnings
from typing import Any, Optional

MLU_FALLBACK_RE = re.compile(r"operator '([^']+)' is not currently (?:supported|implemented) on the MLU backend"
                             r"|operator '([^']+)' fails on the MLU backend")


def parse_mlu_fallback(message: str) -> Optional[str]:
    """The op named by a torch_mlu CPU-fallback warning (``aten::nanmedian``), or None."""
    m = MLU_FALLBACK_RE.search(message)
    if not m:
        return None
    name = m.group(1) or m.group(2)
    return name if "::" in name else f"aten::{name}"


class _State:
    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.t0 = time.perf_counter()
        self.capture = None
        self.limiter = None
        self.redirect = None
        self.mlu_fallbacks: dict[str, int] = {}
        self.written = False
        self.capture_active = False
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.notes: list[dict] = []  # findings the child itself adds (notebook magics skipped)
        self.cell: Optional[int] = None  # the notebook cell running now
        self.hooks: list = []  # --precision / --profile hooks of this run (see .sections.install_hooks)
        self.at_exit = False  # the program's atexit handlers are running (_run_exit_handlers): run.at_exit

    def result(self, status: str, error: Optional[str], exit_code: Optional[int]) -> dict:
        """This process's result with the ``mp.spawn`` workers' results merged in (:mod:`.spawned`)."""
        from hal.conformance.runtime import spawned
        workers = spawned.read(spawned.folder_of(self.spec["result_path"]))
        return spawned.merge(self._own_result(status, error, exit_code), workers)

    def _own_result(self, status: str, error: Optional[str], exit_code: Optional[int]) -> dict:
        from hal.conformance.runtime.sections import hook_results
        ops = self.capture.records() if self.capture is not None else []
        return {"run": {"status": status, "error": error, "exit_code": exit_code,
                        "steps": self.limiter.steps if self.limiter else 0,
                        "optimizer_steps": self.limiter.optimizer_steps if self.limiter else 0,
                        "backward_passes": self.limiter.backward_passes if self.limiter else 0,
                        "stopped_by": self.limiter.stopped_by if self.limiter else None,
                        "seconds": round(time.perf_counter() - self.t0, 4), "mode": self.spec.get("mode"),
                        **({"at_exit": True} if self.at_exit else {})},
                "ops": ops,
                "findings": _cells(self.notes + (self.redirect.findings() if self.redirect is not None else [])),
                "mlu_fallbacks": self.mlu_fallbacks,
                "hal_fallbacks": _hal_fallbacks(), **hook_results(self.hooks)}

    def write(self, status: str, error: Optional[str] = None, exit_code: Optional[int] = None) -> None:
        if os.getpid() != self.pid:  # a forked worker (DataLoader, multiprocessing) never reports
            return
        with self.lock:
            if self.written:
                return
            self.written = True
            if self.capture is not None and self.capture_active:
                self.capture_active = False
                try:
                    self.capture.__exit__(None, None, None)
                except Exception:
                    pass
            path = self.spec["result_path"]
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.result(status, error, exit_code), f, default=str)
            os.replace(tmp, path)


def _cell_of(exc: BaseException) -> str:
    """``"cell N, line L: "`` for an exception raised in a notebook cell (its innermost cell frame)."""
    from hal.conformance.runtime.notebook import parse_cell_filename
    where = ""
    for frame, line in traceback.walk_tb(exc.__traceback__):
        cell = parse_cell_filename(frame.f_code.co_filename)
        if cell is not None:
            where = f"cell {cell[1]}, line {line}: "
    if not where and isinstance(exc, SyntaxError) and exc.filename:
        cell = parse_cell_filename(exc.filename)
        if cell is not None:
            where = f"cell {cell[1]}, line {exc.lineno}: "
    return where


def _cells(findings: list[dict]) -> list[dict]:
    """Findings on a notebook cell (path ``nb.ipynb#cellN``) name the notebook, the cell and the line in it."""
    from hal.conformance.runtime.notebook import parse_cell_filename
    out = []
    for f in findings:
        where = parse_cell_filename(str(f.get("path", "")))
        if where is not None:
            f = {**f, "path": where[0], "cell": where[1],
                 "message": f"cell {where[1]}, line {f.get('line')}: {f.get('message', '')}"}
        out.append(f)
    return out


def _hal_fallbacks() -> list[dict]:
    """Fallbacks that really ran through hal.ops (only if the program imported hal.ops)."""
    ops_mod = sys.modules.get("hal.ops")
    if ops_mod is None:
        return []
    records = ops_mod.fallback_log()
    totals = ops_mod.fallback_totals()
    out = []
    for (op, dev), tot in totals.items():
        try:
            aten = ops_mod.REGISTRY.get(op).aten
        except Exception:
            aten = op
        recs = [r for r in records if r.op == op and r.device_type == dev]
        dtypes = sorted({d for r in recs for d in r.dtypes})
        shapes = []
        for r in recs:
            s = [list(x) for x in r.shapes]
            if s not in shapes and len(shapes) < 3:
                shapes.append(s)
        out.append({"hal_op": op, "op": aten, "device_type": dev, "calls": tot.calls, "bytes": tot.bytes_copied,
                    "seconds": tot.seconds, "dtypes": dtypes, "shapes": shapes,
                    "reason": recs[-1].reason if recs else "no implementation"})
    return out


def _install_warning_hook(state: _State) -> None:
    original = warnings.showwarning
    warnings.filterwarnings("always", message=".*(will fall back to run on the CPU|fails on the MLU backend).*")

    def showwarning(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        op = parse_mlu_fallback(str(message))
        # torch_mlu's warning is a measurement only on an MLU run; elsewhere it is just program output
        if op is not None and state.spec.get("run_device") == "mlu":
            state.mlu_fallbacks[op] = state.mlu_fallbacks.get(op, 0) + 1
        try:
            original(message, category, filename, lineno, file, line)
        except (OSError, ValueError, AttributeError):  # the program closed or replaced sys.stderr
            pass

    warnings.showwarning = showwarning


def _run_script(spec: dict) -> None:
    path = spec["target"]
    sys.argv = [path, *spec.get("args", [])]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    runpy.run_path(path, run_name="__main__")


def _run_module(spec: dict) -> None:
    """``python -m pkg.module`` from the folder the audit was started in (relative imports work)."""
    cwd = spec.get("cwd") or os.getcwd()
    os.chdir(cwd)
    sys.path.insert(0, cwd)
    sys.argv = [spec.get("module_file") or spec["target"], *spec.get("args", [])]
    runpy.run_module(spec["target"], run_name="__main__", alter_sys=True)


def _run_notebook(spec: dict, state: "_State") -> None:
    """The notebook's code cells in order in one ``__main__`` namespace; each cell is compiled
    under ``<notebook>#cell<N>`` so findings and tracebacks name the cell and the line in it."""
    import types

    from hal.conformance.runtime import notebook as nbmod
    path = spec["target"]
    sys.argv = [path, *spec.get("args", [])]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    main_mod = types.ModuleType("__main__")
    main_mod.__file__ = path
    saved_main = sys.modules.get("__main__")
    sys.modules["__main__"] = main_mod
    try:
        for cell in nbmod.read_cells(path):
            code = nbmod.cell_code(cell)
            for line, text in cell.skipped:
                state.notes.append({"rule": "runtime-notebook-magic-skipped", "path": path, "line": line,
                                    "cell": cell.index, "severity": "info", "count": 1,
                                    "message": f"cell {cell.index}, line {line}: IPython magic/shell line not run "
                                               f"by the audit: {text[:120]}",
                                    "fix": "run it yourself before the audit if the notebook depends on it"})
            state.cell = cell.index
            exec(compile(code, nbmod.cell_filename(path, cell.index), "exec"), main_mod.__dict__)
    finally:
        if saved_main is not None:
            sys.modules["__main__"] = saved_main


def _load_func(spec: dict) -> Any:
    path, _, name = spec["target"].rpartition(":")
    sys.argv = [path, *spec.get("args", [])]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    namespace = runpy.run_path(path, run_name="__hal_audit__")
    func = namespace.get(name)
    if not callable(func):
        raise RuntimeError(f"{path} defines no callable {name!r}")
    return func


def _drive_workload(w: Any, spec: dict, state: _State, built: bool) -> None:
    """Training steps then inference on a workload object (hal.models' protocol)."""
    import torch
    steps = spec.get("steps") or 2
    from torch.utils._python_dispatch import _disable_current_modes
    with _disable_current_modes():  # building (weight init) is not part of a step: not captured
        if not built and hasattr(w, "build"):
            w.build(spec["run_device"], torch.float32, seed=0)
        batch = w.example_batch()
    has_train = hasattr(w, "train_step")
    if has_train:
        for _ in range(steps):
            w.train_step(batch)
        state.limiter.optimizer_steps = max(state.limiter.optimizer_steps, steps)
    if hasattr(w, "infer"):
        with torch.no_grad():
            w.infer(batch)
        if not has_train:
            state.limiter.inference_forwards = max(state.limiter.inference_forwards, 1)


def _run_func(spec: dict, state: _State) -> None:
    """``file.py:func``: func() returns a workload (build/example_batch/train_step/infer), a
    zero-argument callable run once per step, or an ``(nn.Module, inputs)`` pair run as inference
    forwards. A func that returns None ran its own loop (the step hooks bound it)."""
    import torch
    func = _load_func(spec)
    steps = spec.get("steps") or 2
    state.limiter.limit = steps  # bounds a func that runs its own training/inference loop
    result = func()
    if result is None:
        return
    state.limiter.limit = None  # the driver below counts the steps itself
    if hasattr(result, "example_batch"):
        _drive_workload(result, spec, state, built=not hasattr(result, "build") or getattr(result, "model", None) is not None)
    elif isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module):
        module, inputs = result
        inputs = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
        with torch.no_grad():
            for _ in range(steps):
                module(*inputs)
        state.limiter.inference_forwards = steps
    elif callable(result):
        for _ in range(steps):
            result()
        state.limiter.optimizer_steps = max(state.limiter.optimizer_steps, steps)
    else:
        raise RuntimeError(f"{spec['target']} returned {type(result).__name__}; expected a workload, "
                           "a callable, or (module, inputs)")


def _run_model(spec: dict, state: _State) -> None:
    from hal.models import get_workload
    w = get_workload(spec["target"], config=spec.get("config") or "tiny")
    state.limiter.limit = None
    _drive_workload(w, spec, state, built=False)


PROGRESS_EVERY_S = 0.5


def _start_progress(path: str, limiter: Any, capture: Any) -> None:
    """A daemon thread that writes ``{"steps", "ops"}`` (ops: distinct ops dispatched so far) to
    ``path`` (temp file + rename) every :data:`PROGRESS_EVERY_S` while it changes; the parent shows
    it. It touches no tensor and never raises into the program."""
    replace, dumps, sleep = os.replace, json.dumps, time.sleep  # bound now: the program may patch them
    # a program that forks (multiprocessing's fork start method) never forks in the middle of a write:
    # the fork waits for the writer's turn to end, and the child (which has no writer thread) drops it
    turn = threading.Lock()
    os.register_at_fork(before=turn.acquire, after_in_parent=turn.release, after_in_child=turn.release)

    def loop() -> None:
        last = None
        while True:
            sleep(PROGRESS_EVERY_S)
            try:
                with turn:
                    now = (limiter.steps, len(capture.shapes))
                    if now != last:
                        with open(path + ".tmp", "w") as fh:
                            fh.write(dumps({"steps": now[0], "ops": now[1]}))
                        replace(path + ".tmp", path)
                        last = now
            except Exception:  # progress is a nicety: never disturb the program
                return

    threading.Thread(target=loop, name="hal-audit-progress", daemon=True).start()


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        spec = json.load(f)
    from hal.conformance.runtime.runner import apply_memory_limit
    apply_memory_limit(spec.get("memory_limit_mb"))
    state = _State(spec)
    real_exit = os._exit

    def on_term(_signum: int, _frame: Any) -> None:
        state.write("timeout", f"stopped after the {spec.get('timeout')} s timeout", None)
        real_exit(124)

    signal.signal(signal.SIGTERM, on_term)
    _guard_sigterm()

    def audited_exit(code: int) -> None:
        try:
            state.write("crashed", f"the program called os._exit({code})", code)
        finally:
            real_exit(code)

    os._exit = audited_exit  # type: ignore[assignment]
    _install_warning_hook(state)

    import torch
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    from hal.conformance.runtime.capture import ModuleTracker, OpCapture
    from hal.conformance.runtime.stepping import StepLimiter, StopAudit
    modules = ModuleTracker()
    capture = OpCapture(modules, target=spec.get("target_paths"))
    limiter = StepLimiter(spec.get("steps"), capture, spec.get("eval_loop_seconds"))
    modules.on_top_level_forward = limiter.before_top_level_forward
    state.capture, state.limiter = capture, limiter
    if spec.get("progress_path"):
        _start_progress(spec["progress_path"], limiter, capture)
    if spec.get("redirect_cuda"):
        from hal.conformance.runtime.redirect import DeviceRedirect
        state.redirect = DeviceRedirect(spec["run_device"], devices=spec.get("devices"))
    status, error, code = "ok", None, None
    from hal.conformance.runtime import process_groups, spawned
    from hal.conformance.runtime.exception_text import exception_text
    from hal.conformance.runtime.sections import install_hooks
    spawn_patches: list = []
    group_patches: list = []
    try:
        state.hooks = install_hooks(spec, modules, limiter)  # before the limiter: theirs run first
        modules.install()
        limiter.install()
        spawn_patches = spawned.install({"run_device": spec["run_device"], "redirect_cuda": spec.get("redirect_cuda"),
                                         "devices": spec.get("devices"),
                                         "steps": spec.get("steps"), "threads": spec.get("threads"),
                                         "eval_loop_seconds": spec.get("eval_loop_seconds"),
                                         "section_spec": spec if spec.get("section_hooks") else None,
                                         "folder": spawned.folder_of(spec["result_path"])})
        if state.redirect is not None:
            state.redirect.install()
            if spec.get("precision_role"):  # both precision runs scale the loss as the program asks
                state.redirect.enable_grad_scalers(("cuda", spec.get("target_device") or "cuda"))
        group_patches = process_groups.install()  # after the redirect: its init_process_group is the one wrapped
        if spec.get("capture", True):
            capture.__enter__()
            state.capture_active = True
        kind = spec["kind"]
        if kind == "script":
            _run_script(spec)
        elif kind == "module":
            _run_module(spec)
        elif kind == "notebook":
            _run_notebook(spec, state)
        elif kind == "func":
            _run_func(spec, state)
        elif kind == "model":
            _run_model(spec, state)
        else:
            raise RuntimeError(f"unknown kind {kind!r}")
    except StopAudit:
        pass
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code:
            status, error = "error", f"the program exited with sys.exit({exc.code!r})"
    except BaseException as exc:  # the program's failure is the audit's finding, never ours
        _print_exc()
        status, error = "error", (_cell_of(exc) + exception_text(exc)).strip()[:2000]
    finally:
        if state.capture_active:
            state.capture_active = False
            try:
                capture.__exit__(None, None, None)
            except Exception:
                pass
    limiter.remove()  # the steps are counted: an exit handler's forward is not one the bound stops
    state.at_exit = True
    _run_exit_handlers()
    state.at_exit = False
    process_groups.remove(group_patches)  # before the sections' results (state.write), and before the redirect's
    if state.redirect is not None:
        state.redirect.remove()
    spawned.remove(spawn_patches)
    modules.remove()
    _flush_quietly()
    state.write(status, error, code)
    return 0


def _guard_sigterm() -> None:
    """Keep the audit's SIGTERM handler (it writes the partial result at the timeout) when the program
    installs its own or ignores SIGTERM: ``signal.signal(SIGTERM, x)`` then records ``x`` as the
    program's and answers as if it had been set; the audit's handler stays in place.

    A process the program forks (``multiprocessing``'s fork start method, DataLoader workers) gets
    the program's disposition back (SIG_DFL unless the program set one): such a worker never writes
    the result, and the audit's Python-level handler could lose the SIGTERM that ``Pool.terminate``
    sends it when the signal lands just before the worker blocks in ``sem_wait`` on the queue lock the
    pool holds; the pool then waits for that worker forever (docs/runtime-audit.md, Limits)."""
    real_signal = signal.signal
    program_handler: list = [signal.SIG_DFL]

    def restore_in_forked_child() -> None:
        try:
            real_signal(signal.SIGTERM, program_handler[0])
        except (ValueError, TypeError, OSError):  # never disturb the fork
            pass

    os.register_at_fork(after_in_child=restore_in_forked_child)

    def audited_signal(signum: Any, action: Any) -> Any:
        if signum == signal.SIGTERM and os.getpid() == _CHILD_PID[0]:
            previous, program_handler[0] = program_handler[0], action
            return previous
        return real_signal(signum, action)

    signal.signal = audited_signal  # type: ignore[assignment]


_CHILD_PID = [os.getpid()]


def _run_exit_handlers() -> None:
    """The program's ``atexit`` handlers, run as the interpreter runs them at exit (the child itself ends with
    ``os._exit``, which skips them): last registered first, a failing one printed as "Exception ignored in atexit
    callback" and the others still run; after a normal end, ``sys.exit``, an exception or the step bound, never
    after ``os._exit`` or a signal. They run with the device redirect and the program's process groups still in place
    (a final ``torch.save`` of CUDA tensors, a summary printed at exit), the op capture and the step bound over. A
    handler that never returns is the program's hang: the timeout reports it as being in the exit handlers."""
    import atexit
    try:
        atexit._run_exitfuncs()
    except BaseException:  # the program's handlers: never the audit's failure
        pass


def _run_multiprocessing_finalizers(wait_s: float = 5.0) -> None:
    """What ``multiprocessing``'s own exit hook would run at a normal interpreter exit, minus joining child
    processes: its finalizers (a pool's workers terminated, the named semaphores of its queues unlinked). The child
    ends with ``os._exit``, which skips that hook, and the resource tracker then printed "There appear to be 6 leaked
    semaphore objects to clean up at shutdown" into the output of a program that leaked none (a spawn ``Pool``).
    Nothing when the program never imported ``multiprocessing``; a finalizer that blocks is left after ``wait_s``."""
    util = sys.modules.get("multiprocessing.util")
    if util is None:
        return

    def run() -> None:
        try:
            util._run_finalizers(0)
        except Exception:  # the program's objects: never the audit's failure
            pass
    t = threading.Thread(target=run, name="hal-audit-mp-finalizers", daemon=True)
    t.start()
    t.join(wait_s)


def _flush_quietly() -> None:
    """Flush whatever the program left as sys.stdout/sys.stderr; a replaced, closed or broken stream
    is the program's business and never stops the audit from writing its result."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass


def _print_exc() -> None:
    """The program's traceback on the child's own stderr (fd 2 as the audit started it, whatever
    the program did to sys.stderr); nothing when even that is gone."""
    text = traceback.format_exc()
    try:
        os.write(_STDERR_FD, text.encode("utf-8", "replace"))
    except OSError:
        pass


_STDERR_FD = 2


if __name__ == "__main__":
    try:
        _STDERR_FD = os.dup(2)  # the child's own copy: the program may close or redirect fd 2
    except OSError:
        pass
    rc = main()
    _run_multiprocessing_finalizers()
    _flush_quietly()
    os._exit(rc)
