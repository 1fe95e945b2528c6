"""Core behaviour against independent oracles: hand-computed cases, the documented contracts
(DESIGN section 4: exit codes and ``--fail-on``; README: backend order mlu > cuda > cpu) and
torch_mlu's own data, never the code's own formula.

Each test here is named in ``benchmarks/mutation.py``: a deliberate bug in the code it guards
makes it fail.
"""
from __future__ import annotations

import uuid
import warnings

import pytest
import torch

from hal.cli import audit as cli
from hal.testing.collectives import Row
from hal.testing.collectives import merge as merge_ranks
from hal.conformance.matrix.merge import merge as merge_matrices
from hal.conformance.matrix.schema import document
from hal.conformance.precision.compare import _verdict, classify
from hal.conformance.precision.tracer import OpRecord
from hal.conformance.runtime.predict import dtype_notes
from hal.errors import NotSupportedError


# -- exit codes: DESIGN section 4, written out case by case -------------------------------------
def _report(status="ok", findings=(), ops=(), precision=None):
    return {"run": {"status": status}, "findings": [{"severity": s} for s in findings],
            "ops": [{"status": s} for s in ops], "precision": precision}


DIVERGED = {"verdict": "warning", "first_divergence": {"op": "aten::mm", "kind": "amplified"}}
FAILED = {"verdict": "fail", "first_divergence": None}
CLEAN = {"verdict": "pass", "first_divergence": None}

# (report, --fail-on, expected exit): 3 = the program failed (wins over everything), 1 = the
# --fail-on condition held, 0 = completed
EXIT_TABLE = [
    (_report("error", ["error"], ["fallback"], FAILED), "finding", 3),
    (_report("timeout", ["error"]), "finding", 3),
    (_report("crashed", [], ["fallback"]), "fallback", 3),
    (_report("timeout", precision=FAILED), "precision", 3),
    (_report("error"), None, 3),
    (_report("ok", ["error", "info"]), "finding", 1),
    (_report("ok", ["warning", "info", "warning"]), "finding", 0),  # only errors count
    (_report("ok", [], ["native", "fallback"]), "fallback", 1),
    (_report("ok", [], ["native", "unsupported", "composite"]), "fallback", 0),
    (_report("ok", [], ["fallback"]), "finding", 0),  # a condition other than the one asked
    (_report("ok", precision=FAILED), "precision", 1),  # verdict fail, no single op blamed
    (_report("ok", precision=DIVERGED), "precision", 1),
    (_report("ok", precision=CLEAN), "precision", 0),
    (_report("ok", precision=None), "precision", 0),  # not requested: nothing diverged
    (_report("ok", ["error"], ["fallback"], FAILED), None, 0),
    (_report("skipped", ["warning"]), "finding", 0),
]


def test_exit_code_precedence_table():
    got = [cli.exit_code(rep, fail_on) for rep, fail_on, _ in EXIT_TABLE]
    assert got == [want for _, _, want in EXIT_TABLE]


# -- precision blame: hand-built op sequences ---------------------------------------------------
def _stats(exceeds: bool) -> dict:
    return {"exceeds": exceeds, "nan_inf_mismatch": 0, "mismatch_frac": 0.5 if exceeds else 0.0,
            "max_abs": 1.0 if exceeds else 0.0, "rms_rel": 0.1 if exceeds else 0.0}


THR = {"rtol_eff": 1e-3, "atol": 1e-5}


def _op(i: int, name: str, local, total, inputs=()):
    return OpRecord("forward", f"m{i}", name, 0, 0, "float32", (4,), "op", THR,
                    None if local is None else _stats(local), None if total is None else _stats(total),
                    inputs=tuple(inputs), total_threshold=THR)


def test_blame_prefers_an_introduced_error_with_clean_inputs_over_earlier_tiers():
    recs = [_op(0, "a", local=False, total=True),  # amplified in-tolerance inputs (tier 3)
            _op(1, "b", local=True, total=True, inputs=[0]),  # own error, inputs already off (tier 2)
            _op(2, "c", local=True, total=True)]  # own error, inputs clean (tier 1): the blame
    status, fd = classify(recs)
    assert status == ["amplified", "introduced", "introduced"]
    assert (fd["op"], fd["module"], fd["kind"], fd["inputs_within"], fd["index"]) == ("c", "m2", "introduced", True, 2)
    assert fd["compared_against"] == "float64 shadow of the op on its actual inputs"


def test_blame_falls_back_to_tier2_then_to_an_amplifier():
    status, fd = classify([_op(0, "a", local=False, total=True), _op(1, "b", local=True, total=True, inputs=[0])])
    assert (fd["op"], fd["kind"], fd["inputs_within"]) == ("b", "introduced", False)
    status, fd = classify([_op(0, "ok", local=False, total=False), _op(1, "a", local=False, total=True, inputs=[0])])
    assert status == ["ok", "amplified"]
    assert (fd["op"], fd["kind"], fd["inputs_within"]) == ("a", "amplified", True)
    assert fd["compared_against"] == "float64 reference run" and fd["metric"] == "mismatch_frac"


def test_an_unshadowed_op_over_its_threshold_is_first_seen_not_introduced():
    # a backward op with no recorded producers and no float64 shadow (too large to sample), whose total
    # exceeds: the error is first seen there, which does not prove it introduced it (H200, autocast fp16)
    rec = _op(0, "select_backward", local=None, total=True)
    rec.shadow_error = "UnshadowedError: output of 1572864 elements has no sampled shadow"
    status, fd = classify([rec])
    assert status == ["exceeds"] and fd["kind"] == "first-seen"
    assert "not isolated (UnshadowedError" in fd["note"] and "not recorded" in fd["note"]
    verdict, why = _verdict({"rows": [], "drift": {"max_rel_dev": 0.0}, "first_divergence": fd}, torch.float16)
    assert verdict == "warning" and "first op over its threshold" in why[0]
    # the same op with a shadow that confirms its own error is introduced, and fails
    status, fd = classify([_op(0, "select_backward", local=True, total=True)])
    assert fd["kind"] == "introduced" and "note" not in fd


def test_a_linear_reduction_over_tolerance_within_its_terms_errors_cancelled():
    """A sum of K terms off by e each is off by at most K e (a mean by e): over tolerance with its inputs within and
    its own error within, it cancelled when its error is under twice that; past it, or for an op that is no linear
    reduction, or with an input not compared against the reference run, it amplified."""
    from hal.conformance.precision.compare import CANCELLATION_SLACK

    def rows(op, out_err, in_err=1e-3, k=4, out_index=0, in_total=True):
        src = _op(0, "mm", local=False, total=False if in_total else None)
        if in_total:
            src.total["rms_abs"] = in_err
        red = _op(1, op, local=False, total=True, inputs=[0])
        red.out_index, red.threshold = out_index, dict(THR, k=k)
        red.total["rms_abs"], red.local["rms_abs"] = out_err, 0.0
        return [src, red]

    bound = CANCELLATION_SLACK * 4 * 1e-3
    assert classify(rows("sum", 0.99 * bound))[0] == ["ok", "cancelled"]
    status, fd = classify(rows("sum", 1.01 * bound))
    assert status == ["ok", "amplified"] and fd["kind"] == "amplified"
    assert classify(rows("mean", 0.99 * CANCELLATION_SLACK * 1e-3))[0][1] == "cancelled"  # K does not count for a mean
    assert classify(rows("mean", 1.01 * CANCELLATION_SLACK * 1e-3))[0][1] == "amplified"
    assert classify(rows("native_layer_norm", 1e-4, out_index=1))[0][1] == "cancelled"  # the saved mean
    assert classify(rows("native_layer_norm", 1e-4, out_index=0))[0][1] == "amplified"  # the normalised output
    assert classify(rows("exp", 1e-4))[0][1] == "amplified"
    assert classify(rows("sum", 1e-4, in_total=False))[0][1] == "amplified"
    assert classify(rows("sum", 1e-4))[1] is None  # a cancelled op is never the first divergence


def test_blame_none_when_nothing_exceeds_and_inherited_errors_are_not_blamed():
    status, fd = classify([_op(0, "a", local=False, total=False), _op(1, "b", local=False, total=False, inputs=[0])])
    assert fd is None and status == ["ok", "ok"]
    # b only carries a's error forward (its own shadow is fine): a is blamed, b "inherited"
    status, fd = classify([_op(0, "a", local=True, total=True), _op(1, "b", local=False, total=True, inputs=[0])])
    assert status == ["introduced", "inherited"] and fd["op"] == "a"


def test_precision_verdict_only_an_introduced_error_fails():
    calm = {"max_rel_dev": 0.0}
    base = {"rows": [], "drift": calm}
    assert _verdict(dict(base, first_divergence=None), torch.float32) == ("pass", [])
    v, why = _verdict(dict(base, first_divergence={"module": "fc", "op": "mm", "kind": "amplified"}), torch.float32)
    assert v == "warning" and "amplified" in why[0]
    v, why = _verdict(dict(base, first_divergence={"module": "act", "op": "exp", "kind": "introduced"}), torch.float32)
    assert v == "fail" and why == ["act:exp introduced error beyond its threshold"]


# -- dtype gates and op status: torch_mlu's facts (reference/mlu.md, data/mlu) -------------------
def test_dtype_gate_blocks_fallback_and_native_ops_alike():
    from hal.capabilities import op_status
    # aten::mode has no MLU kernel (it falls back); addmm has one. bfloat16 needs MLU arch >= 5.
    assert op_status("mlu", "aten::mode", ("float32",)).status == "fallback"
    assert op_status("mlu", "aten::mode", ("bfloat16",), 4).status == "unsupported"
    assert op_status("mlu", "aten::mode", ("bfloat16",), 5).status == "fallback"
    assert op_status("mlu", "aten::addmm", ("bfloat16",), 4).status == "unsupported"
    assert op_status("mlu", "aten::addmm", ("bfloat16",), 5).status == "native"
    assert op_status("mlu", "aten::addmm", ("bfloat16",), (5, 0)).status == "native"
    assert op_status("mlu", "aten::addmm", ("float8_e4m3fn",), 5).status == "unsupported"
    assert op_status("mlu", "aten::addmm", ("float8_e4m3fn",), 6).status == "native"
    assert op_status("mlu", "aten::addmm", ("qint8",), 6).status == "unsupported"


def test_op_status_cuda_only_kernel_is_unsupported_not_a_fallback():
    """aten::_conv_depthwise2d has only a CUDA kernel in PyTorch (native_functions.yaml): the MLU's CPU
    fallback has nothing to run, so it is unsupported."""
    from hal.capabilities import op_status
    st = op_status("mlu", "aten::_conv_depthwise2d", ("float32",))
    assert st.status == "unsupported" and "CPU has no kernel" in st.reason


def test_float64_note_is_an_mlu_fact():
    assert dtype_notes("mlu", ["float64", "float32"], []) == [
        "float64 is computed as float32 on MLU (torch_mlu casts 64-bit tensors to 32-bit silently)"]
    assert dtype_notes("mlu", ["complex128"], []) == [
        "complex128 is computed as complex64 on MLU (torch_mlu casts 64-bit tensors to 32-bit silently)"]
    assert dtype_notes("cuda", ["float64"], []) == [] and dtype_notes("cpu", ["float64"], []) == []


# -- the fallback policy: explicit > scope > $HAL_FALLBACK > warn --------------------------------
def _forced(name: str):
    import hal.ops
    opdef = hal.ops.REGISTRY.get(name)
    return hal.ops.define_op(f"oracle_{name}_{uuid.uuid4().hex[:8]}", opdef.aten, opdef.reference,
                             register_cpu=False)


def test_fallback_policy_precedence(monkeypatch):
    from hal.ops import current_policy, fallback_policy
    assert current_policy() == "warn"
    monkeypatch.setenv("HAL_FALLBACK", "cpu")
    assert current_policy() == "cpu"
    with fallback_policy("error"):
        assert current_policy() == "error"
        assert current_policy("warn") == "warn"
    assert current_policy() == "cpu"
    monkeypatch.setenv("HAL_FALLBACK", "bogus")
    with pytest.raises(ValueError):
        current_policy()


def test_fallback_policy_behaviour_error_cpu_warn():
    import hal.ops
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float32)
    oracle = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64).exp()
    oracle = (oracle / oracle.sum()).to(torch.float32)
    op = _forced("softmax")
    with pytest.raises(NotSupportedError):
        op(x, -1, fallback="error")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = op(x, -1, fallback="cpu")
    assert not [m for m in w if issubclass(m.category, hal.ops.HalFallbackWarning)]
    torch.testing.assert_close(got[0], oracle, rtol=1e-6, atol=0)
    op2 = _forced("softmax")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        op2(x, -1)  # default policy: warn
        op2(x, -1)  # once per (op, device, dtype)
    assert len([m for m in w if issubclass(m.category, hal.ops.HalFallbackWarning)]) == 1


# -- collectives and matrix merges --------------------------------------------------------------
def _row(status="pass", err=0.0, detail=""):
    return Row("all_reduce", "float32", "sum", status, err, 0.1, detail).as_dict()


def test_collectives_merge_a_failure_on_any_rank_fails_the_case():
    merged = merge_ranks({0: [_row(), _row()], 1: [_row(), _row("fail", 2.0, "got 3 want 4")],
                          2: [_row("fail", 1.0, "r2"), _row()]})
    assert [r.status for r in merged] == ["fail", "fail"]
    assert merged[1].detail == "rank 1: got 3 want 4" and merged[0].detail == "rank 2: r2"
    assert [r.max_error for r in merged] == [1.0, 2.0]
    assert [r.status for r in merge_ranks({0: [_row()], 1: [_row()]})] == ["pass"]


def _mdoc(verified: bool, status: str) -> dict:
    return document([], [{"backend": "mlu", "verified": verified, "status": status, "reason": ""}], [])


def test_matrix_merge_verified_collectives_beat_predicted_in_either_order():
    measured, predicted = _mdoc(True, "fail"), _mdoc(False, "pass")
    for docs in ([("a", measured), ("b", predicted)], [("b", predicted), ("a", measured)]):
        rows = merge_matrices(docs)["collectives"]
        assert rows == [{"backend": "mlu", "verified": True, "status": "fail", "reason": ""}]
    # between equals the later input wins
    rows = merge_matrices([("a", _mdoc(False, "pass")), ("b", _mdoc(False, "fail"))])["collectives"]
    assert rows[0]["status"] == "fail"


# -- discovery order: README "mlu > cuda > cpu" --------------------------------------------------
def test_priority_order_is_mlu_cuda_cpu():
    from hal.backends.cpu import CpuBackend
    from hal.backends.cuda import CudaBackend
    from hal.backends.mlu import MluBackend
    assert MluBackend.priority > CudaBackend.priority > CpuBackend.priority


# -- static rules and patch writing: hand-written sources and their expected rewrites -----------
DEVICE_SRC = '''import torch
train_device = "cuda:1"
eval_devices = "cuda"
dev = "cuda"
x = torch.zeros(2, device="cuda")
'''


def test_static_device_strings_by_variable_name():
    """Names that hold a device (dev, *_device, a device= keyword) are rewritten; other strings are
    left alone (``eval_devices`` is a plain name, its value could mean anything)."""
    from hal.conformance.migration import load_rules
    from hal.conformance.migration.patch import apply_edits
    from hal.conformance.migration.scanner import scan_source
    scan = scan_source(DEVICE_SRC, "x.py", load_rules("mlu"))
    assert [(f.line, f.rule) for f in scan.findings] == [(2, "device-string"), (4, "device-string"),
                                                        (5, "device-string")]
    edits = [e for f in scan.findings for e in f.edits["device"]]
    assert apply_edits(DEVICE_SRC, edits) == DEVICE_SRC.replace('"cuda:1"', '"mlu:1"').replace(
        'dev = "cuda"', 'dev = "mlu"').replace('device="cuda"', 'device="mlu"')


def test_patch_overlapping_edits_keep_the_outer_one_in_any_order():
    from hal.conformance.migration.patch import apply_edits
    from hal.conformance.migration.scanner import Edit
    outer, inner = Edit(1, 4, 1, 8, "g(y)"), Edit(1, 6, 1, 7, "a_longer_name")
    for edits in ([outer, inner], [inner, outer]):
        assert apply_edits("a = f(x)\nb = 1\n", edits) == "a = g(y)\nb = 1\n"
    # adjacent (touching) edits are both kept
    assert apply_edits("ab\n", [Edit(1, 0, 1, 1, "X"), Edit(1, 1, 1, 2, "Y")]) == "XY\n"


def test_patch_adds_the_device_import_once():
    """The device flavour adds ``import torch_mlu`` after ``import torch`` only when it is missing."""
    from hal.conformance.migration import load_rules
    from hal.conformance.migration.patch import patched_source
    from hal.conformance.migration.scanner import scan_source
    rules = load_rules("mlu")
    has = 'import torch\nimport torch_mlu\nx = torch.zeros(2, device="cuda")\n'
    assert patched_source(scan_source(has, "x.py", rules), has, "device", "torch_mlu") == has.replace("cuda", "mlu")
    lacks = 'import torch\nx = torch.zeros(2, device="cuda")\n'
    lines = patched_source(scan_source(lacks, "x.py", rules), lacks, "device", "torch_mlu").splitlines()
    assert lines[0] == "import torch" and lines[1].startswith("import torch_mlu  # noqa: F401")
    assert lines[2:] == ['x = torch.zeros(2, device="mlu")']


def test_fallback_totals_add_up_every_call_and_errors_name_the_policies():
    import hal.ops
    op = _forced("gelu")
    x = torch.ones(3)
    for _ in range(3):
        op(x, fallback="cpu")
    recs = [r for r in hal.ops.fallback_log() if r.op.startswith("oracle_gelu_")]
    mine = {r.op for r in recs}
    assert len(mine) >= 1
    for opname in mine:
        rs = [r for r in recs if r.op == opname]
        tot = hal.ops.fallback_totals()[(opname, "cpu")]
        assert tot.calls == len(rs)
        assert tot.seconds == pytest.approx(sum(r.seconds for r in rs), rel=1e-9, abs=1e-12)
    from hal.ops import current_policy
    with pytest.raises(ValueError, match=r"unknown fallback policy 'gpu'; one of cpu, warn, error"):
        current_policy("gpu")
