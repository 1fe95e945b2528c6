"""Hostile backend plugins, built as real distributions and pip-installed into a target folder.

Used by tests/test_discovery.py, benchmarks/hardening_battery.py and benchmarks/bench_startup.py.
:func:`build_site` returns a folder to put on ``PYTHONPATH``; it holds these distributions:

==================  =============  ==========================================================
distribution        entry point    behaviour
==================  =============  ==========================================================
hal-hangprobe       hangprobe      ``probe()`` sleeps for an hour
hal-hangimport      hangimport     the module sleeps for an hour at import
hal-exitprobe       exitprobe      ``probe()`` calls ``os._exit(1)``
hal-sysexitprobe    sysexitprobe   ``probe()`` raises ``SystemExit(3)``
hal-printer         printer        prints to stdout (Python and C level) at import and in probe;
                                   otherwise a working plugin at priority -1
hal-chatty          chatty         a working plugin at priority -1 that prints to stdout when
                                   instantiated (after its probe)
hal-evilcpu         cpu            a second plugin named ``cpu``
==================  =============  ==========================================================
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

_CPU_BASE = "from hal.backends.cpu import CpuBackend\nfrom hal.backend import Availability\n"

PLUGINS = {
    "hangprobe": ("hal-hangprobe", _CPU_BASE + """
class Plugin(CpuBackend):
    name = device_type = "hangprobe"

    @classmethod
    def probe(cls):
        import time
        time.sleep(3600)
        return Availability.ok("never")
"""),
    "hangimport": ("hal-hangimport", "import time\ntime.sleep(3600)\n"),
    "exitprobe": ("hal-exitprobe", _CPU_BASE + """
class Plugin(CpuBackend):
    name = device_type = "exitprobe"

    @classmethod
    def probe(cls):
        import os
        os._exit(1)
"""),
    "sysexitprobe": ("hal-sysexitprobe", _CPU_BASE + """
class Plugin(CpuBackend):
    name = device_type = "sysexitprobe"

    @classmethod
    def probe(cls):
        raise SystemExit(3)
"""),
    "printer": ("hal-printer", _CPU_BASE + """
import os
if os.environ.get("HAL_TEST_IMPORT_LOG"):  # lets a test count how often the plugin is imported
    with open(os.environ["HAL_TEST_IMPORT_LOG"], "a") as fh:
        fh.write("import\\n")
print("PRINTER PLUGIN SAYS HELLO AT IMPORT")
os.write(1, b"PRINTER PLUGIN WRITES TO FD 1\\n")


class Plugin(CpuBackend):
    name = "printer"
    priority = -1

    @classmethod
    def probe(cls):
        print("PRINTER PLUGIN SAYS HELLO IN PROBE")
        return Availability.ok("printer test plugin (host memory)")
"""),
    "chatty": ("hal-chatty", _CPU_BASE + """
class Plugin(CpuBackend):
    name = "chatty"
    priority = -1

    def __init__(self):
        print("CHATTY PLUGIN SAYS HELLO WHEN INSTANTIATED")
        super().__init__()

    @classmethod
    def probe(cls):
        return Availability.ok("chatty test plugin (host memory)")
"""),
    "cpu": ("hal-evilcpu", _CPU_BASE + """
class Plugin(CpuBackend):
    name = "cpu"
    priority = 100

    @classmethod
    def probe(cls):
        return Availability.ok("the impostor cpu plugin")
"""),
}


def _write_project(root: Path, ep_name: str, dist: str, body: str) -> Path:
    pkg_name = f"hostile_{ep_name}_pkg" if ep_name != "cpu" else "hostile_evilcpu_pkg"
    src = root / f"src_{dist}"
    (src / pkg_name).mkdir(parents=True, exist_ok=True)
    (src / pkg_name / "__init__.py").write_text(textwrap.dedent(body))
    (src / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools>=64"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "{dist}"
        version = "0.0.1"
        [project.entry-points."hal.backends"]
        {ep_name} = "{pkg_name}:Plugin"
        [tool.setuptools]
        packages = ["{pkg_name}"]
    """))
    return src


def build_site(root: Path, names=tuple(PLUGINS)) -> Path:
    """pip-install the named hostile plugins into ``root/site`` (one pip call); return that folder."""
    root = Path(root)
    site = root / "site"
    srcs = [str(_write_project(root, n, *PLUGINS[n])) for n in names]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), *srcs], check=True, capture_output=True)
    return site


def site_env(site: Path, **extra: str) -> dict:
    """Environment that makes the plugins in ``site`` visible, with a private cache folder."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
            "XDG_CACHE_HOME": str(Path(site) / ".cache"), **extra}


if __name__ == "__main__":  # pragma: no cover - manual use
    print(build_site(Path(sys.argv[1])))
