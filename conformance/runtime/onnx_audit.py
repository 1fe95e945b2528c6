"""ONNX targets: map each node's op type onto ATen ops and ask the capability API about the target.

The mapping is data (``onnx_map.yaml`` beside this module; documented in docs/runtime-audit.md).
A node type's status is the worst status of the ATen ops it maps to (unsupported < fallback <
unknown < composite < native); an empty mapping means no device computation (``Constant``,
``Shape``, ``Identity``...); op types missing from the table, and nodes of custom domains, are
``unknown`` with the reason. Input dtypes come from ONNX shape inference where it can tell.
Nothing is executed: ``run.status`` is ``skipped``. Raises ValueError when the ``onnx`` package is
missing or the file is not a readable ONNX model.
"""
from __future__ import annotations

import collections
import functools
import os
from typing import Any

from hal.conformance.runtime.predict import _severity, capability_query, dtype_notes

MAP_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "onnx_map.yaml")


@functools.lru_cache(maxsize=1)
def onnx_to_aten() -> dict[str, tuple[str, ...]]:
    """The ONNX op type -> ATen ops table."""
    import yaml
    with open(MAP_FILE) as f:
        data = yaml.safe_load(f)
    return {k: tuple(v or ()) for k, v in data.items()}


def _dtype_names(model: Any) -> dict[str, str]:
    import onnx
    from onnx import helper
    names: dict[str, str] = {}
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    g = inferred.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        et = vi.type.tensor_type.elem_type
        if et:
            names[vi.name] = str(helper.tensor_dtype_to_np_dtype(et))
    for init in g.initializer:
        names[init.name] = str(helper.tensor_dtype_to_np_dtype(init.data_type))
    return {k: v.replace("bool_", "bool") for k, v in names.items()}


def audit_onnx(path: str, target: dict) -> dict:
    """The audit sections for ONNX model ``path`` on ``target`` (from ``target_info``)."""
    try:
        import onnx
    except ImportError as exc:
        raise ValueError(f"auditing .onnx files needs the 'onnx' package ({exc}); pip install onnx") from exc
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:
        raise ValueError(f"{path} is not a readable ONNX model: {type(exc).__name__}: {exc}") from exc
    table = onnx_to_aten()
    dtypes_of = _dtype_names(model)
    nodes: dict[tuple[str, str], dict] = {}
    counts: collections.Counter = collections.Counter()

    def walk(graph: Any) -> None:
        for node in graph.node:
            key = (node.domain or "ai.onnx", node.op_type)
            counts[key] += 1
            rec = nodes.setdefault(key, {"dtypes": [], "names": []})
            for name in node.input:
                dt = dtypes_of.get(name)
                if dt and dt not in rec["dtypes"]:
                    rec["dtypes"].append(dt)
            if len(rec["names"]) < 5 and node.name:
                rec["names"].append(node.name)
            for attr in node.attribute:  # If / Loop / Scan bodies
                if attr.HasField("g"):
                    walk(attr.g)
                for sub in attr.graphs:
                    walk(sub)

    walk(model.graph)
    query, missing = capability_query()
    backend = target["device"]
    ops = []
    for (domain, op_type), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        rec = nodes[(domain, op_type)]
        aten = table.get(op_type) if domain in ("ai.onnx", "") else None
        per_aten = []
        if aten is None:
            status = "unknown"
            reason = (f"ONNX op type {op_type!r} of domain {domain!r} has no ATen mapping in onnx_map.yaml"
                      if domain in ("ai.onnx", "") else f"custom-domain op {domain}::{op_type}: no ATen mapping")
            notes: list[str] = []
        elif not aten:
            status, reason, notes = "native", "no device computation (graph constant or metadata)", []
        else:
            notes = []
            for a in aten:
                if query is None:
                    per_aten.append({"op": a, "status": "unknown", "reason": missing})
                    continue
                try:
                    st = query(backend, a, dtypes=tuple(rec["dtypes"]))
                    per_aten.append({"op": a, "status": st.status, "reason": st.reason})
                    notes.extend(x for x in st.dtype_notes if x not in notes)
                except Exception as exc:
                    per_aten.append({"op": a, "status": "unknown",
                                     "reason": f"capability query failed: {type(exc).__name__}: {exc}"})
            worst = min(per_aten, key=lambda p: _severity(p["status"]))
            status = worst["status"]
            reason = f"{worst['op']}: {worst['reason']}" if len(per_aten) > 1 else worst["reason"]
        ops.append({"op": aten[0] if aten else f"onnx::{op_type}", "onnx_op": op_type, "onnx_domain": domain,
                    "aten_ops": list(aten or ()), "aten_status": per_aten, "count": n, "dtypes": rec["dtypes"],
                    "status": status, "reason": reason, "phase": "inference", "modules": rec["names"],
                    "shapes": [], "calls_per_step": float(n), "bytes_per_step": 0,
                    "dtype_notes": dtype_notes(backend, rec["dtypes"], notes), "verified": False, "source": "onnx"})
    ops.sort(key=lambda o: (_severity(o["status"]), -o["count"], o["onnx_op"]))
    target = dict(target, verified=False,
                  reason=f"ONNX graph mapped onto {backend}'s capability data (predicted; nothing was run)")
    run = {"status": "skipped", "steps": 0, "seconds": 0.0, "error": None, "exit_code": None, "output_tail": [],
           "mode": "onnx", "nodes": sum(counts.values()), "opset": [f"{o.domain or 'ai.onnx'}:{o.version}"
                                                                     for o in model.opset_import]}
    return {"run": run, "ops": ops, "findings": [], "target": target, "precision": None, "profile": None}
