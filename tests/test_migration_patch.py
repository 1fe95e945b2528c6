"""--fix patches: apply with `patch -p1`, compile, re-audit; the hal flavour really runs on the CPU."""
import ast
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from hal.conformance.migration import audit_static
from hal.conformance.migration.patch import apply_edits
from hal.conformance.migration.scanner import Edit

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
#: errors no automatic rewrite can fix (a kernel port, a missing library feature): reported, fix None
UNFIXABLE = {"vendor-import", "cpp-extension", "cuda-source", "reduce-op", "dist-unsupported", "torch-too-new"}
#: rules whose presence means a CUDA-only call is still in the code
CUDA_ONLY = {"device-string", "cuda-method", "is-cuda", "cuda-api", "cuda-amp", "nccl-backend", "to-int",
             "profiler-cuda"}
needs_patch = pytest.mark.skipif(shutil.which("patch") is None, reason="the patch tool is not installed")


def apply_patch(tree: pathlib.Path, flavour: str, device: str = "mlu"):
    before = audit_static(tree, device)
    text = before.patch(flavour)
    pfile = tree.parent / f"{flavour}.patch"
    pfile.write_text(text)
    originals = {p: p.read_bytes() for p in tree.rglob("*.py")}
    # the audit itself never edits the audited files
    assert all(p.read_bytes() == b for p, b in originals.items())
    subprocess.run(["patch", "-p1", "--batch", "-s", "-i", str(pfile)], cwd=tree, check=True)
    return before, text


@needs_patch
@pytest.mark.parametrize("flavour", ["device", "hal"])
def test_patch_applies_compiles_and_reaudits_clean(tmp_path, flavour):
    tree = tmp_path / "proj"
    shutil.copytree(EXAMPLES, tree)
    before, text = apply_patch(tree, flavour)
    assert text.startswith("--- a/") and "+++ b/" in text
    for p in tree.rglob("*.py"):
        compile(p.read_text(), str(p), "exec")
    after = audit_static(tree, "mlu")
    errors = [f for f in after.findings if f.severity == "error"]
    # everything left is an error that the first audit reported without a fix for this flavour
    unfixed_before = {(f.path, f.rule, f.found) for f in before.findings if not f.edits.get(flavour)}
    assert {(f.path, f.rule, f.found) for f in errors} <= unfixed_before, [(f.path, f.line, f.rule) for f in errors]
    assert {f.rule for f in errors} <= UNFIXABLE | {"cuda-api"}
    # CUDA-only code left over is only what has no counterpart on MLU (torch.version.cuda, torch.cuda.nccl: the
    # audit refuses to write torch.mlu.nccl, which does not exist) or, under hal, is_nccl_available
    assert {f.found for f in after.findings if f.rule in CUDA_ONLY} <= {
        "torch.version.cuda", "torch.distributed.is_nccl_available", "torch.cuda.nccl", "torch.cuda.nccl.version"}
    # files whose errors are all fixable are completely clean of errors
    clean = {"cuda_train.py", "migration/amp_scaler.py", "migration/env_capability.py", "migration/float64_math.py"}
    assert not [f for f in errors if f.path in clean]
    if flavour == "device":
        patched = (tree / "cuda_train.py").read_text()
        assert "import torch_mlu" in patched and "torch.mlu.amp.GradScaler" in patched and '"cncl"' in patched
        # alias imports are rewritten at the import
        amp = (tree / "migration" / "amp_scaler.py").read_text()
        assert "import torch.mlu as tc" in amp and "from torch import mlu as cuda" in amp
        assert "from torch.mlu.amp import GradScaler, autocast" in amp and "torch.mlu.MLUGraph()" in amp
    else:
        patched = (tree / "cuda_train.py").read_text()
        assert "import hal.portable as hal_portable" in patched
        assert "torch.cuda." not in "".join(ln for ln in patched.splitlines() if not ln.lstrip().startswith("#")
                                           and "allow_tf32" not in ln and "cudnn" not in ln)


@needs_patch
def test_patch_never_touches_comments_docstrings_or_lookalikes(tmp_path):
    tree = tmp_path / "proj"
    shutil.copytree(EXAMPLES, tree)
    before = {p.relative_to(tree).as_posix(): p.read_text() for p in tree.rglob("*.py")}
    res = audit_static(tree, "mlu")
    flagged = {(f.path, ln) for f in res.findings for e in sum(f.edits.values(), ()) for ln in
               range(e.line, e.end_line + 1)} | {(s.path, e.line) for s in res.scans for e in s.import_edits}
    for flavour in ("device", "hal"):
        for rel, new in res.patched(flavour).items():
            old_lines = before[rel].splitlines()
            new_lines = [ln for ln in new.splitlines() if "added by hal-audit" not in ln
                         and ln != "import hal.portable as hal_portable"]
            assert len(new_lines) == len(old_lines), rel
            for i, (a, b) in enumerate(zip(old_lines, new_lines), 1):
                if a != b:
                    assert (rel, i) in flagged, (flavour, rel, i, a, b)
                    # trailing comments on changed lines survive verbatim
                    if "# expect:" in a:
                        assert a[a.index("# expect:"):] == b[b.index("# expect:"):]
    assert "lookalikes.py" not in "".join(res.patch(f) for f in ("device", "hal"))


def test_hal_patched_example_runs_on_the_cpu_backend(tmp_path):
    src = (EXAMPLES / "cuda_train.py").read_text()
    res = audit_static(EXAMPLES / "cuda_train.py", "mlu")
    patched = res.patched("hal")["cuda_train.py"]
    ast.parse(patched)
    script = tmp_path / "cuda_train.py"
    script.write_text(patched)
    env = dict(os.environ, HAL_BACKEND="cpu")
    out = subprocess.run([sys.executable, str(script), "--steps", "3"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # the hal path takes the "accelerator" branch on the CPU backend: AMP (bfloat16) and the scaler are on
    assert "device=cpu" in out.stdout and "mse=" in out.stdout
    assert src != patched


def test_apply_edits_keeps_outer_edit_and_missing_final_newline():
    src = "a = f(x)\nb = 2"
    out = apply_edits(src, [Edit(1, 4, 1, 8, "g(y)"), Edit(1, 6, 1, 7, "z"), Edit(2, 4, 2, 5, "3")], 1, "import m")
    assert out == "a = g(y)\nimport m\nb = 3"


def test_unified_diff_without_final_newline(tmp_path):
    from hal.conformance.migration.patch import unified_diff
    d = unified_diff("x.py", "import torch\ntorch.cuda.synchronize()", "import torch\ntorch.mlu.synchronize()")
    assert d.endswith("\\ No newline at end of file\n")
    if shutil.which("patch"):
        (tmp_path / "x.py").write_text("import torch\ntorch.cuda.synchronize()")
        (tmp_path / "p").write_text(d)
        subprocess.run(["patch", "-p1", "--batch", "-s", "-i", "p"], cwd=tmp_path, check=True)
        assert (tmp_path / "x.py").read_text() == "import torch\ntorch.mlu.synchronize()"
