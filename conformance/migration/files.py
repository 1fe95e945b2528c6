"""Which files a static audit reads, and reading one safely (never importing or executing it).

A target is a ``.py`` file or a folder: every ``.py`` below it, skipping virtual environments
(any folder holding ``pyvenv.cfg``), VCS folders, caches and build output (:data:`SKIP_DIRS`).
CUDA sources (``.cu``/``.cuh``) found on the way are returned too: they are findings themselves.

:func:`read_python` raises :class:`AuditInputError` (one line, with the path and line) for a file
that is binary, not decodable text, or does not parse.
"""
from __future__ import annotations

import ast
import os
import pathlib
import stat
import tokenize
from typing import Iterator

from hal.errors import HalError

SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", "build", "dist", ".venv", "venv", ".tox", ".nox",
                       ".eggs", "node_modules", "site-packages", ".mypy_cache", ".pytest_cache", ".ruff_cache",
                       ".ipynb_checkpoints"})
CUDA_SUFFIXES = (".cu", ".cuh")
#: larger sources are not read (generated code of this size is not hand-ported; reading it whole
#: would cost the auditor hundreds of MB)
MAX_SOURCE_BYTES = 16 * 2**20


class AuditInputError(HalError):
    """Bad audit input: missing path, not Python, binary, undecodable, syntax error."""


def iter_sources(root: pathlib.Path) -> Iterator[pathlib.Path]:
    """Every ``.py`` and CUDA source below ``root``, sorted, pruning skipped folders."""
    for dirpath, dirnames, filenames in os.walk(root):
        if "pyvenv.cfg" in filenames and pathlib.Path(dirpath) != root:
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")
                             and not os.path.isfile(os.path.join(dirpath, d, "pyvenv.cfg")))
        for name in sorted(filenames):
            if name.endswith((".py", ".ipynb")) or name.endswith(CUDA_SUFFIXES):
                yield pathlib.Path(dirpath, name)


def read_text_file(path: pathlib.Path, display: str) -> str:
    """UTF-8 text of a regular file (notebooks); AuditInputError when missing, special, too large or not text."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise AuditInputError(f"{display}: not a regular file")
        if st.st_size > MAX_SOURCE_BYTES:
            raise AuditInputError(f"{display}: {st.st_size / 2**20:.0f} MiB, larger than the "
                                  f"{MAX_SOURCE_BYTES // 2**20} MiB a static audit reads")
        data = path.read_bytes()
    except OSError as exc:
        raise AuditInputError(f"{display}: cannot read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AuditInputError(f"{display}: not UTF-8 text (byte offset {exc.start})") from None


def source_encoding(path: pathlib.Path) -> str:
    """The encoding Python reads ``path`` with (its coding declaration or BOM; "utf-8" by default)."""
    import io
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
        return tokenize.detect_encoding(io.BytesIO(head).readline)[0]
    except (OSError, SyntaxError, LookupError):
        return "utf-8"


def read_python(path: pathlib.Path, display: str) -> tuple[str, ast.Module]:
    """Source text and syntax tree of ``path``; ``display`` is the name used in error messages."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO, socket or device named *.py: reading it could block forever
            raise AuditInputError(f"{display}: not a regular file")
        size = st.st_size
        if size > MAX_SOURCE_BYTES:
            raise AuditInputError(f"{display}: {size / 2**20:.0f} MiB, larger than the "
                                  f"{MAX_SOURCE_BYTES // 2**20} MiB a static audit reads")
        data = path.read_bytes()
    except OSError as exc:
        raise AuditInputError(f"{display}: cannot read: {exc.strerror or exc}") from None
    if b"\0" in data[:65536]:
        raise AuditInputError(f"{display}: binary file, not Python source")
    try:
        import io
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        source = data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise AuditInputError(f"{display}: not valid {exc.encoding} text (undecodable byte at offset {exc.start}); "
                              "declare the file's encoding in a coding comment") from None
    except (SyntaxError, LookupError) as exc:
        raise AuditInputError(f"{display}: not UTF-8 text and no valid coding declaration "
                              f"({' '.join(str(exc).split())[:120]})") from None
    if source.startswith("\ufeff"):
        source = source[1:]
    try:
        tree = ast.parse(source, filename=display)
    except SyntaxError as exc:
        raise AuditInputError(f"{display}:{exc.lineno}: syntax error: {exc.msg}") from None
    except ValueError as exc:  # e.g. source with null bytes beyond the sniffed prefix
        raise AuditInputError(f"{display}: not valid Python source ({exc})") from None
    return source, tree
