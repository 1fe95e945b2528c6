"""Mutation benchmark: do the tests catch deliberate bugs in core behaviour?

``python benchmarks/mutation.py [--only NAME ...] [--list] [--keep]``

Each mutation replaces one exact expression (it must occur exactly once in its file) in a
*temporary copy* of this checkout, then runs the specific tests that should catch it against that
copy. A mutation is *caught* when those tests fail (pytest exit 1), *survived* when they pass.
Before any mutation the same copy runs every selected test unmutated: all must pass, otherwise
the benchmark stops (a failing baseline would make every mutation look caught).

The copy gets its own virtual environment: a fresh venv whose site-packages sees this checkout's
.venv packages through a .pth file (without our own package), plus the copy installed editable,
so ``hal``, ``hal.conformance``, the ``hal-audit`` console script and the stevedore entry points
all resolve to the mutated copy. Bytecode is not written (``PYTHONDONTWRITEBYTECODE``) so a
restored file is never shadowed by a stale .pyc.

Prints one line per mutation and a summary; writes ``reports/mutation.json``:
``{"mutations": n, "caught": k, "survived": [names], "results": [...], "environment": {...}}``.
Runs sequentially (2-core machines); the whole catalogue takes a few minutes.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IGNORE = shutil.ignore_patterns(".git", ".venv", ".venv*", "out", ".pytest_cache", "__pycache__", "*.egg-info",
                                ".hypothesis", ".ruff_cache")
T = "tests/"
ORACLES = T + "test_oracles_core.py"
CONTRACT = T + "test_contract_verified_boundary.py"
#: the 9 mutations that survived every test in the review that opened issue 25
ISSUE_SURVIVORS = ("blame_later_tier_first", "blame_never_amplified", "failon_before_program_failed",
                   "failon_precision_ignores_failed_verdict", "dtype_blocker_ignored_for_fallback",
                   "collectives_drop_rank_gt0_failure", "matrix_collectives_ignore_verified",
                   "failon_finding_counts_warnings", "captured_ops_verified_on_any_device")


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    area: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]  # pytest arguments: files, node ids, or "-k" expressions following a file


def M(name, area, path, old, new, *tests):  # noqa: N802 - a table constructor
    return Mutation(name, area, path, old, new, tuple(tests))


CATALOGUE: list[Mutation] = [
    # -- exit codes and --fail-on (hal/cli/audit.py) ---------------------------------------------
    M("failon_before_program_failed", "exit-code precedence", "hal/cli/audit.py",
      '    if (report.get("run") or {}).get("status") in FAILED_RUN:\n        return EXIT_PROGRAM_FAILED\n',
      "", ORACLES + "::test_exit_code_precedence_table"),
    M("failed_run_omits_timeout", "exit-code precedence", "hal/cli/audit.py",
      'FAILED_RUN = ("error", "timeout", "crashed")', 'FAILED_RUN = ("error", "crashed")',
      ORACLES + "::test_exit_code_precedence_table"),
    M("failon_precision_ignores_failed_verdict", "--fail-on precision", "hal/cli/audit.py",
      'p.get("first_divergence") is not None or p.get("verdict") == "fail"',
      'p.get("first_divergence") is not None', ORACLES + "::test_exit_code_precedence_table"),
    M("failon_precision_ignores_divergence", "--fail-on precision", "hal/cli/audit.py",
      'p.get("first_divergence") is not None or p.get("verdict") == "fail"',
      'p.get("verdict") == "fail"', ORACLES + "::test_exit_code_precedence_table"),
    M("failon_finding_counts_warnings", "--fail-on finding", "hal/cli/audit.py",
      'f.get("severity") == "error"', 'f.get("severity") in ("error", "warning")',
      ORACLES + "::test_exit_code_precedence_table"),
    M("failon_fallback_counts_unsupported", "--fail-on fallback", "hal/cli/audit.py",
      'any(o.get("status") == "fallback" for o', 'any(o.get("status") in ("fallback", "unsupported") for o',
      ORACLES + "::test_exit_code_precedence_table"),
    # -- precision blame (conformance/precision/compare.py) ---------------------------------------
    M("blame_later_tier_first", "blame tiers", "conformance/precision/compare.py",
      "pick = tier1 if tier1 is not None else tier2 if tier2 is not None else tier3",
      "pick = tier2 if tier2 is not None else tier1 if tier1 is not None else tier3",
      ORACLES, "-k", "blame"),
    M("blame_never_amplified", "blame kinds", "conformance/precision/compare.py",
      'kind = "amplified" if status[pick] == "amplified" else "introduced"', 'kind = "introduced"',
      ORACLES, "-k", "blame"),
    M("blame_skips_tier3", "blame tiers", "conformance/precision/compare.py",
      "pick = tier1 if tier1 is not None else tier2 if tier2 is not None else tier3",
      "pick = tier1 if tier1 is not None else tier2", ORACLES, "-k", "blame"),
    M("verdict_amplified_fails", "precision verdict", "conformance/precision/compare.py",
      'if fd is not None and fd["kind"] == "introduced":', "if fd is not None:",
      ORACLES, "-k", "verdict"),
    # -- dtype gates and op-status prediction (hal/capabilities/query.py) -------------------------
    M("dtype_blocker_ignored_for_fallback", "dtype gates", "hal/capabilities/query.py",
      'if blocker and status in ("native", "composite", "fallback"):',
      'if blocker and status in ("native", "composite"):', ORACLES, "-k", "dtype_gate"),
    M("arch_gate_off_by_one", "dtype gates", "hal/capabilities/query.py",
      "elif major < need:", "elif major <= need:", ORACLES, "-k", "dtype_gate"),
    M("composite_hides_fallback_callee", "op-status prediction", "hal/capabilities/query.py",
      'if worst.status in ("native", "composite"):', 'if worst.status in ("native", "composite", "fallback"):',
      T + "test_capabilities.py", "-k", "table or nanmedian"),
    M("fallback_policy_off_ignored", "op-status prediction", "hal/capabilities/query.py",
      "        if not self.fallback:\n", "        if False:\n",
      T + "test_capabilities.py", "-k", "fallback_policy_off"),
    M("cpu_without_kernel_is_fallback", "op-status prediction", "hal/capabilities/query.py",
      'if man.backend == "cpu" or entry.get("cpu", "-") == "-":', 'if man.backend == "cpu":',
      ORACLES, "-k", "op_status"),
    # -- measured vs predicted (conformance/runtime/predict.py, child.py, __init__.py) -------------
    M("captured_ops_verified_on_any_device", "verified boundary", "conformance/runtime/predict.py",
      'if measured is not None and rec.get("device_type") == measured["device_type"]:',
      "if measured is not None:", CONTRACT, "-k", "builder or another_device"),
    M("hal_fallbacks_verified_on_any_device", "verified boundary", "conformance/runtime/predict.py",
      '"verified": measured is not None and fb["device_type"] == measured["device_type"],',
      '"verified": measured is not None,', CONTRACT, "-k", "builder or another_device"),
    M("mlu_warning_trusted_on_any_device", "verified boundary", "conformance/runtime/predict.py",
      'if measured["device_type"] == "mlu" and _warned(', "if _warned(", CONTRACT, "-k", "builder"),
    M("child_counts_warnings_on_cpu", "verified boundary", "conformance/runtime/child.py",
      'if op is not None and state.spec.get("run_device") == "mlu":', "if op is not None:",
      CONTRACT, "-k", "child_counts"),
    M("absent_target_marked_verified", "verified boundary", "conformance/runtime/__init__.py",
      'if target["available"] and run.get("status") in', 'if run.get("status") in',
      T + "test_runtime_audit.py", "-k", "cuda_only or reference_models and gpt"),
    M("fallback_bytes_charged_to_native_ops", "op-status prediction", "conformance/runtime/predict.py",
      '"bytes_per_step": int(rec["bytes"] / per_step) if fallback else 0,',
      '"bytes_per_step": int(rec["bytes"] / per_step),', CONTRACT, "-k", "builder"),
    M("float64_note_not_for_mlu", "dtype gates", "conformance/runtime/predict.py",
      '    if backend == "mlu":\n        for dt in dtypes:', '    if backend == "cuda":\n        for dt in dtypes:',
      ORACLES, "-k", "float64_note"),
    # -- fallback policy (hal/ops) -------------------------------------------------------------------
    M("default_policy_cpu", "fallback policy", "hal/ops/fallback.py",
      'DEFAULT_POLICY = "warn"', 'DEFAULT_POLICY = "cpu"', ORACLES, "-k", "fallback_policy"),
    M("scope_ignored", "fallback policy", "hal/ops/fallback.py",
      "    scoped = _scope.get()\n", "    scoped = None\n", ORACLES, "-k", "fallback_policy"),
    M("env_beats_explicit", "fallback policy", "hal/ops/fallback.py",
      "    if explicit is not None:\n        return _check(explicit)\n", "",
      ORACLES, "-k", "fallback_policy"),
    M("error_policy_runs_fallback", "fallback policy", "hal/ops/__init__.py",
      '    if policy == "error":\n        raise', '    if policy == "never":\n        raise',
      ORACLES, "-k", "fallback_policy"),
    M("cpu_policy_warns", "fallback policy", "hal/ops/__init__.py",
      'warn=policy == "warn"', 'warn=policy != "error"', ORACLES, "-k", "fallback_policy"),
    M("silu_and_mul_halves_swapped", "hal.ops semantics", "hal/ops/torch_impl.py",
      "return F.silu(a) * b", "return F.silu(b) * a", T + "test_ops_properties.py", "-k", "silu_and_mul"),
    M("add_rms_norm_drops_residual", "hal.ops semantics", "hal/ops/torch_impl.py",
      "    h = input + residual\n", "    h = input + input\n", T + "test_ops_properties.py", "-k", "silu_and_mul"),
    M("fallback_totals_seconds_overwritten", "fallback policy", "hal/ops/fallback.py",
      "tot.seconds += rec.seconds", "tot.seconds = rec.seconds", ORACLES, "-k", "totals"),
    # -- collectives and matrix merges ----------------------------------------------------------------
    M("collectives_drop_rank_gt0_failure", "collectives merge", "hal/testing/collectives.py",
      'if other.status == "fail" and row.status != "fail":', "if False:",
      ORACLES, "-k", "collectives_merge"),
    M("collectives_merge_keeps_rank0_error", "collectives merge", "hal/testing/collectives.py",
      "row.max_error = max(row.max_error, other.max_error)", "row.max_error = row.max_error",
      ORACLES, "-k", "collectives_merge"),
    M("matrix_collectives_ignore_verified", "matrix merge", "conformance/matrix/merge.py",
      'if cur is None or row.get("verified") or not cur.get("verified"):', "if True:",
      ORACLES, "-k", "matrix_merge"),
    M("matrix_cells_ignore_verified", "matrix merge", "conformance/matrix/merge.py",
      "if cur is None or c.verified or not cur.verified:", "if True:",
      T + "test_matrix.py", "-k", "merge_prefers"),
    M("matrix_diff_threshold", "matrix merge", "conformance/matrix/merge.py",
      "abs(tb / ta - 1) > 0.10", "abs(tb / ta - 1) > 0.50", T + "test_matrix.py", "-k", "diff_lists"),
    # -- backends and discovery ------------------------------------------------------------------------
    M("priority_cuda_over_mlu", "discovery order", "backends/mlu/backend.py",
      "    priority = 300\n", "    priority = 100\n", ORACLES, "-k", "priority"),
    M("mlu_rejects_no_reduce_op", "collectives", "backends/mlu/backend.py",
      'unsupported_reduce_ops = frozenset({"BAND", "BOR", "BXOR", "PREMUL_SUM"})',
      'unsupported_reduce_ops = frozenset({"BAND", "BOR", "BXOR"})', T + "test_mlu_contract.py"),
    M("mlu_bf16_gate", "dtype gates", "backends/mlu/backend.py",
      "if major >= need)", "if major + 1 >= need)", T + "test_mlu_contract.py"),
    # -- the GPU path: HAL_REQUIRE_BACKENDS in tests/conftest.py ------------------------------------------
    M("require_backends_never_fails", "GPU path", "tests/conftest.py",
      '        report.outcome = "failed"\n', "        pass\n", T + "test_require_backends.py"),
    M("require_backends_fails_shape_skips", "GPU path", "tests/conftest.py",
      "and not any(s in reason for s in SHAPE_SKIPS)", "", T + "test_require_backends.py"),
    # -- static rules and patch writing ------------------------------------------------------------------
    M("device_name_misses_suffix", "static rules", "conformance/migration/scanner.py",
      'or name.endswith("_device")', 'or name.endswith("_devices")', ORACLES, "-k", "static"),
    M("patch_keeps_overlapping_edits", "patch writing", "conformance/migration/patch.py",
      "        if s[0] >= end:\n", "        if True:\n", ORACLES, "-k", "patch_overlapping"),
    M("patch_import_always_added", "patch writing", "conformance/migration/patch.py",
      'if flavour == "device" and import_module and not scan.has_import["device"]:',
      'if flavour == "device" and import_module:', ORACLES, "-k", "device_import_once"),
]


def _sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def make_copy(work: Path) -> tuple[Path, Path]:
    """The repository copy and a python whose imports resolve to it."""
    repo = work / "repo"
    shutil.copytree(ROOT, repo, ignore=IGNORE, symlinks=True)
    site_src = next((ROOT / ".venv" / "lib").glob("python3*/site-packages"))
    deps = work / "deps"
    deps.mkdir()
    for entry in site_src.iterdir():
        n = entry.name
        if n.startswith(("hal_portability", "__editable__", "_hal_portability")) or n.endswith(".pth"):
            continue
        (deps / n).symlink_to(entry)
    venv = work / "venv"
    _sh([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "_deps.pth").write_text(str(deps) + "\n")
    for pth in site_src.glob("*.pth"):  # keep third-party .pth hooks (not our editable finder)
        if not pth.name.startswith("__editable__"):
            shutil.copy(pth, site / pth.name)
    py = venv / "bin" / "python"
    p = _sh([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(repo)])
    if p.returncode != 0:
        raise SystemExit(f"mutation.py: error: cannot install the copy: {p.stderr.strip()[-800:]}")
    return repo, py


def run_tests(py: Path, repo: Path, tests: tuple[str, ...], timeout: float) -> tuple[int, float, str]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", HYPOTHESIS_PROFILE="ci")
    env.pop("HAL_BACKEND", None)
    t0 = time.perf_counter()
    try:
        p = _sh([str(py), "-m", "pytest", "-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                 "--no-header", "-o", "addopts=", *tests], cwd=repo, env=env, timeout=timeout)
        rc, out = p.returncode, (p.stdout + p.stderr)
    except subprocess.TimeoutExpired:
        rc, out = 124, "timed out"
    return rc, time.perf_counter() - t0, out.strip().splitlines()[-1] if out.strip() else ""


def split_runs(muts: list[Mutation]) -> list[tuple[str, ...]]:
    """Distinct test selections (for the unmutated baseline)."""
    seen: list[tuple[str, ...]] = []
    for m in muts:
        if m.tests not in seen:
            seen.append(m.tests)
    return seen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", help="run only these mutation names")
    ap.add_argument("--list", action="store_true", help="list the catalogue and exit")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per test run (default 240)")
    ap.add_argument("--out", default=str(ROOT / "reports" / "mutation.json"))
    args = ap.parse_args(argv)
    muts = [m for m in CATALOGUE if not args.only or m.name in args.only]
    if args.list:
        for m in muts:
            print(f"{m.name:40s} {m.area:24s} {m.path}")
        return 0
    names = [m.name for m in CATALOGUE]
    assert set(ISSUE_SURVIVORS) <= set(names), set(ISSUE_SURVIVORS) - set(names)
    if len(set(names)) != len(names):
        raise SystemExit("mutation.py: error: duplicate mutation names")
    for m in muts:  # every mutation must apply exactly once to the current source
        n = (ROOT / m.path).read_text().count(m.old)
        if n != 1:
            raise SystemExit(f"mutation.py: error: {m.name}: the expression occurs {n} times in {m.path}")
    work = Path(tempfile.mkdtemp(prefix="hal-mutation-"))
    t_start = time.perf_counter()
    try:
        repo, py = make_copy(work)
        print(f"copy: {repo}  ({len(muts)} mutations)")
        for sel in split_runs(muts):
            rc, secs, last = run_tests(py, repo, sel, args.timeout)
            if rc != 0:
                print(f"baseline FAILED ({rc}) for {' '.join(sel)}: {last}")
                return 2
        print(f"baseline: {len(split_runs(muts))} test selections pass unmutated "
              f"({time.perf_counter() - t_start:.0f} s so far)")
        results = []
        for m in muts:
            target = repo / m.path
            original = target.read_text()
            target.write_text(original.replace(m.old, m.new, 1))
            try:
                rc, secs, last = run_tests(py, repo, m.tests, args.timeout)
            finally:
                target.write_text(original)
            caught = rc not in (0, 5)  # 5: no test collected is a defect of the catalogue, never a catch
            if rc == 5:
                caught = False
                last = "no tests collected: " + last
            results.append({"name": m.name, "area": m.area, "path": m.path, "caught": caught, "exit": rc,
                            "from_issue": m.name in ISSUE_SURVIVORS,
                            "seconds": round(secs, 1), "tests": list(m.tests), "last_line": last})
            print(f"{'CAUGHT  ' if caught else 'SURVIVED'} {m.name:40s} {secs:6.1f}s  {last[:90]}")
        torch_version = _torch_version(py)
    finally:
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    caught = sum(r["caught"] for r in results)
    survived = [r["name"] for r in results if not r["caught"]]
    total = time.perf_counter() - t_start
    print(f"\n{caught}/{len(results)} caught ({100.0 * caught / max(len(results), 1):.1f}%), "
          f"{len(survived)} survived: {', '.join(survived) or '-'}; {total:.0f} s")
    issue = [r for r in results if r["from_issue"]]
    print(f"the issue's 9 survivors: {sum(r['caught'] for r in issue)}/{len(issue)} caught now")
    doc = {"mutations": len(results), "caught": caught, "survived": survived,
           "issue_survivors_caught": f"{sum(r['caught'] for r in issue)}/{len(issue)}",
           "score_pct": round(100.0 * caught / max(len(results), 1), 1), "seconds": round(total, 1),
           "environment": {"python": platform.python_version(), "platform": platform.platform(),
                           "torch": torch_version, "cpus": os.cpu_count()},
           "method": "exact-string mutation in a temporary copy; the listed tests run against it; caught = "
                     "pytest exit 1 (or a crash/timeout), survived = exit 0; an unmutated baseline passes first",
           "results": results}
    if not args.only:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


def _torch_version(py: Path) -> str:
    p = _sh([str(py), "-c", "import torch; print(torch.__version__)"])
    return p.stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
