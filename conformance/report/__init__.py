"""The one report writer of ``hal-audit``: every section of a ``hal-audit/1`` report goes through here.

API::

    report = new_report(target, run=..., findings=[...], ops=[...], precision=..., profile=...)
    paths = write_reports(report, out_dir, catalogue=CATALOGUE, root=audited_root)
    text = render(report, "text" | "md" | "json" | "html" | "sarif")

:func:`write_reports` writes ``audit.json`` always, plus ``audit.md``, ``audit.html`` and
``audit.sarif`` (``formats`` picks them), and :func:`write_artifact` writes ``migration.patch``.
Only the fixed file names of :data:`ARTIFACTS` are ever written, directly inside ``out_dir`` (atomic
replace: an existing symlink at a report name is replaced, never followed), so nothing lands
outside the folder given. Files get mode ``0666 & ~umask`` like any file the user creates. Raises :class:`ReportError` when ``out_dir`` cannot be used.
A later audit adds a section with :func:`hal.conformance.report.render.register_section`.
"""
from __future__ import annotations

import json
import os
import pathlib
import tempfile
from typing import Iterable, Mapping, Optional

from hal.conformance.report.render import register_section, to_html, to_markdown, to_text
from hal.conformance.report.sarif import to_sarif
from hal.conformance.report.schema import (REQUIRED_KEYS, SCHEMA, environment_info, finalize, new_report,
                                          validate)
from hal.errors import HalError

__all__ = ["SCHEMA", "REQUIRED_KEYS", "new_report", "finalize", "validate", "environment_info", "render",
           "write_reports", "write_artifact", "register_section", "ReportError", "ARTIFACTS"]

ARTIFACTS = {"json": "audit.json", "md": "audit.md", "html": "audit.html", "sarif": "audit.sarif",
             "patch": "migration.patch"}
DEFAULT_FORMATS = ("json", "md", "html", "sarif")


class ReportError(HalError):
    """The output folder cannot be created or written."""


def render(report: dict, fmt: str, catalogue: Optional[Mapping[str, str]] = None, root: Optional[str] = None,
           written: Optional[dict] = None) -> str:
    """``report`` as ``fmt`` (text, md, json, html, sarif). ``root``: the audited folder or file
    (SARIF's source root; source snippets in text, md and html)."""
    if fmt == "json":
        return json.dumps(report, indent=2, default=str, ensure_ascii=False)
    if fmt == "md":
        return to_markdown(report, root)
    if fmt == "html":
        return to_html(report, root)
    if fmt == "sarif":
        import hal
        return json.dumps(to_sarif(report, catalogue or {}, root, hal.__version__), indent=2, ensure_ascii=False)
    if fmt == "text":
        return to_text(report, written, root=root)
    raise ValueError(f"unknown report format {fmt!r}")


def _out_dir(out_dir: os.PathLike) -> pathlib.Path:
    out = pathlib.Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {out}: exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"--out {out}: cannot create folder: {exc.strerror or exc}") from None
    return out


def current_umask() -> int:
    """The process umask, read without changing it where /proc allows (else set and restored)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_artifact(out_dir: os.PathLike, kind: str, text: "str | bytes") -> pathlib.Path:
    """Write artifact ``kind`` (a key of :data:`ARTIFACTS`) into ``out_dir`` atomically (bytes as they are)."""
    name = ARTIFACTS[kind]
    out = _out_dir(out_dir)
    dest = out / name
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=out)
        os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp makes 0600; reports follow the umask
        with (os.fdopen(fd, "wb") if isinstance(text, bytes) else
              os.fdopen(fd, "w", encoding="utf-8", newline="")) as fh:
            fh.write(text)
        os.replace(tmp, dest)  # replaces a symlink named `name` itself; never writes through it
    except OSError as exc:
        raise ReportError(f"--out {out}: cannot write {name}: {exc.strerror or exc}") from None
    return dest


def write_reports(report: dict, out_dir: os.PathLike, catalogue: Optional[Mapping[str, str]] = None,
                  root: Optional[str] = None, formats: Iterable[str] = DEFAULT_FORMATS) -> dict:
    """Finalize ``report`` and write it; returns ``{format: path}``. audit.json is always written."""
    finalize(report)
    fmts = ["json"] + [f for f in formats if f != "json"]
    return {f: write_artifact(out_dir, f, render(report, f, catalogue, root)) for f in fmts}
