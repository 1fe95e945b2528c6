"""Which target-side names exist: every ``torch.mlu.*`` / ``torch_mlu.*`` name a device fix writes is checked here.

A backend's ``migration_rules.yaml`` may name an ``api_symbols`` file (one dotted name a line, ``#``
comments). :func:`missing_symbols` returns the names in a fix's text under the checked roots
(``torch.mlu``, ``torch_mlu``, ``torch.backends.mlu`` ... : :data:`CHECKED_ROOTS` of the rule set)
that the list lacks; a fix with a missing name is not emitted (the finding says why).

The MLU list is generated from torch_mlu's own source (the commit in the rules' provenance) by
``python -m hal.conformance.migration.symbols /path/to/torch_mlu REV > backends/mlu/mlu_api_symbols.txt``:
module-level names of each package module, following ``from .x import *`` and ``__all__``, plus
the ``torch.cuda.*`` names torch_mlu's API support list marks supported, renamed ``torch.mlu.*``.
Pure functions; the loaded list is an immutable frozenset.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from typing import Iterable

#: (source module path in the torch_mlu tree, the name user code reaches it under)
MODULES = (("torch_mlu/mlu", "torch.mlu"), ("torch_mlu/mlu/amp", "torch.mlu.amp"),
           ("torch_mlu/mlu/cnpx", "torch.mlu.cnpx"), ("torch_mlu/mlu/cncl", "torch.mlu.cncl"),
           ("torch_mlu/mlu/graphs", "torch.mlu.graphs"), ("torch_mlu/mlu/memory", "torch.mlu.memory"),
           ("torch_mlu/mlu/random", "torch.mlu.random"), ("torch_mlu/mlu/streams", "torch.mlu.streams"),
           ("torch_mlu/backends/mlu", "torch.backends.mlu"), ("torch_mlu/backends/cnnl", "torch.backends.cnnl"),
           ("torch_mlu/backends/mlufusion", "torch.backends.mlufusion"), ("torch_mlu", "torch_mlu"),
           ("torch_mlu/optimizers", "torch_mlu.optimizers"), ("torch_mlu/utils/cpp_extension", "torch_mlu.utils.cpp_extension"),
           ("torch_mlu/profiler", "torch_mlu.profiler"))

_MODULE_NAMES = frozenset(public for _, public in MODULES)
_NAME = re.compile(r"(?<![\w.])(torch\.mlu|torch_mlu|torch\.backends\.(?:mlu|cnnl|mlufusion))((?:\.\w+)*)")


def missing_symbols(text: str, known: frozenset) -> list:
    """Dotted target names in ``text`` (a fix) that ``known`` lacks; [] when all exist or nothing is checked."""
    if not known:
        return []
    out = []
    for m in _NAME.finditer(text):
        name = m.group(1) + m.group(2)
        if not _exists(name, known):
            out.append(name)
    return out


def _exists(name: str, known: frozenset) -> bool:
    """Listed, or an attribute of a listed name that is not a module (``torch.mlu.Event.query``)."""
    while name not in known:
        parent = name.rpartition(".")[0]
        if not parent or parent in _MODULE_NAMES:
            return False
        name = parent
    return True


def load_symbols(path) -> frozenset:
    """The names in an api_symbols file (one a line, ``#`` comments)."""
    names = set()
    for line in open(path, encoding="utf-8"):
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(line)
    return frozenset(names)


# ---- generation (maintainers only; reads a torch_mlu git checkout) ---------------------------------
def _show(repo: str, rev: str, path: str) -> str | None:
    for cand in ((f"{path}.py",) if path.endswith("/__init__") else (f"{path}.py", f"{path}/__init__.py")):
        r = subprocess.run(["git", "-C", repo, "show", f"{rev}:{cand}"], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout
    return None


def _module_names(repo: str, rev: str, path: str, seen: set) -> set:
    if path in seen:
        return set()
    seen.add(path)
    src = _show(repo, rev, path)
    if src is None:
        return set()
    tree = ast.parse(src)
    names: set = set()
    explicit = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") == "PropModule" for b in node.bases):
                # torch.backends.<x> is replaced by this PropModule: its properties are module attributes
                names.update(t.id for st in node.body if isinstance(st, ast.Assign)
                             for t in st.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    names.add(t.id)
                    if t.id == "__all__" and isinstance(node.value, (ast.List, ast.Tuple)):
                        explicit = {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
        elif isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level and any(a.name == "*" for a in node.names):
                is_pkg = _show(repo, rev, path + "/__init__") is not None
                pkg = path if is_pkg else path.rsplit("/", 1)[0]
                for _ in range(node.level - 1):
                    pkg = pkg.rsplit("/", 1)[0]
                target = f"{pkg}/{node.module.replace('.', '/')}" if node.module else pkg
                names |= _module_names(repo, rev, target, seen)
            else:
                names.update(a.asname or a.name for a in node.names if a.name != "*")
    if explicit is not None:
        names |= explicit
    return {n for n in names if not n.startswith("_")}


def generate(repo: str, rev: str, support_tsv: str | None = None) -> Iterable[str]:
    """Every checked name torch_mlu at ``rev`` defines (see the module docstring)."""
    out = set()
    for path, public in MODULES:
        out.add(public)
        out.update(f"{public}.{n}" for n in _module_names(repo, rev, path, set()))
    if support_tsv:
        for line in open(support_tsv, encoding="utf-8"):
            cols = line.rstrip("\n").split("\t")
            if len(cols) >= 3 and cols[1].startswith("torch.cuda.") and cols[2] == "true":
                parts = cols[1].split(".")
                out.add("torch.mlu." + ".".join(parts[2:]))
    return sorted(out)


if __name__ == "__main__":  # pragma: no cover - maintainer tool
    repo, rev = sys.argv[1], sys.argv[2]
    tsv = sys.argv[3] if len(sys.argv) > 3 else None
    sha = subprocess.run(["git", "-C", repo, "rev-parse", rev], capture_output=True, text=True).stdout.strip()
    print(f"# torch_mlu names a --fix-to device rewrite may write (hal.conformance.migration.symbols).\n"
          f"# Generated from github.com/Cambricon/torch_mlu {rev} @ {sha}"
          + (f" and {tsv.rsplit('/', 1)[-1]} (torch.cuda.* marked supported, as torch.mlu.*)" if tsv else ""))
    for name in generate(repo, rev, tsv):
        print(name)
