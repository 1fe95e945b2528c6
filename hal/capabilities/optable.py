"""The ATen op table: for every ATen overload of a torch build, what a device without its own kernel
runs (a composite kernel or nothing), whether the CPU can run it (fallback possible) and which ATen
ops a composite calls. Device-independent; generated once (``python -m hal.capabilities.generate
optable``) and committed as ``hal/capabilities/data/aten_ops.json``.

Entry fields (short keys keep the file small): ``k`` kind on a device key without a kernel of its
own (``cia`` CompositeImplicitAutograd, ``cea`` CompositeExplicitAutograd[NonFunctional], ``-``
none); ``cpu`` the CPU's kind (``kernel``/``cia``/``cea``/``-``); ``c`` the direct ATen callees of
the composite; ``t`` how ``c`` was found (``traced`` on the CPU, ``redispatch`` of the composite itself, both
on OpInfo samples; ``schema``/``schema-redispatch`` the same on inputs built from the op's schema;
``delegate`` from torchgen's structured_delegate; ``untraced``). Loading is
cached and thread-safe (read-only after load).
"""
from __future__ import annotations

import functools
import json
import pathlib
from typing import Optional

DATA = pathlib.Path(__file__).parent / "data" / "aten_ops.json"
SCHEMA = "hal-aten-ops/1"


def build(traced: dict[str, set[str]], generated_by: str,
          redispatched: Optional[dict[str, set[str]]] = None, by_schema: bool = True) -> dict:
    """Build the table from the live dispatcher and ``traced`` edges (see :mod:`hal.capabilities.trace`).

    With ``by_schema``, composites no sample reached are run once more on inputs built from their
    schema (:func:`hal.capabilities.trace.trace_by_schema`)."""
    import torch

    from hal.capabilities.trace import aten_ops, kernel_kind, structured_delegates, trace_by_schema
    delegates = structured_delegates()
    ops: dict[str, dict] = {}
    all_ops = aten_ops()
    kinds = {op: (kernel_kind(op, "PrivateUse1"), kernel_kind(op, "CPU")) for op in all_ops}
    traced, redispatched = dict(traced), dict(redispatched or {})
    if by_schema:
        composite = [op for op in all_ops if kinds[op][0] in ("cia", "cea")]
        same = [op for op in composite if kinds[op][1] == kinds[op][0] and not traced.get(op)]
        hidden = [op for op in composite if kinds[op][1] == "kernel" and not redispatched.get(op)]
        schema_traced = {k: v for k, v in trace_by_schema(same, redispatch=False).items() if v}
        schema_redispatched = {k: v for k, v in trace_by_schema(hidden, redispatch=True).items() if v}
        traced.update(schema_traced)
        redispatched.update(schema_redispatched)
        from_schema = set(schema_traced) | set(schema_redispatched)
    else:
        from_schema = set()
    for op in all_ops:
        kind, cpu = kinds[op]
        kind = kind if kind in ("cia", "cea") else "-"
        entry: dict = {"k": kind, "cpu": cpu}
        if kind != "-":
            if cpu == kind and traced.get(op):
                # a callee on the dense CPU path has a CPU kernel or a composite; others came from
                # sparse/quantized dispatch of the same op and are dropped
                entry["c"] = sorted(c for c in traced[op] if c != op and kinds.get(c, ("-", "-")) != ("-", "-"))
                entry["t"] = "schema" if op in from_schema else "traced"
            elif cpu == "kernel" and (redispatched or {}).get(op):
                entry["c"] = sorted(c for c in redispatched[op] if kinds.get(c, ("-", "-")) != ("-", "-"))
                entry["t"] = "schema-redispatch" if op in from_schema else "redispatch"
            elif op in delegates:
                entry["c"], entry["t"] = [delegates[op]], "delegate"
            else:
                entry["c"], entry["t"] = [], "untraced"
        ops[op] = entry
    return {"schema": SCHEMA,
            "provenance": {"source": "the dispatcher of the installed torch (torch._C._dispatch_has_kernel_for_dispatch_key) "
                                     "and torch.profiler traces on CPU of inputs built from each op's schema"
                                     + (" and of PyTorch's OpInfo samples" if traced or redispatched else ""),
                           "torch": torch.__version__, "generated_by": generated_by},
            "ops": ops}


@functools.lru_cache(maxsize=4)
def load(path: Optional[str] = None) -> dict:
    """The committed op table (or the one at ``path``). Raises FileNotFoundError when absent."""
    with open(path or DATA, encoding="utf-8") as fh:
        data = json.load(fh)
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path or DATA}: schema {data.get('schema')!r}, expected {SCHEMA!r}")
    return data
