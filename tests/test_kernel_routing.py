"""The CUDA kernels' routing table (which calls go to torch's kernel) and the dispatcher's fast path for
implementations that check their own arguments. Pure Python: runs everywhere (no Triton, no GPU)."""
from __future__ import annotations

import json
import pathlib

import pytest
import torch

import hal.ops as H
from hal.backends.cuda.kernels import routing
from hal.errors import HalError


@pytest.fixture(autouse=True)
def _fresh_table(monkeypatch):
    monkeypatch.delenv(routing.ENV, raising=False)
    routing.reload()
    yield
    monkeypatch.delenv(routing.ENV, raising=False)
    routing.reload()


def test_shipped_table_is_the_committed_h200_measurement():
    t = routing.table()
    assert t["source"] == str(routing.DEFAULT_PATH)
    assert "H200" in t["measured"] and "reports/cuda/routing.json" in t["measured"]
    assert len(t["thresholds"]) == len(routing.OPS) * len(routing.DTYPES) * len(routing.MODES)
    assert all(v is None or (isinstance(v, int) and v >= 0) for v in t["thresholds"].values())
    # the thresholds are the sweep's, not edited by hand
    root = pathlib.Path(__file__).resolve().parent.parent
    sweep = json.loads((root / "reports" / "cuda" / "routing.json").read_text())
    assert json.loads(routing.DEFAULT_PATH.read_text())["ops"] == sweep["ops"]
    # what it measured: decode-sized calls go to torch; a 64M-element softmax takes the kernel
    assert not routing.decide("rms_norm", torch.bfloat16, "infer", 8 * 4096)
    assert routing.decide("softmax", torch.bfloat16, "infer", 8192 * 8192)


def test_decide_thresholds(tmp_path):
    doc = {"measured": "unit test", "default": 100,
           "ops": {"softmax": {"default": 10, "bfloat16": {"train": 0, "infer": None}},
                   "cross_entropy": {"float32": {"infer": 7}}}}
    with routing.using(doc) as t:
        assert t["thresholds"]["softmax/bfloat16/infer"] is None
        # at the threshold: the kernel; one below: torch
        assert routing.decide("softmax", torch.float32, "infer", 10)
        assert not routing.decide("softmax", torch.float32, "infer", 9)
        assert routing.decide("softmax", "float32", "train", 10)  # dtype by name works too
        assert routing.decide("softmax", torch.bfloat16, "train", 0)  # 0: always the kernel
        assert not routing.decide("softmax", torch.bfloat16, "infer", 1 << 40)  # null: never
        assert routing.decide("cross_entropy", torch.float32, "infer", 7)
        assert not routing.decide("cross_entropy", torch.float32, "train", 99)  # table default
        assert routing.decide("log_softmax", torch.float16, "train", 100)
        with pytest.raises(KeyError):
            routing.decide("softmax", torch.float64, "infer", 10)
        with pytest.raises(KeyError):
            routing.decide("matmul", torch.float32, "infer", 10)
    # restored
    assert routing.table()["source"] == str(routing.DEFAULT_PATH)


def test_env_override_and_special_values(tmp_path, monkeypatch):
    p = tmp_path / "measured.json"
    p.write_text(json.dumps({"measured": "H200 bench 2026-12-01", "default": 5,
                             "ops": {"rms_norm": {"bfloat16": {"infer": 3}}}}))
    monkeypatch.setenv(routing.ENV, str(p))
    t = routing.reload()
    assert t["source"] == str(p) and t["measured"] == "H200 bench 2026-12-01"
    assert routing.decide("rms_norm", torch.bfloat16, "infer", 3)
    assert not routing.decide("rms_norm", torch.bfloat16, "infer", 2)
    assert not routing.decide("rms_norm", torch.float32, "infer", 4)
    monkeypatch.setenv(routing.ENV, "triton")
    routing.reload()
    assert routing.decide("layer_norm", torch.float16, "train", 1)
    monkeypatch.setenv(routing.ENV, "torch")
    routing.reload()
    assert not routing.decide("layer_norm", torch.float16, "train", 1 << 40)


@pytest.mark.parametrize("doc,needle", [
    ([], "top level must be an object"),
    ({"default": 1}, "missing key 'measured'"),
    ({"measured": "x"}, "missing key 'default'"),
    ({"measured": "x", "default": -1}, "non-negative integer"),
    ({"measured": "x", "default": True}, "non-negative integer"),
    ({"measured": "x", "default": 1.5}, "non-negative integer"),
    ({"measured": "x", "default": 1, "ops": {"gemm": {}}}, "unknown op 'gemm'"),
    ({"measured": "x", "default": 1, "ops": {"softmax": {"float64": {"infer": 1}}}}, "unknown dtype 'float64'"),
    ({"measured": "x", "default": 1, "ops": {"softmax": {"float32": {"fwd": 1}}}}, "unknown mode 'fwd'"),
    ({"measured": "x", "default": 1, "ops": {"softmax": {"float32": {"infer": "big"}}}}, "ops.softmax.float32.infer"),
])
def test_malformed_table_is_a_typed_one_line_error(doc, needle, tmp_path, monkeypatch):
    with pytest.raises(routing.RoutingTableError) as e:
        routing.parse(doc)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg
    assert isinstance(e.value, HalError) and isinstance(e.value, ValueError)
    # the same through the environment variable, and a file that is not JSON
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    monkeypatch.setenv(routing.ENV, str(p))
    with pytest.raises(routing.RoutingTableError):
        routing.reload()
    p.write_text("{not json\n more")
    with pytest.raises(routing.RoutingTableError) as e2:
        routing.reload()
    assert "cannot be read as JSON" in str(e2.value) and "\n" not in str(e2.value)
    monkeypatch.setenv(routing.ENV, str(tmp_path / "missing.json"))
    with pytest.raises(routing.RoutingTableError):
        routing.reload()


def test_dispatcher_calls_a_self_checking_impl_without_predicates():
    """An implementation marked ``hal_checks_own_args`` is cached and called directly: the registry's
    predicate chain does not run per call (one Python check fewer per op)."""
    calls = {"pred": 0, "fast": 0, "slow": 0}

    def reference(x):
        return x + 1

    def pred(x):
        calls["pred"] += 1
        return None

    def fast(x):
        calls["fast"] += 1
        return x + 1

    def slow(x):
        calls["slow"] += 1
        return x + 1

    setattr(fast, H.SELF_CHECKING, True)
    op = H.define_op("_routing_test_fast", "hal::_routing_test_fast", reference)
    H.REGISTRY.register("_routing_test_fast", "cpu", fast, impl="fast", priority=10, supports=pred)
    x = torch.zeros(3)
    for _ in range(3):
        assert torch.equal(op(x), x + 1)
    assert calls == {"pred": 0, "fast": 3, "slow": 0}

    # without the mark the predicate runs on every call (the guarded chain)
    op2 = H.define_op("_routing_test_slow", "hal::_routing_test_slow", reference)
    H.REGISTRY.register("_routing_test_slow", "cpu", slow, impl="slow", priority=10, supports=pred)
    for _ in range(3):
        op2(x)
    assert calls["slow"] == 3 and calls["pred"] >= 3


def test_predicates_accept_and_reject_on_the_fast_path(monkeypatch):
    """The kernel wrappers run these predicates on every call (cheap tensor queries): they must still
    reject what the kernels cannot take. CPU tensors stand in for the kernel device."""
    from hal.backends.cuda import kernels
    from hal.backends.cuda.kernels import _rows
    monkeypatch.setattr(_rows, "KERNEL_DEVICE", "cpu")
    x, w = torch.randn(4, 8), torch.randn(8)
    assert kernels.supports_layer_norm(x, (8,), w, w) is None
    assert kernels.supports_layer_norm(x.view(2, 2, 8), [2, 8], None, torch.randn(2, 8)) is None
    assert kernels.supports_rms_norm(x, torch.Size([8]), w) is None
    assert kernels.supports_add_rms_norm(x, x, (8,), w) is None
    assert "trailing dims" in kernels.supports_layer_norm(x, (4,))
    assert "trailing dims" in kernels.supports_layer_norm(x, (3, 8))
    assert "trailing dims" in kernels.supports_layer_norm(x, ())
    assert "weight/bias" in kernels.supports_layer_norm(x, (8,), torch.randn(7))
    assert "weight/bias" in kernels.supports_rms_norm(x, (8,), torch.empty(8, device="meta"))
    assert "dtype float64" in kernels.supports_rms_norm(x, (8,), w.double())
    assert "dtype float64" in kernels.supports_rms_norm(x.double(), (8,))
    assert "not cpu" in kernels.supports_rms_norm(x.to("meta"), (8,))
    wide = torch.randn(1, _rows.MAX_BLOCK + 1)
    assert "exceed" in kernels.supports_rms_norm(wide, (wide.shape[-1],))
    assert "residual" in kernels.supports_add_rms_norm(x, x[:2], (8,), w)
    assert "residual" in kernels.supports_add_rms_norm(x, x.to("meta"), (8,), w)
    assert "residual" in kernels.supports_add_rms_norm(x, x.half(), (8,), w)
    assert "last dim" in kernels.supports_softmax(x, 0)
    assert kernels.supports_softmax(x, 1, torch.float32) is None


def test_mode_is_train_only_when_autograd_records_the_call():
    x, w = torch.ones(2), torch.ones(2, requires_grad=True)
    assert routing.mode(x) == "infer" and routing.mode(x, None) == "infer"
    assert routing.mode(x, None, w) == "train"
    with torch.no_grad():
        assert routing.mode(w) == "infer"
