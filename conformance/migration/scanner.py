"""The static scan: one pass over a file's syntax tree (stdlib :mod:`ast`) that finds CUDA-specific code.

Nothing here looks at text with patterns: names are resolved through the file's imports
(``import torch.cuda as tc``, ``from torch import cuda``, ``from torch.cuda.amp import autocast``),
strings count only in device positions (``torch.device(...)``, ``device=``, ``.to(...)``,
``backend=``, ``os.environ[...]``, ...), so comments, docstrings, unrelated strings and identifiers
that merely contain "cuda" are never findings.

Each finding carries the exact source spans to rewrite for both fix flavours (``device``: the
target's own names; ``hal``: device-neutral calls into ``hal_portable``). Columns are 1-based
characters; edits use 0-based character columns. ``ast`` was chosen over libcst for the scan because
libcst's metadata resolution is an order of magnitude slower (see benchmarks/bench_static_audit.py);
the node spans ``ast`` records (``end_lineno``/``end_col_offset``) are exact, so the patch is built
from the same tree without touching anything outside the rewritten nodes.

:func:`scan_source` is pure (no I/O, no import of the scanned code) and thread-safe.
"""
from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
from typing import Iterable, Optional

from hal.conformance.migration.dataflow import Defs, option_names
from hal.conformance.migration.rules import RuleSet, hal_map, longest_prefix
from hal.conformance.migration.symbols import missing_symbols

HAL_ALIAS = "hal_portable"
HAL_IMPORT = f"import hal.portable as {HAL_ALIAS}"

#: calls whose first positional argument is a device
_DEVICE_ARG0 = frozenset({"torch.device", "torch.Generator", "torch.autocast", "torch.amp.autocast",
                          "torch.amp.GradScaler", "torch.amp.autocast_mode.autocast",
                          "torch.get_autocast_dtype", "torch.set_autocast_dtype", "torch.is_autocast_enabled",
                          "torch.distributed.device_mesh.init_device_mesh", "torch.distributed.init_device_mesh"})
#: keyword arguments that hold a device
_DEVICE_KWARGS = frozenset({"device", "device_type", "map_location", "pin_memory_device", "device_map",
                            "output_device"})
#: keyword arguments that hold an integer-or-device where an int means "CUDA device N"
_INT_DEVICE_KWARGS = frozenset({"device", "map_location", "output_device"})
#: names compared against a device string (x.device.type == "cuda", device == "cuda")
_DEVICE_COMPARE_ATTRS = frozenset({"type", "device_type", "device"})
_DIST_CALLS = frozenset({"init_process_group", "new_group", "new_subgroups"})
_FLOAT64 = frozenset({"torch.float64", "torch.double", "torch.complex128", "torch.cdouble"})
_CPP_EXT = "torch.utils.cpp_extension"
_ENV_GETTERS = frozenset({"os.getenv", "os.putenv", "os.unsetenv", "os.environ.get", "os.environ.setdefault",
                          "os.environ.pop", "os.environ.__contains__"})


@dataclasses.dataclass(frozen=True)
class Edit:
    """Replace source from (line, col) to (end_line, end_col) with ``text`` (1-based lines, 0-based char cols)."""

    line: int
    col: int
    end_line: int
    end_col: int
    text: str


@dataclasses.dataclass
class Finding:
    """One device-specific place in the source (the audit.json ``findings[]`` entry, see :meth:`as_dict`)."""

    rule: str
    path: str
    line: int
    column: int
    severity: str
    message: str
    found: str
    counterpart: Optional[str] = None
    end_line: int = 0
    end_column: int = 0
    edits: dict = dataclasses.field(default_factory=dict)  # flavour -> tuple[Edit, ...]
    cell: Optional[int] = None       # notebooks: the cell (1-based among all cells) and the line in it;
    cell_line: Optional[int] = None  # ``line`` stays the line of the joined module the edits refer to

    def fix_text(self, flavour: str) -> Optional[str]:
        edits = self.edits.get(flavour)
        return " ; ".join(e.text for e in edits if e.text) if edits else None

    def as_dict(self, flavour: str = "device") -> dict:
        """The audit.json entry; for a notebook ``line`` is the line in ``cell`` (as the run reports it).
        ``edits``: flavour -> the exact edits of its fix (:class:`Edit` fields; lines of the joined module
        for a notebook), absent for a flavour with no automatic fix."""
        where = {} if self.cell is None else {"cell": self.cell, "module_line": self.line}
        return {"rule": self.rule, "path": self.path, "column": self.column, **where,
                "line": self.line if self.cell is None else self.cell_line,
                "end_line": self.end_line, "end_column": self.end_column, "severity": self.severity,
                "message": self.message, "found": self.found, "counterpart": self.counterpart,
                "fix": self.fix_text(flavour),
                "fixes": {f: self.fix_text(f) for f in ("device", "hal")},
                "edits": {f: [dataclasses.asdict(e) for e in es] for f, es in self.edits.items() if es}}


@dataclasses.dataclass
class FileScan:
    """The scan of one file: findings, plus import rewrites the device fix needs (``import_edits``)."""

    path: str
    lines: int
    findings: list
    import_edits: list  # device-flavour edits of `import torch.cuda as x` style statements
    has_import: dict    # flavour -> whether the file already imports what that flavour's fix needs
    insert_line: int    # 0-based line index before which a new import goes


@dataclasses.dataclass(frozen=True)
class _At:
    """A position to report a finding at (byte columns, like ast nodes): the line that must change."""

    lineno: int
    col_offset: int
    end_lineno: int
    end_col_offset: int


class _Scanner(ast.NodeVisitor):
    def __init__(self, rules: RuleSet, path: str, lines: list[str], tree: Optional[ast.AST] = None):
        self.r = rules
        self.defs = Defs(tree) if tree is not None else Defs(ast.Module(body=[], type_ignores=[]))
        self.path = path
        self.lines = lines
        self.aliases: dict[str, str] = {}
        self.cap_names: set[str] = set()
        self.findings: list[Finding] = []
        self.seen: set = set()
        self.import_edits: list[Edit] = []
        self.alias_fix: dict[str, Edit] = {}  # name bound by a rewritten import -> that import's edit
        self.has_import = {"device": rules.import_module is None, "hal": False}
        self.hal = hal_map()

    # ---- positions and text -------------------------------------------------------------
    def _col(self, line: int, byte_col: int) -> int:
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        if text.isascii():
            return byte_col
        return len(text.encode("utf-8")[:byte_col].decode("utf-8", errors="ignore"))

    def _span(self, node: ast.AST) -> tuple[int, int, int, int]:
        return (node.lineno, self._col(node.lineno, node.col_offset),
                node.end_lineno, self._col(node.end_lineno, node.end_col_offset))

    def _text(self, node: ast.AST) -> str:
        if isinstance(node, ast.Name):
            return node.id
        l0, c0, l1, c1 = self._span(node)
        if l0 == l1:
            return self.lines[l0 - 1][c0:c1]
        parts = [self.lines[l0 - 1][c0:]] + self.lines[l0:l1 - 1] + [self.lines[l1 - 1][:c1]]
        return "".join(parts)

    def _edit(self, node: ast.AST, text: str) -> Edit:
        return Edit(*self._span(node), text)

    def _attr_edit(self, node: ast.Attribute, text: str) -> Edit:
        """Replace only the trailing attribute name of ``node`` (``x.cuda`` -> ``x.mlu``)."""
        l1, c1 = node.end_lineno, self._col(node.end_lineno, node.end_col_offset)
        return Edit(l1, c1 - len(node.attr), l1, c1, text)

    # ---- recording ------------------------------------------------------------------------
    def add(self, rule_id: str, node: ast.AST, found: str, counterpart: Optional[str] = None,
            device: Iterable[Edit] = (), hal: Iterable[Edit] = (), note: str = "") -> None:
        rule = self.r.rule(rule_id)
        if rule is None:
            return
        key = (rule_id, node.lineno, node.col_offset)
        if key in self.seen:
            return
        self.seen.add(key)
        l0, c0, l1, c1 = self._span(node)
        edits = {}
        device = tuple(device)
        missing = sorted({m for e in device for m in missing_symbols(e.text, self.r.api_symbols)}
                         | set(missing_symbols(counterpart or "", self.r.api_symbols)))
        if missing and counterpart and missing_symbols(counterpart, self.r.api_symbols):
            counterpart = None  # never advise a name the target does not have
        message = rule.render(found, counterpart) + note
        if missing:
            device = ()
            message += (f"; no automatic fix: {', '.join(missing)} does not exist in torch_mlu's API "
                        f"({pathlib.Path(self.r.api_symbols_source).name})")
        if device:
            edits["device"] = device
        if hal:
            edits["hal"] = tuple(hal)
        self.findings.append(Finding(rule_id, self.path, l0, c0 + 1, rule.severity,
                                     message, found, counterpart, l1, c1 + 1, edits))

    # ---- name resolution ------------------------------------------------------------------
    def qname(self, node: ast.AST) -> Optional[str]:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.qname(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.asname:
                self.aliases[a.asname] = a.name
            else:
                top = a.name.split(".")[0]
                self.aliases[top] = top
            self._check_import(node, a.name)
            if a.name == self.r.import_module:
                self.has_import["device"] = True
            if a.name == "hal.portable" and a.asname == HAL_ALIAS:
                self.has_import["hal"] = True
        self._rewrite_cuda_import(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return
        for a in node.names:
            if a.name == "*":
                continue
            self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            self._check_import(node, f"{node.module}.{a.name}")
        self._rewrite_cuda_import(node)

    def _check_import(self, node: ast.AST, qname: str) -> None:
        r = self.r
        need = _newer(r, qname)
        if need:
            self.add("torch-too-new", node, qname, need,
                     note=f" (the target pairs with torch {r.torch_version})" if r.torch_version else "")
            return
        if isinstance(node, ast.Import) and qname.startswith("torch.cuda.") and qname.count(".") >= 2:
            # `import torch.cuda.nccl as nccl`: the module itself is CUDA-only; the import rewrite (if any) fixes it
            known, mapped = r.map_api(qname)
            self.add("cuda-api", node, qname, mapped)
            return
        top = qname.split(".")[0]
        if top in self.r.triton_imports:
            self.add("triton-import", node, qname)
            return
        known, counterpart = longest_prefix(self.r.vendor_imports, qname)
        if not known:
            return
        edits = ()
        if counterpart and isinstance(node, ast.ImportFrom) and len(node.names) == 1 and node.lineno == node.end_lineno:
            mod, _, name = counterpart.rpartition(".")
            a = node.names[0]
            alias = f" as {a.asname}" if a.asname else (f" as {a.name}" if name != a.name else "")
            edits = (self._edit(node, f"from {mod} import {name}{alias}"),)
        self.add("vendor-import", node, qname, counterpart, device=edits)

    def _rewrite_cuda_import(self, node: ast.AST) -> None:
        """Device fix for imports that bind torch.cuda names (``import torch.cuda as tc``...)."""
        multi = node.lineno != node.end_lineno
        if isinstance(node, ast.Import):
            if not any(a.asname and a.name.startswith("torch.cuda") for a in node.names):
                return
            items = []
            for a in node.names:
                name = a.name
                if a.asname and a.name.startswith("torch.cuda"):
                    known, mapped = self.r.map_api(a.name)
                    if not mapped:
                        return
                    name = mapped
                items.append(f"{name} as {a.asname}" if a.asname else name)
            text = "import " + ", ".join(items)
        else:
            mod = node.module
            full = [f"{mod}.{a.name}" for a in node.names]
            if not any(q.startswith("torch.cuda") or q == "torch.cuda" for q in full):
                return
            if any(a.name == "*" for a in node.names):
                return
            mapped = []
            for a, q in zip(node.names, full):
                if not q.startswith("torch.cuda"):
                    mapped.append((a, q))
                    continue
                _, m = self.r.map_api(q)
                if not m:
                    return
                mapped.append((a, m))
            parents = {m.rpartition(".")[0] for _, m in mapped}
            if len(parents) != 1:
                return
            parent = parents.pop()
            items = []
            for a, m in mapped:
                leaf = m.rpartition(".")[2]
                bound = a.asname or a.name
                items.append(leaf if leaf == bound else f"{leaf} as {bound}")
            text = f"from {parent} import " + ", ".join(items)
        if multi and any("#" in self.lines[i] for i in range(node.lineno - 1, node.end_lineno)):
            return  # a comment inside a parenthesised import: leave it to the engineer
        if missing_symbols(text, self.r.api_symbols):
            return  # e.g. torch.cuda.nccl -> torch.mlu.nccl, which torch_mlu does not have
        edit = self._edit(node, text)
        self.import_edits.append(edit)
        for a in node.names:
            self.alias_fix[a.asname or a.name.split(".")[0]] = edit

    # ---- qualified names ------------------------------------------------------------------
    def visit_Attribute(self, node: ast.Attribute) -> None:
        q = self.qname(node)
        if q is not None:
            if self._check_qname(node, q):
                return
        elif node.attr == "is_cuda":
            dev = [self._attr_edit(node, self.r.is_attr)] if self.r.is_attr else []
            hal = [self._edit(node, f"{HAL_ALIAS}.on_device({self._text(node.value)})")]
            self.add("is-cuda", node, ".is_cuda", f".{self.r.is_attr}" if self.r.is_attr else None, dev, hal)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        q = self.aliases.get(node.id)
        if q is not None and q != node.id:
            self._check_qname(node, q)

    def _device_rewrite(self, node: ast.AST, q: str, mapped: Optional[str]) -> list[Edit]:
        """Rewrite a dotted use site to ``mapped``, keeping the user's alias for the unchanged prefix."""
        if not mapped:
            return []
        sub = node
        while True:
            sq = self.qname(sub)
            if sq is None:
                return []
            if mapped == sq or mapped.startswith(sq + "."):
                if sub is node:
                    return []
                return [self._edit(node, self._text(sub) + mapped[len(sq):])]
            if not isinstance(sub, ast.Attribute):
                fix = self.alias_fix.get(sub.id) if isinstance(sub, ast.Name) else None
                if fix:
                    return [fix]  # the rewritten import fixes this use
                top = mapped.split(".")[0]
                if self.aliases.get(top) == top and isinstance(node, ast.Attribute):
                    return [self._edit(node, mapped)]  # `dist.is_nccl_available` -> `torch.mlu.is_cncl_available`
                return []
            sub = sub.value

    def _hal_rewrite(self, node: ast.AST, q: str) -> list[Edit]:
        known, target = longest_prefix(self.hal, q)
        return [self._edit(node, target)] if target else []

    def _check_qname(self, node: ast.AST, q: str) -> bool:
        r = self.r
        need = _newer(r, q)
        if need:
            if not isinstance(node, ast.Name):  # a from-imported name: reported once, at its import
                self.add("torch-too-new", node, q, need,
                         note=f" (the target pairs with torch {r.torch_version})" if r.torch_version else "")
            return True
        if q in ("torch.version.cuda", "torch.distributed.is_nccl_available",
                 "torch.distributed.distributed_c10d.is_nccl_available"):
            _, mapped = r.map_api(q)
            self.add("cuda-api", node, q, mapped, self._device_rewrite(node, q, mapped), self._hal_rewrite(node, q))
            return True
        if q.startswith("torch.cuda.") or q == "torch.cuda":
            known, mapped = r.map_api(q)
            rule = "cuda-amp" if q.startswith("torch.cuda.amp.") else (
                "cuda-api-unsupported" if q in r.unsupported_api else "cuda-api")
            self.add(rule, node, q, mapped, self._device_rewrite(node, q, mapped), self._hal_rewrite(node, q))
            return True
        if q.startswith("torch.backends.cudnn.") or q == "torch.backends.cudnn":
            _, mapped = r.map_api(q)
            self.add("cudnn-flag", node, q, mapped, self._device_rewrite(node, q, mapped))
            return True
        if q.startswith("torch.backends.cuda.matmul.allow_tf32"):
            _, mapped = r.map_api(q)
            self.add("tf32-flag", node, q, mapped, self._device_rewrite(node, q, mapped))
            return True
        if q.startswith("torch.backends.cuda."):
            _, mapped = r.map_api(q)
            self.add("cuda-backend-flag", node, q, mapped, self._device_rewrite(node, q, mapped))
            return True
        if q in ("torch.get_autocast_gpu_dtype", "torch.set_autocast_gpu_dtype",
                 "torch.autograd.profiler.emit_nvtx"):
            _, mapped = r.map_api(q)
            self.add("cuda-api", node, q, mapped, self._device_rewrite(node, q, mapped))
            return True
        if q in _FLOAT64:
            self.add("float64", node, q)
            return True
        if q == "torch.jit.script":
            self.add("jit-script", node, q)
            return True
        if q.startswith(_CPP_EXT + ".") and q.rpartition(".")[2] in ("CUDAExtension", "CUDA_HOME"):
            _, mapped = r.map_api(q)
            self.add("cpp-extension", node, q, mapped)
            return True
        if q.startswith("torch.distributed"):
            head, _, leaf = q.rpartition(".")
            if head.endswith(".ReduceOp") and leaf in r.reduce_ops_unsupported:
                self.add("reduce-op", node, leaf)
                return True
            if head.endswith(".Backend") and leaf == "NCCL":
                dev = [self._attr_edit(node, r.dist_backend_attr)] if r.dist_backend_attr and isinstance(
                    node, ast.Attribute) else []
                self.add("nccl-backend", node, q, r.dist_backend_attr and f"Backend.{r.dist_backend_attr}",
                         dev, [self._edit(node, f"{HAL_ALIAS}.dist_backend()")])
                return True
            if ("torch.distributed." + leaf) in r.dist_unsupported:
                self.add("dist-unsupported", node, q)
                return True
        if q.endswith("ProfilerActivity.CUDA") and q.startswith("torch."):
            act = r.profiler_activity
            dev = [self._attr_edit(node, act)] if act and isinstance(node, ast.Attribute) else []
            self.add("profiler-cuda", node, q, act and f"ProfilerActivity.{act}", dev,
                     [self._edit(node, f"{HAL_ALIAS}.profiler_activity()")])
            return True
        return False

    # ---- calls ----------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        fq = self.qname(func)
        if isinstance(func, ast.Attribute) and fq is None:
            self._method_call(node, func)
        if fq is not None:
            if fq in _DEVICE_ARG0 and node.args:
                self._device_string(node.args[0])
            leaf = fq.rpartition(".")[2]
            if fq.startswith("torch.distributed") and leaf in _DIST_CALLS:
                self._dist_backend(node)
            if fq.startswith(_CPP_EXT + ".") and leaf in ("load", "load_inline", "CppExtension", "CUDAExtension",
                                                        "setup"):
                self._cpp_extension(node, fq, leaf)
            if fq in _ENV_GETTERS and node.args:
                self._env_name(node.args[0])
            if fq == "os.environ.update":
                for kw in node.keywords:
                    if kw.arg:
                        self._env_keyword(kw)
                for a in node.args:
                    if isinstance(a, ast.Dict):
                        for k in a.keys:
                            if k is not None:
                                self._env_name(k)
            if leaf == "set_device" and node.args:
                self._device_string(node.args[0])
        for kw in node.keywords:
            if kw.arg in _DEVICE_KWARGS:
                self._device_string(kw.value)
            if kw.arg in _INT_DEVICE_KWARGS:
                self._to_int(kw.value)
        self.generic_visit(node)

    def _method_call(self, node: ast.Call, func: ast.Attribute) -> None:
        attr = func.attr
        if attr == "cuda":
            r = self.r
            dev = []
            if r.tensor_method and (r.device_index or not (node.args or node.keywords)):
                dev = [self._attr_edit(func, r.tensor_method)]
            args = [self._text(a) for a in node.args[:1]]
            kws = []
            for kw in node.keywords:
                if kw.arg == "device" and not args:
                    args = [self._text(kw.value)]
                else:
                    kws.append(self._text(kw))
            l1, c1 = node.end_lineno, self._col(node.end_lineno, node.end_col_offset)
            fl, fc = func.end_lineno, self._col(func.end_lineno, func.end_col_offset) - len(attr)
            new = f"to({HAL_ALIAS}.device({', '.join(args)})" + "".join(", " + k for k in kws) + ")"
            hal = [Edit(fl, fc, l1, c1, new)]
            at = _At(func.end_lineno, func.end_col_offset - len(attr), node.end_lineno, node.end_col_offset)
            self.add("cuda-method", at, ".cuda()", f".{r.tensor_method}()" if r.tensor_method else None, dev, hal)
        elif attr == "add_argument" and node.args:
            options = option_names(node)
            for kw in node.keywords:
                if kw.arg == "default" and any(_is_device_name(o) for o in options):
                    self._device_string(kw.value)
                elif kw.arg == "default" and any(o in ("backend", "dist_backend", "dist_url_backend")
                                                 for o in options):
                    self._dist_backend_value(kw.value)
        elif attr == "startswith" and node.args and self._deviceish(func.value):
            self._device_string(node.args[0], "compare")
        elif attr == "double" and not node.args and not node.keywords:
            self.add("float64", node, ".double()")
        elif attr == "to":
            if node.args:
                self._device_string(node.args[0])
                self._to_int(node.args[0])
            for kw in node.keywords:
                if kw.arg == "device":
                    self._to_int(kw.value)

    def _to_int(self, arg: ast.AST, use: Optional[ast.AST] = None) -> None:
        """``.to(n)`` / ``device=n`` with an integer ``n`` (a literal or a rank variable): CUDA device n."""
        dt = self.r.device_type
        if isinstance(arg, ast.Constant) and type(arg.value) is int:
            n = arg.value
            target = f'"{dt}:{n}"' if self.r.device_index else f'"{dt}"'
            self.add("to-int", arg, str(n), target, [self._edit(arg, target)],
                     [self._edit(arg, f"{HAL_ALIAS}.device({n})")])
        elif isinstance(arg, (ast.Name, ast.Attribute, ast.Call, ast.BinOp)) and self.defs.is_int_device(arg):
            src = self._text(arg)
            target = f'"{dt}:{{}}".format({src})' if self.r.device_index else f'"{dt}"'
            self.add("to-int", arg, src, target, [self._edit(arg, target)],
                     [self._edit(arg, f"{HAL_ALIAS}.device({src})")])

    @staticmethod
    def _cuda_literal(value: str) -> bool:
        return value == "cuda" or value.startswith("cuda:")

    def _device_string(self, arg: ast.AST, role: str = "device", use: Optional[ast.AST] = None) -> None:
        """Flag every "cuda"/"cuda:N" literal ``arg``'s value is built from (through the module's dataflow).

        ``role`` "device": the value is used as a device; "compare": it is compared with a device
        (``--fix-to hal`` then compares with the HAL's accelerator type, so CPU runs take the non-CUDA branch).
        The finding is on the literal (the line that must change); the message names the use site.
        """
        for leaf in self.defs.leaves(arg):
            note = ""
            if leaf is not arg and leaf.lineno != arg.lineno:
                what = "compared with a device" if role == "compare" else "used as a device"
                note = f" ({what} at line {arg.lineno}: {self._text(arg).strip()[:60]})"
            if isinstance(leaf, ast.Constant) and isinstance(leaf.value, str) and self._cuda_literal(leaf.value):
                self._cuda_constant(leaf, role, note)
            elif isinstance(leaf, ast.JoinedStr) and leaf.values:
                head = leaf.values[0]
                if isinstance(head, ast.Constant) and isinstance(head.value, str) and head.value.startswith("cuda:"):
                    self._cuda_fstring(leaf, role, note)

    def _cuda_constant(self, arg: ast.Constant, role: str, note: str) -> None:
        r = self.r
        s = arg.value
        rest = s[4:]
        exact = s == "cuda" or (rest[1:].isdigit())
        index = rest[1:] if rest[1:].isdigit() else None
        if exact:
            new = r.device_type + (f":{index}" if index is not None and r.device_index else "")
        else:
            new = r.device_type + rest
        src = self._text(arg)
        text = src.replace(s, new) if src.count(s) == 1 else repr(new)
        if role == "compare":
            hal = f"{HAL_ALIAS}.accelerator_type()" if s == "cuda" else (
                f"({HAL_ALIAS}.accelerator_type() + {rest!r})")
        elif s == "cuda":
            hal = f"{HAL_ALIAS}.device_type()"
        elif index is not None:
            hal = f"{HAL_ALIAS}.device_name({index})"
        else:
            hal = f"({HAL_ALIAS}.device_type() + {rest!r})"
        self.add("device-string", arg, repr(s), repr(new), [self._edit(arg, text)], [self._edit(arg, hal)], note)

    def _cuda_fstring(self, arg: ast.JoinedStr, role: str, note: str) -> None:
        r = self.r
        src = self._text(arg)
        if src.count("cuda") != 1:
            self.add("device-string", arg, src, f'f"{r.device_type}:{{...}}"', note=note)
            return
        dev = [self._edit(arg, src.replace("cuda:", f"{r.device_type}:", 1))] if r.device_index else [
            self._edit(arg, repr(r.device_type))]
        val = arg.values[1] if len(arg.values) == 2 else None
        fn = "accelerator_type" if role == "compare" else "device_type"
        if (role == "device" and isinstance(arg.values[0], ast.Constant) and arg.values[0].value == "cuda:"
                and isinstance(val, ast.FormattedValue) and val.conversion == -1 and val.format_spec is None):
            hal = [self._edit(arg, f"{HAL_ALIAS}.device_name({self._text(val.value)})")]
        else:
            hal = [self._edit(arg, f"({HAL_ALIAS}.{fn}() + {src.replace('cuda', '', 1)})")]
        self.add("device-string", arg, src, f'f"{r.device_type}:{{...}}"', dev, hal, note)

    def _dist_backend(self, node: ast.Call) -> None:
        cands = [kw.value for kw in node.keywords if kw.arg == "backend"]
        if node.args:
            cands.append(node.args[0])
        for arg in cands:
            self._dist_backend_value(arg)

    def _dist_backend_value(self, arg: ast.AST) -> None:
        """Flag every "nccl" literal the backend argument's value is built from (dataflow as for devices)."""
        for leaf in self.defs.leaves(arg):
            if not (isinstance(leaf, ast.Constant) and isinstance(leaf.value, str)):
                continue
            parts = leaf.value.split(",")
            if "nccl" not in parts + [p.partition(":")[2] for p in parts]:
                continue
            note = ""
            if leaf is not arg and leaf.lineno != arg.lineno:
                note = f" (used as the process-group backend at line {arg.lineno})"
            s = leaf.value
            new = ",".join(self.r.dist_backend if p == "nccl" else
                           (f"{self.r.device_type}:{self.r.dist_backend}" if p == "cuda:nccl" else p)
                           for p in parts)
            src = self._text(leaf)
            text = src.replace(s, new) if src.count(s) == 1 else repr(new)
            self.add("nccl-backend", leaf, repr(s), repr(new), [self._edit(leaf, text)],
                     [self._edit(leaf, f"{HAL_ALIAS}.dist_backend()")], note)

    def _cpp_extension(self, node: ast.Call, fq: str, leaf: str) -> None:
        cuda_files = [n for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                      and n.value.endswith((".cu", ".cuh"))]
        inline_cuda = any(kw.arg in ("cuda_sources",) for kw in node.keywords) or any(
            kw.arg == "with_cuda" and isinstance(kw.value, ast.Constant) and kw.value.value is True
            for kw in node.keywords)
        if leaf in ("load", "load_inline") and (cuda_files or inline_cuda):
            _, mapped = self.r.map_api(fq)
            self.add("cpp-extension", node, fq, mapped)
        _, builder = self.r.map_api(_CPP_EXT + ".CUDAExtension")
        for c in cuda_files:
            self.add("cuda-source", c, repr(c.value), builder)

    # ---- environment variables ------------------------------------------------------------
    def _env_name(self, arg: ast.AST) -> None:
        if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
            return
        name = arg.value
        r = self.r
        if name in r.env:
            mapped = r.env[name]
            src = self._text(arg)
            dev = [self._edit(arg, src.replace(name, mapped))] if mapped and src.count(name) == 1 else []
            hal = [self._edit(arg, f"{HAL_ALIAS}.env_name({src})")] if mapped else []
            self.add("env-var", arg, name, mapped, dev, hal)
        elif name.startswith(r.env_prefixes) if r.env_prefixes else False:
            self.add("env-var-unknown", arg, name)

    def _env_keyword(self, kw: ast.keyword) -> None:
        name = kw.arg
        r = self.r
        if name in r.env:
            mapped = r.env[name]
            dev = [Edit(kw.lineno, self._col(kw.lineno, kw.col_offset), kw.lineno,
                        self._col(kw.lineno, kw.col_offset) + len(name), mapped)] if mapped else []
            self.add("env-var", kw, name, mapped, dev)
        elif r.env_prefixes and name.startswith(r.env_prefixes):
            self.add("env-var-unknown", kw, name)

    def visit_Constant(self, node: ast.Constant) -> None:
        """Constants have no children; this also skips NodeVisitor's deprecated visit_Num/visit_Str lookups."""

    def visit_BinOp(self, node: ast.BinOp) -> None:
        """``("cuda:0",) + args``: a device literal prepended to a call's argument tuple (rpc.remote ...)."""
        if isinstance(node.op, ast.Add):
            for side in (node.left, node.right):
                if isinstance(side, (ast.Tuple, ast.List)):
                    for e in side.elts:
                        if isinstance(e, ast.Constant) and isinstance(e.value, str) and (
                                e.value == "cuda" or (e.value.startswith("cuda:") and e.value[5:].isdigit())):
                            self._device_string(e)
        self.generic_visit(node)

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # a docstring or a bare string statement
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if self.qname(node.value) == "os.environ":
            self._env_name(node.slice)
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        if any(k is None and self.qname(v) == "os.environ" for k, v in zip(node.keys, node.values)):
            for k in node.keys:
                if k is not None:
                    self._env_name(k)
        self.generic_visit(node)

    # ---- comparisons ----------------------------------------------------------------------
    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            name = t.id if isinstance(t, ast.Name) else (t.attr if isinstance(t, ast.Attribute) else "")
            if _is_device_name(name):
                self._device_string(node.value)
        if isinstance(node.value, ast.Call) and (self.qname(node.value.func) or "").endswith(
                ("cuda.get_device_capability",)):
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        self.cap_names.add(n.id)
        self.generic_visit(node)

    def _deviceish(self, node: ast.AST) -> bool:
        """Whether ``node`` holds a device or device type (by name, or because a "cuda" literal flows into it)."""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str" and node.args:
            node = node.args[0]
        name = _name_of(node)
        if not name:
            return False
        if name in _DEVICE_COMPARE_ATTRS or _is_device_name(name):
            return True
        return any(isinstance(leaf, ast.Constant) and isinstance(leaf.value, str) and self._cuda_literal(leaf.value)
                   for leaf in self.defs.leaves(node))

    def _is_capability(self, node: ast.AST) -> bool:
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and n.id in self.cap_names:
                return True
            if isinstance(n, ast.Call):
                fq = self.qname(n.func) or ""
                if fq.startswith("torch.cuda.") and fq.endswith(("get_device_capability", "get_device_properties")):
                    return True
        return False

    def visit_Compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        if any(not isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and any(
                self._is_capability(o) for o in operands):
            self.add("capability-gate", node, self._text(node).strip())
        for op, left, right in zip(node.ops, operands, operands[1:]):
            if isinstance(op, (ast.In, ast.NotIn)) and self.qname(right) == "os.environ":
                self._env_name(left)
            if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Set, ast.List, ast.Tuple)) and (
                    self._deviceish(left)):
                for e in right.elts:
                    self._device_string(e, "compare")
            for a, b in ((left, right), (right, left)):
                if isinstance(a, ast.Constant) and isinstance(a.value, str):
                    if self._cuda_literal(a.value) and self._deviceish(b):
                        self._device_string(a, "compare")
                    if a.value == "nccl" and "backend" in _name_of(b).lower():
                        self._dist_backend_value(a)
                    if a.value == "nccl" and isinstance(b, ast.Call) and (self.qname(b.func) or "").endswith(
                            "distributed.get_backend"):
                        self.add("nccl-backend", a, "'nccl'", repr(self.r.dist_backend),
                                 [self._edit(a, repr(self.r.dist_backend))],
                                 [self._edit(a, f"{HAL_ALIAS}.dist_backend()")])
        self.generic_visit(node)


def _newer(r: RuleSet, q: str) -> Optional[str]:
    """The torch release that introduced ``q`` when it is newer than the target's torch, else None."""
    if not r.newer_apis or not q.startswith("torch."):
        return None
    parts = q.split(".")
    for n in range(len(parts), 1, -1):
        need = r.newer_apis.get(".".join(parts[:n]))
        if need:
            return need
    return None


def _name_of(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _is_device_name(name: str) -> bool:
    """Whether a variable / option called ``name`` holds a device ("device", "dev", "train_device")."""
    return name in ("device", "dev", "device_type", "map_location") or name.endswith("_device")


def _insert_line(tree: ast.Module) -> int:
    """0-based line before which a new import goes: after the first top-level torch import, else after
    the docstring and ``from __future__`` imports."""
    after = 0
    for i, stmt in enumerate(tree.body):
        if i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(
                stmt.value.value, str):
            after = stmt.end_lineno
            continue
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            after = stmt.end_lineno
            continue
        break
    for stmt in tree.body:
        if isinstance(stmt, ast.Import) and any(a.name.split(".")[0] == "torch" for a in stmt.names):
            return stmt.end_lineno
        if isinstance(stmt, ast.ImportFrom) and (stmt.module or "").split(".")[0] == "torch" and not stmt.level:
            return stmt.end_lineno
    return after


_ODD_BREAKS = re.compile("[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def split_lines(source: str) -> list:
    """``source`` split into lines with their endings, at the breaks Python's tokenizer counts
    (``\n``, ``\r\n``, ``\r``; not form feeds or Unicode separators, unlike :meth:`str.splitlines`)."""
    if not _ODD_BREAKS.search(source):
        return source.splitlines(keepends=True)
    return _LINE.findall(source)


def scan_source(source: str, path: str, rules: RuleSet, tree: Optional[ast.Module] = None) -> FileScan:
    """Scan one file's source. Raises SyntaxError when it does not parse (the caller reports the line)."""
    if tree is None:
        tree = ast.parse(source, filename=path)
    lines = split_lines(source)
    sc = _Scanner(rules, path, lines, tree)
    sc.visit(tree)
    sc.findings.sort(key=lambda f: (f.line, f.column, f.rule))
    return FileScan(path, len(lines), sc.findings, sc.import_edits, sc.has_import, _insert_line(tree))
