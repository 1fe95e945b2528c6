"""Static audit and --fix on Jupyter notebooks: findings name the cell, the patch is a diff of the JSON."""
import json
import shutil
import subprocess

import pytest

from hal.conformance.migration import audit_static
from hal.conformance.migration.notebook import notebook_source

NB = {"cells": [
    {"cell_type": "markdown", "metadata": {}, "source": ["# Train on cuda\n", "`x.cuda()` in prose"]},
    {"cell_type": "code", "execution_count": 1, "metadata": {}, "outputs": [],
     "source": ["!pip install tqdm\n", "import torch\n", "%matplotlib inline"]},
    {"cell_type": "code", "execution_count": 2, "metadata": {},
     "outputs": [{"name": "stdout", "output_type": "stream", "text": ["cuda\n"]}],
     "source": ["device = 'cuda' if torch.cuda.is_available() else 'cpu'\n", "x = torch.ones(2).cuda()\n",
                "print(device)"]}],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
    "nbformat": 4, "nbformat_minor": 5}


def _write(path):
    path.write_text(json.dumps(NB, indent=1, ensure_ascii=False, sort_keys=True) + "\n")


def test_findings_name_cell_and_line(tmp_path):
    _write(tmp_path / "train.ipynb")
    res = audit_static(tmp_path, "mlu")
    got = {(f.rule, f.message.rsplit("[", 1)[1]) for f in res.findings}
    assert ("cuda-method", "cell 3, line 2]") in got and ("device-string", "cell 3, line 1]") in got
    assert not [f for f in res.findings if "cell 1" in f.message]  # markdown is never code
    ns = notebook_source((tmp_path / "train.ipynb").read_text())
    assert ns.locate(2) == (2, 2)


@pytest.mark.skipif(shutil.which("patch") is None, reason="patch is not installed")
@pytest.mark.parametrize("flavour", ["device", "hal"])
def test_notebook_patch_applies_and_keeps_outputs_and_magics(tmp_path, flavour):
    tree = tmp_path / "nb"
    tree.mkdir()
    _write(tree / "train.ipynb")
    res = audit_static(tree, "mlu")
    (tmp_path / "p.patch").write_bytes(res.patch_bytes(flavour))
    subprocess.run(["patch", "-p1", "--batch", "-s", "-i", str(tmp_path / "p.patch")], cwd=tree, check=True)
    nb = json.loads((tree / "train.ipynb").read_text())
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    assert code[0].startswith("!pip install tqdm\n") and code[0].endswith("%matplotlib inline")
    assert nb["cells"][2]["outputs"] == NB["cells"][2]["outputs"]
    assert nb["cells"][0] == NB["cells"][0]
    assert ".cuda()" not in code[1] and "'cuda'" not in code[1]
    for c in code:
        compile("\n".join(ln for ln in c.splitlines() if not ln.startswith(("!", "%"))), "cell", "exec")
    assert not [f for f in audit_static(tree, "mlu").findings if f.severity == "error"]
