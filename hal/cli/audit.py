"""``hal-audit``: audit a CUDA program for a target backend (DESIGN.md section 4, the contract).

    hal-audit TARGET [options] [-- ARGS passed to the audited script]

TARGET is a ``.py`` file (static audit of the file, then run as a script unless ``--static-only``),
``file.py:func`` (static audit of the file; ``func()`` returns the workload to run), a folder
(static audit of every ``.py`` below it), a reference model name (``gpt``) or a ``.onnx`` file.
The run part is :mod:`hal.conformance.runtime` (behind :func:`_run_dynamic`); when it is not
installed the run is recorded as skipped and the static findings are still written.

Progress goes to stderr while the audit works (phases scan, run, capture, predict, precision,
profile, write; the steps and ops the run has seen so far) only when stderr is a terminal and
``--quiet`` is not given (:mod:`hal.cli.progress`); it is cleared before anything is printed.

Reports go through the one writer (:mod:`hal.conformance.report`) into ``--out`` (default
``./hal-audit-out``): ``audit.json`` always, ``audit.md``, ``audit.html``, ``audit.sarif``, and
``migration.patch`` with ``--fix``. Nothing is written outside ``--out``; audited files are never
edited.

Exit codes (checked in this order): 2 bad input or usage (one line on stderr, no report);
3 the audited program failed (run.status error, timeout or crashed; the report is written), or a
requested section (--precision, --profile) could not be produced (its verdict is "not-run" or
"error", the reason in the report);
1 a ``--fail-on`` condition holds: ``finding`` = at least one error-severity finding,
``fallback`` = at least one op with status ``fallback``, ``precision`` = precision.first_divergence
is not null or precision.verdict is "fail"; 0 otherwise. Interrupted: 130 (Ctrl-C) and 143 (SIGTERM). While the
audited program runs, an interrupt stops it as the timeout does and the report is still written with what ran
until then (``run.status`` "error", ``run.interrupted`` the signal; a --precision/--profile section not reached is
"not-run", the reason saying so). An interrupt at any other moment, or a second one while the program stops, kills
the audit's child processes and writes no report.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from typing import Optional

from hal.commandline import (EXIT_FAIL_ON, EXIT_INTERRUPTED, EXIT_OK, EXIT_PROGRAM_FAILED, EXIT_TERMINATED, CliError, DefaultsHelpFormatter, Parser, add_version, check_number,
                            emit, run_cli)
from hal.cli.outlock import OutBusyError, out_lock
from hal.cli.progress import AUDIT_PHASES, make_progress

PROG = "hal-audit"
DEFAULT_OUT = "hal-audit-out"
FAILED_RUN = ("error", "timeout", "crashed")
#: verdicts of a requested --precision / --profile section that could not be produced (exit 3)
SECTION_NOT_PRODUCED = ("not-run", "error")
#: bounds of the numeric options (finite, inclusive): a run of at most ~11.5 days, 1e9 steps, 1 PB
MAX_TIMEOUT_S = 1e6
MAX_STEPS = 10**9
#: ``--devices``: more than one host's worth of GPUs has no use here (each rank is a process on this machine)
MAX_DEVICES = 64
MIN_MEMORY_MB, MAX_MEMORY_MB = 64, 1e9


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = Parser(
        prog=prog, usage=f"{prog} (TARGET | -m MODULE) [options] [-- ARGS]", description="Audit a CUDA PyTorch program for a target backend: device-specific code with a "
                               "patch, ops that would fall back, dtype risks, precision and profile.",
        epilog="ARGS after -- go to the audited program. Exit codes: 0 completed; 1 a --fail-on condition "
               "held; 2 bad input or usage; 3 the audited program failed or a requested section could not be "
               "produced (report still written); 130 interrupted (Ctrl-C), 143 terminated (SIGTERM): the running "
               "program is stopped and the report written with what ran until then.",
        formatter_class=DefaultsHelpFormatter)
    add_version(p)
    p.add_argument("target", metavar="TARGET", nargs="?",
                   help="file.py | file.py:func | notebook.ipynb | folder | reference model name (e.g. gpt) | "
                        "model.onnx")
    p.add_argument("-m", dest="module", metavar="MODULE",
                   help="run a module from the current folder like `python -m MODULE` (instead of TARGET)")
    p.add_argument("--device", default="mlu", metavar="NAME",
                   help="target backend: any installed plugin (cpu, cuda, mlu, ...)")
    p.add_argument("--static-only", action="store_true", help="never import or execute the audited code")
    p.add_argument("--precision", action="store_true", help="compare the run against a float64 reference")
    p.add_argument("--precision-step", type=int, metavar="N",
                   help="with --precision on a program (script, -m module, notebook): compare optimizer step N op by "
                        "op instead of the first (both runs train N-1 steps first); the loss curve is followed "
                        "over --steps either way, and a drift says from which step (default: 1)")
    p.add_argument("--profile", action="store_true", help="per-op time and memory on the target")
    p.add_argument("--memory-limit", type=float, metavar="MB",
                   help="cap the audited program's memory (heap and anonymous mappings) at MB megabytes; "
                        "an allocation past it fails inside the program and the run is reported as an error")
    p.add_argument("--devices", type=int, metavar="N",
                   help="how many GPUs a program redirected to this machine sees (torch.cuda.device_count(), "
                        "torch.accelerator.device_count()); each is the run device, so a program that needs N "
                        "(mp.spawn over device_count(), a 'not enough GPUs' check) runs N ranks here (default: 1)")
    p.add_argument("--arch", metavar="MAJOR[.MINOR]",
                   help="the target's architecture generation for dtype gates and TF32 notes "
                        "(e.g. 5, mlu370, mlu590; MLU bf16 needs >= 5); default: not given")
    p.add_argument("--steps", type=int, metavar="N", help="stop after N optimizer steps / forward passes "
                   "(default: a script runs to its end; a func or model target runs 2)")
    p.add_argument("--timeout", type=float, metavar="SEC",
                   help="bound on the audited program's run, in seconds (default: 600)")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help="report folder: audit.json always, audit.md, audit.html, "
                        "audit.sarif, and migration.patch with --fix")
    p.add_argument("--format", choices=("text", "md", "json"), default="text", help="what goes to stdout")
    p.add_argument("--fail-on", choices=("finding", "fallback", "precision"),
                   help="exit 1 when: an error-severity finding exists | an op falls back | precision diverges")
    p.add_argument("--fix", action="store_true", help="write migration.patch (unified diff) into --out")
    p.add_argument("--fix-to", choices=("device", "hal"), default="device",
                   help="device: CUDA names become the target's; hal: device-neutral calls")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress on stderr (progress is shown only when stderr is a terminal)")
    return p


def parse_args(argv: Optional[list], prog: str = PROG) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if (args.target is None) == (args.module is None):
        parser.error("give exactly one of TARGET or -m MODULE")
    args.args = extra
    args.prog = prog
    return args


def classify(target: str) -> tuple[str, str]:
    """(kind, path): kind is folder | script | func | model | onnx. Raises CliError for bad input."""
    if os.path.islink(target) and not os.path.exists(target):
        raise CliError(f"{target}: broken symbolic link or symbolic-link loop")
    if os.path.isdir(target):
        return "folder", target
    if os.path.isfile(target):
        if target.endswith(".onnx"):
            return "onnx", target
        if target.endswith(".ipynb"):
            return "notebook", target
        if not target.endswith(".py"):
            raise CliError(f"{target}: not a Python file (expected a .py file, file.py:func, a folder, "
                           "a reference model name or a .onnx file)")
        return "script", target
    path, sep, func = target.rpartition(":")
    if sep and path.endswith(".py"):
        if not os.path.isfile(path):
            raise CliError(f"{path}: no such file")
        if not func.isidentifier():
            raise CliError(f"{target}: expected file.py:function_name")
        return "func", path
    if target.startswith("hf:") and target[3:].isidentifier():  # a real architecture (hal.models.hf)
        return "model", target
    if target.endswith((".py", ".onnx")) or os.sep in target or "/" in target:
        raise CliError(f"{target}: no such file or folder")
    if not target.isidentifier() and not target.replace("-", "_").isidentifier():
        raise CliError(f"{target}: no such file, folder or reference model")
    return "model", target


def resolve_module(name: str, cwd: Optional[str] = None) -> tuple[str, str]:
    """``(file, static root)`` of ``-m name`` as ``python -m`` would find it from ``cwd`` (first) or
    sys.path, without importing (executing) anything. The static root is the top-level package's
    folder (relative imports and sibling modules are audited too), or the file itself."""
    import importlib.machinery
    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        raise CliError(f"-m {name}: not a module name")
    search = [cwd or os.getcwd(), *sys.path[1:]]
    spec = None
    top = None
    for i in range(len(parts)):
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:i + 1]), search)
        if spec is None or (i < len(parts) - 1 and not spec.submodule_search_locations):
            raise CliError(f"-m {name}: no module named {'.'.join(parts[:i + 1])!r} in {search[0]}")
        if i == 0:
            top = spec
        search = list(spec.submodule_search_locations or [])
    if spec.submodule_search_locations:  # a package: python -m runs its __main__
        main = importlib.machinery.PathFinder.find_spec(name + ".__main__", list(spec.submodule_search_locations))
        if main is None or not main.origin:
            raise CliError(f"-m {name}: is a package and has no __main__ module")
        spec = main
    if not spec.origin or not spec.origin.endswith(".py"):
        raise CliError(f"-m {name}: not a Python source module ({spec.origin})")
    root = list(top.submodule_search_locations)[0] if top.submodule_search_locations else spec.origin
    return spec.origin, root


def _target_info(device: str) -> dict:
    import hal
    infos = {i.name: i for i in hal.list_backends()}
    info = infos.get(device)
    if info is None:
        raise CliError(f"unknown device {device!r}; valid: {', '.join(sorted(infos)) or 'none installed'}")
    return {"device": device, "available": bool(info.available), "verified": False, "reason": info.reason,
            "device_type": info.cls.device_type if info.cls is not None else device}


def _run_dynamic(request: dict, progress=None) -> dict:
    """Run part of the audit (``hal.conformance.runtime.audit_target``), imported lazily.
    ``progress(phase, **counts)`` is told the run's phases (run, capture, predict) and counts.

    Returns partial report sections. When the runtime audit is not installed the run is recorded as
    skipped. A bad request (unknown model, ...) raises CliError (exit 2)."""
    try:
        from hal.conformance import runtime
    except ModuleNotFoundError as exc:
        if exc.name in ("hal.conformance.runtime",):
            return {"run": {"status": "skipped", "steps": None, "seconds": None,
                            "error": "runtime audit not installed"}}
        raise
    try:
        return runtime.audit_target(request, progress=progress) or {}
    except (ValueError, FileNotFoundError) as exc:
        raise CliError(str(exc)) from None
    except Exception as exc:
        from hal.errors import HalError
        if isinstance(exc, HalError):
            raise CliError(str(exc)) from None
        raise


def _static(path: str, device: str):
    from hal.conformance.migration import AuditInputError, RulesError, audit_static
    try:
        return audit_static(path, device)
    except (AuditInputError, RulesError) as exc:
        raise CliError(str(exc)) from None


def _relative(finding: dict, root) -> dict:
    """A run-part finding with its path made relative to the audited folder when it lies inside."""
    path = finding.get("path")
    if root is not None and isinstance(path, str) and os.path.isabs(path):
        rel = os.path.relpath(path, root)
        if not rel.startswith(os.pardir):
            return {**finding, "path": rel.replace(os.sep, "/")}
    return finding


def exit_code(report: dict, fail_on: Optional[str]) -> int:
    """The contract's exit code for a written report (see the module docstring)."""
    if (report.get("run") or {}).get("status") in FAILED_RUN:
        return EXIT_PROGRAM_FAILED
    if any(isinstance(report.get(k), dict) and report[k].get("verdict") in SECTION_NOT_PRODUCED
           for k in ("precision", "profile")):
        return EXIT_PROGRAM_FAILED
    if fail_on == "finding" and any(f.get("severity") == "error" for f in report.get("findings") or []):
        return EXIT_FAIL_ON
    if fail_on == "fallback" and any(o.get("status") == "fallback" for o in report.get("ops") or []):
        return EXIT_FAIL_ON
    if fail_on == "precision":
        p = report.get("precision") or {}
        if p and (p.get("first_divergence") is not None or p.get("verdict") == "fail"):
            return EXIT_FAIL_ON
    return EXIT_OK


def validate_numbers(args: argparse.Namespace) -> None:
    """Every numeric option finite and in range, else CliError (exit 2, one line)."""
    check_number("--steps", args.steps, minimum=1, maximum=MAX_STEPS, what="a positive integer")
    check_number("--precision-step", args.precision_step, minimum=1, maximum=MAX_STEPS, what="a positive integer")
    if args.precision_step is not None:
        if not args.precision:
            raise CliError("--precision-step needs --precision")
        if args.steps is not None and args.precision_step > args.steps:
            raise CliError(f"--precision-step {args.precision_step} is past --steps {args.steps}")
    if args.arch is not None:
        from hal.capabilities import parse_arch
        try:
            args.arch = parse_arch(args.arch)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    check_number("--timeout", args.timeout, above=0, maximum=MAX_TIMEOUT_S, what="a number of seconds")
    check_number("--devices", args.devices, minimum=1, maximum=MAX_DEVICES, what="a positive integer")
    check_number("--memory-limit", args.memory_limit, minimum=MIN_MEMORY_MB, maximum=MAX_MEMORY_MB,
                 what="a number of megabytes")


def handle(args: argparse.Namespace) -> int:
    validate_numbers(args)
    target = _target_info(args.device)
    if args.module is not None:
        kind, path = "module", args.module
        module_file, module_root = resolve_module(args.module)
        args.target = args.module
    else:
        kind, path = classify(args.target)
    if args.static_only and kind in ("model", "onnx"):
        raise CliError(f"--static-only needs Python source (a .py file or a folder), not a {kind} target")
    if args.fix and kind in ("model", "onnx"):
        raise CliError(f"--fix needs Python source (a .py file or a folder), not a {kind} target")
    if args.precision_step is not None:
        from hal.conformance.workload_audit import PROGRAM_KINDS
        if kind not in PROGRAM_KINDS:
            raise CliError("--precision-step applies to a program (a script, -m module or notebook), "
                           f"not a {kind} target")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise CliError(f"--out {args.out}: exists and is not a folder")
    target.update(source=args.target, kind=kind)
    if kind == "model":  # before --out is created: bad input writes nothing
        from hal.models import workload_class
        try:
            workload_class(args.target)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    progress = make_progress(audit_phases(args, kind), quiet=args.quiet)
    with progress:  # cleared on the way out, before stdout or an error line is written
        static = None
        if kind in ("folder", "script", "func", "notebook", "module"):
            progress("scan")
        if kind in ("folder", "script", "func", "notebook"):
            static = _static(path, args.device)  # a notebook's cells, mapped back (conformance.migration.notebook)
        elif kind == "module":
            static = _static(module_root, args.device)
        try:
            os.makedirs(args.out, exist_ok=True)
        except OSError as exc:
            raise CliError(f"--out {args.out}: cannot create folder: {exc.strerror or exc}") from None
        try:
            with out_lock(args.out, wait_s=(args.timeout or 600.0) + 300.0, prog=args.prog):
                text, code = _audit_locked(args, target, kind, static, progress)
        except OutBusyError as exc:
            raise CliError(str(exc)) from None
    emit(text)
    interrupted = _interruption()
    if interrupted:
        sys.stderr.write(f"{args.prog}: {'interrupted' if interrupted == 'SIGINT' else 'terminated (SIGTERM)'}: the "
                         f"program was stopped; the report in {args.out} covers what ran until then\n")
        return EXIT_INTERRUPTED if interrupted == "SIGINT" else EXIT_TERMINATED
    return code


def _interruption(clear: bool = False) -> Optional[str]:
    """The interrupt that stopped the audited program in this audit ("SIGINT", "SIGTERM"), or None
    (:func:`hal.conformance.runtime.runner.interruption`; None when the runtime audit is not installed).
    ``clear``: forget it first (a new audit starts)."""
    try:
        from hal.conformance.runtime import runner
    except ModuleNotFoundError:
        return None
    if clear:
        runner.clear_interruption()
    return runner.interruption()


def audit_phases(args: argparse.Namespace, kind: str) -> list[str]:
    """The phases (of :data:`hal.cli.progress.AUDIT_PHASES`) this audit goes through, in order."""
    runs = kind != "folder" and not args.static_only
    wanted = {"scan": kind in ("folder", "script", "func", "notebook", "module"), "run": runs, "capture": runs,
              "predict": runs, "precision": runs and args.precision, "profile": runs and args.profile,
              "write": True}
    return [p for p in AUDIT_PHASES if wanted[p]]


def _audit_locked(args: argparse.Namespace, target: dict, kind: str, static, progress) -> tuple[str, int]:
    """Run and report, while this process holds the lock on ``--out`` (the input is valid).
    Returns (what goes to stdout, exit code)."""
    from hal.conformance import report as rep
    from hal.conformance.migration import CATALOGUE
    findings = [f.as_dict(args.fix_to) for f in static.findings] if static else []
    sections: dict = {}
    if kind == "folder" or args.static_only:
        run = {"status": "skipped", "steps": None, "seconds": None, "error": None,
               "reason": "folder targets are audited statically" if kind == "folder" else "--static-only"}
    else:
        _interruption(clear=True)  # an earlier audit in this process (hal's own tests) was interrupted: not this one
        t0 = time.perf_counter()
        request = {"target": args.target, "kind": kind, "device": args.device, "args": list(args.args),
                   "steps": args.steps, "timeout": args.timeout, "precision": bool(args.precision),
                   "profile": bool(args.profile), "out": os.path.abspath(args.out),
                   "memory_limit_mb": args.memory_limit, "arch": args.arch, "devices": args.devices,
                   "precision_warm_steps": (args.precision_step or 1) - 1}
        progress("run")
        sections = _run_dynamic(request, progress)
        run = dict(sections.get("run") or {})
        if args.devices and run.get("device") != "cuda":  # the GPUs the redirected program was told of
            run["devices"] = args.devices
        for k, v in (("status", "skipped"), ("steps", None), ("seconds", round(time.perf_counter() - t0, 3)),
                     ("error", None)):
            run.setdefault(k, v)
        findings += [_relative(f, static.root if static is not None else None) for f in sections.get("findings") or []]
        if isinstance(sections.get("target"), dict):
            target.update({k: v for k, v in sections["target"].items() if k in ("available", "verified", "reason")})
        if args.precision or args.profile:
            progress("precision" if args.precision else "profile")
            from hal.conformance.workload_audit import precision_and_profile
            fallbacks = sorted({o["op"] for o in sections.get("ops") or [] if o.get("status") == "fallback"})
            sections.update(precision_and_profile(request, fallbacks))
    progress("write")
    extra = {"invocation": {"prog": args.prog, "out": os.path.abspath(args.out)}}
    if static is not None:
        extra["static"] = static.stats()
    report = rep.new_report(target, run=run, findings=findings, ops=sections.get("ops") or [],
                            precision=sections.get("precision"), profile=sections.get("profile"), **extra)
    root = str(static.root) if static is not None else None
    try:
        written = {}
        if args.fix:
            written["patch"] = rep.write_artifact(args.out, "patch", static.patch_bytes(args.fix_to))
            report["fix"] = {"flavour": args.fix_to, "patch": str(written["patch"]),
                             "files": len(static.patched(args.fix_to)),
                             "apply": f"cd {shlex.quote(str(static.root))} && patch -p1 < "
                                      f"{shlex.quote(os.path.abspath(written['patch']))}"}
        written = {**rep.write_reports(report, args.out, CATALOGUE, root), **written}
    except rep.ReportError as exc:
        raise CliError(str(exc)) from None
    if args.format == "text":
        text = rep.render(report, "text", root=root, written=written)
        if args.precision or args.profile:  # what the sections found, or why they could not be produced
            from hal.conformance.workload_audit import section_summary
            text = "\n".join([text.rstrip("\n"), *section_summary(report)]) + "\n"
    else:
        text = rep.render(report, args.format, CATALOGUE, root)
    return text, exit_code(report, args.fail_on)


def main(argv=None, prog: str = PROG) -> int:
    """``hal-audit`` (and ``hal audit``, with ``prog="hal audit"``); returns the exit code."""
    return run_cli(lambda: parse_args(argv, prog), handle, prog=prog)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
