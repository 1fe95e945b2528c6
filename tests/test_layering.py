"""Import layering: every arrow points one way (issue 21).

Layers, lowest first: the core (``hal`` minus ``hal.cli``), ``hal.backends`` (plugins),
``hal.models``, ``hal.conformance`` (the audits), ``hal.cli``. A module may import its own layer and
the ones below, never one above; lazy (function-level) imports count, since they are how cycles hide.
Imports are read with ``ast`` from the source folders (the installed names follow pyproject.toml's package-dir);
a string constant that is exactly one of our module names counts as a (dynamic) import, unless it
is the value assigned to a name (``NAMESPACE = "hal.backends"`` is an entry-point group, not an import).

``KNOWN`` lists the violations that remain; the test fails on any new one *and* on a listed one that
is gone (so the list only shrinks). Import cycles between modules are checked the same way.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = {"hal": "hal", "backends": "hal.backends", "models": "hal.models", "conformance": "hal.conformance"}
LAYERS = ["core", "hal.backends", "hal.models", "hal.conformance", "hal.cli"]

#: (importer, imported) pairs allowed to point up a layer: none (the contract; add nothing here)
KNOWN_UPWARD: set[tuple[str, str]] = set()

#: import cycles (strongly connected modules, lazy imports included) still open
KNOWN_CYCLES: set[tuple[str, ...]] = {
    ("hal.conformance.matrix.cell", "hal.conformance.matrix.runner"),
    ("hal.conformance.runtime.child", "hal.conformance.runtime.runner"),
    ("hal.models.cnn", "hal.models.estimate", "hal.models.gpt"),
}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for folder, pkg in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = path
    return out


def _layer(module: str) -> int:
    if module == "hal.__main__":  # `python -m hal`: an entry point, the CLI's own layer
        return LAYERS.index("hal.cli")
    for i, name in enumerate(LAYERS[1:], start=1):
        if module == name or module.startswith(name + "."):
            return i
    return 0


def _imports(module: str, path: pathlib.Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    found = set()
    named = {id(n.value) for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))}  # NAMESPACE = "..."
    named |= {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call)  # logging.getLogger("hal.discovery")
              and getattr(n.func, "attr", getattr(n.func, "id", "")) == "getLogger" for a in n.args}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_pkg else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known \
                and id(node) not in named:
            names = [node.value]  # importlib.import_module("hal.cli.matrix") and the like
        for name in names:
            while name and name not in known:  # the longest prefix that is one of our modules
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


def test_every_arrow_points_down_or_is_a_known_open_item():
    upward = {(m, t) for m, ts in _graph().items() for t in ts if _layer(t) > _layer(m)}
    new, gone = upward - KNOWN_UPWARD, KNOWN_UPWARD - upward
    assert not new, f"imports pointing up a layer: {sorted(new)}"
    assert not gone, f"fixed (remove from KNOWN_UPWARD): {sorted(gone)}"


def test_core_backend_interface_imports_only_the_core():
    """The modules a backend is written against import nothing above the core."""
    graph = _graph()
    for m in ("hal", "hal.backend", "hal.device_backend", "hal.discovery", "hal.streams", "hal.memory",
              "hal.errors", "hal.capabilities.manifest", "hal.capabilities.live", "hal.capabilities.generate"):
        assert all(_layer(t) == 0 for t in graph[m]), (m, sorted(graph[m]))


def _cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), set(), [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.add(tuple(sorted(comp)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _drop_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    # a package's __init__ re-exporting its submodules is not a cycle worth reporting: drop edges from
    # a module to its own ancestors (``from hal.ops import x`` inside hal.ops.fallback)
    return {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}


def test_import_cycles_are_only_the_known_ones():
    cycles = _cycles(_drop_packages(_graph()))
    new, gone = cycles - KNOWN_CYCLES, KNOWN_CYCLES - cycles
    assert not new, f"new import cycles: {sorted(new)}"
    assert not gone, f"fixed (remove from KNOWN_CYCLES): {sorted(gone)}"
    flat = {m for c in cycles for m in c}
    assert not {"hal.capabilities.generate", "hal.capabilities.manifest"} <= flat
