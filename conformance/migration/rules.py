"""Migration rule data: the generic rule catalogue and each backend's ``migration_rules.yaml``.

The rule *kinds* (what the scanner looks for: device strings in device positions, ``torch.cuda.*``
names, env var names, ...) are code in :mod:`hal.conformance.migration.scanner`; everything
target-specific (severity, message, the target's counterpart of each CUDA name) is data shipped by
the backend plugin next to its module (``Backend.data_file(Backend.migration_rules_file)``), so a
new chip brings its own rules. ``--fix-to hal`` rewrites come from the generic ``hal_map.yaml``
beside this module.

:func:`load_rules` raises :class:`RulesError` for an unknown backend or a malformed file: the file is
validated against the published schema ``hal-migration-rules/1`` (``hal schema hal-migration-rules/1``;
``hal_map.yaml`` against ``hal-migration-map/1``) and the message names the file and the exact path of
the first problem (``$.rules['device-string'].severity: 'fatal' is not one of [...]``).
Loaded rule sets are immutable and cached per process (thread-safe to share).
"""
from __future__ import annotations

import dataclasses
import functools
import pathlib
from typing import Any, Mapping, Optional

import yaml

SCHEMA = "hal-migration-rules/1"
SEVERITIES = ("error", "warning", "info")

#: rule id -> one-line description (the SARIF rule catalogue; docs/audit-rules.md explains each)
CATALOGUE: dict[str, str] = {
    "device-string": 'a "cuda" / "cuda:N" device string in a device position',
    "cuda-method": "a .cuda() call on a tensor or module",
    "is-cuda": "a .is_cuda check",
    "cuda-api": "a torch.cuda.* name (device, streams, events, memory, seeds, graphs, nvtx, ...)",
    "cuda-api-unsupported": "a torch.cuda.* name the target lists as unsupported",
    "cuda-amp": "torch.cuda.amp.autocast / GradScaler",
    "capability-gate": "a comparison on the CUDA compute capability",
    "nccl-backend": 'the "nccl" process-group backend or Backend.NCCL',
    "profiler-cuda": "ProfilerActivity.CUDA",
    "cudnn-flag": "a torch.backends.cudnn.* setting",
    "tf32-flag": "torch.backends.cuda.matmul.allow_tf32",
    "cuda-backend-flag": "another torch.backends.cuda.* setting",
    "cpp-extension": "a CUDA C++ extension build (CUDAExtension, cpp_extension.load with CUDA sources)",
    "cuda-source": "a CUDA source file (.cu/.cuh) in the tree or in an extension's sources",
    "vendor-import": "an import of a CUDA-only extension (apex, flash_attn, xformers)",
    "triton-import": "an import of triton",
    "jit-script": "torch.jit.script",
    "to-int": ".to(<int>): an integer device",
    "float64": "float64 / double / complex128 tensors",
    "env-var": "a CUDA/NCCL environment variable with a known target mapping",
    "env-var-unknown": "a CUDA/NCCL-looking environment variable the target does not map",
    "reduce-op": "a ReduceOp the target's collective library rejects",
    "dist-unsupported": "a torch.distributed call the target's process group does not support",
    "torch-too-new": "a torch API newer than the torch release the target pairs with",
    "parse-error": "a .py file below the audited folder that does not parse",
    "unreadable": "a .py file below the audited folder that is binary or not text",
}


class RulesError(ValueError):
    """The backend is unknown or its migration rules are missing or malformed. ``path``: the document
    path of the (first) schema problem as a tuple of keys and indexes (empty when none applies)."""

    def __init__(self, message: str, path: tuple = ()):
        super().__init__(message)
        self.path = path


MAP_SCHEMA = "hal-migration-map/1"


def check_rules(data: Any, source: str, schema: str = SCHEMA) -> dict:
    """``data`` (parsed YAML) when it is a valid ``schema`` document, else :class:`RulesError`."""
    from hal import schemas
    if not isinstance(data, dict) or data.get("schema") != schema:
        raise RulesError(f"{source}: not a {schema} file", ("schema",))
    try:
        return schemas.check(schema, data, source)
    except schemas.SchemaError as exc:
        raise RulesError(str(exc), exc.path) from None


@dataclasses.dataclass(frozen=True)
class Rule:
    id: str
    severity: str  # error | warning | info | off
    message: str
    message_none: str

    def render(self, found: str, counterpart: Optional[str]) -> str:
        template = self.message if counterpart else (self.message_none or self.message)
        return template.format(found=found, counterpart=counterpart or "none")


@dataclasses.dataclass(frozen=True)
class RuleSet:
    """One backend's migration data (see backends/*/migration_rules.yaml and docs/audit-rules.md)."""

    backend: str
    device_type: str
    device_index: bool
    tensor_method: Optional[str]
    is_attr: Optional[str]
    import_module: Optional[str]
    dist_backend: str
    dist_backend_attr: Optional[str]
    profiler_activity: Optional[str]
    rules: Mapping[str, Rule]
    api: Mapping[str, Optional[str]]
    unsupported_api: frozenset
    vendor_imports: Mapping[str, Optional[str]]
    triton_imports: frozenset
    reduce_ops_unsupported: frozenset
    dist_unsupported: frozenset
    env: Mapping[str, Optional[str]]
    env_prefixes: tuple
    provenance: Mapping[str, Any]
    source: str
    api_symbols: frozenset = frozenset()
    api_symbols_source: str = ""
    torch_version: Optional[str] = None
    newer_apis: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def rule(self, rule_id: str) -> Optional[Rule]:
        """The enabled rule ``rule_id`` or None when the backend turns it off."""
        r = self.rules.get(rule_id)
        return r if r is not None and r.severity != "off" else None

    def map_api(self, qname: str) -> tuple[bool, Optional[str]]:
        """(known, counterpart): longest-prefix mapping of a CUDA qualified name to the target's."""
        return longest_prefix(self.api, qname)


def longest_prefix(table: Mapping[str, Optional[str]], qname: str) -> tuple[bool, Optional[str]]:
    """Map ``qname`` through the longest key of ``table`` that is a dotted prefix of it."""
    parts = qname.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in table:
            value = table[key]
            if value is None:
                return True, None
            rest = parts[n:]
            return True, ".".join([value, *rest]) if rest else value
    return False, None


def _rules_path(backend: str) -> pathlib.Path:
    from hal.discovery import list_backends
    infos = {i.name: i for i in list_backends()}
    info = infos.get(backend)
    if info is None:
        raise RulesError(f"unknown device {backend!r}; installed backends: {', '.join(sorted(infos)) or 'none'}")
    if info.cls is None:
        raise RulesError(f"backend {backend!r} failed to load: {info.reason}")
    path = info.cls.data_file(info.cls.migration_rules_file)
    if path is None:
        raise RulesError(f"backend {backend!r} ships no {info.cls.migration_rules_file}")
    return path


@functools.lru_cache(maxsize=None)
def load_rules(backend: str, path: Optional[str] = None) -> RuleSet:
    """The migration rules of installed backend ``backend`` (or read from ``path``)."""
    p = pathlib.Path(path) if path else _rules_path(backend)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise RulesError(f"cannot read migration rules {p}: {exc}") from None
    check_rules(data, str(p))
    rules = {}
    for rid, spec in (data.get("rules") or {}).items():
        sev = spec.get("severity", "off")
        sev = "off" if sev is False else sev  # YAML 1.1 reads a bare off as false
        rules[rid] = Rule(rid, sev, spec.get("message", CATALOGUE[rid]), spec.get("message_none", ""))
    return RuleSet(
        backend=data.get("backend", backend), device_type=data["device_type"],
        device_index=bool(data.get("device_index", True)),
        tensor_method=data.get("tensor_method"), is_attr=data.get("is_attr"),
        import_module=data.get("import"), dist_backend=data.get("dist_backend", "gloo"),
        dist_backend_attr=data.get("dist_backend_attr"), profiler_activity=data.get("profiler_activity"),
        rules=rules, api=dict(data.get("api") or {}),
        unsupported_api=frozenset(data.get("unsupported_api") or ()),
        vendor_imports=dict(data.get("vendor_imports") or {}),
        triton_imports=frozenset(data.get("triton_imports") or ()),
        reduce_ops_unsupported=frozenset(data.get("reduce_ops_unsupported") or ()),
        dist_unsupported=frozenset(data.get("dist_unsupported") or ()),
        env=dict(data.get("env") or {}), env_prefixes=tuple(data.get("env_prefixes") or ()),
        provenance=dict(data.get("provenance") or {}), source=str(p),
        api_symbols=_symbols(p, data.get("api_symbols")), api_symbols_source=str(data.get("api_symbols") or ""),
        torch_version=str(data["torch"]) if data.get("torch") else None,
        newer_apis={str(k): str(v) for k, v in (data.get("newer_apis") or {}).items()})


def _symbols(rules_path: pathlib.Path, name: Optional[str]) -> frozenset:
    if not name:
        return frozenset()
    from hal.conformance.migration.symbols import load_symbols
    try:
        return load_symbols(rules_path.with_name(name))
    except OSError as exc:
        raise RulesError(f"{rules_path}: cannot read api_symbols {name}: {exc}") from None


@functools.lru_cache(maxsize=None)
def hal_map() -> Mapping[str, Optional[str]]:
    """The generic ``--fix-to hal`` map: CUDA qualified name -> expression on ``hal_portable``."""
    p = pathlib.Path(__file__).with_name("hal_map.yaml")
    return dict(check_rules(yaml.safe_load(p.read_text(encoding="utf-8")), str(p), MAP_SCHEMA)["api"])
