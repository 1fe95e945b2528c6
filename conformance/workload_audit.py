"""Precision and profile for ``hal-audit --precision/--profile``, every target kind, run in child processes.

The parent (:func:`precision_and_profile`) never runs user code itself; every run goes through the
runtime audit's bounded child runner, so a crash, hang or ``os._exit`` never takes the auditor down:
the sections then say what happened.

* Workload targets (reference-model names; ``file.py:func`` returning a workload with
  ``build``/``example_batch``/``train_step``/``infer``, or an ``(nn.Module, inputs)`` pair):
  ``python -m hal.conformance.workload_audit SPEC`` drives the workload (:func:`compare_workload` /
  :func:`compare_module`, :func:`profile_workload` / :func:`profile_callable`).
* Program targets (scripts, ``-m`` modules, notebooks, and ``file.py:func`` returning a callable or
  None): the program runs unchanged in the runtime child (:mod:`hal.conformance.runtime.child`)
  with a hook from :func:`program_hooks`: for ``--precision`` a float64 reference run (CPU, seeded,
  dropout off) then the target run with float64 shadows
  (:mod:`hal.conformance.precision.script`), for ``--profile`` one profiled run
  (:mod:`hal.conformance.profiling.script`). These runs are bounded by ``--steps`` (default
  :data:`PROGRAM_PRECISION_STEPS` for precision) and by ``--timeout`` each.

The device is the target when it is present; otherwise the CPU, and the section says that the
figures were measured on the CPU, not on the target (``verified`` false). A requested section that
could not be produced has ``verdict`` ``"not-run"`` or ``"error"`` and a ``reason``/``error``; the CLI
exits 3 for it.
"""
from __future__ import annotations

import collections
import json
import os
import re
import sys
import tempfile
import traceback
from typing import Any, Optional

#: seconds an audited run may take when the request names no limit (``hal-audit --timeout``'s default)
RUN_TIMEOUT_S = 600.0
#: target kinds audited as a whole program (:func:`program_sections`): their sections come from the program's own steps
PROGRAM_KINDS = ("script", "module", "notebook")
#: optimizer steps (or forwards) of the precision runs of a program target when --steps is not given
PROGRAM_PRECISION_STEPS = 3
#: profiled (and plain) steps of a program target's profile run when --steps is not given (the run is
#: bounded by hal.conformance.profiling.script.run_bound: warm-up, plain, profiled, attribution, analysis)
PROGRAM_PROFILE_STEPS = 2
#: how long an evaluation or generation loop between training steps may run in a precision or profile run of a
#: program target before the audit stops the program (capped at a quarter of the run's timeout): these runs need
#: the training steps after it (the audit's plain run stops such a loop after --steps forward passes)
EVAL_LOOP_SECONDS = 60.0


def _not_run(reason: str) -> dict:
    return {"verdict": "not-run", "reason": reason, "verified": False}


def program_hooks(spec: dict, modules: Any, limiter: Any) -> list:
    """In a runtime child: the installed precision / profile hooks that ``spec`` asks for
    (``precision_role``, ``profile_program``). Each has ``result() -> dict`` merged into the child's result, and
    ``disown()`` for a process the program forks (:func:`~hal.conformance.runtime.sections.install_hooks`)."""
    hooks: list = []
    if spec.get("precision_role"):
        from hal.conformance.precision.script import ProgramPrecision
        hooks.append(ProgramPrecision(spec, modules, limiter))
    if spec.get("profile_program"):
        from hal.conformance.profiling.script import ProgramProfile
        hooks.append(ProgramProfile(spec, modules, limiter))
    for h in hooks:
        h.install()
    return hooks


def precision_and_profile(request: dict, fallback_ops: list[str]) -> dict:
    """``{"precision": ..., "profile": ...}`` for the sections the request asks for (None otherwise)."""
    want_p, want_f = bool(request.get("precision")), bool(request.get("profile"))
    out: dict[str, Any] = {"precision": None, "profile": None}
    if not (want_p or want_f):
        return out
    from hal.conformance.runtime.runner import INTERRUPTS, interruption
    interrupted = interruption()
    if interrupted:  # the run was stopped by Ctrl-C or SIGTERM: no section starts
        why = f"the audit was interrupted ({INTERRUPTS[interrupted]}) before this section ran"
        return {"precision": _not_run(why) if want_p else None, "profile": _not_run(why) if want_f else None}
    if request["kind"] in PROGRAM_KINDS:
        return program_sections(request, fallback_ops)
    if request["kind"] not in ("model", "func"):
        why = f"--precision/--profile are not available for a {request['kind']} target (no PyTorch program runs)"
        return {"precision": _not_run(why) if want_p else None, "profile": _not_run(why) if want_f else None}
    from hal.conformance.runtime.runner import run_child
    work = request.get("out") or tempfile.mkdtemp(prefix="hal-audit-")
    os.makedirs(work, exist_ok=True)
    fd, spec_path = tempfile.mkstemp(prefix=".workload-spec-", suffix=".json", dir=work)
    result_path = spec_path.replace(".workload-spec-", ".workload-result-")
    spec = {**request, "result_path": result_path, "fallback_ops": fallback_ops}
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f)
    try:
        res = run_child(spec_path, result_path, request.get("timeout") or 900.0,
                        module="hal.conformance.workload_audit")
    finally:
        for p in (spec_path, result_path):
            if os.path.exists(p):
                os.remove(p)
    run = res.get("run", {})
    if res.get("program_target"):  # file.py:func returned a callable or None: run it as a program
        return program_sections(request, fallback_ops)
    for key, wanted in (("precision", want_p), ("profile", want_f)):
        if not wanted:
            continue
        section = res.get(key)
        if section is None:
            tail = " | ".join(run.get("output_tail", [])[-5:])
            section = {"verdict": "error", "verified": False,
                       "error": f"{run.get('status', 'crashed')}: {run.get('error') or 'no result'}; last output: {tail}"}
        out[key] = section
    return out


class _ProgramTarget(Exception):
    """file.py:func returned a callable or None: precision/profile run it as a program."""


def _workload(spec: dict):
    """The workload object, or ``(module, inputs)``; raises _ProgramTarget for a callable / None."""
    if spec["kind"] == "model":
        from hal.models import get_workload
        return get_workload(spec["target"], config=spec.get("config") or "tiny")
    from hal.conformance.runtime.capture import ModuleTracker
    from hal.conformance.runtime.child import _load_func
    from hal.conformance.runtime.stepping import StepLimiter, StopAudit
    func = _load_func(spec)
    # a func that runs its own loop (and returns None) is stopped after its first step: it is a program
    limiter, modules = StepLimiter(1), ModuleTracker()
    modules.on_top_level_forward = limiter.before_top_level_forward
    limiter.install()
    modules.install()
    try:
        w = func()
    except StopAudit:
        raise _ProgramTarget() from None
    finally:
        modules.remove()
        limiter.remove()
    if hasattr(w, "example_batch"):
        return w
    if isinstance(w, tuple) and len(w) == 2 and isinstance(w[0], __import__("torch").nn.Module):
        return w
    if w is None or callable(w):
        raise _ProgramTarget()
    raise TypeError(f"{spec['target']} returned {type(w).__name__}; expected a workload "
                    "(build/example_batch/train_step/infer), (module, inputs), a callable or None")


def _pair_precision(pair, device, steps, calib):
    import torch

    from hal.conformance.precision import compare_module
    module, inputs = pair
    inputs = tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)
    dtypes = [p.dtype for p in module.parameters() if p.is_floating_point()]
    dtype = dtypes[0] if dtypes else torch.float32
    module = module.to("cpu")
    inputs = tuple(x.to("cpu") if isinstance(x, torch.Tensor) else x for x in inputs)
    return compare_module(lambda: module, inputs, device=device, dtype=dtype, steps=steps,
                          calibrate_with=calib).as_dict()


def _pair_profile(pair, backend, steps, out, fallback_ops):
    import torch

    from hal.conformance.profiling import profile_callable
    module, inputs = pair
    dev = backend.torch_device()
    module = module.to(dev)
    inputs = tuple(x.to(dev) if isinstance(x, torch.Tensor) else x
                   for x in (inputs if isinstance(inputs, (list, tuple)) else (inputs,)))

    def step():
        with torch.no_grad():
            module(*inputs)
    prof = profile_callable(step, backend, steps=max(steps, 2), warmup=1, out_dir=out, model=module,
                            fallback_ops=fallback_ops, live=(module, inputs))
    prof["mode"] = "inference forward of the returned (module, inputs) pair"
    return prof


def _child(spec: dict) -> dict:
    import torch

    import hal
    infos = {i.name: i for i in hal.list_backends()}
    info = infos[spec["device"]]
    device = spec["device"] if info.available else "cpu"
    note = "" if info.available else (f"{spec['device']} is not present here ({info.reason}); "
                                      f"measured on the CPU, not on {spec['device']}")
    result: dict = {}
    steps = spec.get("steps") or 2
    if spec.get("precision"):
        from hal.conformance.precision import compare_workload
        calib = "cuda" if device != "cuda" and infos.get("cuda") and infos["cuda"].available else None
        w = _workload(spec)
        if isinstance(w, tuple):
            p = _pair_precision(w, device, steps, calib)
        else:
            p = compare_workload(w, device=device, dtype=torch.float32, steps=steps,
                                 calibrate_with=calib).as_dict()
        p["verified"] = bool(info.available) and bool(p.get("verified", True))
        if note:
            p["note"] = note
            predicted = predicted_tf32(spec["device"], p.get("metrics") or [], spec.get("arch"))
            if predicted:
                p["tf32"] = predicted
        result["precision"] = p
    if spec.get("profile"):
        from hal.conformance.profiling import inference_load_matrix, profile_workload
        backend = hal.get_backend(device)
        w = _workload(spec)
        if isinstance(w, tuple):
            prof = _pair_profile(w, backend, steps, spec.get("out"), spec.get("fallback_ops") or ())
            prof["verified"] = bool(info.available)
            if note:
                prof["note"] = note
            result["profile"] = prof
            return result
        if getattr(w, "model", None) is None:
            w.build(backend.torch_device(), torch.float32, seed=0)
        prof = profile_workload(w, backend, steps=max(steps, 2), warmup=1, out_dir=spec.get("out"), mode="train",
                                fallback_ops=spec.get("fallback_ops") or ())
        if hasattr(w, "decode_step"):
            prof["inference"] = inference_load_matrix(w, backend, batches=(1,), prompt_lens=(16,), output_lens=(8,),
                                                      warmup=1, repeats=3)
        prof["verified"] = bool(info.available)
        if note:
            prof["note"] = note
        result["profile"] = prof
    return result


# -- program targets (scripts, -m modules, notebooks, file.py:func returning a callable / None) -------------
def _program_spec(request: dict, workdir: str, name: str, run_device: str, steps: Optional[int], **extra) -> tuple:
    """(spec path, result path) of one runtime child run of the program with a section hook."""
    kind = request["kind"]
    target = request["target"]
    if kind in ("script", "notebook"):
        target = os.path.abspath(target)
    elif kind == "func":
        path, _, fn = target.rpartition(":")
        target = os.path.abspath(path) + ":" + fn
    spec_path = os.path.join(workdir, f"{name}-spec.json")
    result_path = os.path.join(workdir, f"{name}-result.json")
    timeout = request.get("timeout") or RUN_TIMEOUT_S
    spec = {"target": target, "kind": kind, "args": [str(a) for a in request.get("args") or []], "steps": steps,
            "timeout": timeout, "eval_loop_seconds": min(EVAL_LOOP_SECONDS, timeout / 4), "run_device": run_device,
            "redirect_cuda": run_device != "cuda", "result_path": result_path, "mode": kind,
            "threads": request.get("threads"), "memory_limit_mb": request.get("memory_limit_mb"),
            "devices": request.get("devices"), "cwd": request.get("cwd") or os.getcwd(), "capture": False,
            "target_device": request.get("device"),
            "section_hooks": "hal.conformance.workload_audit:program_hooks", **extra}
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    return spec_path, result_path, spec


#: how many times a crashed profile run is run again. The ranks of a program audited rank by rank
#: (:func:`rendezvous_env`) run it again together when one of theirs crashed (:func:`ranks_agree`): a retry one rank
#: started alone met no peer, waited out the audit's timeout and reported a timeout, not the crash
#: (tests/fixtures/runtime/rank_crash_torchrun.py)
PROFILE_RETRIES = 2
#: the section runs of a program target, in the order every rank starts them (:func:`rendezvous_env`), the profile
#: run's retries last (every rank runs them together, :func:`ranks_agree`)
SECTION_RUNS = ("precision-reference", "precision-target", "profile") + tuple(
    f"profile-retry{k}" for k in range(1, PROFILE_RETRIES + 1))


def rendezvous_env(name: str, environ: Optional[dict] = None) -> dict:
    """The environment overrides of section run ``name`` of a program whose ranks are each audited on their own
    (``torchrun ... hal-audit``: ``$WORLD_SIZE`` > 1 and ``$MASTER_PORT`` in the environment): the ranks' runs of one
    kind meet at a rendezvous of their own, ``$MASTER_PORT`` plus the run's place in :data:`SECTION_RUNS` (plus one),
    hosted by rank 0's run (``TORCHELASTIC_USE_AGENT_STORE=False``), not at torchrun's store. There, the keys the
    audit's first run had left made the second run's ranks read stale addresses ("Gloo connectFullMesh failed ...
    Connection refused") and the runs after it hang. ``{}`` for a single process. Every rank runs the same sections
    in the same order, so their ports agree; a run one rank alone starts would meet no peer and end at its timeout,
    so a rank never starts one (a crashed profile run is run again only when the ranks agree: :func:`ranks_agree`)."""
    env = os.environ if environ is None else environ
    try:
        world, port = int(env.get("WORLD_SIZE", "1")), int(env["MASTER_PORT"])
    except (KeyError, ValueError):
        return {}
    if world < 2:
        return {}
    offset = SECTION_RUNS.index(name) + 1 if name in SECTION_RUNS else len(SECTION_RUNS) + 1
    return {"MASTER_PORT": str(port + offset), "TORCHELASTIC_USE_AGENT_STORE": "False"}


def _run_program(request: dict, workdir: str, name: str, run_device: str, steps: Optional[int], **extra) -> dict:
    from hal.conformance.runtime.runner import run_child
    spec_path, result_path, spec = _program_spec(request, workdir, name, run_device, steps, **extra)
    return run_child(spec_path, result_path, spec["timeout"],
                     env=dict(os.environ, PYTHONUNBUFFERED="1", **rendezvous_env(name)))


#: why a crashed profile run of a rank audited with its peers is not run again, for the report
NO_LONE_RETRY = ("not run again: this rank's runs meet the other ranks' at a rendezvous, and the ranks could not agree "
                 "on a retry through torchrun's store (a run started alone would meet no peer and wait out its "
                 "timeout)")
#: the key prefix of :func:`ranks_agree` in torchrun's store (apart from the program's own keys)
_AGREE_PREFIX = "hal-audit/profile-crashed"


def ranks_agree(attempt: int, crashed: bool, timeout_s: float, environ: Optional[dict] = None) -> Optional[list]:
    """The ranks whose profile run ``attempt`` crashed, every rank's answer read back, for the ranks of a program
    audited rank by rank under torchrun (:func:`rendezvous_env`): each publishes its own in a store at
    ``$MASTER_ADDR:$MASTER_PORT`` (torchrun's agent's where it shares it, ``$TORCHELASTIC_USE_AGENT_STORE``, as
    torch 2.13's does; else one rank 0's audit hosts there, free while no section run is on: torch 2.4.1's) and waits
    up to ``timeout_s`` for the others, so all decide alike whether to run it again; rank 0's store stays until every
    rank has read. None when no store can be reached or a peer did not answer in time: no retry then. Blocks;
    raises nothing."""
    env = os.environ if environ is None else environ
    try:
        import datetime

        world, rank = int(env["WORLD_SIZE"]), int(env["RANK"])
        store = _agreement_store(env, rank, timeout_s)
        wait = datetime.timedelta(seconds=timeout_s)
        base = f"{_AGREE_PREFIX}/{env.get('TORCHELASTIC_RUN_ID', '')}/{attempt}"
        store.set(f"{base}/{rank}", "1" if crashed else "0")
        store.wait([f"{base}/{r}" for r in range(world)], wait)
        crashed_ranks = [r for r in range(world) if store.get(f"{base}/{r}") == b"1"]
        store.set(f"{base}/read/{rank}", "1")
        if rank == 0:  # the store may be this process's: it stays until every rank has read the answers
            store.wait([f"{base}/read/{r}" for r in range(world)], wait)
        return crashed_ranks
    except Exception:  # no store there, a peer gone or late: the caller does not run it again
        return None


#: the agreement stores of this process, by (address, port, rank): made once, kept for the later attempts
_AGREE_STORES: dict = {}


def _agreement_store(env, rank: int, timeout_s: float):
    import datetime

    import torch.distributed as dist
    host, port = env.get("MASTER_ADDR", "localhost"), int(env["MASTER_PORT"])
    key = (host, port, rank)
    if key not in _AGREE_STORES:
        hosts = rank == 0 and env.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        _AGREE_STORES[key] = dist.TCPStore(host, port, is_master=hosts, wait_for_workers=False,
                                           timeout=datetime.timedelta(seconds=timeout_s))
    return _AGREE_STORES[key]


def _run_line(res: dict) -> dict:
    run = res.get("run") or {}
    return {k: run.get(k) for k in ("status", "error", "steps", "optimizer_steps", "backward_passes", "stopped_by",
                                    "seconds")} | {"output_tail": (run.get("output_tail") or [])[-5:]}


def _device_plan(device: str) -> tuple:
    """(backend info, run device type, note) for the target ``device``."""
    import hal
    infos = {i.name: i for i in hal.list_backends()}
    info = infos[device]
    dtype = info.cls.device_type if info.cls is not None else device
    run_device = dtype if info.available else "cpu"
    note = "" if info.available else (f"{device} is not present here ({info.reason}); measured on the CPU, "
                                      f"not on {device}")
    return info, run_device, note


def program_sections(request: dict, fallback_ops: list[str]) -> dict:
    """``{"precision", "profile"}`` for a program target (see the module docstring): each section is
    produced from its own bounded child runs, or says why it could not be (``verdict`` error)."""
    import shutil
    want_p, want_f = bool(request.get("precision")), bool(request.get("profile"))
    out_dir = request.get("out") or tempfile.mkdtemp(prefix="hal-audit-")
    os.makedirs(out_dir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix=".hal-sections-", dir=out_dir)
    info, run_device, note = _device_plan(request["device"])
    out: dict[str, Any] = {"precision": None, "profile": None}
    try:
        if want_p:
            out["precision"] = _program_precision(request, workdir, info, run_device, note)
        if want_f:
            import hal
            from hal.conformance.profiling.script import run_bound
            steps = request.get("steps") or PROGRAM_PROFILE_STEPS
            bound = run_bound(steps, hal.get_backend(run_device))
            def profile_run(name: str) -> dict:
                return _run_program(request, workdir, name, run_device, bound, profile_program=True,
                                    profile_steps=steps, out=out_dir, fallback_ops=list(fallback_ops))
            # torch.profiler itself crashes now and then collecting a session (SIGSEGV after profiler_stop, seen
            # on 2.4.1 and 2.13, about 1 run in 6 on a loaded box), in the child or in a worker it spawned: a crashed
            # run is run again, twice at most; ranks audited with their peers run it again together once they agree
            # (ranks_agree), never one alone (NO_LONE_RETRY)
            res, crashes = profile_run("profile"), []
            with_peers, agreed = bool(rendezvous_env("profile")), True
            while len(crashes) < PROFILE_RETRIES:
                mine = _crashed(res)
                ranks = ranks_agree(len(crashes), mine, float(request.get("timeout") or RUN_TIMEOUT_S)) if with_peers \
                    else ([0] if mine else [])
                if not ranks:  # none crashed (or, with peers, no agreement reached: not run again alone)
                    agreed = ranks is not None
                    break
                crashes.append((res.get("run") or {}).get("error") if mine else
                               f"rank(s) {', '.join(map(str, ranks))} crashed: run again with them")
                res = profile_run(f"profile-retry{len(crashes)}")
            prof = res.get("profile_run")
            if crashes and prof:
                prof.setdefault("not_measured", []).append(
                    f"{len(crashes)} profiled run(s) crashed before this one ({'; '.join(map(str, crashes))}); "
                    "these figures are from the last run")
            if not prof or (not prof.get("ops") and not prof.get("step_ms", {}).get("all")):
                why = "; ".join((prof or {}).get("not_measured") or []) or "no profile recorded"
                if with_peers and _crashed(res) and not agreed:
                    why += f"; {NO_LONE_RETRY}"
                failed = _run_failure(res)
                out["profile"] = {"verdict": "error", "verified": False, "run": _run_line(res),
                                  "error": f"{failed}nothing profiled: {why}",
                                  "not_measured": (prof or {}).get("not_measured"), "note": note}
            else:
                prof["verified"] = bool(info.available)
                prof["run"] = _run_line(res)
                prof["target_kind"] = request["kind"]
                if note:
                    prof["note"] = note
                out["profile"] = prof
    finally:
        if not os.environ.get("HAL_DEBUG"):
            shutil.rmtree(workdir, ignore_errors=True)
    return out


#: how ``torch.multiprocessing`` reports a spawned worker killed by a crash (``ProcessExitedException``)
_WORKER_CRASH = re.compile(r"terminated with signal SIG(SEGV|BUS|ABRT|ILL|FPE)\b")


def _crashed(res: dict) -> bool:
    """Whether a child run crashed: killed by a signal itself, or its program failed because a worker it spawned was
    (``mp.spawn``: "process 0 terminated with signal SIGSEGV", CI at 37fa699, the profile run of a DDP tutorial)."""
    run = res.get("run") or {}
    return run.get("status") == "crashed" or bool(_WORKER_CRASH.search(str(run.get("error") or "")))


def _run_failure(res: dict) -> str:
    """``"the program run <status>: <error>; "`` for a child result whose program failed, else ``""``: what a section
    that could not be produced says first."""
    run = res.get("run") or {}
    return f"the program run {run.get('status', 'crashed')}: {run.get('error')}; " if run.get("error") else ""


def _program_precision(request: dict, workdir: str, info: Any, run_device: str, note: str) -> dict:
    from hal.conformance.precision import thresholds as th
    from hal.conformance.precision.compare import _summary, _tensor_rows, _verdict
    from hal.conformance.precision.drift import drift_stats
    from hal.conformance.precision.result import json_safe
    import torch

    from hal.conformance.precision.script import SCRIPT_MAX_ELEMENTS, SEED
    # both runs open their compared window after the same number of optimizer steps (0: the first step; hal-audit
    # --precision-step N: N - 1), and run at least to the end of that step
    warm = int(request.get("precision_warm_steps") or 0)
    steps = request.get("steps") or max(PROGRAM_PRECISION_STEPS, warm + 1)
    samples = os.path.join(workdir, "reference-samples.pt")
    ref = _run_program(request, workdir, "precision-reference", "cpu", steps, precision_role="reference",
                       precision_samples=samples, precision_warm_steps=warm)
    ref_run = ref.get("precision_run") or {}
    missing = None
    if not os.path.exists(samples):
        r = ref.get("run") or {}
        missing = (f"the float64 reference run stored no samples ({r.get('status', 'crashed')}: "
                   f"{r.get('error') or ref_run.get('window_closed_by') or 'no module forward ran'}): "
                   "totals, gradients and parameters not compared; local (shadow) errors only")
    tgt = _run_program(request, workdir, "precision-target", run_device, steps, precision_role="target",
                       precision_samples=samples, reference_missing=missing, precision_warm_steps=warm,
                       precision_prime=bool(request.get("precision_prime")))
    pr = tgt.get("precision_run")
    if not pr or "rows" not in pr:
        run = tgt.get("run") or {}
        return {"verdict": "error", "verified": False, "note": note, "run": _run_line(tgt),
                "error": f"target run {run.get('status', 'crashed')}: {run.get('error') or 'no precision result'}"
                         + (f"; {'; '.join(tgt.get('hook_errors') or [])}" if tgt.get("hook_errors") else "")}
    rows = pr["rows"]
    if not [r for r in rows if r["kind"] == "op"]:
        # a program that ended before its first module forward (an import it lacks, a bad argument) says so first
        failed = _run_failure(tgt)
        return {"verdict": "error", "verified": False, "note": note, "run": _run_line(tgt),
                "error": f"{failed}no floating-point op ran inside a module forward: nothing to compare",
                "not_compared": pr.get("not_compared")}
    not_compared = list(pr.get("reasons") or []) + list(pr.get("not_compared") or [])
    ref_line, tgt_line = ref.get("run") or {}, tgt.get("run") or {}
    if tgt_line.get("status") not in (None, "ok"):
        error = " ".join(str(tgt_line.get("error") or "no error text").split())
        not_compared.insert(0, f"the target run ended early ({tgt_line.get('status')}: {error[:300]}): what it ran "
                               "before that is compared")
    if ref_line.get("status") not in (None, "ok") and ref_line.get("status") != tgt_line.get("status"):
        error = " ".join(str(ref_line.get("error") or "no error text").split())
        not_compared.insert(0, f"the float64 reference run ended early ({ref_line.get('status')}: {error[:300]}) while "
                               f"the target run was {tgt_line.get('status')}: totals only for the ops it reached")
    narrow = ref_run.get("narrow_params") or {}
    if narrow:
        names = ", ".join(f"{k} ({v})" for k, v in list(narrow.items())[:6]) + (" ..." if len(narrow) > 6 else "")
        not_compared.append(f"the float64 reference run kept {len(narrow)} optimizer parameter(s) in their own dtype: "
                            f"{names}. It converts a module's parameters at the first forward the program calls it "
                            "through (module(x)); these belong to none (a layer whose forward the program calls "
                            "directly, module.forward(x), as pytorch/examples mnist_forward_forward's, or a parameter "
                            "outside every module). Their gradients and updates are in that dtype in both runs: their "
                            "gradient and parameter rows check the ops that feed them, not the rounding of their own "
                            "accumulation and update (every op that reads them runs in float64 there)")
    lt, lr = pr.get("losses") or [], ref_run.get("losses") or []
    n = min(len(lt), len(lr))
    drift = None
    if missing is None and n and not any("differ" in x for x in pr.get("reasons") or []):
        same_data = _losses_on_same_inputs(pr, ref_run)
        if same_data is not None and same_data[0] < n:
            n, forward = max(1, same_data[0]), same_data[1]  # the window's own loss was checked with its inputs
            not_compared.append(f"loss curve: the inputs of top-level forward {forward} (after the compared window) "
                                "differ from the float64 reference run's (data order not reproducible, or an input "
                                f"the program computed outside its modules): the first {n} of {len(lt)} losses "
                                "compared")
        elif len(lt) != len(lr):
            not_compared.append(f"loss curve: {len(lt)} target vs {len(lr)} reference losses; the first {n} compared")
        drift = drift_stats(lt[:n], lr[:n])
        if pr.get("loss_steps"):  # the optimizer step of each loss, for where a drift starts (compare._verdict)
            drift["loss_steps"], drift["compared_step"] = [k + 1 for k in pr["loss_steps"][:n]], warm + 1
        compute = th.format_named(pr.get("compute_dtype")) or torch.float32
        # the compared step's loss (its first: the window's), not the run's first when steps were let pass before it
        k = next((i for i, s in enumerate((pr.get("loss_steps") or [])[:n]) if s == warm), 0)
        rows = rows + _tensor_rows("loss", [("loss", _t(lt[k], torch.float32), _t(lr[k], torch.float64))],
                                   compute, SCRIPT_MAX_ELEMENTS)
    elif not n:
        not_compared.append("loss curve: no backward pass ran (no loss to follow)" if not lt else
                            "loss curve: the reference recorded no loss")
    else:
        not_compared.append("loss curve: not compared (the reference run is not comparable, see above)")
    for r in rows:  # rows from the child are JSON already; the loss row is ours
        r.setdefault("inputs", [])
    compute_dtype = th.loosest([th.format_named((r.get("threshold") or {}).get("format") or r["dtype"])
                                for r in rows if r["kind"] == "op"])
    out = {"rows": rows, "first_divergence": pr.get("first_divergence"), "drift": drift}
    verdict, reasons = _verdict(out, compute_dtype) if drift else _verdict_local(out)
    summary = _summary(rows, pr.get("cache"))
    summary["verdict_reasons"] = reasons
    thresholds = th.thresholds_summary()
    thresholds["sampling"] = (f"op outputs over {SCRIPT_MAX_ELEMENTS} elements are compared on a fixed pseudo-random "
                              f"sample of {SCRIPT_MAX_ELEMENTS} positions (seeded by the element count)")
    section = {
        "reference": {"device": "cpu", "dtype": "float64", "run": "a second run of the same program (seed "
                      f"{SEED}, dropout off, every floating op in float64)", "status": _run_line(ref)},
        "target": {"device": run_device, "dtype": "as the program computes", "kind": request["kind"],
                   "steps": steps, "compared_window": pr.get("window_closed_by"),
                   "dropout_calls_disabled": pr.get("dropout_calls_disabled"), "status": _run_line(tgt),
                   "timing": pr.get("timing"),
                   "compute_dtype": th.format_name(compute_dtype),
                   "losses": "the value handed to GradScaler.scale (unscaled)" if pr.get("scaled_losses")
                   else "the value handed to backward()"},
        "metrics": rows, "first_divergence": pr.get("first_divergence"), "drift": drift,
        "calibration": None, "verdict": verdict, "thresholds": thresholds,
        "verified": bool(info.available), "summary": summary, "not_compared": not_compared, "tf32": pr.get("tf32"),
        "method": ("program target, no code change: the target run shadows every floating-point op in float64 on "
                   "its actual inputs (local error) and compares it with the float64 reference run's op of the same "
                   "(phase, module, op, occurrence) (total error)"),
    }
    if note:
        section["note"] = note
        section["tf32"] = predicted_tf32(request["device"], rows, request.get("arch")) or section["tf32"]
    return json_safe(section)


def predicted_tf32(backend: str, rows: list, arch: Optional[int] = None) -> Optional[str]:
    """The precision section's line for a target that is not here (measured on the CPU in float32): which of the
    compared float32 op outputs ``backend`` computes in TF32 by default (its manifest's ``tf32_defaults``), None when
    none. A prediction, and it says so."""
    import torch

    from hal.capabilities.tf32 import arch_gate, default_switch
    from hal.conformance.precision import thresholds as th
    from hal.conformance.precision.tracer import by_op
    seen: dict = collections.Counter()
    switches = set()
    for r in rows:
        flag = default_switch(backend, r["op"], arch) if r.get("kind") == "op" and r.get("dtype") == "float32" else None
        if flag is not None:
            seen[r["op"]] += 1
            switches.add(flag)
    if not seen:
        return None
    return (f"predicted, not measured: {backend} computes float32 convolutions or matmuls in TF32 by default"
            f"{arch_gate(backend, arch)} "
            f"({', '.join(f'{s} = True' for s in sorted(switches))}): {sum(seen.values())} float32 op output(s) "
            f"compared here in float32 would run in TF32 there, with errors of TF32's order (rtol "
            f"{th.base_tolerance(th.TF32)[0]:g}, float32's is {th.base_tolerance(torch.float32)[0]:g}); by op: "
            f"{by_op(seen)}")


def _losses_on_same_inputs(target: dict, reference: dict) -> Optional[tuple]:
    """``(k, f)`` when top-level forward ``f`` (1-based) is the first whose inputs differ between the two precision
    runs (their ``input_fps``): only the first ``k`` target losses (those recorded before it ran, by
    ``loss_forwards``) were computed on the same data. None when every fingerprinted forward matches."""
    from hal.conformance.precision.script import same_fingerprint
    fps_t, fps_r = target.get("input_fps") or [], reference.get("input_fps") or []
    first = next((i for i, (a, b) in enumerate(zip(fps_t, fps_r)) if not same_fingerprint(a, b)), None)
    if first is None:
        return None
    return sum(1 for f in target.get("loss_forwards") or [] if f <= first), first + 1


def _t(v: float, dtype: Any):
    import torch
    return torch.tensor([float(v)], dtype=dtype)


def _verdict_local(out: dict) -> tuple:
    """Verdict from local (shadow) errors only: no reference run to compare totals and drift with."""
    from hal.conformance.precision.compare import divergence_reason
    fd = out["first_divergence"]
    if fd is not None and fd["kind"] == "introduced":
        return "fail", [divergence_reason(fd)]
    reasons = ["compared against float64 shadows only (no comparable reference run)"]
    if fd is not None:
        reasons.append(divergence_reason(fd))
        return "warning", reasons
    return "pass", reasons


def section_summary(report: dict) -> list[str]:
    """Terminal lines for the precision and profile sections of a report (one or two each): the
    verdict and first divergence, the step times, or why the section could not be produced."""
    from hal.conformance.report import escape
    from hal.conformance.report.digest import largest_divergence_reasons, unexplained_verdict_reasons
    esc = escape.terminal
    lines = []
    p = report.get("precision")
    if isinstance(p, dict):
        if p.get("verdict") in ("not-run", "error"):
            lines.append(f"precision: NOT PRODUCED ({esc(p.get('reason') or p.get('error') or 'no reason given')})")
        else:
            fd = p.get("first_divergence")
            where = (f"first divergence {esc(fd.get('module'))}:{esc(fd.get('op'))} ({esc(fd.get('kind'))}, "
                     f"{esc(fd.get('phase'))})" if fd else "no divergence")
            reasons = unexplained_verdict_reasons(p) or largest_divergence_reasons(p)
            if reasons:  # not pass, yet no op diverged: say why; or where the error is largest, when not there
                where += f" ({esc('; '.join(reasons))})"
            lines.append(f"precision: {esc(p.get('verdict'))}, {where}"
                         + ("" if p.get("verified") else " [measured on the CPU, not on the target]"))
            if p.get("tf32"):
                lines.append(f"  TF32: {esc(p['tf32'])[:300]}")
            if p.get("not_compared"):
                lines.append(f"  not compared: {esc('; '.join(p['not_compared'])[:300])}")
    f = report.get("profile")
    if isinstance(f, dict):
        if f.get("verdict") in ("not-run", "error"):
            lines.append(f"profile: NOT PRODUCED ({esc(f.get('reason') or f.get('error') or 'no reason given')})")
        else:
            step = f.get("step_ms") or {}
            prof = f.get("profiled_step_ms") or {}
            med = step.get("median") if isinstance(step, dict) else step
            pmed = prof.get("median") if isinstance(prof, dict) else prof
            hot = ", ".join(esc(h) for h in (f.get("hotspots") or [])[:3])
            lines.append(f"profile: step {_ms(med)} ms, profiled {_ms(pmed)} ms, hot spots {hot or '-'}"
                         + ("" if f.get("verified") else " [measured on the CPU, not on the target]"))
            for note in f.get("notes") or []:
                lines.append(f"  note: {esc(note)[:300]}")
            if f.get("not_measured"):
                lines.append(f"  not measured: {esc('; '.join(f['not_measured'])[:300])}")
    return lines


def _ms(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, (int, float)) else "-"


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        spec = json.load(f)
    from hal.conformance.runtime.runner import apply_memory_limit
    apply_memory_limit(spec.get("memory_limit_mb"))
    try:
        result = _child(spec)
        result["run"] = {"status": "ok", "steps": spec.get("steps") or 2, "error": None}
    except _ProgramTarget:
        result = {"program_target": True, "run": {"status": "ok", "steps": 0, "error": None}}
    except BaseException as exc:  # the workload's failure is reported, never raised at the parent
        traceback.print_exc()
        result = {"run": {"status": "error", "steps": 0, "error": f"{type(exc).__name__}: {exc}"[:2000]}}
    tmp = spec["result_path"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, default=str)
    os.replace(tmp, spec["result_path"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
