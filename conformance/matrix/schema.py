"""The matrix's data: cells, statuses and the document schema ``hal-compat-matrix/1``.

A cell says what happened and how we know: ``verified`` is True only when the figures were
measured on that device; a cell for a device that is not present is *predicted* from the
backend's capability manifest (op support only; no time, memory or precision figures).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

SCHEMA = "hal-compat-matrix/1"

#: op statuses from best to worst (a cell keeps an op's worst status across phases)
OP_STATUS_ORDER = ("native", "composite", "unknown", "fallback", "unsupported")

#: every status a measured cell can have, best first
MEASURED_STATUSES = ("pass", "pass-with-fallback", "precision-fail", "fail", "crashed", "timeout", "not-run")
#: a predicted cell states op support only, never a measured cell's words: every op runs on the
#: device (native or composite) | some fall back to the CPU | some cannot run there
PREDICTED_STATUSES = ("ops-supported", "ops-fallback", "ops-unsupported")
#: every status a cell can have
STATUSES = MEASURED_STATUSES + PREDICTED_STATUSES


@dataclasses.dataclass
class Cell:
    """One (backend, model, mode, dtype) result. ``figures`` holds measured numbers
    (step_ms, peak_bytes, ops, fallback_ops, precision verdict ...); ``env`` names the entry of the
    document's ``environments`` that produced it."""

    backend: str
    model: str
    mode: str
    dtype: str
    status: str = "not-run"
    verified: bool = False
    reason: str = ""
    figures: dict = dataclasses.field(default_factory=dict)
    ops: dict = dataclasses.field(default_factory=dict)  # op -> status on this backend
    env: str = ""
    seconds: float = 0.0

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.backend, self.model, self.mode, self.dtype)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Cell":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in fields})


def document(cells: list[Cell], collectives: list[dict], environments: list[dict],
             extra: Optional[dict] = None) -> dict[str, Any]:
    """The JSON document for a set of cells (cells sorted; derived from them: ``per_op``, op -> backend
    -> worst status, and ``op_models``, op -> the models whose cells ran it)."""
    cells = sorted(cells, key=lambda c: c.key)
    per_op: dict[str, dict[str, str]] = {}
    op_models: dict[str, set] = {}
    rank = {st: i for i, st in enumerate(OP_STATUS_ORDER)}
    for c in cells:
        for op, st in c.ops.items():
            op_models.setdefault(op, set()).add(c.model)
            cur = per_op.setdefault(op, {}).get(c.backend)
            if cur is None or rank.get(st, 2) > rank.get(cur, 2):
                per_op[op][c.backend] = st
    doc = {"schema": SCHEMA, "cells": [c.as_dict() for c in cells], "collectives": collectives,
           "environments": environments, "per_op": dict(sorted(per_op.items())),
           "op_models": {op: sorted(ms) for op, ms in sorted(op_models.items())},
           "summary": {s: sum(c.status == s for c in cells) for s in STATUSES}}
    doc["summary"]["verified"] = sum(c.verified for c in cells)
    doc["summary"]["predicted"] = sum(not c.verified and c.status != "not-run" for c in cells)
    if extra:
        doc.update(extra)
    return doc


def validate(doc: Any) -> list[str]:
    """Every way ``doc`` breaks the published schema ``hal-compat-matrix/1`` (``hal schema
    hal-compat-matrix/1``), one line each naming the exact JSON path; empty when it conforms."""
    from hal import schemas
    return [str(p) for p in schemas.problems(SCHEMA, doc)]


def check(doc: Any, source: Optional[str] = None) -> dict:
    """``doc`` unchanged when it is a valid ``hal-compat-matrix/1`` document, else raise
    :class:`hal.schemas.SchemaError` (a ValueError; one line: ``source``, the JSON path, the problem)."""
    from hal import schemas
    return schemas.check(SCHEMA, doc, source)
