"""--fix never breaks a program: real `patch -p1` / `git apply` on odd files, semantics of --fix-to hal.

Covers: latin-1 sources (the patch is written in the file's encoding), CRLF files (the inserted import
keeps CRLF), names with spaces (quoted diff headers), a pathological file (parse-error finding, the
folder audit goes on), a FIFO named x.py (skipped, never opened for reading), fixes that would write a
torch.mlu name torch_mlu lacks (no fix, says why), and hal-flavour comparisons on the CPU.
"""
import os
import shutil
import subprocess
import sys

import pytest

from hal.conformance.migration import audit_static

needs_tools = pytest.mark.skipif(shutil.which("patch") is None or shutil.which("git") is None,
                                 reason="patch and git are needed")
PROGRAM = 'import torch\n\nx = torch.zeros(2, device="cuda")\ny = x.cuda()\n'


def _apply_both(tree, patch_bytes):
    """Apply with `git apply` on one copy and `patch -p1` on another; return both trees."""
    out = []
    for tool in ("git", "patch"):
        dst = tree.parent / f"{tree.name}-{tool}"
        shutil.copytree(tree, dst)
        pf = tree.parent / f"{tool}.patch"
        pf.write_bytes(patch_bytes)
        cmd = ["git", "apply", "--unsafe-paths", str(pf)] if tool == "git" else [
            "patch", "-p1", "--batch", "-s", "-i", str(pf)]
        r = subprocess.run(cmd, cwd=dst, capture_output=True, text=True)
        assert r.returncode == 0, (tool, r.stdout, r.stderr)
        out.append(dst)
    return out


@needs_tools
def test_latin1_crlf_and_spaces_apply_with_patch_and_git_apply(tmp_path):
    tree = tmp_path / "proj"
    tree.mkdir()
    (tree / "latin.py").write_bytes(("# -*- coding: latin-1 -*-\n# caf\xe9\n" + PROGRAM).encode("latin-1"))
    (tree / "crlf.py").write_bytes(PROGRAM.replace("\n", "\r\n").encode())
    (tree / "my script.py").write_text(PROGRAM)
    res = audit_static(tree, "mlu")
    data = res.patch_bytes("device")
    assert b'"a/my script.py"' in data
    for dst in _apply_both(tree, data):
        latin = (dst / "latin.py").read_bytes()
        assert b"caf\xe9" in latin and b'device="mlu"' in latin
        crlf = (dst / "crlf.py").read_bytes()
        assert b"import torch_mlu" in crlf and b"\n" not in crlf.replace(b"\r\n", b"")
        spaced = (dst / "my script.py").read_text()
        assert "x.mlu()" in spaced
        for p in dst.glob("*.py"):
            compile(p.read_bytes(), str(p), "exec")


def test_pathological_file_is_a_finding_and_the_folder_goes_on(tmp_path):
    """A 700-term string chain overflows the recursive tree walk: that file becomes a parse-error."""
    (tmp_path / "deep.py").write_text("import torch\ns = " + " + ".join(['"a"'] * 700) + "\n")
    (tmp_path / "ok.py").write_text(PROGRAM)
    res = audit_static(tmp_path, "mlu")
    rules = {(f.path, f.rule) for f in res.findings}
    assert ("ok.py", "device-string") in rules and ("deep.py", "parse-error") in rules


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_named_py_is_skipped_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "x.py")
    (tmp_path / "ok.py").write_text(PROGRAM)
    code = ("import sys; from hal.conformance.migration import audit_static; "
            "r = audit_static(sys.argv[1], 'mlu'); print(sorted({(f.path, f.rule) for f in r.findings}))")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "('x.py', 'unreadable')" in r.stdout and "('ok.py', 'device-string')" in r.stdout


def test_fix_writing_a_missing_torch_mlu_name_is_not_emitted(tmp_path):
    p = tmp_path / "n.py"
    p.write_text("import torch\nimport torch.cuda.nccl as nccl\n\nnccl.all_reduce([torch.ones(1)])\n")
    res = audit_static(p, "mlu")
    f = [f for f in res.findings if "nccl" in f.found]
    assert f and all(not x.edits.get("device") for x in f)
    assert "torch.mlu.nccl" in f[0].message and "does not exist" in f[0].message
    assert "torch.mlu.nccl" not in res.patch("device")


def test_hal_fix_keeps_comparisons_false_on_the_cpu(tmp_path):
    """nanoGPT's pattern: patched --fix-to hal, the CUDA-only branch must stay off on the CPU."""
    p = tmp_path / "prog.py"
    p.write_text("import torch\n\ndevice = 'cuda'\n"
                 "device_type = 'cuda' if 'cuda' in device else 'cpu'\n"
                 "if device_type == 'cuda':\n    raise SystemExit('took the CUDA branch')\n"
                 "x = torch.ones(2).to(device)\nprint('ok', x.device.type)\n")
    res = audit_static(p, "mlu")
    patched = res.patched("hal")["prog.py"]
    assert "accelerator_type()" in patched
    p.write_text(patched)
    env = dict(os.environ, HAL_BACKEND="cpu")
    r = subprocess.run([sys.executable, str(p)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "ok cpu" in r.stdout, r.stdout + r.stderr
