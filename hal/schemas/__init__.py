"""Published JSON Schemas (draft 2020-12) of HAL's documents, shipped as package data.

Each document HAL writes or reads carries its format as a ``schema`` field (``"hal-audit/1"``); the
schema for ``NAME/N`` is the file ``NAME-N.schema.json`` beside this module, with ``$id``
``urn:hal:NAME/N``. ``hal schema`` lists the names, ``hal schema NAME`` prints one.

Contract: :func:`names` lists every shipped schema; :func:`load` returns one as a dict (raises
:class:`UnknownSchemaError` for a name not shipped); :func:`problems` validates a document and returns
every :class:`Problem` (empty when it conforms), each naming the exact JSON path of the offending
value (``$.findings[3].severity``); :func:`check` raises :class:`SchemaError` (a ValueError) with the
first problems as one line. Schemas may ``$ref`` each other by ``$id``. Loaded schemas and
validators are cached; everything here is thread-safe once loaded. ``jsonschema`` is imported on
first validation only (``hal schema`` and ``import hal`` never pay for it).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import re
from importlib import resources
from typing import Any, Iterable, Optional, Sequence

SUFFIX = ".schema.json"
URN = "urn:hal:"

_NAME = re.compile(r"^[a-z][a-z0-9-]*/[0-9]+$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class UnknownSchemaError(KeyError):
    """No shipped schema has that name."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


@dataclasses.dataclass(frozen=True)
class Problem:
    """One validation error: where (``path``, as keys and indexes from the document's root) and what."""

    path: tuple
    message: str

    @property
    def json_path(self) -> str:
        return json_path(self.path)

    def __str__(self) -> str:
        return f"{self.json_path}: {self.message}"


class SchemaError(ValueError):
    """A document does not conform to its schema. ``problems`` lists every error found; ``str()`` is
    one line naming the source, the schema, the first problem's JSON path and how many more there are."""

    def __init__(self, schema: str, problems: Sequence[Problem], source: Optional[str] = None):
        self.schema = schema
        self.problems = list(problems)
        self.source = source
        first = self.problems[0] if self.problems else Problem((), "invalid")
        more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        where = f"{source}: " if source else ""
        super().__init__(f"{where}not a valid {schema} document: {first}{more}")

    @property
    def path(self) -> tuple:
        return self.problems[0].path if self.problems else ()


def json_path(path: Iterable) -> str:
    """``("findings", 3, "severity")`` -> ``$.findings[3].severity``; keys that are not identifiers
    are bracketed and quoted (``$.rules['device-string']``)."""
    out = "$"
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENT.match(str(part)):
            out += f".{part}"
        else:
            out += "['" + str(part).replace("\\", "\\\\").replace("'", "\\'") + "']"
    return out


def _file(name: str) -> str:
    return name.replace("/", "-") + SUFFIX


def names() -> list[str]:
    """Every shipped schema name (``hal-audit/1``, ...), sorted."""
    out = []
    for entry in resources.files(__name__).iterdir():
        if entry.name.endswith(SUFFIX):
            stem = entry.name[: -len(SUFFIX)]
            base, _, version = stem.rpartition("-")
            out.append(f"{base}/{version}")
    return sorted(out)


@functools.lru_cache(maxsize=None)
def _text(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name) or name not in names():
        raise UnknownSchemaError(f"unknown schema {name!r}; known: {', '.join(names())}")
    return resources.files(__name__).joinpath(_file(name)).read_text(encoding="utf-8")


def text(name: str) -> str:
    """The schema ``name`` exactly as shipped (JSON text)."""
    return _text(name)


def load(name: str) -> dict:
    """The schema ``name`` as a new dict (callers may modify it)."""
    return json.loads(_text(name))


@functools.lru_cache(maxsize=1)
def _registry():
    from referencing import Registry, Resource
    return Registry().with_resources(
        (URN + n, Resource.from_contents(json.loads(_text(n)))) for n in names())


@functools.lru_cache(maxsize=None)
def validator(name: str):
    """A cached ``jsonschema`` validator for schema ``name`` (other shipped schemas resolvable by $id)."""
    import jsonschema
    schema = json.loads(_text(name))
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, registry=_registry())


def validator_for_schema(schema: dict):
    """A validator for an ad-hoc schema that may ``$ref`` the shipped ones by ``$id`` (tests use it)."""
    import jsonschema
    return jsonschema.validators.validator_for(schema)(schema, registry=_registry())


def _leaf_errors(errors) -> list:
    """The most specific errors: an ``anyOf``/``oneOf`` failure is replaced by its best sub-error."""
    from jsonschema.exceptions import best_match
    out = []
    for err in errors:
        if err.context:
            out.append(best_match(err.context))
        else:
            out.append(err)
    return out


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_key_error(err) -> bool:
    """True for an error about a property *name* (raised under ``propertyNames``)."""
    return "propertyNames" in list(err.schema_path)[:-1]


def _message(err) -> str:
    """A one-line message for a jsonschema error (long instances abbreviated)."""
    v = err.validator
    if _is_key_error(err):
        noun = err.schema.get("title") or "key"
        return f"unknown {noun} {err.instance!r}" if v == "enum" else f"invalid {noun} {err.instance!r}"
    if v == "required":
        missing = [k for k in err.validator_value if isinstance(err.instance, dict) and k not in err.instance]
        return "missing " + ", ".join(repr(k) for k in missing) if missing else err.message
    if v == "additionalProperties" and isinstance(err.instance, dict):
        allowed = set((err.schema.get("properties") or {}))
        pats = [re.compile(p) for p in (err.schema.get("patternProperties") or {})]
        extra = [k for k in err.instance if k not in allowed and not any(p.search(k) for p in pats)]
        return "unexpected " + ", ".join(repr(k) for k in extra)
    if v in ("enum", "const"):
        allowed = err.validator_value if v == "enum" else [err.validator_value]
        return f"{_short(err.instance)} is not one of {_short(allowed, 120)}"
    if v == "type":
        return f"{_short(err.instance)} is not of type {err.validator_value!r}"
    msg = " ".join(str(err.message).split())
    return msg if len(msg) <= 200 else msg[:197] + "..."


def problems(name: str, document: Any) -> list[Problem]:
    """Every way ``document`` fails schema ``name`` (empty list: it conforms), sorted by path."""
    val = validator(name)
    out = []
    for err in _leaf_errors(val.iter_errors(document)):
        path = tuple(err.absolute_path)
        if _is_key_error(err):  # name the offending key itself
            path = path + (err.instance,)
        out.append(Problem(path, _message(err)))
    return sorted(set(out), key=lambda p: (tuple((0, x, "") if isinstance(x, int) else (1, 0, str(x))
                                                 for x in p.path), p.message))


def check(name: str, document: Any, source: Optional[str] = None) -> Any:
    """``document`` unchanged when it conforms to schema ``name``; else raise :class:`SchemaError`."""
    found = problems(name, document)
    if found:
        raise SchemaError(name, found, source)
    return document


__all__ = ["Problem", "SchemaError", "UnknownSchemaError", "check", "json_path", "load", "names", "problems",
           "text", "validator"]
