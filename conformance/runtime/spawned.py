"""Processes a program starts with ``torch.multiprocessing.spawn`` / ``start_processes``, or as plain
``multiprocessing`` processes with the spawn or forkserver start method, run audited too.

The DDP tutorials (pytorch/examples distributed/ddp-tutorial-series/multigpu.py) do all their work in
``mp.spawn`` workers: fresh interpreters that import the program again. :func:`install` (in the
audit's child) wraps the function each worker runs in a picklable :class:`SpawnedWorker`, which in
the worker installs what the child installs in itself (module tracker, op capture, step limiter with
the same ``--steps`` bound, the CUDA redirect when the child has one, and :mod:`.process_groups`' hold on the
groups the program destroys until the function has returned), runs the function, and
writes ``{"rank", "pid", "run", "ops", "findings"}`` to ``spawned-<pid>.json`` in the run's own
folder (:func:`folder_of` its result file: the runs of one audit share a working folder), also when
the function raises (the exception then propagates as it would, so ``mp.spawn`` in the program fails
as it would without the audit). A worker stopped by the step
bound returns normally (``StopAudit`` is the audit's, never the program's failure). In a
``--precision`` or ``--profile`` run the workers also install that run's section hooks (``section_spec``:
the child's spec): every rank the precision hooks (seeded, dropout off, float64 in the reference run:
the ranks' collectives must agree; a rank other than 0 keeps its reference samples in a file of its
own), rank 0 alone the profile's; rank 0 adds their results to its file.

:func:`merge` folds those files into the child's result:

- ``ops``: the union over the program's processes (the audited process and every worker), one
  record per ``(op, phase, device_type)``; ``count`` and ``bytes`` are the largest of any one
  process (each rank runs on a device of its own, so that is what one device dispatches), dtypes,
  modules and shapes are merged;
- ``findings``: the union by ``(rule, path, line)``, counts added up;
- ``run.spawned``: one entry per worker (rank, pid, status, steps, stopped_by, error); the run's
  steps, optimizer steps, backward passes and ``stopped_by`` come from the workers when the audited
  process took no step itself, and so do the sections (``precision_run``, ``profile_run``: rank 0's).

Plain ``multiprocessing`` processes that start a fresh interpreter (``mp.set_start_method("spawn")`` then
``mp.Process(target=train, ...)``, as pytorch/examples mnist_hogwild does) get the same wrapper, without a rank
and without section hooks (:func:`_install_process_start`); their entries in ``run.spawned`` name the process.
Not covered: forked workers (``multiprocessing`` with the fork start method, DataLoader workers), which share
the audited process's redirect and capture, never report (see :mod:`.child`) and disown the section hooks
(:func:`.sections.install_hooks`); DataLoader workers and process pools
(``Pool``, ``ProcessPoolExecutor``) of any start method; ``Process`` subclasses that override ``run``.
"""
from __future__ import annotations

import glob
import json
import os
import sys
import traceback
from typing import Any, Callable, Optional

PREFIX = "spawned-"


class SpawnedWorker:
    """Picklable wrapper: ``fn(i, *args)`` in a spawned process, audited like the child itself.

    ``config``: ``run_device``, ``redirect_cuda``, ``steps``, ``eval_loop_seconds``, ``threads``, ``folder``
    (where the worker writes its result) and ``section_spec`` (the child's spec, when it has section hooks).
    ``ranked=False``: the target of a plain ``multiprocessing`` process (``fn(*args, **kwargs)``, no rank; no
    section hooks: the sections follow the audited process and ``mp.spawn`` ranks only); its result names the
    process (``process``: its name) and has rank None."""

    def __init__(self, fn: Callable[..., Any], config: dict, ranked: bool = True) -> None:
        self.fn, self.config, self.ranked = fn, dict(config), ranked

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        from hal.conformance.runtime import process_groups
        from hal.conformance.runtime.capture import ModuleTracker, OpCapture
        from hal.conformance.runtime.exception_text import exception_text
        from hal.conformance.runtime.rebinding import rebind
        from hal.conformance.runtime.sections import hook_results, install_hooks
        from hal.conformance.runtime.stepping import StepLimiter, StopAudit
        cfg = self.config
        rank = args[0] if self.ranked else None
        if cfg.get("threads"):
            torch.set_num_threads(int(cfg["threads"]))
        modules = ModuleTracker()
        capture = OpCapture(modules)
        limiter = StepLimiter(cfg.get("steps"), capture, cfg.get("eval_loop_seconds"))
        modules.on_top_level_forward = limiter.before_top_level_forward
        redirect = None
        if cfg.get("redirect_cuda"):
            from hal.conformance.runtime.redirect import DeviceRedirect
            redirect = DeviceRedirect(cfg["run_device"], devices=cfg.get("devices"))
        status, error = "ok", None
        active = False
        section_spec = _rank_sections(cfg.get("section_spec"), rank) if self.ranked else None
        hooks: list = []
        group_patches: list = []
        try:
            if section_spec:
                hooks = install_hooks(section_spec, modules, limiter)  # before the limiter: theirs run first
            modules.install()
            limiter.install()
            if redirect is not None:
                redirect.install()
                redirect.rebind(self.fn)
                if section_spec and section_spec.get("precision_role"):  # as the child does (child.main)
                    redirect.enable_grad_scalers(("cuda", section_spec.get("target_device") or "cuda"))
            group_patches = process_groups.install()  # after the redirect: its init_process_group is the one wrapped
            rebind(self.fn, group_patches)
            capture.__enter__()
            active = True
            out = self.fn(*args, **kwargs)
        except StopAudit:
            out = None
        except SystemExit as exc:
            if exc.code not in (None, 0):
                status, error = "error", f"the worker exited with sys.exit({exc.code!r})"
            raise
        except BaseException as exc:
            status, error = "error", exception_text(exc)
            raise
        finally:
            if active:
                try:
                    capture.__exit__(None, None, None)
                except Exception:
                    pass
            process_groups.remove(group_patches)  # the program's destroyed groups go before the sections' results
            import multiprocessing
            result = {"rank": rank, "pid": os.getpid(),
                      **({} if self.ranked else {"process": multiprocessing.current_process().name}),
                      "run": {"status": status, "error": error, "steps": limiter.steps,
                              "optimizer_steps": limiter.optimizer_steps, "backward_passes": limiter.backward_passes,
                              "stopped_by": limiter.stopped_by},
                      "ops": capture.records(), "findings": redirect.findings() if redirect is not None else [],
                      **({"sections": hook_results(hooks)} if hooks and rank == 0 else {})}
            if redirect is not None:
                redirect.remove()
            modules.remove()
            limiter.remove()
            _write(os.path.join(cfg["folder"], f"{PREFIX}{os.getpid()}.json"), result)
        if hooks:  # as the child ends itself: torch.profiler's sessions, kept alive, crashed the interpreter's exit
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
            os._exit(0)
        return out


def _rank_sections(spec: Optional[dict], rank: int) -> Optional[dict]:
    """The section spec of worker ``rank`` (see the module docstring), or None."""
    if not spec or rank == 0:
        return spec
    samples = spec.get("precision_samples")
    return {**spec, "profile_program": False, "precision_samples": f"{samples}.rank{rank}" if samples else None}


def folder_of(result_path: str) -> str:
    """Where the workers of the run whose result file is ``result_path`` write theirs (made if missing)."""
    folder = result_path + ".spawned"
    os.makedirs(folder, exist_ok=True)
    return folder


def _write(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, default=str)
        os.replace(tmp, path)
    except OSError:  # the run's folder is gone (the audit was stopped): nothing to report to
        traceback.print_exc(file=sys.__stderr__)


#: targets of processes :func:`install` leaves alone: ``mp.spawn``'s own wrapper (its function is wrapped already),
#: DataLoader workers (they load data on the host; the fork start method's are not audited either) and the task
#: loops of process pools (``Pool``, ``ProcessPoolExecutor``: the step bound's stop inside a task would end the
#: worker, not the task, and the pool would wait for its result)
_NOT_WRAPPED = ("torch.multiprocessing.spawn", "torch.utils.data._utils.worker", "multiprocessing.pool",
                "concurrent.futures.process")


def _spawns(process: Any) -> bool:
    """Whether ``process`` (a ``multiprocessing`` process about to start) starts a fresh interpreter (the spawn
    or forkserver start method: it inherits none of the audit's hooks), without fixing the program's start method
    (asking ``get_start_method()`` would: a later ``set_start_method`` of the program would then raise)."""
    import multiprocessing.context as ctx
    method = getattr(process, "_start_method", None)
    if method is None:
        default = ctx._default_context
        method = getattr(default._actual_context or default._default_context, "_name", None)
    return method in ("spawn", "forkserver")


def _install_process_start(config: dict) -> list[tuple[Any, str, Any]]:
    """Wrap the target of every plain ``multiprocessing`` process that starts a fresh interpreter (see
    :func:`_spawns`; pytorch/examples mnist_hogwild trains in such processes) in an unranked
    :class:`SpawnedWorker`. A subclass that overrides ``run`` (no target) is left as it is."""
    import multiprocessing.process as mpp
    real_start = mpp.BaseProcess.start

    def start(self: Any) -> None:
        target = getattr(self, "_target", None)
        if target is not None and not isinstance(target, SpawnedWorker) and type(self).run is mpp.BaseProcess.run \
                and getattr(target, "__module__", None) not in _NOT_WRAPPED and _spawns(self):
            self._target = SpawnedWorker(target, config, ranked=False)
        return real_start(self)

    mpp.BaseProcess.start = start  # type: ignore[method-assign]
    return [(mpp.BaseProcess, "start", real_start)]


def install(config: dict) -> list[tuple[Any, str, Any]]:
    """Wrap the function of every ``torch.multiprocessing`` ``start_processes``/``spawn`` call in a
    :class:`SpawnedWorker` (``config`` as there), and the target of every plain ``multiprocessing`` process
    started with the spawn or forkserver method in an unranked one. Returns the patches, for :func:`remove`."""
    saved: list[tuple[Any, str, Any]] = _install_process_start(config)
    mod = sys.modules.get("torch.multiprocessing.spawn")
    if mod is None or not hasattr(mod, "start_processes"):
        return saved
    real = mod.start_processes

    def start_processes(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return real(SpawnedWorker(fn, config), *args, **kwargs)

    import torch.multiprocessing as tmp
    for owner in (mod, tmp):
        if getattr(owner, "start_processes", None) is real:
            saved.append((owner, "start_processes", real))
            owner.start_processes = start_processes
    return saved


def remove(saved: list[tuple[Any, str, Any]]) -> None:
    for owner, name, value in reversed(saved):
        setattr(owner, name, value)


def read(folder: str) -> list[dict]:
    """The results the workers wrote in ``folder``, in rank order (unreadable files are skipped)."""
    out = []
    for path in glob.glob(os.path.join(folder, f"{PREFIX}*.json")):
        try:
            with open(path) as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda r: (-1 if r.get("rank") is None else r["rank"], r.get("pid", 0)))


def merge(result: dict, workers: list[dict]) -> dict:
    """``result`` (the audited process's) with the workers' ops, findings and steps folded in (see
    the module docstring). Returns ``result`` unchanged when there are no workers."""
    if not workers:
        return result
    ops: dict[tuple, dict] = {}
    for records in [result.get("ops") or []] + [w.get("ops") or [] for w in workers]:
        for rec in records:
            key = (rec["op"], rec["phase"], rec.get("device_type"))
            have = ops.get(key)
            if have is None:
                ops[key] = {**rec, "dtypes": list(rec.get("dtypes") or []), "modules": list(rec.get("modules") or []),
                            "shapes": list(rec.get("shapes") or [])}
                continue
            have["count"] = max(have["count"], rec["count"])
            have["bytes"] = max(have.get("bytes", 0), rec.get("bytes", 0))
            for field, cap in (("dtypes", None), ("modules", 8), ("shapes", 3)):
                for v in rec.get(field) or []:
                    if v not in have[field] and (cap is None or len(have[field]) < cap):
                        have[field].append(v)
    findings: dict[tuple, dict] = {}
    for f in (result.get("findings") or []) + [f for w in workers for f in w.get("findings") or []]:
        key = (f.get("rule"), f.get("path"), f.get("line"))
        if key in findings:
            findings[key] = {**findings[key], "count": findings[key].get("count", 1) + f.get("count", 1)}
        else:
            findings[key] = dict(f)
    run = dict(result.get("run") or {})
    run["spawned"] = [{"rank": w.get("rank"), "pid": w.get("pid"), **({"process": w["process"]} if "process" in w else {}),
                       **{k: (w.get("run") or {}).get(k) for k in
                       ("status", "steps", "optimizer_steps", "backward_passes", "stopped_by", "error")}}
                      for w in workers]
    if not run.get("steps"):
        best: Optional[dict] = max((w.get("run") or {} for w in workers), key=lambda r: r.get("steps") or 0)
        for k in ("steps", "optimizer_steps", "backward_passes"):
            run[k] = max((w.get("run") or {}).get(k) or 0 for w in workers)
        if not run.get("stopped_by") and best is not None:
            run["stopped_by"] = best.get("stopped_by")
        result = {**result, **next((w["sections"] for w in workers if w.get("rank") == 0 and w.get("sections")), {})}
    return {**result, "run": run,
            "ops": sorted(ops.values(), key=lambda r: (-r["count"], r["op"], r["phase"])),
            "findings": sorted(findings.values(), key=lambda r: (str(r.get("path")), r.get("line") or 0,
                                                                  str(r.get("rule"))))}
