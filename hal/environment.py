"""The environment fingerprint recorded with every published figure.

:func:`fingerprint` returns plain data: Python, platform, CPU, torch, the git commit of the HAL
checkout (when it is one), the command line, the UTC time, and for every installed backend its
availability, reason, library versions and devices (name, memory, capability, driver where the
backend reports one). Never raises: a part that cannot be read says why.
"""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Optional


def git_commit(path: Optional[Path] = None) -> str:
    """The commit of the checkout HAL runs from (``+dirty`` when it has local changes); ``$HAL_COMMIT``
    when set (a copy of the tree without its git folder, e.g. on a lent GPU machine); else ``"unknown"``."""
    if os.environ.get("HAL_COMMIT"):
        return os.environ["HAL_COMMIT"]
    where = path or Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        if len(sha) != 40 or any(c not in "0123456789abcdef" for c in sha):
            return "unknown"
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except Exception:
        return "unknown"


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint(include_devices: bool = True) -> dict:
    """See the module docstring."""
    import torch

    import hal
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "hal": hal.__version__,
        "commit": git_commit(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else "",
        "utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "backends": {},
    }
    for info in hal.list_backends():
        entry: dict = {"available": info.available, "reason": info.reason}
        if info.isolated or info.cls is not None:  # isolated plugins answer from their probe record
            entry["versions"] = info.versions()
        if include_devices and info.available:
            entry["devices"] = [{k: v for k, v in d.items() if k in
                                 ("index", "name", "total_memory", "capability", "extra", "error")}
                                for d in info.devices()]
        env["backends"][info.name] = entry
    return env
