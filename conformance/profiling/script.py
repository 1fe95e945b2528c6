"""Profile of a whole program (script, ``-m`` module, notebook, ``file.py:func``) with no code change.

Runs inside the audit's child (:mod:`hal.conformance.runtime.child`) as a hook, like
:mod:`hal.conformance.precision.script`. The program's own loop is the step: a step ends at each
optimizer step (post-hook) of the first optimizer to step (a GAN's discriminator and generator steps are one
step; the run's bound moves one optimizer step further for each of the others'); in a program that builds no
optimizer, at each backward pass; in one that
runs no backward either, at the end of each top-level forward. The first step starts at the first
top-level forward. Schedule over the bounded run (``P`` = ``profile_steps``):

1. step 1: warm-up (untimed);
2. steps 2 .. 1+P: plain steps (only the step-boundary hooks), for the overhead ratio; on an
   accelerator the backend's peak memory over these steps;
3. step 2+P: profiler warm-up (the timed steps' profiler runs, its record is dropped, as
   torch.profiler's ``schedule(warmup=1)`` does: the first step of a session carries its start-up, on
   the CPU 2-3x a plain step of word_language_model, which with P = 2 made the median profiled step
   2.5x the plain one); ``W`` = 1 on an accelerator and where P >= 2, else 0 (on the CPU with P = 1 the
   one profiled step carries it: a notebook's three-step loop is still profiled); ``D`` = 1 on an
   accelerator, 0 on the CPU;
4. steps 2+P+W .. 1+2P+W: timed steps under ``torch.profiler``, cheap configuration (no shapes, stacks
   or memory). On the CPU they record the CPU activity: per-op host time, runtime sync calls, the
   Chrome trace ``trace.json`` (taken when the profiler stops, at a step boundary, outside every
   timed step). On an accelerator they record the backend's device activity only (kernels,
   memcpy events: the CPU activity's operator events are most of the profiler's cost on a
   host-bound step), and
5. step 2+2P+W (accelerator only): the attribution step (untimed), CPU and device activities: per-op
   calls and host time, runtime sync calls, ``trace.json``, and the kernel -> op links that give
   each op its device time of the timed steps (:mod:`.attribution`);
6. step 2+2P+W+D: analysis (untimed): FlopCounterMode and a dispatch tally for FLOPs, bytes and dtype
   per op, host-device copies and sync points located by module and source line
   (:mod:`.analysis`), and on the CPU the memory peak (torch.profiler ``profile_memory``).

Plain steps come before any profiler has run: steps after a profiler stopped measured up to 3x
slower here (nanoGPT on the CPU), which would understate the overhead. A short program (a
notebook's three-step loop) still gets plain and profiled steps; what it missed is listed.

Every step boundary synchronises the backend and reads the host clock (inside the profiler, under
the harness range, so the sync is not counted as the program's). A program that ends before the
schedule is done gets what was measured and, for the rest, a reason in ``not_measured``.
Not thread-safe: one instance per child process.
"""
from __future__ import annotations

import os
import statistics
import time
import weakref
from typing import Any, Dict, List, Optional

import torch

SCHEDULE = ("warm-up", "plain", "profiler warm-up", "profiled", "attribution", "analysis")  # 3rd: see W; 5th: accelerator only


def device_timed(backend: Any) -> bool:
    """Whether the profile's timed steps on ``backend`` record its device activity (then an attribution step
    joins the schedule)."""
    from .profiler import _activities
    return len(_activities(backend)[0]) > 1


def run_bound(profile_steps: int, backend: Any) -> int:
    """Steps the profile run of a program on ``backend`` needs (:data:`SCHEDULE`): the bound the audit puts
    on that run. 2 + 2P + W on the CPU (W = 1 where P >= 2), 4 + 2P on an accelerator."""
    dev = int(device_timed(backend))
    return 2 + 2 * int(profile_steps) + profiler_warmup_steps(profile_steps, bool(dev)) + dev


def profiler_warmup_steps(profile_steps: int, device: bool) -> int:
    """``W`` of the schedule: 1 on an accelerator and where ``profile_steps`` >= 2, else 0."""
    return int(device or int(profile_steps) >= 2)


_RUNTIME_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime")


def _library_dirs() -> tuple:
    import sysconfig
    return tuple(sorted({p for p in (sysconfig.get_paths().get(k) for k in ("purelib", "platlib", "stdlib"))
                         if p}))


#: installed libraries and the standard library: a copy inside numpy.memmap is located at the user's line
_LIBRARY_DIRS = _library_dirs()


def _user_line() -> tuple:
    """(file, line) of the innermost frame of the program itself: outside torch, this package, the
    audit's runtime wrappers, the standard library and installed packages (numpy.memmap ...)."""
    import traceback
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    skip = (torch_dir, os.path.dirname(os.path.abspath(__file__)), _RUNTIME_DIR, *_LIBRARY_DIRS)
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if path.startswith(skip) or frame.filename.startswith("<") or os.sep + "site-packages" + os.sep in path \
                or os.sep + "dist-packages" + os.sep in path:
            continue
        return frame.filename, int(frame.lineno or 0)
    return "-", 0


def _program_tally_cls():
    from .analysis import _in_backward, _OpTally

    class _ProgramTally(_OpTally):
        """The analysis tally; source lines skip the audit's own runtime wrappers (the redirect)."""

        def _where(self):
            module = self.modules.stack[-1] if self.modules.stack else ("<backward>" if _in_backward() else "-")
            return module, *_user_line()
    return _ProgramTally


#: plain steps are unsteady (a one-time cost in one of them, not noise) when the slowest took more than UNSTEADY times
#: the fastest and UNSTEADY_MS more: a lazy initialisation, autotuning or a recompile costs tens of milliseconds and
#: more (H100, the sparse graph fixture: 156 ms against 5.4), where a loaded 2-core CPU's noise reached 2.1x (3.95 and
#: 8.34 ms, torch 2.4.1 CI leg)
UNSTEADY, UNSTEADY_MS = 3.0, 20.0


def unsteady(steps_ms) -> bool:
    """Whether plain step times (ms) carry a one-time cost (:data:`UNSTEADY`, :data:`UNSTEADY_MS`)."""
    return bool(steps_ms) and max(steps_ms) > UNSTEADY * min(steps_ms) and max(steps_ms) - min(steps_ms) > UNSTEADY_MS


class ProgramProfile:
    """The profile hook of one audit child (see the module docstring). ``spec`` keys:
    ``run_device``, ``profile_steps`` (P, default 2), ``out`` (folder for trace.json),
    ``fallback_ops``."""

    def __init__(self, spec: dict, modules: Any, limiter: Any = None) -> None:
        import hal
        self.spec = spec
        self.modules = modules
        self.limiter = limiter
        self.P = int(spec.get("profile_steps") or 2)
        self.backend = hal.get_backend(spec.get("run_device") or "cpu")
        self.device = self.backend.torch_device()
        from .profiler import _activities
        self.acts, self.act_names, self.act_note = _activities(self.backend)
        #: timed steps record the device activity only, an attribution step follows them (module docstring)
        self.device_timed = device_timed(self.backend)
        self.W = profiler_warmup_steps(self.P, self.device_timed)
        self.step = 0          # completed steps
        self.started = False
        self.t_last = 0.0
        self.plain: List[float] = []
        self.profiled: List[float] = []
        self.first_ms: Optional[float] = None
        self.prof = None          # the profiler of the timed steps, then of the attribution step
        self.timed_events: Any = None
        self.recorded: Optional[dict] = None
        self.analysis: Optional[dict] = None
        self.memory: Optional[dict] = None
        self._modes: list = []
        self._mem_prof = None
        self._keep: list = []  # profilers kept alive until the process ends (see _end_analysis)
        self._baseline = 0
        self.roots: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()
        self.optimizers: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()
        self.backwards = 0
        self._depth = 0
        self._handles: list = []
        self._saved: list = []
        self.errors: List[str] = []
        self.step_kind: Optional[str] = None
        #: the first optimizer to finish a step: a step is one of its cycles (lead step to lead step), so a GAN's
        #: discriminator and generator steps are one step, not two steps of different work each
        self._lead: Optional[weakref.ref] = None
        #: optimizer steps in the latest cycle of the lead optimizer (theirs included; None: no cycle yet)
        self.optimizer_steps_per_step: Optional[int] = None
        self._cycle_steps = 0
        self.est: Optional[dict] = None  # taken while the program's objects are alive (at the end they are gone)

    # -- install --------------------------------------------------------------------------------
    def install(self) -> None:
        from torch.nn.modules import module as m
        from torch.optim import optimizer as o
        self._handles = [m.register_module_forward_pre_hook(self._pre),
                         m.register_module_forward_hook(self._post),
                         o.register_optimizer_step_pre_hook(self._opt_pre),
                         o.register_optimizer_step_post_hook(self._opt_post)]
        real_backward = torch.autograd.backward
        owner = self

        def backward(*a, **k):
            out = real_backward(*a, **k)
            owner.backwards += 1
            if not owner._optimizers_built():
                owner._tick("backward passes")
            return out
        backward.__wrapped__ = real_backward  # type: ignore[attr-defined]
        self._saved.append((torch.autograd, "backward", real_backward))
        torch.autograd.backward = backward

    def disown(self) -> None:
        """Called in a process the program forked from this one (a DataLoader worker, a fork-started
        ``multiprocessing`` process; see :func:`~hal.conformance.runtime.sections.install_hooks`): its global hooks and
        its ``backward`` patch are taken back there, so a forked process's steps start no profiler and count no step.
        Only the forked process's copy of this object changes."""
        from hal.conformance.runtime.sections import take_back
        take_back(self._handles, self._saved)

    def _optimizers_built(self) -> int:
        return int(getattr(self.limiter, "optimizers_built", 0) or len(self.optimizers))

    def _pre(self, module: torch.nn.Module, _args: Any) -> None:
        if self._depth == 0:
            self.roots.add(module)
            if not self.started:
                self.started = True
                self._sync()
                self.t_last = time.perf_counter()
        self._depth += 1

    def _post(self, module: torch.nn.Module, _args: Any, _out: Any) -> None:
        if self._depth:
            self._depth -= 1
        if self._depth == 0 and not torch.is_grad_enabled() and not self._optimizers_built() and not self.backwards:
            self._tick("forward passes")

    def _opt_pre(self, opt: Any, _a: Any, _k: Any) -> None:
        """Another optimizer than the lead steps: that step is part of the lead's cycle, so the run's step bound
        (optimizer steps, :class:`~hal.conformance.runtime.stepping.StepLimiter`, whose post-hook counts it) moves
        one further: the schedule's steps are cycles."""
        lead = self._lead() if self._lead is not None else None
        if lead is not None and opt is not lead and getattr(self.limiter, "limit", None) is not None:
            self.limiter.limit += 1

    def _opt_post(self, opt: Any, _a: Any, _k: Any) -> None:
        self.optimizers.add(opt)
        if self._lead is None:
            self._lead = weakref.ref(opt)
        self._cycle_steps += 1
        if self._lead() is opt:
            if self.step:  # the first lead step ends the warm-up step, whatever came before it
                self.optimizer_steps_per_step = self._cycle_steps
            self._cycle_steps = 0
            self._tick("optimizer steps")

    # -- the schedule ---------------------------------------------------------------------------
    def _sync(self) -> None:
        try:
            self.backend.synchronize()
        except Exception:  # a backend without a device context yet: the host clock alone
            pass

    def _tick(self, kind: str) -> None:
        if not self.started:
            return
        self.step_kind = self.step_kind or kind
        if self.prof is not None:
            from .profiler import HARNESS_RANGE
            with torch.profiler.record_function(HARNESS_RANGE):
                self._sync()
        else:
            self._sync()
        now = time.perf_counter()
        ms = (now - self.t_last) * 1e3
        self.step += 1
        phase = self._phase(self.step)  # the step that just ended
        try:
            if phase == "warm-up":
                self.first_ms = ms
                self.est = self._estimate()
            elif phase == "analysis":
                self._end_analysis()
            elif phase == "profiler warm-up" and self.prof is not None:
                self.prof.step()
            elif phase == "profiled":
                self.profiled.append(ms)
                if self.prof is not None:
                    self.prof.step()  # the last one ends the schedule's cycle: _timed_ready
                if len(self.profiled) == self.P:
                    self._end_profiler()
            elif phase == "attribution":
                self._end_attribution()
            elif phase == "plain":
                self.plain.append(ms)
                if len(self.plain) == self.P:
                    self._end_memory_device()
            nxt = self._phase(self.step + 1)
            if nxt == "analysis":
                self._begin_analysis()
            elif nxt == "attribution" and self.timed_events is not None:
                self._begin_attribution()
            elif nxt in ("profiler warm-up", "profiled") and self.prof is None and not self.profiled:
                self._begin_profiler()
            elif nxt == "plain" and not self.plain:
                self._begin_memory_device()
        except Exception as exc:  # a profiler failure is reported, never the program's problem
            self.errors.append(f"{phase} step {self.step}: {type(exc).__name__}: {exc}"[:400])
        self._sync()
        self.t_last = time.perf_counter()

    def _phase(self, n: int) -> Optional[str]:
        P, W, dev = self.P, self.W, int(self.device_timed)  # on the CPU: no attribution step
        if n == 1:
            return "warm-up"
        if 2 <= n <= 1 + P:
            return "plain"
        if W and n == 2 + P:
            return "profiler warm-up"
        if 2 + P + W <= n <= 1 + 2 * P + W:
            return "profiled"
        if dev and n == 2 + 2 * P + W:
            return "attribution"
        if n == 2 + 2 * P + W + dev:
            return "analysis"
        return None

    def _begin_analysis(self) -> None:
        from torch.utils.flop_counter import FlopCounterMode

        from .analysis import _extra_flop_formulas
        _ProgramTally = _program_tally_cls()
        self._flops = FlopCounterMode(display=False, custom_mapping=_extra_flop_formulas())
        self._tally = _ProgramTally(self.modules, True)
        if self.device.type == "cpu":
            from torch.profiler import ProfilerActivity, profile

            from hal.models.measure import live_tensor_bytes
            self._baseline = live_tensor_bytes(*self._live())
            self._mem_prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._mem_prof.__enter__()
        self._flops.__enter__()
        self._tally.__enter__()
        self._modes = [self._tally, self._flops]

    def _end_analysis(self) -> None:
        from .analysis import _locations, op_name
        for mode in self._modes:
            mode.__exit__(None, None, None)
        self._modes = []
        flops: Dict[str, int] = {}
        for packet, n in self._flops.get_flop_counts().get("Global", {}).items():
            flops[op_name(packet)] = flops.get(op_name(packet), 0) + int(n)
        for name, rec in self._tally.ops.items():
            rec["flops"] = flops.get(name, 0)
        t = self._tally
        self.est = self._estimate()
        self.analysis = {"ops": t.ops,
                         "copies": {"count": sum(t.copies.values()), "bytes": t.copy_bytes,
                                    "locations": _locations(t.copies)},
                         "syncs": {"count": sum(t.syncs.values()), "bytes": 0, "locations": _locations(t.syncs)}}
        if self._mem_prof is not None:
            from hal.models.measure import _allocator_peak_delta
            self._mem_prof.__exit__(None, None, None)
            peak, _ = _allocator_peak_delta(self._mem_prof)
            self._hold(self._mem_prof)
            self._mem_prof = None
            self.memory = {"peak_bytes": self._baseline + peak, "baseline_bytes": self._baseline,
                           "source": "live tensors of the program's modules and optimizers before the analysis "
                                     "step + peak net CPU allocator allocations in it (torch.profiler "
                                     "profile_memory)"}

    def _hold(self, prof: Any) -> None:
        """Keep a stopped profiler alive until the child's ``os._exit``, and stop the cycle collector for the rest of
        the run: on torch 2.4.1 collecting a ``profile_memory`` profiler that was stopped inside an optimizer hook
        segfaulted (3 runs in 5), and with the profilers kept, the collector still segfaulted collecting the garbage
        a stopped session leaves (torch 2.13, 2026-12-05: 7 crashed profile runs in 15 of a ``-m`` package target,
        each time in a collection at the child's end; none in 12 with the collector off). The rest of the run is
        untimed (the analysis step and the result), and short: the run is bounded."""
        import gc
        self._keep.append(prof)
        gc.disable()

    def _begin_profiler(self) -> None:
        """The timed steps' profiler: it starts one step early (with ``W``), the profiler warm-up step
        (torch.profiler's ``schedule(warmup=1)``: the tracer runs, its record is dropped; the first step of a
        session carries its start-up), and hands its cycle to :meth:`_timed_ready`. On an accelerator it records
        the device activity alone."""
        from torch.profiler import profile, schedule
        self.prof = profile(activities=self.acts[1:] if self.device_timed else self.acts,
                            schedule=schedule(wait=0, warmup=self.W, active=self.P, repeat=1),
                            on_trace_ready=self._timed_ready)
        self.prof.start()

    def _timed_ready(self, prof: Any) -> None:
        """The timed steps' profile: on the CPU it is the record; on an accelerator its device events wait
        for the attribution step."""
        if self.device_timed:
            self.timed_events = prof.events()
        else:
            self._record(prof, None)

    def _end_profiler(self) -> None:
        prof, self.prof = self.prof, None
        prof.stop()  # a cycle cut short by the program's end reaches _timed_ready here
        self._hold(prof)

    def _begin_attribution(self) -> None:
        from torch.profiler import profile
        self.prof = profile(activities=self.acts)
        self.prof.start()

    def _end_attribution(self) -> None:
        from .profiler import device_split
        prof, self.prof = self.prof, None
        prof.stop()
        self._hold(prof)
        self._record(prof, device_split(self.timed_events, prof.events()))

    def _record(self, prof: Any, device: Optional[dict]) -> None:
        from .profiler import TRACE_FILE, _runtime_syncs
        self.recorded = {"averages": prof.key_averages(), "runtime_syncs": _runtime_syncs(prof.events()),
                         "device": device}
        out = self.spec.get("out")
        if out:
            os.makedirs(out, exist_ok=True)
            prof.export_chrome_trace(os.path.join(out, TRACE_FILE))
            self.recorded["trace"] = TRACE_FILE

    def _begin_memory_device(self) -> None:
        if self.device.type != "cpu":
            try:
                self.backend.reset_peak_memory_stats(self.device)
            except Exception as exc:
                self.memory = {"peak_bytes": None, "source": f"not measured: {type(exc).__name__}: {exc}"}

    def _end_memory_device(self) -> None:
        if self.device.type != "cpu" and self.memory is None:
            stats = self.backend.memory_stats(self.device)
            self.memory = {"peak_bytes": int(stats.peak), "baseline_bytes": None,
                           "source": f"{self.backend.name} backend memory_stats().peak over the plain steps "
                                     f"({stats.source})"}

    def _live(self) -> list:
        return [*list(self.roots), *list(self.optimizers)]

    # -- result ---------------------------------------------------------------------------------
    def _estimate(self) -> dict:
        seen, params, grads = set(), 0, 0
        for m in list(self.roots):
            for p in m.parameters():
                if id(p) in seen:
                    continue
                seen.add(id(p))
                params += p.numel() * p.element_size()
                if p.requires_grad:
                    grads += p.numel() * p.element_size()
        state = 0
        for opt in list(self.optimizers):
            for st in opt.state.values():
                for v in st.values():
                    if isinstance(v, torch.Tensor):
                        state += v.numel() * v.element_size()
        return {"total_bytes": params + grads + state, "params_bytes": params, "grads_bytes": grads,
                "optimizer_state_bytes": state, "lower_bound": True,
                "activations": "not estimated for a program target (no model config): the estimate is "
                               "parameters + gradients + optimizer state, a lower bound of the peak"}

    def result(self) -> dict:
        """JSON-ready ``{"profile_run": ...}`` for the child's result file."""
        for mode in self._modes:  # the program ended inside the analysis step
            try:
                mode.__exit__(None, None, None)
            except Exception:
                pass
        self._modes = []
        if self.prof is not None:  # the program ended inside the timed or the attribution steps
            try:
                self._end_attribution() if self.timed_events is not None else self._end_profiler()
            except Exception as exc:
                self.errors.append(f"profiler stop: {type(exc).__name__}: {exc}"[:400])
        return {"profile_run": self._section()}

    def _section(self) -> dict:
        from hal.backend import dtype_name  # noqa: F401 - keeps the import light at install time

        from .profiler import (_host_device_bandwidth, _op_rows, annotate_rows, definitions, device_attribution,
                               overhead_note)
        from .roofline import resolve_peaks
        not_measured: List[str] = []
        attr = int(self.device_timed)
        need = 2 + 2 * self.P + self.W + attr
        if self.step < need:
            lim = self.limiter
            trained = lim is not None and (getattr(lim, "optimizer_steps", 0) or getattr(lim, "backward_passes", 0))
            if trained and getattr(lim, "stopped_by", None) == "forward passes":
                # an evaluation or generation loop between training steps that outlasted its time bound (the
                # precision and profile runs' StepLimiter.eval_seconds): more iterations of the program would not help
                bound = getattr(lim, "eval_seconds", None)
                ended = (f"the audit stopped the program after {self.step} step(s): {lim.eval_forwards} forward "
                         f"passes without grad followed training step {trained} (an evaluation or generation loop), "
                         + (f"longer than this run allows such a loop ({bound:g} s)" if bound is not None else
                            f"more than this run allows ({lim.limit})"))
                advice = "a program argument that shortens or skips that loop"
            else:
                ended = f"the program ended after {self.step} step(s) ({self.step_kind or 'none counted'})"
                advice = "pass more iterations to the program or a larger --steps"
            not_measured.append(f"{ended}; the schedule needs {need} (1 warm-up, {self.P} plain, "
                                f"{'1 profiler warm-up, ' if self.W else ''}{self.P} profiled, "
                                f"{'1 attribution, ' if attr else ''}1 analysis): {advice}")
        if not self.started:
            not_measured.append("no module forward ran: nothing to profile")
        has_device = False
        rows: list = []
        runtime_syncs: dict = {}
        runtime = {"memcpy_events": 0, "memcpy_names": {}}
        act_names = self.act_names
        device = (self.recorded or {}).get("device")
        if self.recorded is not None:
            has_device = len(act_names) > 1
            rows, runtime = _op_rows(self.recorded["averages"], sum(self.profiled), device)
            runtime_syncs = self.recorded["runtime_syncs"]
        elif self.timed_events is not None:
            not_measured.append("per-op times: the attribution step (which links kernels to ops) did not complete")
        else:
            not_measured.append("per-op times: no profiled step completed")
        analysis = self.analysis or {"ops": {}, "copies": {"count": None, "locations": []},
                                     "syncs": {"count": None, "locations": []}}
        if self.analysis is None:
            not_measured.append("FLOPs, bytes, copies and syncs by source line: the analysis step did not complete")
        dtypes = {r["dtype"] for r in analysis["ops"].values() if r.get("dtype")}
        peaks, peaks_source = resolve_peaks(self.backend, dtypes, measure=bool(rows))
        n = max(1, len(self.profiled))
        annotate_rows(rows, analysis, peaks, has_device, n)
        fb_names = set(self.spec.get("fallback_ops") or ())
        fb_rows = [r for r in rows if r["op"] in fb_names]
        for r in rows:
            r["fallback"] = r["op"] in fb_names
        bw, bw_note = _host_device_bandwidth(self.backend, peaks) if fb_rows else (0.0, "no fallback ops")
        fb_bytes = sum(r["bytes"] or 0 for r in fb_rows)
        est = self.est if self.est is not None else self._estimate()
        mem = dict(self.memory or {"peak_bytes": None, "source": "not measured: the memory step did not complete"})
        peak = mem.get("peak_bytes")
        memory = {"estimate_bytes": est["total_bytes"], "peak_bytes": peak,
                  "error_pct": (100.0 * (est["total_bytes"] - peak) / peak) if peak else None,
                  "items": {k: v for k, v in est.items() if k.endswith("_bytes") and k != "total_bytes"},
                  "lower_bound": True, "peak_source": mem.get("source"), "baseline_bytes": mem.get("baseline_bytes"),
                  "estimate_detail": {"activations": est["activations"]}}
        plain_med = statistics.median(self.plain) if self.plain else None
        prof_med = statistics.median(self.profiled) if self.profiled else None
        ratio = (prof_med / plain_med) if prof_med and plain_med else None
        notes: List[str] = []
        if not self.plain:
            not_measured.append("plain step time (overhead ratio): no plain step completed")
        elif ratio is not None and unsteady(self.plain):
            # a one-time cost in a timed step (the program's own warm-up outlasting its first step): the median of a
            # few steps carries it, the fastest does not
            ratio = min(self.profiled) / min(self.plain)
            notes.append(f"the plain steps took {min(self.plain):.3g} to {max(self.plain):.3g} ms: the program was "
                         "still warming up in its first timed steps (lazy initialisation, autotuning, recompilation); "
                         "the overhead ratio divides the fastest profiled step by the fastest plain step, not the "
                         "medians; more --steps give steadier medians")
        props = self.backend.device_properties(0)
        return {
            "device": props.name or self.backend.name, "backend": self.backend.name,
            "activities": act_names,
            "activity_note": self.act_note or ("device activity recorded" if has_device else
                                               "CPU only: device_ms is null, host self time is the op time"),
            "steps": len(self.profiled), "warmup": 1, "step_kind": self.step_kind,
            "optimizer_steps_per_step": self.optimizer_steps_per_step,
            "step_ms": {"median": plain_med, "all": self.plain, "min": min(self.plain) if self.plain else None},
            "profiled_step_ms": {"median": prof_med, "all": self.profiled,
                                 "min": min(self.profiled) if self.profiled else None},
            "first_step_ms": self.first_ms,
            "overhead_ratio": ratio, "notes": notes,
            "ops": rows, "hotspots": [r["op"] for r in rows[:10]],
            "copies": dict(analysis["copies"], profiler_memcpy_events=runtime["memcpy_events"],
                           profiler_memcpy=runtime["memcpy_names"]),
            "syncs": dict(analysis["syncs"], runtime_calls=sum(runtime_syncs.values()), runtime=runtime_syncs),
            "fallback": {"ms_per_step": sum((r["device_ms"] if has_device else r["self_ms"]) or 0 for r in fb_rows) / n,
                         "copy_ms_per_step": (fb_bytes / bw * 1e3) if bw else 0.0, "copy_bytes_per_step": fb_bytes,
                         "bandwidth_bytes_per_s": bw or None, "bandwidth_source": bw_note,
                         "ops": sorted(r["op"] for r in fb_rows),
                         "not_seen": sorted(fb_names - {r["op"] for r in fb_rows})},
            "memory": memory,
            "roofline": {"peaks": peaks, "peaks_source": peaks_source, "dtypes": sorted(dtypes),
                         "missing": sorted(f"flops_per_s.{d}" for d in dtypes if f"flops_per_s.{d}" not in peaks)},
            "trace": (self.recorded or {}).get("trace"),
            "schedule": {"warmup_steps": 1, "analysis_steps": 1, "profiled_steps": self.P, "plain_steps": self.P,
                         "profiler_warmup_steps": self.W,
                         "attribution_steps": attr,
                         "completed_steps": self.step,
                         "step": "the program's own iteration, ended by its optimizer step (else its backward, "
                                 "else its top-level forward); the first starts at the first top-level forward"},
            "timing": {"method": "host clock at each step boundary after backend.synchronize()", "warmup": 1,
                       "repeats": self.P, "statistic": "median"},
            "overhead_note": overhead_note(self.device_timed) + "; on the CPU the memory peak from the analysis step too",
            "device_attribution": device_attribution(device, act_names[1:] if self.device_timed else act_names),
            "not_measured": not_measured, "errors": self.errors,
            "definitions": dict(definitions(device), step_ms="plain step time of the program's own loop between step "
                                "boundaries (see schedule.step), synchronised, after warm-up and analysis"),
        }
