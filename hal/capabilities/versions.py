"""Which ATen overloads exist in a given torch release (for manifests that pair with an older torch).

Op lists are derived from the ``native_functions.yaml`` that every torch wheel ships under
``torchgen/packaged/ATen/native/`` (every ``- func:`` plus its ``autogen:`` out variants) and
committed as ``hal/capabilities/data/torch-<version>-ops.tsv``: one normalised overload per line,
``#`` comment lines giving the source. Built with::

    python -m hal.capabilities.generate torch-ops --yaml PATH/native_functions.yaml --version 2.4.0

Loading is cached; read-only afterwards (thread-safe).
"""
from __future__ import annotations

import functools
import pathlib
import re
from typing import Optional

from hal.capabilities.names import normalize_op

DATA = pathlib.Path(__file__).parent / "data"
_FUNC = re.compile(r"^- func: ([\w.]+)\(")
_AUTOGEN = re.compile(r"^\s+autogen: (.+)$")


def ops_from_yaml(text: str) -> set[str]:
    """Every ATen overload a native_functions.yaml declares (functions and autogen variants)."""
    out: set[str] = set()
    for line in text.splitlines():
        m = _FUNC.match(line)
        if m:
            out.add(normalize_op("aten::" + m.group(1)))
            continue
        m = _AUTOGEN.match(line)
        if m:
            out.update(normalize_op("aten::" + x.strip()) for x in m.group(1).split(",") if x.strip())
    return out


def path_for(version: str) -> pathlib.Path:
    return DATA / f"torch-{version}-ops.tsv"


def available_versions() -> list[str]:
    return sorted(p.name[len("torch-"):-len("-ops.tsv")] for p in DATA.glob("torch-*-ops.tsv"))


def version_for_pairing(pairing: str) -> Optional[str]:
    """The committed op list whose version matches ``pairing`` ("2.4" -> "2.4.0"), or None."""
    for v in available_versions():
        if v == pairing or v.startswith(pairing + "."):
            return v
    return None


@functools.lru_cache(maxsize=8)
def ops_of(version: str) -> frozenset[str]:
    """The committed op set of torch ``version``. Raises FileNotFoundError when not committed."""
    lines = path_for(version).read_text(encoding="utf-8").splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def source_of(version: str) -> str:
    lines = path_for(version).read_text(encoding="utf-8").splitlines()
    return " ".join(line[1:].strip() for line in lines if line.startswith("#"))
