"""The command surface: `hal audit` is `hal-audit`, `python -m hal`, --version, help, a torch-free start."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hal.cli.main import COLLECTIVE_DTYPES

PY = sys.executable


def _run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([PY, *args], capture_output=True, text=True, timeout=300, **kw)


def test_help_and_version_do_not_import_torch():
    code = ("import sys\nfrom hal.cli.main import main\n"
            "for argv in (['--help'], ['--version'], ['audit', '--help'], ['collectives', '--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print('TORCH', 'torch' in sys.modules)\n")
    p = _run("-c", code)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "TORCH False", p.stdout[-500:]


def test_import_hal_is_lazy_but_complete():
    p = _run("-c", "import sys, hal\nlazy = 'torch' not in sys.modules\n"
                   "missing = [n for n in hal.__all__ if not hasattr(hal, n)]\n"
                   "print(lazy, missing, 'torch' in sys.modules)")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["True", "[]", "True"]  # lazy at import, every public name resolves


def test_unknown_attribute_is_an_attribute_error():
    import hal
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        hal.nosuch  # noqa: B018


@pytest.mark.parametrize("argv", [["-m", "hal", "--version"], ["-m", "hal.cli.main", "--version"]])
def test_version(argv):
    from hal import __version__
    p = _run(*argv)
    assert p.returncode == 0 and p.stdout.split()[-1] == __version__, (p.stdout, p.stderr)


def test_hal_audit_alias_is_the_same_command(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("import torch\nx = torch.ones(2).cuda()\n")
    outs = []
    for argv in (["-m", "hal", "audit"], ["-m", "hal.cli.audit"]):
        out = tmp_path / ("o" + str(len(outs)))
        p = _run(*argv, str(script), "--device", "mlu", "--static-only", "--out", str(out), "--format", "json")
        assert p.returncode == 0, p.stderr
        outs.append({(f["line"], f["rule"]) for f in json.loads(p.stdout)["findings"]})
    assert outs[0] == outs[1] and (2, "cuda-method") in outs[0]
    p = _run("-m", "hal", "audit", str(tmp_path / "missing.py"))
    assert p.returncode == 2 and p.stderr.startswith("hal audit: error:") and len(p.stderr.splitlines()) == 1


def test_usage_names_program_args_and_help_shows_defaults():
    p = _run("-m", "hal", "audit", "--help")
    assert p.returncode == 0
    assert p.stdout.startswith("usage: hal audit (TARGET | -m MODULE) [options] [-- ARGS]")
    assert "(default: mlu)" in p.stdout and "(default: hal-audit-out)" in p.stdout and "(default: None)" not in p.stdout
    p = _run("-m", "hal", "collectives", "--help")
    flat = " ".join(p.stdout.split())
    assert "(default: 2)" in flat and f"(default: {COLLECTIVE_DTYPES})" in flat, flat


def test_collectives_default_dtypes_are_the_suites():
    from hal.testing.collectives import DTYPES
    assert tuple(COLLECTIVE_DTYPES.split(",")) == DTYPES
