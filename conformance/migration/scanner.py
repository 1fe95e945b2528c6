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
from typing import Iterable, Optional

from hal.conformance.migration.rules import RuleSet, hal_map, longest_prefix

HAL_ALIAS = "hal_portable"
HAL_IMPORT = f"import hal.conformance.migration.portable as {HAL_ALIAS}"

#: calls whose first positional argument is a device
_DEVICE_ARG0 = frozenset({"torch.device", "torch.Generator", "torch.autocast", "torch.amp.autocast",
                          "torch.amp.GradScaler", "torch.amp.autocast_mode.autocast",
                          "torch.get_autocast_dtype", "torch.set_autocast_dtype", "torch.is_autocast_enabled",
                          "torch.distributed.device_mesh.init_device_mesh", "torch.distributed.init_device_mesh"})
#: keyword arguments that hold a device
_DEVICE_KWARGS = frozenset({"device", "device_type", "map_location", "pin_memory_device"})
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

    def fix_text(self, flavour: str) -> Optional[str]:
        edits = self.edits.get(flavour)
        return " ; ".join(e.text for e in edits if e.text) if edits else None

    def as_dict(self, flavour: str = "device") -> dict:
        return {"rule": self.rule, "path": self.path, "line": self.line, "column": self.column,
                "end_line": self.end_line, "end_column": self.end_column, "severity": self.severity,
                "message": self.message, "found": self.found, "counterpart": self.counterpart,
                "fix": self.fix_text(flavour),
                "fixes": {f: self.fix_text(f) for f in ("device", "hal")}}


@dataclasses.dataclass
class FileScan:
    """The scan of one file: findings, plus import rewrites the device fix needs (``import_edits``)."""

    path: str
    lines: int
    findings: list
    import_edits: list  # device-flavour edits of `import torch.cuda as x` style statements
    has_import: dict    # flavour -> whether the file already imports what that flavour's fix needs
    insert_line: int    # 0-based line index before which a new import goes


class _Scanner(ast.NodeVisitor):
    def __init__(self, rules: RuleSet, path: str, lines: list[str]):
        self.r = rules
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
            device: Iterable[Edit] = (), hal: Iterable[Edit] = ()) -> None:
        rule = self.r.rule(rule_id)
        if rule is None:
            return
        key = (rule_id, node.lineno, node.col_offset)
        if key in self.seen:
            return
        self.seen.add(key)
        l0, c0, l1, c1 = self._span(node)
        edits = {}
        if device:
            edits["device"] = tuple(device)
        if hal:
            edits["hal"] = tuple(hal)
        self.findings.append(Finding(rule_id, self.path, l0, c0 + 1, rule.severity,
                                     rule.render(found, counterpart), found, counterpart, l1, c1 + 1, edits))

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
            if a.name == "hal.conformance.migration.portable" and a.asname == HAL_ALIAS:
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
                return [fix] if fix else []  # the rewritten import fixes this use
            sub = sub.value

    def _hal_rewrite(self, node: ast.AST, q: str) -> list[Edit]:
        known, target = longest_prefix(self.hal, q)
        return [self._edit(node, target)] if target else []

    def _check_qname(self, node: ast.AST, q: str) -> bool:
        r = self.r
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
        for kw in node.keywords:
            if kw.arg in _DEVICE_KWARGS:
                self._device_string(kw.value)
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
            self.add("cuda-method", node, ".cuda()", f".{r.tensor_method}()" if r.tensor_method else None, dev, hal)
        elif attr == "add_argument" and node.args and isinstance(node.args[0], ast.Constant) and isinstance(
                node.args[0].value, str):
            option = node.args[0].value.lstrip("-").replace("-", "_")
            for kw in node.keywords:
                if kw.arg == "default" and _is_device_name(option):
                    self._device_string(kw.value)
                elif kw.arg == "default" and option in ("backend", "dist_backend", "dist_url_backend"):
                    self._dist_backend_value(kw.value)
        elif attr == "double" and not node.args and not node.keywords:
            self.add("float64", node, ".double()")
        elif attr == "to":
            if node.args:
                self._device_string(node.args[0])
                self._to_int(node.args[0])
            for kw in node.keywords:
                if kw.arg == "device":
                    self._to_int(kw.value)

    def _to_int(self, arg: ast.AST) -> None:
        if isinstance(arg, ast.Constant) and type(arg.value) is int:
            n = arg.value
            dt = self.r.device_type
            target = f'"{dt}:{n}"' if self.r.device_index else f'"{dt}"'
            self.add("to-int", arg, str(n), target, [self._edit(arg, target)],
                     [self._edit(arg, f"{HAL_ALIAS}.device({n})")])

    def _device_string(self, arg: ast.AST) -> None:
        r = self.r
        if isinstance(arg, ast.IfExp):
            self._device_string(arg.body)
            self._device_string(arg.orelse)
        elif isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            s = arg.value
            if s == "cuda":
                index = None
            elif s.startswith("cuda:") and s[5:].isdigit():
                index = s[5:]
            else:
                return
            new = r.device_type + (f":{index}" if index is not None and r.device_index else "")
            src = self._text(arg)
            text = src.replace(s, new) if src.count(s) == 1 else repr(new)
            hal = f"{HAL_ALIAS}.device_type()" if index is None else f"{HAL_ALIAS}.device_name({index})"
            self.add("device-string", arg, repr(s), repr(new), [self._edit(arg, text)], [self._edit(arg, hal)])
        elif isinstance(arg, ast.JoinedStr) and len(arg.values) == 2:
            head, val = arg.values
            if (isinstance(head, ast.Constant) and head.value == "cuda:" and isinstance(val, ast.FormattedValue)
                    and val.conversion == -1 and val.format_spec is None):
                src = self._text(arg)
                dev = [self._edit(arg, src.replace("cuda:", f"{r.device_type}:", 1))] if r.device_index else [
                    self._edit(arg, repr(r.device_type))]
                hal = [self._edit(arg, f"{HAL_ALIAS}.device_name({self._text(val.value)})")]
                self.add("device-string", arg, src, f'f"{r.device_type}:{{...}}"', dev, hal)

    def _dist_backend(self, node: ast.Call) -> None:
        cands = [kw.value for kw in node.keywords if kw.arg == "backend"]
        if node.args:
            cands.append(node.args[0])
        for arg in cands:
            self._dist_backend_value(arg)

    def _dist_backend_value(self, arg: ast.AST) -> None:
        if isinstance(arg, ast.IfExp):
            self._dist_backend_value(arg.body)
            self._dist_backend_value(arg.orelse)
            return
        if True:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and "nccl" in arg.value.split(
                    ",") + [p.partition(":")[2] for p in arg.value.split(",")]:
                s = arg.value
                new = ",".join(self.r.dist_backend if p == "nccl" else
                               (f"{self.r.device_type}:{self.r.dist_backend}" if p == "cuda:nccl" else p)
                               for p in s.split(","))
                src = self._text(arg)
                text = src.replace(s, new) if src.count(s) == 1 else repr(new)
                self.add("nccl-backend", arg, repr(s), repr(new), [self._edit(arg, text)],
                         [self._edit(arg, f"{HAL_ALIAS}.dist_backend()")])

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
            for a, b in ((left, right), (right, left)):
                if isinstance(a, ast.Constant) and isinstance(a.value, str):
                    if (isinstance(b, ast.Attribute) and b.attr in _DEVICE_COMPARE_ATTRS) or (
                            isinstance(b, ast.Name) and b.id in _DEVICE_COMPARE_ATTRS):
                        self._device_string(a)
                    if a.value == "nccl" and isinstance(b, ast.Call) and (self.qname(b.func) or "").endswith(
                            "distributed.get_backend"):
                        self.add("nccl-backend", a, "'nccl'", repr(self.r.dist_backend),
                                 [self._edit(a, repr(self.r.dist_backend))],
                                 [self._edit(a, f"{HAL_ALIAS}.dist_backend()")])
        self.generic_visit(node)


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


def scan_source(source: str, path: str, rules: RuleSet, tree: Optional[ast.Module] = None) -> FileScan:
    """Scan one file's source. Raises SyntaxError when it does not parse (the caller reports the line)."""
    if tree is None:
        tree = ast.parse(source, filename=path)
    lines = source.splitlines(keepends=True)
    sc = _Scanner(rules, path, lines)
    sc.visit(tree)
    sc.findings.sort(key=lambda f: (f.line, f.column, f.rule))
    return FileScan(path, len(lines), sc.findings, sc.import_edits, sc.has_import, _insert_line(tree))
