"""The hal-audit command line: DESIGN.md section 4 (options, exit codes, reports in --out)."""
import json
import pathlib
import subprocess
import sys

import pytest

from hal.cli import audit as cli
from hal.conformance.report import validate

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cuda_train.py"
FIXTURES = ROOT / "examples" / "migration"


def hal_audit(*args, cwd=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "hal.cli.audit", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


def one_line_error(proc, fragment):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hal-audit: error: "), proc.stderr
    assert "Traceback" not in proc.stderr and fragment in lines[0], lines[0]
    assert proc.stdout == ""


def test_static_file_writes_every_report(tmp_path):
    out = tmp_path / "out"
    p = hal_audit(EXAMPLE, "--device", "mlu", "--static-only", "--out", out, "--fix")
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in out.iterdir()) == ["audit.html", "audit.json", "audit.md", "audit.sarif",
                                                     "migration.patch"]
    rep = json.loads((out / "audit.json").read_text())
    assert validate(rep) == []
    assert rep["target"] == {"device": "mlu", "available": False, "verified": False,
                             "reason": rep["target"]["reason"], "device_type": "mlu",
                             "source": str(EXAMPLE), "kind": "script"}
    assert rep["run"]["status"] == "skipped" and rep["run"]["reason"] == "--static-only"
    assert rep["summary"]["by_severity"]["error"] == 15 and rep["static"]["files"] == 1
    assert rep["fix"]["flavour"] == "device" and rep["fix"]["files"] == 1
    assert {f["rule"] for f in rep["findings"]} >= {"cuda-api", "cuda-amp", "nccl-backend", "float64", "env-var",
                                                    "capability-gate", "device-string", "cuda-method"}
    assert "15 error" in p.stdout and "audit.sarif" in p.stdout
    sarif = json.loads((out / "audit.sarif").read_text())
    assert sarif["version"] == "2.1.0" and sarif["runs"][0]["results"]
    assert (out / "migration.patch").read_text().startswith("--- a/cuda_train.py\n+++ b/cuda_train.py\n")


def test_folder_json_stdout_and_fail_on(tmp_path, capsys):
    rc = cli.main([str(FIXTURES), "--device", "mlu", "--out", str(tmp_path / "o"), "--format", "json",
                   "--fail-on", "finding"])
    assert rc == 1
    rep = json.loads(capsys.readouterr().out)
    assert rep["target"]["kind"] == "folder" and rep["run"]["status"] == "skipped"
    assert {f["path"] for f in rep["findings"]} >= {"ddp_nccl.py", "amp_scaler.py"}
    assert all(not f["path"].startswith("/") for f in rep["findings"])
    rc = cli.main([str(FIXTURES / "lookalikes.py"), "--static-only", "--out", str(tmp_path / "o2"),
                   "--fail-on", "finding", "--format", "md"])
    assert rc == 0 and capsys.readouterr().out.startswith("# hal-audit report")


def test_cpu_target_and_hal_fix(tmp_path):
    assert cli.main([str(EXAMPLE), "--device", "cpu", "--static-only", "--out", str(tmp_path), "--fix",
                     "--fix-to", "hal"]) == 0
    patch = (tmp_path / "migration.patch").read_text()
    assert "+import hal.portable as hal_portable" in patch
    rep = json.loads((tmp_path / "audit.json").read_text())
    assert rep["target"]["device"] == "cpu" and rep["target"]["available"] is True
    assert rep["target"]["verified"] is False  # a static audit measures nothing


@pytest.mark.parametrize("args,fragment", [
    (["missing.py"], "missing.py: no such file"),
    (["nowhere/"], "no such file or folder"),
    (["{EX}", "--device", "tpu"], "unknown device 'tpu'; valid: cpu, cuda, mlu"),
    (["{BAD}", "--static-only"], "bad.py:3: syntax error"),
    (["{BIN}"], "binary file"),
    (["{TXT}"], "not a Python file"),
    (["gpt", "--static-only"], "--static-only needs Python source"),
    (["{EX}:", "--static-only"], "expected file.py:function_name"),
    (["{EX}", "--steps", "0"], "--steps must be a positive integer"),
    (["{EX}", "--out", "{TXT}"], "exists and is not a folder"),
    (["{EX}", "--precision-step", "0", "--precision"], "--precision-step must be a positive integer"),
    (["{EX}", "--precision-step", "2"], "--precision-step needs --precision"),
    (["{EX}", "--precision", "--precision-step", "3", "--steps", "2"], "--precision-step 3 is past --steps 2"),
    (["gpt", "--precision", "--precision-step", "2"], "--precision-step applies to a program"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, args, fragment):
    (tmp_path / "bad.py").write_text("import torch\n\nx = [\n")
    (tmp_path / "bin.py").write_bytes(b"\x00\x01\x02binary")
    (tmp_path / "notes.txt").write_text("hello\n")
    subs = {"{EX}": str(EXAMPLE), "{BAD}": str(tmp_path / "bad.py"), "{BIN}": str(tmp_path / "bin.py"),
            "{TXT}": str(tmp_path / "notes.txt")}
    argv = []
    for a in args:
        for k, v in subs.items():
            a = a.replace(k, v)
        argv.append(a)
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "o")]
    rc = cli.main(argv)
    cap = capsys.readouterr()
    one_line_error(subprocess.CompletedProcess(argv, rc, cap.out, cap.err), fragment)
    assert not (tmp_path / "o").exists()  # bad input writes no report


def test_bad_input_in_a_real_process(tmp_path):
    (tmp_path / "bad.py").write_text("def f(:\n")
    one_line_error(hal_audit(tmp_path / "bad.py", "--out", tmp_path / "o"), "bad.py:1: syntax error")


def test_usage_error_exits_2(capsys):
    assert cli.main([]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_dynamic_part_skipped_when_runtime_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "hal.conformance.runtime", None)  # import now raises ModuleNotFoundError
    import hal.conformance
    monkeypatch.delattr(hal.conformance, "runtime", raising=False)
    rc = cli.main([str(EXAMPLE), "--device", "mlu", "--out", str(tmp_path)])
    assert rc == 0
    rep = json.loads((tmp_path / "audit.json").read_text())
    assert rep["run"]["status"] == "skipped" and rep["run"]["error"] == "runtime audit not installed"
    assert rep["summary"]["findings"] == len(rep["findings"]) > 0
    assert "run: skipped (runtime audit not installed)" in capsys.readouterr().out


def test_dynamic_request_and_exit_codes(tmp_path, monkeypatch):
    seen = {}

    def fake_dynamic(request, progress=None):
        seen.update(request)
        return {"run": {"status": "error", "steps": 1, "seconds": 0.1, "error": "RuntimeError: boom"},
                "ops": [{"op": "aten::nanmedian", "count": 2, "dtypes": ["float32"], "status": "fallback",
                         "reason": "no MLU kernel"}]}

    monkeypatch.setattr(cli, "_run_dynamic", fake_dynamic)
    rc = cli.main([str(EXAMPLE), "--device", "mlu", "--out", str(tmp_path), "--steps", "2", "--timeout", "5",
                   "--precision", "--precision-step", "2", "--", "--width", "8"])
    assert rc == 3  # the audited program failed: report still written
    assert seen == {"target": str(EXAMPLE), "kind": "script", "device": "mlu", "args": ["--width", "8"],
                    "steps": 2, "timeout": 5.0, "precision": True, "profile": False, "out": str(tmp_path),
                    "memory_limit_mb": None, "arch": None, "devices": None, "precision_warm_steps": 1}
    rep = json.loads((tmp_path / "audit.json").read_text())
    assert rep["run"]["status"] == "error" and rep["ops"][0]["op"] == "aten::nanmedian"
    assert "aten::nanmedian" in (tmp_path / "audit.html").read_text()
    assert cli.exit_code({"run": {"status": "ok"}, "ops": rep["ops"]}, "fallback") == 1
    assert cli.exit_code({"run": {"status": "ok"}, "ops": rep["ops"]}, "finding") == 0
    assert cli.exit_code({"run": {"status": "ok"}, "precision": {"first_divergence": {"op": "aten::mm"}}},
                         "precision") == 1
    assert cli.exit_code({"run": {"status": "ok"}, "precision": {"first_divergence": None, "verdict": "pass"}},
                         "precision") == 0
    assert cli.exit_code({"run": {"status": "timeout"}}, None) == 3


def test_run_part_paths_become_relative(tmp_path):
    f = cli._relative({"path": str(EXAMPLE), "line": 3}, EXAMPLE.parent)
    assert f["path"] == "cuda_train.py"
    assert cli._relative({"path": "/elsewhere/x.py"}, EXAMPLE.parent)["path"] == "/elsewhere/x.py"


def test_classify_targets(tmp_path):
    assert cli.classify(str(EXAMPLE)) == ("script", str(EXAMPLE))
    assert cli.classify(f"{EXAMPLE}:main") == ("func", str(EXAMPLE))
    assert cli.classify(str(FIXTURES)) == ("folder", str(FIXTURES))
    assert cli.classify("gpt") == ("model", "gpt")
    (tmp_path / "m.onnx").write_bytes(b"x")
    assert cli.classify(str(tmp_path / "m.onnx"))[0] == "onnx"


# -- issue 16: --out shared by concurrent audits, user files there, report permissions ---------------

_OUT_A = "import torch\nprint('program A')\nm = torch.nn.Linear(3, 3)\nwith torch.no_grad():\n" \
         "    for _ in range(2):\n        m(torch.randn(2, 3))\n        __import__('time').sleep(1)\n"
_OUT_B = "import torch\nprint('program B')\nm = torch.nn.Conv1d(3, 3, 1)\nwith torch.no_grad():\n" \
         "    m(torch.randn(1, 3, 4))\n"


def test_concurrent_audits_on_one_out_never_mix_and_user_files_survive(tmp_path):
    out = tmp_path / "shared-out"
    out.mkdir()
    mine = {"runtime-child-spec.json": '{"mine": 1}\n', "runtime-child-result.json": "keep\n", "notes.txt": "x\n"}
    for name, text in mine.items():
        (out / name).write_text(text)
    (tmp_path / "a.py").write_text(_OUT_A)
    (tmp_path / "b.py").write_text(_OUT_B)
    cmd = [sys.executable, "-m", "hal.cli.audit", "--device", "mlu", "--out", str(out), "--format", "json"]
    procs = {n: subprocess.Popen([*cmd[:3], str(tmp_path / f"{n}.py"), *cmd[3:]], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for n in ("a", "b")}
    res = {n: p.communicate(timeout=300) for n, p in procs.items()}
    for n, p in procs.items():
        assert p.returncode == 0, res[n][1]
    reports = {n: json.loads(res[n][0]) for n in res}
    assert reports["a"]["run"]["output_tail"] == ["program A"] and reports["b"]["run"]["output_tail"] == ["program B"]
    ops_a = {o["op"] for o in reports["a"]["ops"]}
    ops_b = {o["op"] for o in reports["b"]["ops"]}
    assert "aten::addmm" in ops_a and "aten::convolution" not in ops_a
    assert "aten::convolution" in ops_b and "aten::addmm" not in ops_b
    for name, text in mine.items():
        assert (out / name).read_text() == text
    last = json.loads((out / "audit.json").read_text())  # whole: one run's report, never a mix
    assert last["target"]["source"] in (str(tmp_path / "a.py"), str(tmp_path / "b.py"))
    assert last["run"]["output_tail"] == (["program A"] if last["target"]["source"].endswith("a.py") else ["program B"])
    assert sorted(p.name for p in out.iterdir()) == sorted([*mine, "audit.html", "audit.json", "audit.md",
                                                            "audit.sarif"])


def test_busy_out_waits_then_exits_2_with_one_line(tmp_path):
    from hal.cli.outlock import OutBusyError, out_lock
    out = tmp_path / "busy"
    with out_lock(str(out)):
        with pytest.raises(OutBusyError, match="in use by another audit"):
            with out_lock(str(out), wait_s=0.5):
                pass
    with out_lock(str(out), wait_s=0.5):  # released with its holder
        pass


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600)])
def test_reports_are_readable_per_the_umask(tmp_path, umask, mode):
    out = tmp_path / "o"
    old = __import__("os").umask(umask)
    try:
        p = hal_audit(EXAMPLE, "--device", "mlu", "--static-only", "--out", out)
    finally:
        __import__("os").umask(old)
    assert p.returncode == 0, p.stderr
    assert {x.name: x.stat().st_mode & 0o777 for x in out.iterdir()} == {
        n: mode for n in ("audit.html", "audit.json", "audit.md", "audit.sarif")}
