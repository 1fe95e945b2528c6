"""hal-audit targets beyond a script: ``-m pkg.module`` (like ``python -m``) and ``.ipynb`` notebooks.

Real subprocesses of the real CLI, real torch programs (CUDA-only code run redirected on this CPU)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FIX = Path(__file__).resolve().parent / "fixtures" / "runtime"


def hal_audit(*args, cwd=None, timeout=240):
    return subprocess.run([sys.executable, "-m", "hal.cli.audit", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


def _nb(path: Path, cells: list) -> Path:
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                                           "source": src} for src in cells], "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    return path


def test_module_target_runs_like_python_m_with_relative_imports(tmp_path):
    p = hal_audit("-m", "trainer.train", "--device", "mlu", "--out", tmp_path / "o", "--format", "json", "--", "3",
                  cwd=FIX / "modpkg")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["run"]["status"] == "ok" and rep["run"]["optimizer_steps"] == 3
    assert rep["run"]["output_tail"][-1] == "module step 2 __main__"  # run as __main__, argv passed
    assert rep["target"]["kind"] == "module"
    found = {(f["path"], f["line"], f["rule"]) for f in rep["findings"]}
    assert ("train.py", 7, "runtime-redirect-cuda-device") in found and ("train.py", 7, "cuda-method") in found
    assert any(o["op"] == "aten::addmm" for o in rep["ops"])


@pytest.mark.parametrize("argv,fragment", [
    (["-m", "no_such_pkg.train"], "no module named 'no_such_pkg'"),
    (["-m", "trainer"], "has no __main__ module"),
    (["-m", "trainer.train", "x.py"], "exactly one of TARGET or -m MODULE"),
])
def test_module_bad_input_exits_2(tmp_path, argv, fragment):
    p = hal_audit(*argv, "--out", tmp_path / "o", cwd=FIX / "modpkg")
    assert p.returncode == 2 and fragment in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "o").exists()


def test_notebook_runs_cells_in_order_and_findings_name_cell_and_line(tmp_path):
    p = hal_audit(FIX / "cuda_notebook.ipynb", "--device", "mlu", "--out", tmp_path / "o", "--format", "json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["run"]["status"] == "ok" and rep["run"]["optimizer_steps"] == 3
    assert rep["run"]["output_tail"][-1] == "nb step 2"
    found = {(f["cell"], f["line"], f["rule"]) for f in rep["findings"]}
    # cells are numbered among all cells (the fixture starts with a markdown cell), as editors show them
    assert {(2, 1, "runtime-notebook-magic-skipped"), (2, 2, "runtime-notebook-magic-skipped")} <= found
    assert (2, 4, "runtime-redirect-cuda-available") in found and (2, 4, "cuda-api") in found  # run and static
    assert (4, 2, "runtime-redirect-cuda-device") in found and (4, 2, "cuda-method") in found
    assert all(f["path"] == "cuda_notebook.ipynb" for f in rep["findings"])
    magic = next(f for f in rep["findings"] if f["rule"] == "runtime-notebook-magic-skipped")
    assert magic["severity"] == "info" and "!pip install nothing" in magic["message"]


def test_notebook_error_names_the_cell_and_line(tmp_path):
    nb = _nb(tmp_path / "broken.ipynb", ["import torch\nx = torch.ones(2)\n", "y = x + 1\nraise ValueError('bad cell')\n",
                                         "print('never')\n"])
    p = hal_audit(nb, "--device", "mlu", "--out", tmp_path / "o", "--format", "json")
    assert p.returncode == 3, p.stderr
    run = json.loads(p.stdout)["run"]
    assert run["status"] == "error" and run["error"] == "cell 2, line 2: ValueError: bad cell"


def test_notebook_bad_input_and_static_only(tmp_path):
    bad = tmp_path / "bad.ipynb"
    bad.write_text("{not json")
    p = hal_audit(bad, "--out", tmp_path / "o")
    assert p.returncode == 2 and "bad.ipynb: not JSON" in p.stderr and "Traceback" not in p.stderr
    syntax = _nb(tmp_path / "syntax.ipynb", ["import torch\n", "x = [\n"])
    p = hal_audit(syntax, "--out", tmp_path / "o")
    assert p.returncode == 2 and "cell 2, line" in p.stderr and "syntax error" in p.stderr, p.stderr
    p = hal_audit(FIX / "cuda_notebook.ipynb", "--static-only", "--out", tmp_path / "o2", "--format", "json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["run"]["status"] == "skipped"
    assert {(f["cell"], f["line"], f["rule"]) for f in rep["findings"]} >= {(4, 2, "cuda-method"), (2, 4, "cuda-api")}
