"""Backend discovery through real stevedore entry points, including a real installed plugin package
whose import raises."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hal
from hal.backend import Backend
from tests.conftest import run_cli


def _build_plugin(tmp_path: Path, name: str, body: str, dist: str) -> Path:
    """Write a plugin distribution and pip-install it into a private target folder."""
    src = tmp_path / f"src_{name}"
    pkg = src / f"{name}_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(body))
    (src / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools>=64"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "{dist}"
        version = "0.0.1"
        [project.entry-points."hal.backends"]
        {name} = "{name}_pkg:Plugin"
        [tool.setuptools]
        packages = ["{name}_pkg"]
    """))
    target = tmp_path / f"site_{name}"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(src)], check=True, capture_output=True)
    return target


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """A folder with two real installed third-party plugins: one whose import raises, one that works."""
    tmp = tmp_path_factory.mktemp("plugins")
    broken = _build_plugin(tmp, "brokenchip", """
        raise ImportError("vendor SDK libbroken.so: cannot open shared object file")
    """, "hal-brokenchip")
    good = _build_plugin(tmp, "goodchip", """
        from hal.backends.cpu import CpuBackend
        from hal.backend import Availability

        class Plugin(CpuBackend):
            name = "goodchip"
            priority = 5

            @classmethod
            def probe(cls):
                return Availability.ok("goodchip test plugin (host memory)")
    """, "hal-goodchip")
    site = tmp / "site"
    site.mkdir()
    for src in (broken, good):
        for p in src.iterdir():
            os.rename(p, site / p.name)
    return site


def _env(site: Path) -> dict:
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
            "XDG_CACHE_HOME": str(site / ".cache")}


def test_builtin_backends_listed_with_reasons():
    infos = {i.name: i for i in hal.list_backends()}
    assert {"cpu", "cuda", "mlu"} <= set(infos)
    assert infos["cpu"].available and infos["cpu"].target == "hal.backends.cpu:CpuBackend"
    if not infos["mlu"].available:
        assert "torch_mlu" in infos["mlu"].reason
    if not infos["cuda"].available:
        assert infos["cuda"].reason
    assert hal.backend_errors().keys() == {n for n, i in infos.items() if not i.available}


def test_cli_backends_json_lists_broken_plugin_and_cpu_still_works(plugin_site):
    r = run_cli("hal", "backends", "--format", "json", env=_env(plugin_site))
    assert r.returncode == 0, r.stderr
    rows = {b["name"]: b for b in json.loads(r.stdout)["backends"]}
    assert rows["cpu"]["available"] and rows["cpu"]["devices"]
    assert not rows["brokenchip"]["available"]
    assert "libbroken.so" in rows["brokenchip"]["reason"] and "ImportError" in rows["brokenchip"]["reason"]
    assert rows["goodchip"]["available"] and rows["goodchip"]["priority"] == 5
    assert "torch_mlu" in rows["mlu"]["reason"] or rows["mlu"]["available"]


def test_explicit_backend_fails_loudly_with_recorded_reason(plugin_site):
    code = ("import hal\n"
            "try:\n    hal.get_backend()\nexcept hal.BackendUnavailableError as e:\n    print('ERR', e.reason)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, **_env(plugin_site), "HAL_BACKEND": "brokenchip"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ERR plugin failed to import: ImportError") and "libbroken.so" in r.stdout
    r = subprocess.run([sys.executable, "-c", "import hal; print(hal.get_backend().name)"], capture_output=True,
                       text=True, env={**os.environ, **_env(plugin_site), "HAL_BACKEND": "goodchip"})
    assert r.stdout.strip() == "goodchip", r.stderr


def test_default_is_highest_priority_available(plugin_site):
    r = subprocess.run([sys.executable, "-c", "import hal; print(hal.get_backend().name)"], capture_output=True,
                       text=True, env={**os.environ, **_env(plugin_site)})
    best = max((i for i in hal.list_backends() if i.available), key=lambda i: i.priority)
    expected = best.name if best.priority > 5 else "goodchip"
    assert r.stdout.strip() == expected, r.stderr


def test_unknown_explicit_backend(monkeypatch):
    monkeypatch.setenv("HAL_BACKEND", "nosuchchip")
    with pytest.raises(hal.BackendUnavailableError, match="no such backend is installed"):
        hal.get_backend()


def test_probe_that_raises_is_recorded_not_propagated():
    from hal.discovery import _probe

    class Exploding(Backend):
        name = device_type = "exploding"

        @classmethod
        def probe(cls):
            raise RuntimeError("driver crashed")

    info = _probe("exploding", Exploding, "x:Exploding", "")
    assert not info.available and "RuntimeError: driver crashed" in info.reason
    info = _probe("notabackend", dict, "x:dict", "")
    assert not info.available and "not a hal.Backend subclass" in info.reason


def test_warns_when_hardware_present_but_backend_unavailable(tmp_path):
    from hal.discovery import BackendInfo, _warn_missing
    (tmp_path / "chip0").write_text("")

    class Present(Backend):
        name = device_type = "present"
        device_files = (str(tmp_path / "chip*"),)

        @classmethod
        def probe(cls):
            return hal.Availability.no("SDK missing")

    info = BackendInfo("present", Present, Present.probe(), 0)
    with pytest.warns(RuntimeWarning, match="looks present .*chip0.*SDK missing"):
        _warn_missing({"present": info})


def test_refresh_clears_stevedore_cache():
    from stevedore import ExtensionManager
    hal.list_backends()
    assert ExtensionManager.ENTRY_POINT_CACHE
    hal.refresh()
    assert not ExtensionManager.ENTRY_POINT_CACHE
    assert any(i.name == "cpu" for i in hal.list_backends())
