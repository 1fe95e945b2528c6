"""Intra-module dataflow for the static audit: where the value at a use site can come from.

:class:`Defs` indexes one module's statements once (flow-insensitive, by name): assignments to
names (module constants, locals, tuple unpacking), to attributes (``args.gpu = ...``,
``self.device = ...``), function parameter defaults and argparse defaults (``p.add_argument(...)``
statements, under every option string and ``dest``). Walrus targets and lambda defaults are not
indexed. :meth:`Defs.leaves` follows an expression back through those definitions and
through ``IfExp``, ``or``/``and``, f-strings, ``.format``, ``%``, ``+``, tuples, lists, dicts and
``str()``/``torch.device()`` wrappers, yielding the leaf expressions (constants, f-strings, calls)
the value is built from. :meth:`Defs.is_int_device` says whether an expression holds an integer
device index (``int(...)``, ``LOCAL_RANK``, ``get_rank()``, ``x % device_count()``, ``args.gpu``).

Bounded: recursion depth and visited set keep pathological modules linear. Pure; no I/O.
"""
from __future__ import annotations

import ast
from typing import Iterator

MAX_DEPTH = 12
#: names that, by convention, hold an integer device index
RANK_NAMES = frozenset({"local_rank", "gpu", "gpu_id", "gpu_ids", "device_id", "rank", "ddp_local_rank",
                        "ddp_rank", "local_gpu", "gpu_index", "device_index", "dev_id", "cuda_id", "gpu_idx",
                        "device_idx", "LOCAL_RANK", "RANK"})
_INT_CALLS = frozenset({"int", "get_rank", "get_local_rank", "current_device", "device_count", "get_world_size",
                        "get_node_local_rank"})


_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def _statements(tree: ast.AST):
    """Every statement of ``tree`` at any nesting (expressions are not entered: cheaper than ast.walk)."""
    stack = list(reversed(getattr(tree, "body", [])))
    while stack:
        node = stack.pop()
        yield node
        for field in _BLOCKS:
            block = getattr(node, field, None)
            if block:
                stack.extend(reversed(block))


def option_names(call: ast.Call) -> list:
    """The attribute names an ``add_argument(...)`` call may store under (every option string, ``dest``)."""
    names = []
    for a in call.args:
        if isinstance(a, ast.Constant) and isinstance(a.value, str):
            names.append(a.value.lstrip("-").replace("-", "_"))
    for kw in call.keywords:
        if kw.arg == "dest" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
            names.append(kw.value.value)
    return names


class Defs:
    """Definitions of one module, by name (see the module docstring)."""

    def __init__(self, tree: ast.AST):
        self.names: dict = {}
        self.attrs: dict = {}
        for node in _statements(tree):
            t = type(node)
            if t is ast.Assign:
                for tgt in node.targets:
                    self._bind(tgt, node.value)
            elif t in (ast.AnnAssign, ast.AugAssign):
                if node.value is not None:
                    self._bind(node.target, node.value)
            elif t in (ast.FunctionDef, ast.AsyncFunctionDef):
                a = node.args
                pos = a.posonlyargs + a.args
                for arg, d in zip(pos[len(pos) - len(a.defaults):], a.defaults):
                    self.names.setdefault(arg.arg, []).append(d)
                for arg, d in zip(a.kwonlyargs, a.kw_defaults):
                    if d is not None:
                        self.names.setdefault(arg.arg, []).append(d)
            elif t is ast.Expr and type(node.value) is ast.Call:
                call = node.value
                if isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument":
                    default = next((kw.value for kw in call.keywords if kw.arg == "default"), None)
                    if default is not None:
                        for name in option_names(call):
                            self.attrs.setdefault(name, []).append(default)

    def _bind(self, target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Name):
            self.names.setdefault(target.id, []).append(value)
        elif isinstance(target, ast.Attribute):
            self.attrs.setdefault(target.attr, []).append(value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                for t, v in zip(target.elts, value.elts):
                    self._bind(t, v)

    def definitions(self, node: ast.AST) -> list:
        """Expressions assigned to the name or attribute ``node`` anywhere in the module."""
        if isinstance(node, ast.Name):
            return self.names.get(node.id, [])
        if isinstance(node, ast.Attribute):
            return self.attrs.get(node.attr, [])
        return []

    def leaves(self, expr: ast.AST) -> Iterator[ast.AST]:
        """Leaf expressions ``expr``'s value may be built from (each yielded once)."""
        seen: set = set()
        stack = [(expr, 0)]
        while stack:
            node, depth = stack.pop()
            if id(node) in seen or depth > MAX_DEPTH:
                continue
            seen.add(id(node))
            kids = self._children(node)
            if kids is None:
                yield node
            else:
                stack.extend((k, depth + 1) for k in reversed(kids))

    def _children(self, node: ast.AST):
        """Where ``node``'s value comes from, or None for a leaf."""
        if isinstance(node, (ast.Name, ast.Attribute)):
            d = self.definitions(node)
            return d if d else None
        if isinstance(node, ast.IfExp):
            return [node.body, node.orelse]
        if isinstance(node, ast.BoolOp):
            return list(node.values)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
            return [node.left, node.right] if isinstance(node.op, ast.Add) else [node.left]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return list(node.elts)
        if isinstance(node, ast.Dict):
            return [k for k in node.keys if k is not None] + list(node.values)
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "format":
                return [f.value]
            if isinstance(f, ast.Name) and f.id == "str" and len(node.args) == 1:
                return [node.args[0]]
            if isinstance(f, ast.Attribute) and f.attr == "device" and isinstance(f.value, ast.Name) and node.args:
                return [node.args[0]]  # torch.device("cuda:{}".format(i))
            return None
        return None

    def is_int_device(self, expr: ast.AST) -> bool:
        """Whether ``expr`` holds an integer device index (and never a device string or object)."""
        verdicts: list = []
        self._int(expr, 0, set(), verdicts)
        return bool(verdicts) and all(verdicts)

    def _int(self, node: ast.AST, depth: int, seen: set, out: list) -> None:
        if id(node) in seen or depth > MAX_DEPTH:
            return
        seen.add(id(node))
        if isinstance(node, ast.Constant):
            if node.value is not None:  # an unset default (None) says nothing either way
                out.append(type(node.value) is int)
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else (f.attr if isinstance(f, ast.Attribute) else "")
            out.append(name in _INT_CALLS)
        elif isinstance(node, ast.BinOp):
            if isinstance(node.op, (ast.Mod, ast.FloorDiv, ast.Add, ast.Sub, ast.Mult)):
                self._int(node.left, depth + 1, seen, out)  # int % n, rank + 1: as int as the left operand
            else:
                out.append(False)
        elif isinstance(node, ast.IfExp):
            self._int(node.body, depth + 1, seen, out)
            self._int(node.orelse, depth + 1, seen, out)
        elif isinstance(node, (ast.Name, ast.Attribute)):
            defs = self.definitions(node)
            name = node.id if isinstance(node, ast.Name) else node.attr
            sub: list = []
            for d in defs:
                self._int(d, depth + 1, seen, sub)
            out.extend(sub if sub else [name in RANK_NAMES])
        else:
            out.append(False)
