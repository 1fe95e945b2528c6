"""Jupyter notebooks as Python source for the audits: code cells joined into one module, lines mapped back.

:func:`notebook_source` turns ``.ipynb`` JSON into a :class:`NotebookSource`: the code cells joined in
order, each followed by a boundary comment line, IPython magics and shell lines (``%...``, ``!...``)
commented out so the module parses; :meth:`NotebookSource.locate` maps a line of that module back to
``(cell number, line in cell)`` (both 1-based, cell numbers count every cell as Jupyter shows them).
The runtime audit may reuse this to run or map a notebook.

:func:`patched_notebook` writes a fixed module back into the notebook JSON (code cells only; outputs,
metadata and other cells untouched), serialised the way Jupyter saves (``indent=1``, non-ASCII kept),
so a unified diff against a notebook Jupyter saved touches only the changed source lines.
Raises :class:`NotebookError` for JSON that is not a notebook. Pure functions.
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Optional

BOUNDARY = "# -- hal-audit cell boundary --"
_MAGIC = re.compile(r"^\s*[%!]")


class NotebookError(ValueError):
    """The text is not a Jupyter notebook (nbformat 4 JSON)."""


@dataclasses.dataclass(frozen=True)
class NotebookSource:
    source: str
    cells: tuple  # (cell_index 0-based, first module line 1-based, number of lines)
    magics: frozenset  # commented-out magic lines ("#" + original line text, without newline)

    def locate(self, line: int) -> Optional[tuple[int, int]]:
        """(cell number, line in cell), 1-based, of module line ``line``; None for a boundary line."""
        for index, first, n in self.cells:
            if first <= line < first + n:
                return index + 1, line - first + 1
        return None


def _cell_text(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def load(text: str) -> dict:
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotebookError(f"not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise NotebookError("not a Jupyter notebook (no cells list)")
    return nb


def notebook_source(text: str) -> NotebookSource:
    """The code cells of notebook JSON ``text`` as one module (see the module docstring)."""
    nb = load(text)
    parts, cells, magics = [], [], set()
    line = 1
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        lines = _cell_text(cell).splitlines()
        out = []
        for ln in lines:
            if _MAGIC.match(ln):
                magics.add("#" + ln)
                ln = "#" + ln
            out.append(ln + "\n")
        parts.extend(out)
        parts.append(BOUNDARY + "\n")
        cells.append((i, line, len(out)))
        line += len(out) + 1
    return NotebookSource("".join(parts), tuple(cells), frozenset(magics))


def patched_notebook(text: str, ns: NotebookSource, patched: str) -> str:
    """Notebook JSON ``text`` with its code cells replaced by the cells of ``patched`` (a fixed module)."""
    nb = load(text)
    chunks, cur = [], []
    for ln in patched.splitlines(keepends=True):
        if ln.rstrip("\r\n") == BOUNDARY:
            chunks.append(cur)
            cur = []
        else:
            cur.append(ln)
    if len(chunks) != len(ns.cells):
        raise NotebookError("the fix changed the cell structure")
    for (index, _, _), lines in zip(ns.cells, chunks):
        lines = [ln[1:] if ln.rstrip("\r\n") in ns.magics else ln for ln in lines]
        original = _cell_text(nb["cells"][index])
        if lines and not original.endswith("\n"):
            lines[-1] = lines[-1].rstrip("\n")
        new = "".join(lines)
        if new != original:
            nb["cells"][index]["source"] = new.splitlines(keepends=True)
    return dumps(nb)


def dumps(nb: dict) -> str:
    """Serialise like Jupyter (nbformat): indent 1, non-ASCII kept, sorted keys, final newline."""
    return json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
