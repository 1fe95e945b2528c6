"""Jupyter notebooks as audit targets: code cells in order, with (cell, line) positions.

The reader for *running* a notebook; the static audit reads notebooks through
``conformance.migration.notebook``. Both number cells the same way.

- :func:`read_cells` returns the code cells (markdown and raw cells are skipped), each numbered by
  its position among *all* cells from 1, as notebook editors show them (the ``In [n]`` execution
  count varies from run to run).
- :func:`cell_code` turns a cell's source into Python: ``!shell`` lines, ``x = !shell``, ``%magic``
  lines and ``%%cell_magic`` cells are replaced by ``pass`` at the same indentation (so line
  numbers stay those of the cell and the code still compiles); each one is reported as skipped.
  ``%%time``/``%%timeit``/``%%capture`` cells keep their Python body.
- :func:`cell_filename` / :func:`parse_cell_filename` name a cell for ``compile`` so that stack
  frames, findings and tracebacks carry the notebook path and the cell number.

Raises :class:`NotebookError` (a ``ValueError``) for a file that is not a readable notebook.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Optional

_SHELL = re.compile(r"^(\s*)(!|%|\w[\w\s,]*=\s*!)")
_BODY_MAGICS = ("%%time", "%%timeit", "%%capture", "%%prun")
_CELL_TAG = "#cell"


class NotebookError(ValueError):
    """Not a readable .ipynb notebook (bad JSON, no cells list, ...)."""


@dataclass
class Cell:
    """One code cell: ``index`` (1-based among all cells) and its source lines (no newlines)."""
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
    for number, cell in enumerate(cells, 1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        text = "".join(src) if isinstance(src, list) else str(src)
        out.append(Cell(number, text.splitlines()))
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
