"""Merging matrices from several machines and diffing two matrices.

Merge rule for a cell present in several inputs: a verified cell beats a predicted one; between
equals, the later input wins. Environments are kept once each (by ``id``); collectives rows are
kept per backend with the same rule. Raises ValueError for a document of another schema.
"""
from __future__ import annotations

from typing import Iterable

from hal.conformance.matrix.schema import SCHEMA, Cell, check, document


def check_schema(doc: dict, where: str) -> dict:
    """``doc`` when it is a valid ``hal-compat-matrix/1`` document, else ValueError naming ``where`` and
    the first problem's JSON path (:class:`hal.schemas.SchemaError`)."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{where} is not a {SCHEMA} document (schema: {doc.get('schema') if isinstance(doc, dict) else type(doc).__name__})")
    return check(doc, where)


def merge(docs: Iterable[tuple[str, dict]]) -> dict:
    """``docs`` are (name, document) pairs in priority order (later wins ties)."""
    cells: dict[tuple, Cell] = {}
    envs: dict[str, dict] = {}
    colls: dict[str, dict] = {}
    sources = []
    for name, doc in docs:
        check_schema(doc, name)
        sources.append(name)
        for env in doc.get("environments", []):
            envs[env.get("id", name)] = env
        for row in doc.get("collectives", []):
            cur = colls.get(row["backend"])
            if cur is None or row.get("verified") or not cur.get("verified"):
                colls[row["backend"]] = row
        for d in doc.get("cells", []):
            c = Cell.from_dict(d)
            cur = cells.get(c.key)
            if cur is None or c.verified or not cur.verified:
                cells[c.key] = c
    return document(list(cells.values()), sorted(colls.values(), key=lambda r: r["backend"]),
                    list(envs.values()), {"merged_from": sources})


def op_changes(rows: list[dict]) -> list[dict]:
    """From :func:`diff`'s rows: one row per op that some cell's op set lost or gained,
    ``{"op", "only_old", "only_new", "models"}`` (cell counts and the models involved), most cells first."""
    by: dict[str, dict] = {}
    for r in rows:
        if r["change"] != "ops":
            continue
        model = r["cell"].split("/")[1]
        for side in ("old", "new"):
            for op in r[side]:
                e = by.setdefault(op, {"op": op, "only_old": 0, "only_new": 0, "models": set()})
                e["only_" + side] += 1
                e["models"].add(model)
    out = [{**e, "models": sorted(e["models"])} for e in by.values()]
    return sorted(out, key=lambda e: (-(e["only_old"] + e["only_new"]), e["op"]))


def diff(old: dict, new: dict) -> list[dict]:
    """Rows for every cell whose status or verification changed, whose step time moved by more
    than 10%, whose fallback ops changed or whose op set changed (``old``: ops only in ``old``,
    ``new``: ops only in ``new``), plus cells only in one of the two."""
    check_schema(old, "old")
    check_schema(new, "new")
    a = {tuple(c[k] for k in ("backend", "model", "mode", "dtype")): c for c in old["cells"]}
    b = {tuple(c[k] for k in ("backend", "model", "mode", "dtype")): c for c in new["cells"]}
    rows = []
    for key in sorted(set(a) | set(b)):
        ca, cb = a.get(key), b.get(key)
        cell = "/".join(key)
        if ca is None or cb is None:
            rows.append({"cell": cell, "change": "added" if ca is None else "removed",
                         "old": ca and ca["status"], "new": cb and cb["status"]})
            continue
        if ca["status"] != cb["status"] or ca["verified"] != cb["verified"]:
            rows.append({"cell": cell, "change": "status",
                         "old": f"{ca['status']} ({'verified' if ca['verified'] else 'predicted'})",
                         "new": f"{cb['status']} ({'verified' if cb['verified'] else 'predicted'})"})
        ta, tb = ca.get("figures", {}).get("step_ms"), cb.get("figures", {}).get("step_ms")
        if ta and tb and abs(tb / ta - 1) > 0.10:
            rows.append({"cell": cell, "change": "step_ms", "old": round(ta, 3), "new": round(tb, 3),
                         "ratio": round(tb / ta, 3)})
        oa, ob = set(ca.get("figures", {}).get("fallback_ops", [])), set(cb.get("figures", {}).get("fallback_ops", []))
        if oa != ob:
            rows.append({"cell": cell, "change": "fallback_ops", "old": sorted(oa - ob), "new": sorted(ob - oa)})
        sa, sb = set(ca.get("ops") or {}), set(cb.get("ops") or {})
        if sa != sb:  # torch versions decompose differently: the ops a device must run change
            rows.append({"cell": cell, "change": "ops", "old": sorted(sa - sb), "new": sorted(sb - sa)})
    return rows
