"""Turn findings' edits into a unified diff (``migration.patch``); never writes the audited files.

Paths in the diff are relative to the audited folder with ``a/`` and ``b/`` prefixes, so the patch
applies with ``patch -p1`` (or ``git apply``) run in that folder. A path with spaces, quotes,
backslashes or non-ASCII characters is written C-quoted (``"a/my file.py"``), which both tools read.
Each file keeps its own line endings (an inserted import ends like the file's first line) and, in
:func:`build_patch_bytes`, its own encoding. Overlapping edits keep the first (outermost) one.

Cost is linear in the file size: edits are applied in one join, and the diff is built from the
changed line blocks the edits touch (no sequence matching over the whole file).
Pure functions; thread-safe.
"""
from __future__ import annotations

import re
from typing import Iterable, Sequence

from hal.conformance.migration.scanner import HAL_IMPORT, Edit, FileScan, split_lines

FLAVOURS = ("device", "hal")
CONTEXT = 3


def newline_of(source: str) -> str:
    """The line ending of ``source``'s first line ("\\n" when it has none)."""
    m = re.search(r"\r\n|\r|\n", source)
    return m.group(0) if m else "\n"


def _blocks(source: str, edits: Iterable[Edit], insert_line: int = 0, insert_text: str = ""):
    """``(lines, [(first, last, new_lines)])``: changed line blocks (0-based, inclusive) and their new text."""
    lines = split_lines(source)
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
    if insert_text:
        nl = newline_of(source)
        if lines and insert_line >= len(lines):  # append after the last line
            last = lines[-1]
            pre = "" if last.endswith(("\n", "\r")) else nl
            kept.append((starts[-1], starts[-1], pre + insert_text + nl))
        else:
            at = starts[min(insert_line, len(lines))]
            at = next((s[0] for s in kept if s[0] < at < s[1]), at)  # never inside a rewritten span
            kept.append((at, at, insert_text + nl))
        kept.sort(key=lambda s: (s[0], s[1]))
    import bisect
    groups: list = []  # [first_line, last_line, [spans]]
    for s in kept:
        first = bisect.bisect_right(starts, s[0]) - 1
        last = max(first, bisect.bisect_right(starts, max(s[1] - 1, s[0])) - 1)
        first = min(first, max(len(lines) - 1, 0))
        last = min(last, max(len(lines) - 1, 0))
        if groups and first <= groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], last)
            groups[-1][2].append(s)
        else:
            groups.append([first, last, [s]])
    blocks = []
    for first, last, group in groups:
        base = starts[first]
        old = "".join(lines[first:last + 1])
        pieces, pos = [], 0
        for start, stop, text in group:
            pieces.append(old[pos:start - base])
            pieces.append(text)
            pos = stop - base
        pieces.append(old[pos:])
        blocks.append((first, last, split_lines("".join(pieces))))
    return lines, blocks


def apply_edits(source: str, edits: Iterable[Edit], insert_line: int = 0, insert_text: str = "") -> str:
    """``source`` with ``edits`` applied (and ``insert_text`` inserted as a line before ``insert_line``)."""
    lines, blocks = _blocks(source, edits, insert_line, insert_text)
    out, pos = [], 0
    for first, last, new in blocks:
        out.extend(lines[pos:first])
        out.extend(new)
        pos = last + 1
    out.extend(lines[pos:])
    return "".join(out)


def _insert_for(scan: FileScan, flavour: str, import_module: str | None) -> str:
    if flavour == "device" and import_module and not scan.has_import["device"]:
        return f"import {import_module}  # noqa: F401  (added by hal-audit: registers the target device with torch)"
    if flavour == "hal" and not scan.has_import["hal"] and any(f.edits.get("hal") for f in scan.findings):
        return HAL_IMPORT
    return ""


def _edits_for(scan: FileScan, flavour: str) -> list:
    edits = [e for f in scan.findings for e in f.edits.get(flavour, ())]
    if flavour == "device" and edits:
        edits += scan.import_edits
    return edits


def patched_source(scan: FileScan, source: str, flavour: str, import_module: str | None) -> str:
    """The file after the ``flavour`` fix (unchanged text when no finding has an edit)."""
    edits = _edits_for(scan, flavour)
    if not edits:
        return source
    return apply_edits(source, edits, scan.insert_line, _insert_for(scan, flavour, import_module))


def quote_path(path: str) -> str:
    """A diff header path: as is, or C-quoted when it holds whitespace, quotes, backslashes or non-ASCII."""
    if path.isascii() and not re.search(r'[\s"\\]', path):
        return path
    out = []
    for ch in path:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\n":
            out.append("\\n")
        elif ch.isascii() and ch.isprintable():
            out.append(ch)
        else:
            out.extend(f"\\{b:03o}" for b in ch.encode("utf-8"))
    return '"' + "".join(out) + '"'


def _hunk_lines(prefix: str, lines: Sequence[str]) -> list:
    out = []
    for ln in lines:
        if ln.endswith(("\n", "\r")):
            out.append(prefix + ln)
        else:
            out.append(prefix + ln + "\n\\ No newline at end of file\n")
    return out


def diff_blocks(rel_path: str, lines: Sequence[str], blocks: Sequence) -> str:
    """A unified diff of ``lines`` (the original) with ``blocks`` replaced; "" when nothing changes."""
    blocks = [b for b in blocks if list(b[2]) != list(lines[b[0]:b[1] + 1])]
    if not blocks:
        return ""
    q = quote_path
    a = f"a/{rel_path}"
    b = f"b/{rel_path}"
    out = [f"--- {q(a) if q(a) == a else q(a)}\n", f"+++ {q(b)}\n"]
    # group blocks whose context overlaps into one hunk
    hunks, cur = [], [blocks[0]]
    for blk in blocks[1:]:
        if blk[0] - cur[-1][1] - 1 <= 2 * CONTEXT:
            cur.append(blk)
        else:
            hunks.append(cur)
            cur = [blk]
    hunks.append(cur)
    delta = 0
    for hunk in hunks:
        start = max(0, hunk[0][0] - CONTEXT)
        stop = min(len(lines), hunk[-1][1] + 1 + CONTEXT)
        body, pos, old_n, new_n = [], start, 0, 0
        for first, last, new in hunk:
            body += _hunk_lines(" ", lines[pos:first])
            old_n += first - pos
            new_n += first - pos
            body += _hunk_lines("-", lines[first:last + 1])
            body += _hunk_lines("+", new)
            old_n += last + 1 - first
            new_n += len(new)
            pos = last + 1
        body += _hunk_lines(" ", lines[pos:stop])
        old_n += stop - pos
        new_n += stop - pos
        new_start = start + delta
        out.append(f"@@ -{start + 1 if old_n else start},{old_n} +{new_start + 1 if new_n else new_start},{new_n} @@\n")
        out += body
        delta += new_n - old_n
    return "".join(out)


def file_diff(scan: FileScan, source: str, flavour: str, import_module: str | None) -> str:
    """One scanned file's diff for ``flavour`` ("" when the fix changes nothing)."""
    edits = _edits_for(scan, flavour)
    if not edits:
        return ""
    lines, blocks = _blocks(source, edits, scan.insert_line, _insert_for(scan, flavour, import_module))
    return diff_blocks(scan.path, lines, blocks)


def unified_diff(rel_path: str, before: str, after: str) -> str:
    """One file's unified diff of two whole texts (small inputs; :func:`file_diff` is the linear path)."""
    import difflib
    if before == after:
        return ""
    out = []
    for line in difflib.unified_diff(split_lines(before), split_lines(after),
                                     quote_path(f"a/{rel_path}"), quote_path(f"b/{rel_path}")):
        out.append(line if line.endswith(("\n", "\r")) else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def build_patch(files: Sequence[tuple[str, str, str]]) -> str:
    """Concatenate per-file diffs of ``(rel_path, before, after)``."""
    return "".join(unified_diff(p, b, a) for p, b, a in files)


def build_patch_bytes(diffs: Sequence[tuple[str, str]]) -> bytes:
    """Concatenate per-file diffs ``(diff_text, encoding)``, each encoded like its source file."""
    out = []
    for text, encoding in diffs:
        enc = "utf-8" if encoding in (None, "utf-8-sig") else encoding
        out.append(text.encode(enc, errors="surrogateescape"))
    return b"".join(out)
