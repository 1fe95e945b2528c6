"""Jupyter notebooks as audit targets: code cells in order, with (cell, line) positions.

A minimal reader for running a notebook (the static side may use the issue-18 module
``conformance.migration.notebook`` when it exists; this one needs nothing but the JSON).

- :func:`read_cells` returns the code cells (markdown and raw cells are skipped), numbered from 1
  in notebook order counting code cells only (the number Jupyter users see as ``In [n]`` varies).
- :func:`cell_code` turns a cell's source into Python: ``!shell`` lines, ``x = !shell``, ``%magic``
  lines and ``%%cell_magic`` cells are replaced by ``pass`` at the same indentation (so line
  numbers stay those of the cell and the code still compiles); each one is reported as skipped.
  ``%%time``/``%%timeit``/``%%capture`` cells keep their Python body.
- :func:`cell_filename` / :func:`parse_cell_filename` name a cell for ``compile`` so that stack
  frames, findings and tracebacks carry the notebook path and the cell number.
- :func:`to_script` concatenates the cells into one Python source and returns the line map
  ``script line -> (cell, line in cell)`` (used for the static audit).

Raises :class:`NotebookError` (a ``ValueError``) for a file that is not a readable notebook.
"""
from __future__ import annotations

import json
import pathlib
import re
from dataclasses import dataclass, field
from typing import Any, Optional

_SHELL = re.compile(r"^(\s*)(!|%|\w[\w\s,]*=\s*!)")
_BODY_MAGICS = ("%%time", "%%timeit", "%%capture", "%%prun")
_CELL_TAG = "#cell"


class NotebookError(ValueError):
    """Not a readable .ipynb notebook (bad JSON, no cells list, ...)."""


@dataclass
class Cell:
    """One code cell: ``index`` (1-based among code cells) and its source lines (no newlines)."""
    index: int
    lines: list[str]
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line in cell, the skipped text)


def read_cells(path: str) -> list[Cell]:
    """The notebook's code cells in order (see the module docstring)."""
    try:
        with open(path, encoding="utf-8") as f:
            nb = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise NotebookError(f"{path}: not a readable Jupyter notebook ({exc})") from None
    cells = nb.get("cells") if isinstance(nb, dict) else None
    if not isinstance(cells, list):
        raise NotebookError(f"{path}: not a Jupyter notebook (no 'cells' list)")
    out: list[Cell] = []
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        text = "".join(src) if isinstance(src, list) else str(src)
        out.append(Cell(len(out) + 1, text.splitlines()))
    return out


def cell_code(cell: Cell) -> str:
    """The cell as Python (magics and shell lines become ``pass``); fills ``cell.skipped``."""
    cell.skipped = []
    lines = list(cell.lines)
    if lines and lines[0].lstrip().startswith("%%"):
        magic = lines[0].split()[0]
        cell.skipped.append((1, lines[0].strip()))
        if magic in _BODY_MAGICS:
            return "\n".join(["pass", *lines[1:]]) + "\n"
        return "\n".join("pass" if i == 0 else "" for i in range(len(lines))) + "\n"
    out = []
    for i, line in enumerate(lines, 1):
        m = _SHELL.match(line)
        if m and not _is_python(line):
            cell.skipped.append((i, line.strip()))
            out.append(m.group(1) + "pass")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def _is_python(line: str) -> bool:
    """``x = !ls`` looks like shell; ``a != b`` or ``x %= 3`` are Python: keep a line that compiles."""
    stripped = line.strip()
    if stripped.startswith(("!", "%")):
        return False
    try:
        compile(stripped, "<line>", "exec")
    except SyntaxError:
        return False
    return True


def cell_filename(path: str, index: int) -> str:
    """The filename a cell is compiled under: ``<path>#cell<index>``."""
    return f"{path}{_CELL_TAG}{index}"


def parse_cell_filename(filename: str) -> Optional[tuple[str, int]]:
    """``(notebook path, cell index)`` for a name made by :func:`cell_filename`, else None."""
    path, tag, num = filename.rpartition(_CELL_TAG)
    if tag and num.isdigit() and path.endswith(".ipynb"):
        return path, int(num)
    return None


def to_script(cells: list[Cell]) -> tuple[str, dict[int, tuple[int, int]]]:
    """All cells as one source, and ``{script line: (cell, line in cell)}`` (1-based)."""
    parts: list[str] = []
    where: dict[int, tuple[int, int]] = {}
    for cell in cells:
        code = cell_code(cell).splitlines()
        for i, text in enumerate(code, 1):
            parts.append(text)
            where[len(parts)] = (cell.index, i)
    return "\n".join(parts) + "\n", where


class _CellFinding:
    """A static finding on the generated script, re-addressed to (notebook, cell, line in cell)."""

    def __init__(self, finding: Any, notebook: str, where: dict[int, tuple[int, int]]) -> None:
        self._f, self._nb, self._where = finding, notebook, where

    def as_dict(self, flavour: str = "device") -> dict:
        d = self._f.as_dict(flavour)
        cell, line = self._where.get(d.get("line") or 0, (None, d.get("line")))
        end = self._where.get(d.get("end_line") or 0, (None, d.get("end_line")))[1]
        return {**d, "path": self._nb, "cell": cell, "line": line, "end_line": end,
                "message": f"cell {cell}, line {line}: {d.get('message', '')}"}


class NotebookStatic:
    """The static audit of a notebook: ``findings`` (with ``as_dict``), ``root``, ``stats()``."""

    def __init__(self, audit: Any, notebook: pathlib.Path, where: dict[int, tuple[int, int]]) -> None:
        self.root = notebook.resolve().parent
        self.findings = [_CellFinding(f, notebook.name, where) for f in audit.findings]
        self._audit = audit

    def stats(self) -> dict:
        return {**self._audit.stats(), "notebook_cells": True}


def static_audit(path: str, device: str) -> NotebookStatic:
    """Scan the notebook's code cells with the static auditor (``audit_static``) and name each
    finding's cell and line in it. Raises :class:`NotebookError`, or the auditor's own errors."""
    import tempfile

    from hal.conformance.migration import AuditInputError, audit_static
    nb = pathlib.Path(path)
    source, where = to_script(read_cells(path))
    with tempfile.TemporaryDirectory(prefix="hal-audit-nb-") as tmp:
        script = pathlib.Path(tmp) / (nb.stem + ".py")
        script.write_text(source, encoding="utf-8")
        try:
            audit = audit_static(script, device)
        except AuditInputError as exc:  # AuditInputError: name the cell, not the generated file
            msg = str(exc)
            m = re.search(re.escape(str(script)) + r":(\d+)", msg)
            if m:
                cell, line = where.get(int(m.group(1)), (0, int(m.group(1))))
                msg = msg.replace(m.group(0), f"{path}: cell {cell}, line {line}")
            raise NotebookError(msg.replace(str(script), str(path))) from None
    return NotebookStatic(audit, nb, where)
