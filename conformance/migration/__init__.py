"""Static migration audit: find every CUDA-specific line of a program and build a reviewable patch.

Public API::

    result = audit_static("path/to/file_or_dir", device="mlu")
    result.findings            # [Finding], sorted by path, line, column
    result.patch("device")     # unified diff: CUDA names -> the target's names (+ import torch_mlu)
    result.patch("hal")        # unified diff: device-neutral calls into hal_portable

Never imports or executes the audited code (it is parsed with :mod:`ast`). Rules are data: the
target backend's ``migration_rules.yaml`` (:mod:`.rules`). Raises :class:`AuditInputError` for a
missing path, a file that is not Python, binary or does not parse (file targets; inside a folder a
broken file becomes a ``parse-error`` / ``unreadable`` finding and the scan goes on) and
:class:`RulesError` for an unknown device.
"""
from __future__ import annotations

import dataclasses
import pathlib
import time
from typing import Optional, Union

from hal.conformance.migration.files import (CUDA_SUFFIXES, AuditInputError, iter_sources, read_python, read_text_file,
                                             source_encoding)
from hal.conformance.migration.notebook import NotebookError, notebook_source, patched_notebook
from hal.conformance.migration.patch import FLAVOURS, build_patch_bytes, file_diff, patched_source, unified_diff
from hal.conformance.migration.rules import CATALOGUE, RuleSet, RulesError, load_rules
from hal.conformance.migration.scanner import Edit, FileScan, Finding, scan_source

__all__ = ["audit_static", "StaticAudit", "Finding", "Edit", "FileScan", "AuditInputError", "RulesError",
           "RuleSet", "load_rules", "CATALOGUE", "FLAVOURS"]


@dataclasses.dataclass
class StaticAudit:
    """The result of one static audit. ``root`` is the folder paths are relative to."""

    root: pathlib.Path
    target: pathlib.Path
    rules: RuleSet
    scans: list
    sources: dict
    findings: list
    files: int
    lines: int
    seconds: float
    encodings: dict = dataclasses.field(default_factory=dict)  # rel path -> the source's encoding
    notebooks: dict = dataclasses.field(default_factory=dict)  # rel path -> (notebook JSON, NotebookSource)

    def patch(self, flavour: str = "device") -> str:
        """The unified diff for ``flavour`` ("device" or "hal"); "" when nothing is fixable."""
        return "".join(d for d, _ in self._diffs(flavour))

    def patch_bytes(self, flavour: str = "device") -> bytes:
        """The patch as bytes, each file's part in that file's own encoding (what ``--fix`` writes)."""
        return build_patch_bytes(self._diffs(flavour))

    def _diffs(self, flavour: str) -> list:
        if flavour not in FLAVOURS:
            raise ValueError(f"unknown fix flavour {flavour!r}; one of {', '.join(FLAVOURS)}")
        out = []
        for scan in self.scans:
            if scan.path in self.notebooks:
                after = self.patched_notebook(scan, flavour)
                d = unified_diff(scan.path, self.notebooks[scan.path][0], after) if after is not None else ""
            else:
                d = file_diff(scan, self.sources[scan.path], flavour, self.rules.import_module)
            if d:
                out.append((d, self.encodings.get(scan.path)))
        return out

    def patched_notebook(self, scan: FileScan, flavour: str) -> Optional[str]:
        """The notebook JSON after the fix (the patch is a diff of the notebook JSON), None when unchanged."""
        raw, ns = self.notebooks[scan.path]
        after = patched_source(scan, ns.source, flavour, self.rules.import_module)
        if after == ns.source:
            return None
        return patched_notebook(raw, ns, after)

    def patched(self, flavour: str = "device") -> dict:
        """``{rel_path: patched source}`` for every scanned file that the fix changes."""
        out = {}
        for scan in self.scans:
            if scan.path in self.notebooks:
                nb = self.patched_notebook(scan, flavour)
                if nb is not None:
                    out[scan.path] = nb
                continue
            before = self.sources[scan.path]
            after = patched_source(scan, before, flavour, self.rules.import_module)
            if after != before:
                out[scan.path] = after
        return out

    def stats(self) -> dict:
        return {"files": self.files, "lines": self.lines, "seconds": round(self.seconds, 6),
                "lines_per_s": round(self.lines / self.seconds) if self.seconds > 0 else None,
                "rules_file": self.rules.source, "rules_provenance": dict(self.rules.provenance)}


def read_notebook(path: pathlib.Path, display: str):
    """(notebook JSON, NotebookSource, joined source, syntax tree) of ``path``; AuditInputError when bad."""
    import ast
    data = read_text_file(path, display)
    try:
        ns = notebook_source(data)
    except NotebookError as exc:
        raise AuditInputError(f"{display}: {exc}") from None
    try:
        tree = ast.parse(ns.source, filename=display)
    except SyntaxError as exc:
        where = ns.locate(exc.lineno or 0)
        cell = f" (cell {where[0]}, line {where[1]})" if where else ""
        raise AuditInputError(f"{display}:{exc.lineno}: syntax error: {exc.msg}{cell}") from None
    return data, ns, ns.source, tree


def _file_finding(rules: RuleSet, rule_id: str, rel: str, found: str, counterpart: Optional[str] = None,
                  line: int = 1) -> Optional[Finding]:
    rule = rules.rule(rule_id)
    if rule is None:
        return None
    return Finding(rule_id, rel, line, 1, rule.severity, rule.render(found, counterpart), found, counterpart,
                   line, 1)


def audit_static(target: Union[str, pathlib.Path], device: str = "mlu", rules: Optional[RuleSet] = None) -> StaticAudit:
    """Scan ``target`` (a .py file or a folder) for code that must change to run on ``device``."""
    rules = rules or load_rules(device)
    t0 = time.perf_counter()
    target = pathlib.Path(target)
    if not target.exists():
        raise AuditInputError(f"{target}: no such file or folder")
    scans, sources, findings, encodings, notebooks = [], {}, [], {}, {}
    n_files = n_lines = 0
    if target.is_file():
        if target.suffix not in (".py", ".ipynb"):
            raise AuditInputError(f"{target}: not a Python file (expected a .py or .ipynb file or a folder)")
        root = target.resolve().parent
        paths = [target.resolve()]
        strict = True
    else:
        root = target.resolve()
        paths = list(iter_sources(root))
        strict = False
    _, builder = rules.map_api("torch.utils.cpp_extension.CUDAExtension")
    for path in paths:
        rel = path.relative_to(root).as_posix()
        if path.suffix in CUDA_SUFFIXES:
            f = _file_finding(rules, "cuda-source", rel, rel, builder)
            if f:
                findings.append(f)
            continue
        try:
            if path.suffix == ".ipynb":
                raw, ns, source, tree = read_notebook(path, str(target) if strict else rel)
                notebooks[rel] = (raw, ns)
            else:
                source, tree = read_python(path, str(target) if strict else rel)
            scan = scan_source(source, rel, rules, tree)
            if path.suffix == ".ipynb":
                _locate_cells(scan, ns)
        except RecursionError:
            # a pathologically nested expression (e.g. a 700-term string chain): this file only
            if strict:
                raise AuditInputError(f"{target}: too deeply nested to analyse") from None
            f = _file_finding(rules, "parse-error", rel, "too deeply nested to analyse (RecursionError)")
            if f:
                findings.append(f)
            continue
        except AuditInputError as exc:
            if strict:
                raise
            msg = str(exc)
            line = 1
            if ": syntax error: " in msg:
                head = msg.split(": syntax error: ")[0]
                line = int(head.rsplit(":", 1)[1]) if head.rsplit(":", 1)[-1].isdigit() else 1
                f = _file_finding(rules, "parse-error", rel, msg.split(": ", 1)[1] if ": " in msg else msg, line=line)
            else:
                f = _file_finding(rules, "unreadable", rel, msg.split(": ", 1)[1] if ": " in msg else msg)
            if f:
                findings.append(f)
            continue
        n_files += 1
        n_lines += scan.lines
        scans.append(scan)
        sources[rel] = source
        encodings[rel] = source_encoding(path)
        findings.extend(scan.findings)
    findings.sort(key=lambda f: (f.path, f.line, f.column, f.rule))
    return StaticAudit(root, target, rules, scans, sources, findings, n_files, n_lines, time.perf_counter() - t0,
                       encodings, notebooks)


def _locate_cells(scan: FileScan, ns) -> None:
    """Name the notebook cell and line in each finding (``line`` itself counts in the joined module)."""
    for f in scan.findings:
        where = ns.locate(f.line)
        if where:
            f.cell, f.cell_line = where
            f.message += f" [cell {where[0]}, line {where[1]}]"
