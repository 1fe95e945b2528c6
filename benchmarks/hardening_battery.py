"""The hardening battery: bad inputs and injected faults against the real `hal-audit` CLI.

Each case states the documented exit code and what must survive: exit 2 cases print exactly one
``PROG: error:`` line on stderr, nothing on stdout and no traceback (``hal-audit`` by default, ``hal``
subcommands where a case says ``prog``); every other case writes audit.json (plus md/html/sarif) whose
run.status says what happened; no process the audited program started may outlive the audit.
Prints a table and writes JSON; tests/test_hardening.py asserts the same table case by case.

    python benchmarks/hardening_battery.py [--out out/hardening.json]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RT = ROOT / "tests" / "fixtures" / "runtime"
HB = ROOT / "tests" / "fixtures" / "hardening"


INPUT_NAMES = ("empty.py", "binary.py", "latin1.py", "syntax.py", "notpython.txt", "folder", "big.py", "loop_a",
               "loop_b", "imports_missing.py", "raise_at_import.py", "noisy_megabytes.py", "inject.py", "ok.py",
               "plugins")
#: what the audited program prints and raises in the injection case (markdown image and link, raw HTML,
#: terminal escape sequences)
INJECT_OUT = "![px](https://evil.example/pixel.png) <img src=x onerror=alert(1)> \x1b[2J\x1b[31mRED"
INJECT_EXC = "[click](javascript:alert(document.cookie)) ![p2](https://evil.example/p2.png) \x1b]0;title\x07"


def make_inputs(tmp: Path, create: bool = True) -> dict[str, str]:
    """Bad-input files in ``tmp`` (written when ``create``), by name."""
    if not create:
        return {n: str(tmp / n) for n in INPUT_NAMES}
    (tmp / "empty.py").write_text("")
    (tmp / "binary.py").write_bytes(bytes(range(256)) * 8)
    (tmp / "latin1.py").write_bytes("x = 'caf\xe9'\n".encode("latin-1"))
    (tmp / "syntax.py").write_text("import torch\ndef f(:\n    pass\n")
    (tmp / "notpython.txt").write_text("hello")
    (tmp / "folder").mkdir(exist_ok=True)
    (tmp / "folder" / "a.py").write_text("import torch\nx = torch.ones(1).cuda()\n")
    (tmp / "folder" / "broken.py").write_text("def (:\n")
    big = tmp / "big.py"
    with big.open("w") as f:
        line = "y = torch.zeros(4, device='cuda')  # padding padding padding padding\n"
        f.write("import torch\n" + line * (17 * 2**20 // len(line)))
    for a, b in (("loop_a", "loop_b"), ("loop_b", "loop_a")):
        if not (tmp / a).is_symlink():
            os.symlink(tmp / b, tmp / a)
    (tmp / "imports_missing.py").write_text("import torch\nimport no_such_module_hal_test\n")
    (tmp / "raise_at_import.py").write_text("import torch\nraise RuntimeError('boom at import')\n")
    (tmp / "noisy_megabytes.py").write_text("import sys\nfor i in range(200000):\n    print('x' * 60, i)\n")
    (tmp / "inject.py").write_text(f"import torch\nprint({INJECT_OUT!r}, flush=True)\nraise RuntimeError({INJECT_EXC!r})\n")
    (tmp / "ok.py").write_text("import torch\nprint(torch.ones(2).sum().item())\n")
    if not (tmp / "plugins" / "site").is_dir():
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import hostile_plugins
        hostile_plugins.build_site(tmp / "plugins")
    return {n: str(tmp / n) for n in INPUT_NAMES}


def cases(tmp: Path, create: bool = True) -> list[dict]:
    f = make_inputs(tmp, create)
    sentinel = str(tmp / "sentinel")
    pidfile = str(tmp / "grandchild.pid")
    daemon_pidfile = str(tmp / "daemon.pid")
    mlu = ["--device", "mlu"]
    return [
        # kind "input": bad input; "fault": a program that fails on purpose
        {"name": "missing path", "kind": "input", "args": [str(tmp / "nope.py"), *mlu], "exit": 2},
        {"name": "folder with a broken file", "kind": "input", "args": [f["folder"], *mlu], "exit": 0},
        {"name": "empty file", "kind": "input", "args": [f["empty.py"], *mlu, "--static-only"], "exit": 0},
        {"name": "binary file", "kind": "input", "args": [f["binary.py"], *mlu], "exit": 2},
        {"name": "non-UTF-8 file", "kind": "input", "args": [f["latin1.py"], *mlu], "exit": 2},
        {"name": "very large file (17 MiB)", "kind": "input", "args": [f["big.py"], *mlu, "--static-only"], "exit": 2},
        {"name": "syntax error", "kind": "input", "args": [f["syntax.py"], *mlu], "exit": 2, "stderr": "syntax.py:2"},
        {"name": "not Python", "kind": "input", "args": [f["notpython.txt"], *mlu], "exit": 2},
        {"name": "symlink loop", "kind": "input", "args": [f["loop_a"], *mlu], "exit": 2},
        {"name": "unknown device", "kind": "input", "args": [f["empty.py"], "--device", "tpu9"], "exit": 2},
        {"name": "unknown model", "kind": "input", "args": ["gpt9", *mlu], "exit": 2},
        {"name": "bad --steps", "kind": "input", "args": [f["empty.py"], *mlu, "--steps", "0"], "exit": 2},
        {"name": "--out is a file", "kind": "input", "args": [f["empty.py"], *mlu, "--out", f["notpython.txt"]], "exit": 2},
        {"name": "imports a missing module", "kind": "fault", "args": [f["imports_missing.py"], *mlu], "exit": 3,
         "status": "error"},
        {"name": "raises at import", "kind": "fault", "args": [f["raise_at_import.py"], *mlu], "exit": 3,
         "status": "error"},
        {"name": "raises", "kind": "fault", "args": [str(RT / "crash_raise.py"), *mlu], "exit": 3, "status": "error"},
        {"name": "sys.exit(3)", "kind": "fault", "args": [str(RT / "crash_sys_exit.py"), *mlu], "exit": 3,
         "status": "error"},
        {"name": "os._exit", "kind": "fault", "args": [str(RT / "crash_os_exit.py"), *mlu], "exit": 3,
         "status": "crashed"},
        {"name": "segfault", "kind": "fault", "args": [str(RT / "crash_segfault.py"), *mlu], "exit": 3,
         "status": "crashed"},
        {"name": "hang (--timeout 5)", "kind": "fault", "args": [str(RT / "crash_hang.py"), *mlu, "--timeout", "5"],
         "exit": 3, "status": "timeout"},
        {"name": "spawns a child, then hangs", "kind": "fault",
         "args": [str(HB / "spawns_then_hangs.py"), *mlu, "--timeout", "8"], "exit": 3, "status": "timeout",
         "env": {"HAL_TEST_PIDFILE": pidfile}, "pidfile": pidfile},
        {"name": "exhausts memory (--memory-limit 1200)", "kind": "fault",
         "args": [str(HB / "memory_hog.py"), "--device", "cpu", "--memory-limit", "1200"], "exit": 3,
         # a MemoryError inside the program (error); with a CUDA torch on a GPU host, the CUDA runtime's own
         # start-up under that limit can kill the process instead (crashed: seen on the H200, 2026-12-01)
         "status": ("error", "crashed")},
        {"name": "prints megabytes", "kind": "fault", "args": [f["noisy_megabytes.py"], *mlu], "exit": 0,
         "status": "ok", "max_stdout": 20000},
        {"name": "--static-only never executes", "kind": "fault",
         "args": [str(HB / "static_sentinel.py"), *mlu, "--static-only"], "exit": 0, "sentinel": sentinel,
         "env": {"HAL_TEST_SENTINEL": sentinel}},
        # ---- issue 20: the exit-code contract on every command, hostile output, plugins that misbehave ----
        {"name": "--memory-limit inf", "kind": "input", "args": [f["empty.py"], *mlu, "--memory-limit", "inf"],
         "exit": 2, "stderr": "--memory-limit must be"},
        {"name": "--memory-limit nan", "kind": "input", "args": [f["empty.py"], *mlu, "--memory-limit", "nan"],
         "exit": 2, "stderr": "--memory-limit must be"},
        {"name": "--timeout nan", "kind": "input", "args": [f["empty.py"], *mlu, "--timeout", "nan"], "exit": 2,
         "stderr": "--timeout must be"},
        {"name": "--timeout inf", "kind": "input", "args": [f["empty.py"], *mlu, "--timeout", "inf"], "exit": 2,
         "stderr": "--timeout must be"},
        {"name": "--timeout -1", "kind": "input", "args": [f["empty.py"], *mlu, "--timeout", "-1"], "exit": 2,
         "stderr": "--timeout must be"},
        {"name": "--steps 1e99 (not an integer)", "kind": "input", "args": [f["empty.py"], *mlu, "--steps", "1e99"],
         "exit": 2, "stderr": "invalid int value"},
        {"name": "--steps 10**12", "kind": "input", "args": [f["empty.py"], *mlu, "--steps", str(10**12)], "exit": 2,
         "stderr": "--steps must be"},
        {"name": "usage error: unknown option", "kind": "input", "args": [f["empty.py"], "--frobnicate"], "exit": 2,
         "stderr": "unrecognized arguments"},
        {"name": "usage error: no target", "kind": "input", "args": [], "exit": 2,
         "stderr": "give exactly one of TARGET or -m MODULE"},
        {"name": "usage error: bad --format", "kind": "input", "args": [f["empty.py"], "--format", "xml"], "exit": 2,
         "stderr": "invalid choice"},
        {"name": "--out existing_file/sub (--static-only)", "kind": "input",
         "args": [f["empty.py"], *mlu, "--static-only", "--out", f["notpython.txt"] + "/sub"], "exit": 2},
        {"name": "hal: unknown command", "kind": "input", "prog": "hal", "args": ["frobnicate"], "exit": 2},
        {"name": "hal: no command", "kind": "input", "prog": "hal", "args": [], "exit": 2},
        {"name": "hal backends --probe-timeout nan", "kind": "input", "prog": "hal",
         "args": ["backends", "--probe-timeout", "nan"], "exit": 2, "stderr": "--probe-timeout must be"},
        {"name": "hal matrix --steps 0", "kind": "input", "prog": "hal",
         "args": ["matrix", "--devices", "cpu", "--models", "gpt", "--steps", "0", "--out", str(tmp / "m0")],
         "exit": 2, "stderr": "--steps must be"},
        {"name": "hal matrix --config huge9", "kind": "input", "prog": "hal",
         "args": ["matrix", "--devices", "cpu", "--models", "gpt", "--config", "huge9", "--out", str(tmp / "m1")],
         "exit": 2, "stderr": "unknown config 'huge9'"},
        {"name": "hal matrix --timeout -1", "kind": "input", "prog": "hal",
         "args": ["matrix", "--devices", "cpu", "--models", "gpt", "--timeout", "-1", "--out", str(tmp / "m2")],
         "exit": 2, "stderr": "--timeout must be"},
        {"name": "hal matrix --timeout nan", "kind": "input", "prog": "hal",
         "args": ["matrix", "--devices", "cpu", "--models", "gpt", "--timeout", "nan", "--out", str(tmp / "m3")],
         "exit": 2, "stderr": "--timeout must be"},
        {"name": "hal matrix --out <file>", "kind": "input", "prog": "hal",
         "args": ["matrix", "--devices", "cpu", "--models", "gpt", "--out", f["notpython.txt"]], "exit": 2,
         "stderr": "exists and is not a folder"},
        {"name": "hal matrix --out <file>/sub", "kind": "input", "prog": "hal",
         "args": ["matrix", "--devices", "cpu", "--models", "gpt", "--out", f["notpython.txt"] + "/sub"], "exit": 2,
         "stderr": "is not a folder"},
        {"name": "hal collectives --timeout -5", "kind": "input", "prog": "hal",
         "args": ["collectives", "--timeout", "-5"], "exit": 2, "stderr": "--timeout must be"},
        {"name": "hal collectives --timeout nan", "kind": "input", "prog": "hal",
         "args": ["collectives", "--timeout", "nan"], "exit": 2, "stderr": "--timeout must be"},
        {"name": "hal collectives --dtypes ''", "kind": "input", "prog": "hal",
         "args": ["collectives", "--dtypes", ""], "exit": 2, "stderr": "--dtypes must name at least one"},
        {"name": "hal collectives --world-size 1e9", "kind": "input", "prog": "hal",
         "args": ["collectives", "--world-size", "1000000000"], "exit": 2, "stderr": "--world-size must be"},
        {"name": "markdown/terminal injection in output and exception text", "kind": "fault",
         "args": [f["inject.py"], "--device", "cpu"], "exit": 3, "status": "error", "clean_md": True},
        {"name": "reports follow umask 022", "kind": "fault", "args": [f["empty.py"], *mlu, "--static-only"],
         "exit": 0, "umask": 0o022, "mode": 0o644},
        {"name": "reports follow umask 077", "kind": "fault", "args": [f["empty.py"], *mlu, "--static-only"],
         "exit": 0, "umask": 0o077, "mode": 0o600},
        {"name": "hostile plugins: hal backends --format json", "kind": "fault", "prog": "hal",
         "args": ["backends", "--format", "json"], "exit": 0, "plugins": True, "json_backends": {
             "hangprobe": "probe timed out after", "hangimport": "plugin import timed out after",
             "exitprobe": "probe exited the process with code 1", "sysexitprobe": "probe raised SystemExit: 3",
             "printer": "plugin wrote to stdout while imported or probed"}},
        {"name": "hostile plugins: hal-audit x.py --device cpu", "kind": "fault",
         "args": [f["ok.py"], "--device", "cpu"], "exit": 0, "status": "ok", "plugins": True},
        # issue 16/20 (runtime helper): SIGTERM ignored at the timeout; a daemon outside the process group
        {"name": "ignores SIGTERM, then hangs (--timeout 15)", "kind": "fault",
         "args": [str(HB / "ignores_sigterm.py"), *mlu, "--timeout", "15"], "exit": 3, "status": "timeout",
         "ops": ["aten::silu", "aten::addmm"]},
        {"name": "starts a setsid daemon", "kind": "fault", "args": [str(HB / "setsid_daemon.py"), *mlu],
         "exit": 0, "status": "ok", "env": {"HAL_TEST_PIDFILE": daemon_pidfile}, "pidfile": daemon_pidfile},
    ]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


_MD_IMAGE_OR_LINK = re.compile(r"(?<!\\)\]\(")  # "](" not preceded by a backslash: a link or an image


def _check_injection(out: Path, stdout: str) -> list[str]:
    """Nothing the program printed or raised is markup or a control sequence in any report."""
    prob = []
    md = (out / "audit.md").read_text()
    if _MD_IMAGE_OR_LINK.search(md):
        prob.append("audit.md contains a live Markdown link or image")
    if "evil" not in md or "javascript" not in md or "onerror" not in md:
        prob.append("audit.md lost the program's text (it must be shown, escaped)")
    for name in ("audit.md", "audit.html", "audit.sarif", "audit.json"):
        text = (out / name).read_text()
        if "\x1b" in text or "\x07" in text:
            prob.append(f"{name} contains a raw control character")
    html = (out / "audit.html").read_text()
    if "<img" in html or "<img" in md:
        prob.append("raw <img> in audit.html or audit.md")
    if "\x1b" in stdout:
        prob.append("stdout contains an escape sequence")
    return prob


def _check_hal_output(case: dict, stdout: str) -> list[str]:
    """``hal`` subcommands: stdout is valid JSON listing the expected unavailable backends."""
    want = case.get("json_backends")
    if not want:
        return []
    try:
        rows = {b["name"]: b for b in json.loads(stdout)["backends"]}
    except (ValueError, KeyError, TypeError) as exc:
        return [f"stdout is not the backends JSON ({exc}): {stdout[:200]!r}"]
    prob = []
    for name, reason in want.items():
        row = rows.get(name)
        if row is None or row["available"] or reason not in row["reason"]:
            prob.append(f"{name}: expected unavailable with {reason!r}, got {row and row['reason']!r}")
    if not rows.get("cpu", {}).get("available"):
        prob.append("cpu is not available")
    return prob


def run_case(case: dict, tmp: Path) -> dict:
    out = tmp / ("out_" + "".join(c if c.isalnum() else "_" for c in case["name"]))
    prog = case.get("prog", "hal-audit")
    args = list(case["args"])
    if prog == "hal-audit" and "--out" not in args and args:
        args += ["--out", str(out)]
    exe = Path(sys.executable).parent / prog
    env = {**os.environ, **case.get("env", {})}
    env.pop("HAL_BACKEND", None)
    if case.get("plugins"):  # the hostile plugin distributions on the path, a private probe cache, 3 s bound
        env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(tmp / "plugins" / "site"), env.get("PYTHONPATH")])),
                   XDG_CACHE_HOME=str(tmp / "plugins" / "cache"), HAL_PROBE_TIMEOUT="3")
    t0 = time.monotonic()
    p = subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=600,
                       umask=case.get("umask", -1))
    res = {"name": case["name"], "kind": case["kind"], "exit": p.returncode, "expected_exit": case["exit"],
           "seconds": round(time.monotonic() - t0, 2), "problems": []}
    prob = res["problems"]
    if p.returncode != case["exit"]:
        prob.append(f"exit {p.returncode}, expected {case['exit']}: {p.stderr.strip()[-300:]}")
    if "Traceback" in p.stderr:
        prob.append("traceback on stderr")
    if case["exit"] == 2:
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        if len(lines) != 1 or not lines[0].startswith(f"{prog}: error: "):
            prob.append(f"stderr is not one error line: {p.stderr[-300:]!r}")
        if case.get("stderr") and case["stderr"] not in p.stderr:
            prob.append(f"stderr lacks {case['stderr']!r}")
        res["message"] = lines[0] if lines else ""
        if p.stdout:
            prob.append(f"stdout is not empty: {p.stdout[:200]!r}")
    elif prog != "hal-audit":
        prob += _check_hal_output(case, p.stdout)
    else:
        report = out / "audit.json"
        if not report.is_file():
            prob.append("no audit.json written")
        else:
            doc = json.loads(report.read_text())
            res["run_status"] = doc["run"]["status"]
            allowed = case.get("status")
            allowed = (allowed,) if isinstance(allowed, str) else allowed
            if allowed and doc["run"]["status"] not in allowed:
                prob.append(f"run.status {doc['run']['status']}, expected {' or '.join(allowed)}")
            missing = sorted(set(case.get("ops", ())) - {o["op"] for o in doc.get("ops") or []})
            if missing:
                prob.append(f"captured ops lost: {', '.join(missing)}")
            for name in ("audit.md", "audit.html", "audit.sarif"):
                if not (out / name).is_file():
                    prob.append(f"no {name}")
            if case.get("clean_md"):
                prob += _check_injection(out, p.stdout)
            if case.get("mode") is not None:
                for name in ("audit.json", "audit.md", "audit.html", "audit.sarif"):
                    mode = (out / name).stat().st_mode & 0o777
                    if mode != case["mode"]:
                        prob.append(f"{name} has mode {mode:o}, expected {case['mode']:o}")
    if case.get("max_stdout") and len(p.stdout) > case["max_stdout"]:
        prob.append(f"stdout is {len(p.stdout)} characters")
    if case.get("sentinel") and os.path.exists(case["sentinel"]):
        prob.append("the program was executed under --static-only")
    if case.get("pidfile"):
        pid_path = Path(case["pidfile"])
        if not pid_path.is_file():
            prob.append("the grandchild never started")
        else:
            pid = int(pid_path.read_text())
            time.sleep(0.5)
            if _alive(pid):
                prob.append(f"grandchild {pid} outlived the audit")
                os.kill(pid, 9)
    res["survived"] = not prob
    return res


def main() -> None:
    from tabulate import tabulate
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/hardening.json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hal-hardening-") as d:
        tmp = Path(d)
        results = [run_case(c, tmp) for c in cases(tmp)]
    print(tabulate([[r["kind"], r["name"], r["exit"], r.get("run_status", "-"), "yes" if r["survived"] else "NO",
                     "; ".join(r["problems"])[:80]] for r in results],
                   headers=["kind", "case", "exit", "run.status", "survived", "problem"]))
    n_in = sum(r["kind"] == "input" for r in results)
    n_fault = len(results) - n_in
    ok = sum(r["survived"] for r in results)
    print(f"bad inputs tried: {n_in}, faults injected: {n_fault}, survived with nothing lost: {ok}/{len(results)}")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    Path(a.out).write_text(json.dumps({"results": results, "survived": ok, "total": len(results)}, indent=2))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
