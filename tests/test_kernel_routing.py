"""The CUDA kernels' routing table (which calls go to torch's kernel), the kernel wrappers' fast path in
front of it, and the dispatcher's fast path for implementations that check their own arguments. Pure
Python: runs everywhere (no GPU); the tests that call the kernel wrappers themselves need Triton importable
(they launch nothing: the kernel entry points are replaced by spies) and skip without it."""
from __future__ import annotations

import itertools
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


def test_dispatcher_takes_a_size_route_in_its_own_frame():
    """A self-checking implementation with ``hal_size_route = (floors, plain)``: calls under
    ``floors[(op, dtype, grad state)]`` elements go to ``plain`` from the dispatcher (the implementation is
    not called), calls at or above it to the implementation; the grad state is 0 with grad mode off, 1 with it on
    and the input not requiring grad, 2 with the input requiring grad; a change of the floors takes effect at
    ``invalidate_cache()``; a dtype without keys has no route; ``fallback=`` still takes the uncached path."""
    calls = {"impl": 0, "plain": 0}

    def reference(x, k=1):
        return x + k

    def plain(x, k=1):
        calls["plain"] += 1
        return x + k

    def impl(x, k=1):
        calls["impl"] += 1
        return x + k

    op_name, f32 = "_routing_test_sized", torch.float32
    floors = {(op_name, f32, 0): 4, (op_name, f32, 1): 4, (op_name, f32, 2): 4}
    setattr(impl, H.SELF_CHECKING, True)
    setattr(impl, H.SIZE_ROUTE, (floors, plain))
    op = H.define_op("_routing_test_sized", "hal::_routing_test_sized", reference)
    H.REGISTRY.register("_routing_test_sized", "cpu", impl, impl="sized", priority=10)
    small, big = torch.zeros(3), torch.zeros(4)
    op(small)  # the first call resolves (the implementation itself); later ones use the cache
    calls.update(impl=0, plain=0)
    assert torch.equal(op(small, 2), small + 2) and torch.equal(op(small, k=3), small + 3)
    assert calls == {"impl": 0, "plain": 2}
    assert torch.equal(op(big), big + 1) and calls == {"impl": 1, "plain": 2}
    floors[(op_name, f32, 1)] = 0  # with grad mode on every call is the implementation's, once the
    op(small)  # cache is told: until then the copied floors stand
    assert calls == {"impl": 1, "plain": 3}
    H.invalidate_cache()
    op(small)
    assert calls == {"impl": 2, "plain": 3}
    with torch.no_grad():  # grad mode off reads key 0
        op(small)
    assert calls == {"impl": 2, "plain": 4}
    op(small.clone().requires_grad_())  # an input requiring grad reads key 2
    assert calls == {"impl": 2, "plain": 5}
    floors[(op_name, f32, 2)] = 0
    H.invalidate_cache()
    op(small.clone().requires_grad_())
    with torch.no_grad():
        op(small.clone().requires_grad_())  # grad mode off: key 0, whatever the input
    assert calls == {"impl": 3, "plain": 6}
    floors.update({(op_name, f32, 1): 100, (op_name, f32, 2): 100})
    H.invalidate_cache()
    op(big, fallback="error")  # a per-call policy: the uncached path calls the implementation
    assert calls == {"impl": 4, "plain": 6}
    op(torch.zeros(3, dtype=torch.float64))  # no keys for float64: no route
    op(torch.zeros(3, dtype=torch.float64))
    assert calls == {"impl": 6, "plain": 6}


def test_kernel_wrappers_size_route_is_the_ops_torch_reference(monkeypatch):
    """Every CUDA kernel wrapper declares its size route: the routing floors and the op's torch reference,
    which is what the wrapper itself calls under the floor (CPU tensors stand in for the kernel device)."""
    pytest.importorskip("triton")
    from hal.backends.cuda import kernels
    from hal.ops import torch_impl
    for op in routing.OPS:
        fn, _ = kernels.load(op)
        floors, plain = getattr(fn, H.SIZE_ROUTE)
        assert floors is routing.dispatch_floors() and plain is torch_impl.direct(op), op


@pytest.mark.parametrize("spec", [None, "triton", "torch", "doc"])
def test_dispatch_floors_are_the_exact_per_dtype_bound(spec):
    """``dispatch_floors()[(op, dtype, grad state)]`` is the infer threshold without grad mode, the train
    threshold with an input requiring grad, and with an input not requiring grad the infer threshold, or the
    smaller of the two where the wrapper's mode reads a weight or a residual too: under it
    :func:`routing.decide` answers torch for every mode the call could be in, and at it one of them answers the
    kernel (the bound is exact); the dict is live."""
    live = routing.dispatch_floors()
    doc = {"measured": "unit test", "default": 50,
           "ops": {"softmax": {"float32": {"infer": 10, "train": None}, "bfloat16": {"infer": None, "train": 7}},
                   "silu_and_mul": {"float32": {"infer": 12, "train": 0}}}}
    with routing.using(doc if spec == "doc" else spec or str(routing.DEFAULT_PATH)):
        assert routing.dispatch_floors() is live
        for (op, dt, grad), floor in live.items():
            modes = {0: ("infer",), 2: ("train",),
                     1: ("infer", "train") if op in ("layer_norm", "rms_norm", "add_rms_norm") else ("infer",)}[grad]
            if floor < routing._NEVER:
                assert any(routing.decide(op, dt, m, floor) for m in modes), (op, dt, grad)
            if floor > 0:
                assert not any(routing.decide(op, dt, m, floor - 1) for m in modes), (op, dt, grad)
        if spec == "doc":
            assert [live[("softmax", torch.float32, g)] for g in (0, 1, 2)] == [10, 10, routing._NEVER]
            assert [live[("softmax", torch.bfloat16, g)] for g in (0, 1, 2)] == [routing._NEVER, routing._NEVER, 7]
            # grad mode on, nothing requiring grad: silu_and_mul's inference floor, not the training one (0)
            assert [live[("silu_and_mul", torch.float32, g)] for g in (0, 1, 2)] == [12, 12, 0]
            assert [live[("rms_norm", torch.float32, g)] for g in (0, 1, 2)] == [50, 50, 50]


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


# ---- the kernel wrappers' fast path (routing.floors) ---------------------------------------------------
def _probe_sizes(th: dict) -> list[int]:
    """Element counts on both sides of every threshold in ``th`` (and 0, 1)."""
    out = {0, 1}
    for v in th.values():
        if v is not None:
            out.update({max(0, v - 1), v, v + 1})
    return sorted(out)


def _fast_then_full(op, dtype, mode, numel):
    """What a kernel wrapper decides: the op's floor first, :func:`routing.decide` only at or above it."""
    if numel < routing.floors()[op]:
        return False
    return routing.decide(op, dtype, mode, numel)


@pytest.mark.parametrize("spec", [None, "triton", "torch", "doc"])
def test_floors_make_the_same_decision_as_decide(spec):
    """The floor is the op's smallest threshold over every dtype and both modes (null: no tensor reaches
    it), so the fast path never sends to torch a call that decide would give the kernel, on either side of
    any threshold, for any dtype and mode."""
    doc = {"measured": "unit test", "default": 50,
           "ops": {"softmax": {"float32": {"infer": 10, "train": None}, "bfloat16": {"infer": None, "train": 7}},
                   "rms_norm": {"default": None, "float16": {"train": 0}},
                   "layer_norm": {"default": None},
                   "silu_and_mul": {"default": None, "bfloat16": {"infer": 12}},
                   "cross_entropy": {"float32": {"infer": 3, "train": 3}}}}
    with routing.using(doc if spec == "doc" else spec or str(routing.DEFAULT_PATH)) as t:
        sizes = _probe_sizes(t["thresholds"]) + [1 << 40]
        for op in routing.OPS:
            every = [t["thresholds"][f"{op}/{dt}/{m}"] for dt in routing.DTYPES for m in routing.MODES]
            known = [v for v in every if v is not None]
            assert routing.floors()[op] == (min(known) if known else routing._NEVER), op
        for op, dt, mode in itertools.product(routing.OPS, routing.DTYPES.values(), routing.MODES):
            for n in sizes:
                assert _fast_then_full(op, dt, mode, n) == routing.decide(op, dt, mode, n), (op, dt, mode, n)
        if spec == "doc":  # the cases the table was written for
            assert routing.floors()["softmax"] == 7 and routing.floors()["rms_norm"] == 0
            assert routing.floors()["layer_norm"] == routing._NEVER and routing.floors()["silu_and_mul"] == 12
            assert routing.floors()["cross_entropy"] == 3 and routing.floors()["add_rms_norm"] == 50
        if spec == "triton":
            assert set(routing.floors().values()) == {0}
        if spec == "torch":
            assert all(v > 1 << 60 for v in routing.floors().values())
        if spec is None:  # the shipped table: decode-sized norm and softmax calls are below their floors
            assert min(routing.floors()[op] for op in ("softmax", "layer_norm", "rms_norm")) >= 8 * 4096


def test_floors_follow_using_reload_and_the_environment(monkeypatch, tmp_path):
    """The dict floors() hands out is live: the wrappers bind it once, at import."""
    live = routing.floors()
    assert routing.floors() is live and set(live) == set(routing.OPS)
    shipped = dict(live)
    assert shipped == {op: min(routing._fast[(op, dt, m)] for dt in routing.DTYPES.values() for m in routing.MODES)
                       for op in routing.OPS}
    with routing.using({"measured": "t", "default": 5, "ops": {"rms_norm": {"bfloat16": {"infer": 2, "train": 9}}}}):
        assert routing.floors() is live
        assert live["rms_norm"] == 2 and live["softmax"] == 5
        with routing.using("triton"):
            assert set(live.values()) == {0}
        assert live["rms_norm"] == 2
    assert live == shipped
    monkeypatch.setenv(routing.ENV, "torch")
    routing.reload()
    assert all(v > 1 << 60 for v in live.values())
    monkeypatch.setenv(routing.ENV, "triton")
    routing.reload()
    assert set(live.values()) == {0}
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"measured": "m", "default": None, "ops": {"rms_norm": {"float32": {"train": 4}}}}))
    routing.reload(str(p))
    assert live["rms_norm"] == 4 and live["softmax"] > 1 << 60


def test_floors_before_any_table_is_loaded_mean_ask(monkeypatch):
    """Before the first table is loaded every floor is 0: the first call takes the full path, whose
    decide() loads the table (and so the floors)."""
    monkeypatch.setattr(routing, "_table", None)
    monkeypatch.setattr(routing, "_fast", {})
    monkeypatch.setattr(routing, "_floors", {op: 0 for op in routing.OPS})
    live = routing.floors()
    assert set(live.values()) == {0}
    assert not routing.decide("softmax", torch.float32, "infer", 64)  # loads the shipped table
    assert live["softmax"] == min(routing._fast[("softmax", dt, m)] for dt in routing.DTYPES.values()
                                  for m in routing.MODES)


class _Launched(Exception):
    """Raised by the spies that stand in for the kernels' entry points."""


@pytest.fixture
def wrappers(monkeypatch):
    """The kernel wrappers on CPU tensors (``KERNEL_DEVICE = "cpu"``) with every kernel entry point
    replaced by a spy that raises :class:`_Launched`, and a count of predicate calls."""
    pytest.importorskip("triton")
    from hal.backends.cuda import kernels
    from hal.backends.cuda.kernels import _rows, cross_entropy, norms, silu_and_mul, softmax
    monkeypatch.setattr(_rows, "KERNEL_DEVICE", "cpu")

    def launched(*a, **k):
        raise _Launched

    for mod, names in ((softmax, ("softmax_forward",)), (norms, ("norm_forward",)),
                       (silu_and_mul, ("silu_and_mul_forward",)), (cross_entropy, ("ce_forward",))):
        for name in names:
            monkeypatch.setattr(mod, name, launched)
    for cls in (softmax.SoftmaxFunction, norms.LayerNormFunction, norms.RmsNormFunction,
                silu_and_mul.SiluAndMulFunction, cross_entropy.CrossEntropyFunction):
        monkeypatch.setattr(cls, "apply", launched)
    preds = {"n": 0}
    for mod in (softmax, norms, silu_and_mul, cross_entropy):
        for name in dir(mod):
            if name.startswith("supports_"):
                real = getattr(kernels, name)

                def counted(*a, _real=real, **k):
                    preds["n"] += 1
                    return _real(*a, **k)
                monkeypatch.setattr(mod, name, counted)
    return {"softmax": softmax, "norms": norms, "silu": silu_and_mul, "ce": cross_entropy, "preds": preds}


def _calls(k, dtype, train):
    """(op, thunk) for every wrapper on a 4 x 8 input (32 elements) of ``dtype``; ``train``: the input
    requires grad. Includes calls the predicates reject (softmax over dim 0, an empty input)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=g).to(dtype).requires_grad_(train)
    r, w, b = (torch.randn(*s, generator=g).to(dtype) for s in ((4, 8), (8,), (8,)))
    t = torch.tensor([0, 3, 7, 1])
    e = torch.empty(0, 8, dtype=dtype)
    F = torch.nn.functional
    sm, nm, si, ce = k["softmax"], k["norms"], k["silu"], k["ce"]
    return [
        ("softmax", lambda: sm.softmax(x, -1), lambda: torch.softmax(x, -1)),
        ("softmax", lambda: sm.softmax(x, 0), lambda: torch.softmax(x, 0)),
        ("softmax", lambda: sm.softmax(e, -1), lambda: torch.softmax(e, -1)),
        ("softmax", lambda: sm.softmax(x, -1, torch.float32), lambda: torch.softmax(x, -1, dtype=torch.float32)),
        ("log_softmax", lambda: sm.log_softmax(x, 1), lambda: torch.log_softmax(x, 1)),
        ("layer_norm", lambda: nm.layer_norm(x, (8,), w, b, 1e-5), lambda: F.layer_norm(x, (8,), w, b, 1e-5)),
        ("layer_norm", lambda: nm.layer_norm(x, (4,)), lambda: None),  # predicate rejects; torch raises
        ("rms_norm", lambda: nm.rms_norm(x, (8,), w, 1e-6), lambda: F.rms_norm(x, (8,), w, 1e-6)),
        ("add_rms_norm", lambda: nm.add_rms_norm(x, r, (8,), w), None),
        ("silu_and_mul", lambda: si.silu_and_mul(x), lambda: F.silu(x[:, :4]) * x[:, 4:]),
        ("cross_entropy", lambda: ce.cross_entropy(x, t), lambda: F.cross_entropy(x, t)),
        ("cross_entropy", lambda: ce.cross_entropy(x, t, label_smoothing=0.1),
         lambda: F.cross_entropy(x, t, label_smoothing=0.1)),
    ]


def _run(thunk):
    try:
        return "torch", thunk()
    except _Launched:
        return "kernel", None
    except Exception as exc:
        return type(exc).__name__, None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_wrappers_fast_path_decides_as_the_full_path(wrappers, dtype):
    """Every wrapper, with thresholds on both sides of its input's size (31, 32, 33 for 32 elements), 0 and
    null in each mode, and in both modes: the call takes the kernel exactly when it did without the fast
    path (every floor 0: "ask"), and a call routed to torch returns torch's result."""
    k = wrappers
    values = [0, 31, 32, 33, None]
    seen = set()
    for op in routing.OPS:
        for infer, train in itertools.product(values, values):
            doc = {"measured": "t", "default": None,
                   "ops": {op: {dt: {"infer": infer, "train": train} for dt in routing.DTYPES}}}
            with routing.using(doc):
                for is_train in (False, True):
                    for name, thunk, want in _calls(k, dtype, is_train):
                        if name != op:
                            continue
                        fast = _run(thunk)
                        saved = dict(routing._floors)
                        try:
                            routing._floors.update(dict.fromkeys(saved, 0))  # 0: ask, the full path
                            full = _run(thunk)
                        finally:
                            routing._floors.update(saved)
                        assert fast[0] == full[0], (op, dtype, infer, train, is_train)
                        seen.add(fast[0])
                        if fast[0] == "torch" and want is not None:
                            got, ref = fast[1], want()
                            assert torch.equal(got, ref), (op, dtype)
    assert "torch" in seen
    assert ("kernel" in seen) == (dtype is not torch.float64)


def test_wrappers_below_the_floor_run_no_predicate(wrappers):
    """The point of the fast path: a call the table sends to torch by its size never runs the predicate."""
    k = wrappers
    routing.reload()
    # the shipped table sends some ops to the kernel at every size (silu_and_mul float32 inference):
    # here every op's floor is above the calls' sizes
    ops = {op: {"default": 1 << 30} for op in routing.OPS}
    with routing.using({"measured": "unit test: floors above every call", "default": 1 << 30, "ops": ops}):
        for train in (False, True):
            for name, thunk, _ in _calls(k, torch.float32, train):
                assert _run(thunk)[0] in ("torch", "RuntimeError"), name
    assert k["preds"]["n"] == 0
    for train in (False, True):
        for name, thunk, _ in _calls(k, torch.float32, train):
            if routing.floors()[name.split()[0]] > 8 * 4096:  # the shipped table's torch-at-decode ops
                assert _run(thunk)[0] in ("torch", "RuntimeError"), name
    n = k["preds"]["n"]
    with routing.using("triton"):  # every size reaches the floor (0): the full path runs
        assert _run(lambda: k["softmax"].softmax(torch.randn(4, 8), -1))[0] == "kernel"
        assert _run(lambda: k["softmax"].softmax(torch.randn(4, 8), 0))[0] == "torch"
    assert k["preds"]["n"] == n + 2


@pytest.mark.parametrize("value", ["triton", "torch"])
def test_wrappers_follow_the_environment_variable(wrappers, monkeypatch, value):
    monkeypatch.setenv(routing.ENV, value)
    routing.reload()
    x = torch.randn(4, 8)
    got = _run(lambda: wrappers["norms"].rms_norm(x, (8,), None, 1e-6))[0]
    assert got == ("kernel" if value == "triton" else "torch")
    assert _run(lambda: wrappers["ce"].cross_entropy(x, torch.tensor([0, 1, 2, 3])))[0] == got


def test_wrappers_non_tensor_input_takes_the_full_path(wrappers):
    """A non-tensor input has no numel(): the fast path steps aside and the predicate and torch decide (as
    before the fast path: torch's own error)."""
    with pytest.raises(TypeError):
        wrappers["softmax"].softmax([1.0, 2.0], -1)
    assert wrappers["preds"]["n"] == 1


# ---- hal.ops dispatch: the cache is per device type and dtype ------------------------------------------
def test_dispatch_cache_separates_device_types_and_dtypes():
    """CPU tensors, meta tensors (a device type with neither is_cuda nor is_cpu) and dtypes each get
    their own entry; a registration afterwards invalidates every entry."""
    def reference(x):
        return x

    op = H.define_op("_routing_test_devices", "hal::_routing_test_devices", reference, register_cpu=False)
    H.REGISTRY.register("_routing_test_devices", "cpu", lambda x: "cpu32", impl="a", dtypes={"float32"})
    H.REGISTRY.register("_routing_test_devices", "cpu", lambda x: "cpu64", impl="b", dtypes={"float64"})
    H.REGISTRY.register("_routing_test_devices", "meta", lambda x: "meta", impl="c")
    c, m = torch.zeros(2), torch.zeros(2, device="meta")
    for _ in range(2):
        assert op(c) == "cpu32" and op(m) == "meta" and op(c.double()) == "cpu64" and op(m.double()) == "meta"
    H.REGISTRY.register("_routing_test_devices", "meta", lambda x: "meta2", impl="c")
    assert op(m) == "meta2" and op(c) == "cpu32"
    assert op(x=c) == "cpu32"  # the input by keyword, as the signature (x, *args, ...) allowed
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'x'"):
        op()


def test_small_linear_cross_entropy_goes_to_torchs_reference(monkeypatch):
    """The chunked head takes the call only when its logits reach TORCH_BELOW_LOGITS elements (a decode-sized
    head is host-bound there: 0.25-0.41x torch on the H200). CPU tensors stand in for the kernel device."""
    from hal.backends.cuda import kernels
    from hal.backends.cuda.kernels import _rows
    monkeypatch.setattr(_rows, "KERNEL_DEVICE", "cpu")
    w, t = torch.randn(64, 8), torch.zeros(512, dtype=torch.long)
    monkeypatch.setattr(kernels, "TORCH_BELOW_LOGITS", 512 * 64)
    assert kernels.supports_linear_cross_entropy(torch.randn(512, 8), w, t) is None
    assert "torch's reference" in kernels.supports_linear_cross_entropy(torch.randn(511, 8), w, t[:511])
    assert "torch's reference" in kernels.supports_linear_cross_entropy(torch.randn(7, 73, 8), w, t[:511].view(7, 73))
    assert "reduction" in kernels.supports_linear_cross_entropy(torch.randn(512, 8), w, t, reduction="none")
