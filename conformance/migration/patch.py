"""Turn findings' edits into a unified diff (``migration.patch``); never writes the audited files.

Paths in the diff are relative to the audited folder with ``a/`` and ``b/`` prefixes, so the patch
applies with ``patch -p1`` (or ``git apply``) run in that folder. Overlapping edits keep the first
(outermost) one. Pure functions; thread-safe.
"""
from __future__ import annotations

import difflib
from typing import Iterable, Sequence

from hal.conformance.migration.scanner import HAL_IMPORT, Edit, FileScan

FLAVOURS = ("device", "hal")


def apply_edits(source: str, edits: Iterable[Edit], insert_line: int = 0, insert_text: str = "") -> str:
    """``source`` with ``edits`` applied (and ``insert_text`` inserted as a line before ``insert_line``)."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln))

    def offset(line: int, col: int) -> int:
        return starts[line - 1] + col

    spans = sorted({(offset(e.line, e.col), offset(e.end_line, e.end_col), e.text) for e in edits},
                   key=lambda s: (s[0], -s[1]))
    kept: list = []
    end = -1
    for s in spans:
        if s[0] >= end:
            kept.append(s)
            end = s[1]
    out = source
    for start, stop, text in reversed(kept):
        out = out[:start] + text + out[stop:]
    if insert_text:
        new_lines = out.splitlines(keepends=True)
        at = min(insert_line, len(new_lines))
        if at and not new_lines[at - 1].endswith("\n"):
            new_lines[at - 1] += "\n"
        new_lines.insert(at, insert_text + "\n")
        out = "".join(new_lines)
    return out


def patched_source(scan: FileScan, source: str, flavour: str, import_module: str | None) -> str:
    """The file after the ``flavour`` fix (unchanged text when no finding has an edit)."""
    edits = [e for f in scan.findings for e in f.edits.get(flavour, ())]
    if flavour == "device":
        edits += scan.import_edits
    if not edits:
        return source
    insert = ""
    if flavour == "device" and import_module and not scan.has_import["device"]:
        insert = f"import {import_module}  # noqa: F401  (added by hal-audit: registers the target device with torch)"
    elif flavour == "hal" and not scan.has_import["hal"] and any(f.edits.get("hal") for f in scan.findings):
        insert = HAL_IMPORT
    return apply_edits(source, edits, scan.insert_line, insert)


def unified_diff(rel_path: str, before: str, after: str) -> str:
    """One file's unified diff with ``a/``/``b/`` prefixes (handles a missing final newline)."""
    if before == after:
        return ""
    out = []
    for line in difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                     f"a/{rel_path}", f"b/{rel_path}"):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def build_patch(files: Sequence[tuple[str, str, str]]) -> str:
    """Concatenate per-file diffs of ``(rel_path, before, after)``."""
    return "".join(unified_diff(p, b, a) for p, b, a in files)
