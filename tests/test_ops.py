"""hal.ops: torch semantics for every op, registry resolution with reasons, fallback policy and log."""
from __future__ import annotations

import importlib.util
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F

import hal.ops
from hal.errors import NotSupportedError, OpNotFoundError
from hal.ops.fallback import FallbackLog, FallbackRecord, current_policy
from hal.ops.registry import OpRegistry

g = torch.Generator().manual_seed(0)


def rnd(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype)


CASES = {
    "softmax": lambda: ((rnd(3, 17), 1), torch.softmax),
    "log_softmax": lambda: ((rnd(5, 9), 0), torch.log_softmax),
    "layer_norm": lambda: ((rnd(4, 10), (10,), rnd(10), rnd(10), 1e-5), F.layer_norm),
    "rms_norm": lambda: ((rnd(4, 10), (10,), rnd(10), 1e-6),
                         lambda x, s, w, e: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + e) * w),
    "gelu": lambda: ((rnd(33),), F.gelu),
    "silu": lambda: ((rnd(33),), F.silu),
    "silu_and_mul": lambda: ((rnd(4, 12),), lambda x: F.silu(x[:, :6]) * x[:, 6:]),
    "matmul": lambda: ((rnd(2, 3, 4), rnd(4, 5)), torch.matmul),
    "cross_entropy": lambda: ((rnd(6, 11), torch.randint(0, 11, (6,), generator=g)), F.cross_entropy),
    "embedding": lambda: ((torch.randint(0, 10, (3, 4), generator=g), rnd(10, 6)), F.embedding),
    "scaled_dot_product_attention": lambda: ((rnd(2, 3, 5, 8), rnd(2, 3, 5, 8), rnd(2, 3, 5, 8)),
                                             F.scaled_dot_product_attention),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_op_has_torch_semantics_on_cpu(name):
    args, ref = CASES[name]()
    torch.testing.assert_close(getattr(hal.ops, name)(*args), ref(*args))
    assert hal.ops.resolve(name, "cpu", args[0].dtype).ok


def test_add_rms_norm_returns_normed_and_residual_sum():
    x, r, w = rnd(3, 8), rnd(3, 8), rnd(8)
    normed, h = hal.ops.add_rms_norm(x, r, (8,), w, 1e-6)
    torch.testing.assert_close(h, x + r)
    torch.testing.assert_close(normed, hal.ops.rms_norm(x + r, (8,), w, 1e-6))


_DIRECT_CALLS = {
    "layer_norm": [lambda: ((rnd(3, 8), (8,)), {}), lambda: ((rnd(3, 8), (8,), rnd(8), rnd(8), 1e-3), {}),
                   lambda: ((rnd(2, 3, 8), (3, 8)), {"weight": rnd(3, 8), "eps": 0.5})],
    "rms_norm": [lambda: ((rnd(3, 8), (8,)), {}), lambda: ((rnd(3, 8), (8,), rnd(8), 1e-3), {}),
                 lambda: ((rnd(2, 3, 8), (3, 8)), {"weight": rnd(3, 8)})],
    "cross_entropy": [lambda: ((rnd(5, 7), torch.tensor([0, 6, 2, -100, 3])), {}),
                      lambda: ((rnd(5, 7), torch.tensor([0, 6, 2, 1, 3]), rnd(7).abs()), {"reduction": "sum"}),
                      lambda: ((rnd(5, 7), torch.tensor([0, 6, 2, 1, 3])), {"reduction": "none", "ignore_index": 2,
                                                                            "label_smoothing": 0.1}),
                      lambda: ((rnd(5, 7), rnd(5, 7).softmax(-1)), {}),  # class probabilities
                      lambda: ((rnd(5, 7), torch.tensor([0, 6, 2, 1, 3])), {"size_average": False})],
}


@pytest.mark.parametrize("name", sorted(_DIRECT_CALLS))
def test_direct_callables_are_the_references(name):
    """What a size route calls (``torch_impl.direct``) is a cheaper callable than the reference, with its
    arguments and results (forward and gradient), its legacy arguments, and its error for a bad reduction."""
    from hal.ops import torch_impl
    fast, ref = torch_impl.direct(name), torch_impl.OPS[name][2]
    assert fast is not ref
    for make in _DIRECT_CALLS[name]:
        args, kwargs = make()
        x = args[0].requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # size_average's deprecation, from both
            got, want = fast(*args, **kwargs), ref(*args, **kwargs)
        (gx,), (wx,) = torch.autograd.grad(got.sum(), [x]), torch.autograd.grad(want.sum(), [x])
        assert torch.equal(got, want) and torch.equal(gx, wx), (name, kwargs)
    if name == "cross_entropy":
        with pytest.raises(ValueError, match="not a valid value for reduction"):
            fast(rnd(2, 3), torch.tensor([0, 1]), reduction="average")


def test_every_builtin_op_is_defined_with_its_aten_name():
    for name in hal.ops.REGISTRY.names():
        opdef = hal.ops.REGISTRY.get(name)
        assert opdef.aten.startswith(("aten::", "hal::")) and opdef.reaches
    with pytest.raises(OpNotFoundError):
        hal.ops.REGISTRY.get("no_such_op")


def test_resolution_keeps_every_rejection_reason_in_order():
    reg = OpRegistry()
    reg.define("f", "hal::f", lambda x: x)
    reg.register("f", "cpu", lambda x: x + 1, impl="fast", dtypes={"float16"}, priority=10)
    reg.register("f", "cpu", lambda x: x + 2, impl="picky", priority=5,
                 supports=lambda x: None if x.is_contiguous() else "needs a contiguous input")
    reg.register("f", "cpu", lambda x: x + 3, impl="torch", priority=0)
    xt = rnd(4, 4).t()
    res = reg.resolve("f", "cpu", "float32", (xt,))
    assert res.impl.impl == "torch"
    assert res.rejected == ("cpu/fast: dtype float32 not in ['float16']", "cpu/picky: needs a contiguous input")
    assert reg.resolve("f", "cpu", "float32", (rnd(4, 4),)).impl.impl == "picky"
    none = reg.resolve("f", "mlu", "float32")
    assert not none.ok and none.rejected == ("no implementation registered for mlu",)


def test_guarded_dispatch_rechecks_predicates_per_call():
    calls = []

    def reference(x):
        """identity with torch."""
        return x.clone()

    op = hal.ops.define_op("test_guarded", "hal::test_guarded", reference)
    hal.ops.REGISTRY.register("test_guarded", "cpu", lambda x: calls.append("fast") or x.clone(), impl="fast",
                              priority=10, supports=lambda x: None if x.is_contiguous() else "non-contiguous")
    a = rnd(4, 4)
    op(a)
    op(a.t())
    op(a)
    assert calls == ["fast", "fast"]


def test_a_cached_call_no_candidate_takes_gets_the_fallback_policy():
    """After a first call cached the guarded chain, a call its only candidate rejects falls back as an uncached
    call would (it raised NotSupportedError before), and a per-call ``fallback=`` is honoured."""
    def reference(x):
        """x + 1."""
        return x + 1

    op = hal.ops.define_op("test_guarded_only", "hal::test_guarded_only", reference, register_cpu=False)
    hal.ops.REGISTRY.register("test_guarded_only", "cpu", lambda x: x + 1, impl="fast",
                              supports=lambda x: None if x.is_contiguous() else "non-contiguous")
    a = rnd(4, 4)
    torch.testing.assert_close(op(a), a + 1)  # cached: a guarded chain of one candidate
    hal.ops.clear_fallback_log()
    with hal.ops.fallback_policy("cpu"):
        torch.testing.assert_close(op(a.t()), a.t() + 1)
    assert hal.ops.fallback_totals()[("test_guarded_only", "cpu")].calls == 1
    with pytest.raises(NotSupportedError, match="non-contiguous"):
        op(a.t(), fallback="error")
    with hal.ops.fallback_policy("error"), pytest.raises(NotSupportedError, match="non-contiguous"):
        op(a.t())
    torch.testing.assert_close(op(a, fallback="error"), a + 1)  # a call the candidate takes never falls back


def test_fallback_policy_precedence(monkeypatch):
    assert current_policy() == "warn"
    monkeypatch.setenv("HAL_FALLBACK", "error")
    assert current_policy() == "error"
    with hal.ops.fallback_policy("cpu"):
        assert current_policy() == "cpu"
        assert current_policy("warn") == "warn"
        with hal.ops.fallback_policy("error"):
            assert current_policy() == "error"
        assert current_policy() == "cpu"
    with pytest.raises(ValueError, match="unknown fallback policy"):
        current_policy("sometimes")


def test_fallback_scope_is_per_thread():
    seen = {}
    with hal.ops.fallback_policy("error"):
        t = threading.Thread(target=lambda: seen.setdefault("other", current_policy()))
        t.start()
        t.join()
        seen["this"] = current_policy()
    assert seen == {"other": "warn", "this": "error"}


def test_fallback_runs_reference_logs_and_warns_once():
    def reference(x, k=1.0):
        """x * k."""
        return x * k

    op = hal.ops.define_op("test_fp16_only", "hal::test_fp16_only", reference, register_cpu=False)
    hal.ops.REGISTRY.register("test_fp16_only", "cpu", reference, dtypes={"float16"})
    hal.ops.clear_fallback_log()
    x = rnd(3, 4)
    with pytest.raises(NotSupportedError) as ei:
        op(x, 2.0, fallback="error")
    assert ei.value.reasons == ["cpu/torch: dtype float32 not in ['float16']"]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            torch.testing.assert_close(op(x, k=2.0), x * 2)
    assert sum(issubclass(i.category, hal.ops.HalFallbackWarning) for i in w) == 1
    totals = hal.ops.fallback_totals()[("test_fp16_only", "cpu")]
    assert totals.calls == 3 and totals.seconds > 0
    torch.testing.assert_close(op(x.half(), k=2.0, fallback="error"), x.half() * 2)
    assert hal.ops.fallback_totals()[("test_fp16_only", "cpu")].calls == 3


def test_fallback_log_is_bounded_but_totals_are_complete():
    log = FallbackLog(limit=5)
    for i in range(12):
        log.add(FallbackRecord("op", "mlu", ("float32",), ((i,),), 8, 0.001, "r"))
    assert len(log.records()) == 5 and log.records()[-1].shapes == ((11,),)
    tot = log.totals()[("op", "mlu")]
    assert tot.calls == 12 and tot.bytes_copied == 96


def test_backend_dtype_restrictions_drive_fallback():
    """register_torch_impls with an empty dtype set leaves the op unregistered (it falls back)."""
    reg = OpRegistry()
    for name in hal.ops.REGISTRY.names():
        d = hal.ops.REGISTRY.get(name)
        reg.define(name, d.aten, d.reference, reaches=d.reaches)
    hal.ops.register_torch_impls(reg, "mlu", dtypes={"softmax": {"float32", "float16"}, "rms_norm": set()})
    assert reg.resolve("softmax", "mlu", "float32").ok
    assert not reg.resolve("softmax", "mlu", "float64").ok
    assert not reg.resolve("rms_norm", "mlu", "float32").ok
    assert reg.resolve("gelu", "mlu", "float64").ok


# ---- the kernel benchmarks' CPU dry runs and the routing-table rule (benchmarks/bench_kernels.py) ----
def _bench_module():
    import importlib.util
    import pathlib
    import sys
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_kernels.py"
    spec = importlib.util.spec_from_file_location("bench_kernels_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_bench_routing_min_numel_rule():
    mn = _bench_module().min_numel
    assert mn([(10, 1.0, 2.0), (100, 1.0, 2.0)]) == 0  # triton wins everywhere
    assert mn([(10, 3.0, 2.0), (100, 1.0, 2.0), (1000, 2.0, 2.0)]) == 100  # ties count as wins
    assert mn([(10, 1.0, 2.0), (100, 3.0, 2.0), (1000, 1.0, 2.0)]) == 1000  # a loss in between
    assert mn([(10, 1.0, 2.0), (1000, 3.0, 2.0)]) is None  # loses at the largest: never
    assert mn([(1000, 1.0, 2.0), (10, 3.0, 2.0)]) == 1000  # unsorted input
    assert mn([(10, 1.0, 2.0), (100, None, 2.0)]) is None  # a failed measurement is not a win


def test_bench_kernels_and_e2e_cpu_dry_runs(tmp_path):
    import json
    import subprocess
    import sys
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    out = tmp_path / "k.json"
    r = subprocess.run([sys.executable, "benchmarks/bench_kernels.py", "--device", "cpu", "--sizes", "small",
                        "--kernels", "rms_norm,cross_entropy,linear_cross_entropy", "--json", str(out)],
                       cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["complete"] and len(doc["rows"]) == 3 * 2 * 2
    keys = {"kernel", "dtype", "shape", "direction", "timing", "hal_us", "torch_us", "liger_us", "compile_us"}
    for row in doc["rows"]:
        assert keys <= row.keys() and row["timing"] == "wall" and row["hal_us"] > 0 and row["torch_us"] > 0
        assert not row["errors"], row
    lce = [r for r in doc["rows"] if r["kernel"] == "linear_cross_entropy"]
    assert {r["hal_impl"] for r in lce} == {"cpu/chunked"} and lce[1]["measures"] == "fwd+bwd"
    e2e = tmp_path / "e.json"
    r = subprocess.run([sys.executable, "benchmarks/bench_e2e.py", "--device", "cpu", "--config", "tiny", "--dtype",
                        "float32", "--steps", "2", "--warmup", "1", "--no-compile", "--vocab64", "--json", str(e2e)],
                       cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(e2e.read_text())
    assert res["complete"] and res["speedup_vs_torch"] > 0 and res["loss_max_rel_diff"] < 1e-4
    assert len(res["loss_curves"]["hal"]) == 3 and res["hal_linear_cross_entropy_impl"] == "cpu/chunked"
    # the hand-padded torch baseline trains a (possibly) larger model: timed, its loss curve not compared
    assert res["speedup_vs_torch_vocab64"] > 0 and "torch-vocab64" not in res["loss_max_abs_diff"]
    for script in ("bench_kernels.py", "bench_e2e.py"):
        h = subprocess.run([sys.executable, f"benchmarks/{script}", "--help"], cwd=root, capture_output=True,
                           text=True, timeout=120)
        assert h.returncode == 0 and "--device" in h.stdout


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not importable: the raw sweep loads "
                    "the kernel modules")
def test_bench_raw_sweep_decides_on_the_median_of_whole_sweeps(tmp_path):
    import json
    import statistics
    import subprocess
    import sys
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "benchmarks/bench_kernels.py", "--raw-triton", "--device", "cpu", "--sweeps", "3",
                        "--kernels", "softmax", "--dtypes", "float32", "--json", str(out)],
                       cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert len(doc["sweep"]) == 2 * 3  # two modes, three row counts on the CPU
    for p in doc["sweep"]:
        assert len(p["triton_us_runs"]) == len(p["torch_us_runs"]) == 3
        assert p["triton_us"] == statistics.median(p["triton_us_runs"])
        assert p["torch_us"] == statistics.median(p["torch_us_runs"])
    for mode in ("infer", "train"):
        pts = [(p["numel"], p["triton_us"], p["torch_us"]) for p in doc["sweep"] if p["mode"] == mode]
        assert doc["ops"]["softmax"]["float32"][mode] == _bench_module().min_numel(pts)


def _kernel_wrapper_parameters() -> dict:
    """``{op: [(name, default source or None), ...]}`` of each CUDA kernel wrapper, read from the source
    (the modules import Triton, which CI does not have)."""
    import ast
    from pathlib import Path

    from hal.backends.cuda import kernels
    folder = Path(kernels.__file__).parent
    out = {}
    for op, (module, fn, _pred) in kernels.KERNELS.items():
        tree = ast.parse((folder / f"{module}.py").read_text())
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn)
        args = node.args.args
        defaults = [None] * (len(args) - len(node.args.defaults)) + [ast.unparse(d) for d in node.args.defaults]
        out[op] = [(a.arg, d) for a, d in zip(args, defaults)]
    return out


def test_cuda_kernel_wrappers_take_the_references_arguments_in_their_order():
    """``hal.ops.<op>(x, a, b)`` must mean the same on every device: each CUDA wrapper's positional
    parameters start with its op's reference's (the CPU implementation and what a fallback runs), same
    names, same order, same defaults; it may add keywords after them. (The cross_entropy wrapper once
    took ``ignore_index`` fourth, where ``F.cross_entropy`` takes ``size_average``.)"""
    import inspect

    from hal.ops import torch_impl
    for op, params in _kernel_wrapper_parameters().items():
        ref = torch_impl.OPS[op][2]
        try:
            sig = inspect.signature(ref)
        except (TypeError, ValueError):  # a builtin (torch.softmax): no Python signature to compare
            continue
        want = [(p.name, None if p.default is inspect.Parameter.empty else repr(p.default))
                for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        got = [(n, None if d is None else repr(eval(d, {"torch": torch}))) for n, d in params[:len(want)]]
        assert got == want, f"{op}: the CUDA wrapper's parameters {params} do not start with the reference's {want}"
