"""Backend discovery through real entry points: real installed plugin packages whose import raises,
and hostile plugins (probe hangs, exits the process, raises SystemExit, prints, a second ``cpu``)
that are probed in bounded child processes and never break ``hal`` (benchmarks/hostile_plugins.py)."""
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import hostile_plugins  # noqa: E402


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


def test_refresh_forgets_entry_points_and_instances():
    from hal import discovery
    hal.list_backends()
    first = hal.get_backend("cpu")
    assert discovery._entry_points
    hal.refresh()
    assert discovery._entry_points is None and discovery._cache is None
    assert any(i.name == "cpu" for i in hal.list_backends())
    assert hal.get_backend("cpu") is not first


# ---- plugin isolation: hostile plugins (benchmarks/hostile_plugins.py), pip-installed for real --------------

@pytest.fixture(scope="module")
def hostile_site(tmp_path_factory) -> Path:
    return hostile_plugins.build_site(tmp_path_factory.mktemp("hostile"))


def _hostile_env(site: Path, **extra) -> dict:
    return hostile_plugins.site_env(site, HAL_PROBE_TIMEOUT="3", **extra)


def _run(args, env, timeout=180):
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)


def test_hostile_plugins_listed_unavailable_with_reasons_json_stays_valid(hostile_site, tmp_path):
    log = tmp_path / "imports.log"
    # a probe cache of its own: other tests of this module share the site (and would fill its cache)
    env = _hostile_env(hostile_site, HAL_TEST_IMPORT_LOG=str(log), XDG_CACHE_HOME=str(tmp_path / "cache"))
    hal_bin = Path(sys.executable).parent / "hal"
    r = _run([str(hal_bin), "backends", "--format", "json"], env)
    assert r.returncode == 0, r.stderr
    assert not [ln for ln in r.stdout.splitlines() if "PRINTER" in ln and '"reason"' not in ln]  # no raw print
    rows = {b["name"]: b for b in json.loads(r.stdout)["backends"]}
    assert rows["hangprobe"]["reason"] == "probe timed out after 3 s" and not rows["hangprobe"]["available"]
    assert rows["hangimport"]["reason"] == "plugin import timed out after 3 s"
    assert rows["exitprobe"]["reason"] == "probe exited the process with code 1"
    assert rows["sysexitprobe"]["reason"] == "probe raised SystemExit: 3"
    assert not rows["printer"]["available"] and rows["printer"]["isolated"] and not rows["printer"]["devices"]
    assert rows["printer"]["reason"].startswith("plugin wrote to stdout while imported or probed (")
    assert "PRINTER PLUGIN SAYS HELLO AT IMPORT" in rows["printer"]["reason"]
    assert rows["printer"]["distribution"] == "hal-printer" and rows["printer"]["version"] == "0.0.1"
    assert rows["chatty"]["available"] and rows["chatty"]["devices"] and "CHATTY" not in r.stdout
    cpu = rows["cpu"]
    assert cpu["available"] and cpu["distribution"] == "hal-portability" and "host CPU" in cpu["reason"]
    assert not cpu["isolated"] and cpu["priority"] == 0
    assert len(cpu["collisions"]) == 1
    assert "hal-evilcpu 0.0.1" in cpu["collisions"][0] and "hal-portability" in cpu["collisions"][0]
    assert log.read_text().count("import") == 1  # probed once, in a child
    # a second command is answered from the cache: the plugin is not imported again
    r2 = _run([str(hal_bin), "backends", "--format", "json"], env)
    assert r2.returncode == 0 and json.loads(r2.stdout) == json.loads(r.stdout)
    assert log.read_text().count("import") == 1
    # text format: the collision is a warning naming both distributions; reasons are one line each
    r3 = _run([str(hal_bin), "backends"], env)
    assert r3.returncode == 0 and "warning: backend name 'cpu' is registered twice: hal-evilcpu" in r3.stdout
    # --refresh probes again
    r4 = _run([str(hal_bin), "backends", "--format", "json", "--refresh"], env)
    assert r4.returncode == 0 and log.read_text().count("import") == 2


def test_hostile_plugins_never_run_in_the_hal_process(hostile_site):
    code = ("import sys, hal\n"
            "infos = {i.name: i for i in hal.list_backends()}\n"
            "print(sorted(m for m in sys.modules if m.startswith('hostile_')))\n"
            "print(hal.get_backend().name, type(hal.get_backend('cpu')).__module__)\n"
            "print(infos['cpu'].collisions[0].split(':')[0])\n")
    r = _run([sys.executable, "-c", code], _hostile_env(hostile_site))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "[]"
    assert lines[1].split()[1] == "hal.backends.cpu"  # the impostor 'cpu' (priority 100) is not used
    assert lines[2] == "backend name 'cpu' is registered twice"


@pytest.mark.parametrize("name,reason", [
    ("hangprobe", "probe timed out after 3 s"),
    ("exitprobe", "probe exited the process with code 1"),
    ("sysexitprobe", "probe raised SystemExit: 3"),
    ("hangimport", "plugin import timed out after 3 s"),
    ("printer", "plugin wrote to stdout while imported or probed (101 bytes: 'PRINTER PLUGIN SAYS HELLO AT IMPORT "
                "PRINTER PLUGIN WRITES TO FD 1 PRINTER PLUGIN'); a backend must keep stdout clean"),
])
def test_explicit_hostile_backend_raises_typed_error(hostile_site, name, reason):
    code = ("import hal\n"
            "try:\n    hal.get_backend()\nexcept hal.BackendUnavailableError as e:\n    print('ERR', e.reason)\n")
    r = _run([sys.executable, "-c", code], _hostile_env(hostile_site, HAL_BACKEND=name))
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"ERR {reason}\n"


def test_requested_plugin_loads_in_process_with_stdout_clean(hostile_site):
    code = "import sys, hal; b = hal.get_backend(); print('NAME', b.name, 'hostile_chatty_pkg' in sys.modules)"
    r = _run([sys.executable, "-c", code], _hostile_env(hostile_site, HAL_BACKEND="chatty"))
    assert r.returncode == 0, r.stderr
    assert "CHATTY PLUGIN SAYS HELLO WHEN INSTANTIATED" in r.stderr
    assert r.stdout == "NAME chatty True\n"
    code = "import sys, hal; hal.list_backends(); print('hostile_chatty_pkg' in sys.modules)"
    r = _run([sys.executable, "-c", code], _hostile_env(hostile_site))
    assert r.stdout == "False\n"  # listing never loads it here


def test_hal_audit_cpu_works_with_hostile_plugins(hostile_site, tmp_path):
    script = tmp_path / "x.py"
    script.write_text("import torch\nprint(torch.ones(2).sum().item())\n")
    exe = Path(sys.executable).parent / "hal-audit"
    r = _run([str(exe), str(script), "--device", "cpu", "--out", str(tmp_path / "o"), "--format", "json"],
             _hostile_env(hostile_site))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["run"]["status"] == "ok" and doc["target"]["device"] == "cpu"
    assert (tmp_path / "o" / "audit.md").is_file()


def test_probe_cache_key_follows_plugin_version_and_environment(monkeypatch):
    from hal.plugin_probe import PluginSpec, cache_key
    a = PluginSpec("x", "x_pkg:Plugin", "hal-x", "1.0")
    assert cache_key(a) == cache_key(PluginSpec("x", "x_pkg:Plugin", "hal-x", "1.0"))
    assert cache_key(a) != cache_key(PluginSpec("x", "x_pkg:Plugin", "hal-x", "1.1"))
    before = cache_key(a)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    assert cache_key(a) != before


@pytest.mark.parametrize("raw,expected", [("2.5", 2.5), ("nan", 10.0), ("-1", 10.0), ("inf", 10.0), ("x", 10.0),
                                          ("0", 10.0)])
def test_probe_timeout_from_environment(monkeypatch, raw, expected):
    from hal.plugin_probe import probe_timeout
    monkeypatch.setenv("HAL_PROBE_TIMEOUT", raw)
    assert probe_timeout() == expected
