"""Core contracts: packaging (one import root), every backend class importable without its SDK and
complete, typed errors, host streams/events, the hal CLI."""
from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys

import pytest
import torch

import hal
from hal.backend import Backend
from hal.errors import HalError
from tests.conftest import run_cli


def test_user_packages_named_models_and_reports_are_not_shadowed(tmp_path):
    for name in ("models", "reports", "conformance", "backends"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"WHO = 'user {name}'\n")
    code = ("import hal, hal.models, hal.backends.cpu, hal.conformance\n"
            "import models, reports, conformance, backends\n"
            "print(models.WHO, reports.WHO, conformance.WHO, backends.WHO)")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["user", "models", "user", "reports", "user", "conformance", "user", "backends"]


@pytest.mark.parametrize("name", ["cpu", "cuda", "mlu", "null"])
def test_every_backend_imports_without_its_sdk_and_implements_the_interface(name):
    """DeepSpeed's accelerator test: with the SDK absent the class still imports and is complete."""
    blocked = {"cupy": None, "triton": None, "torch_mlu": None}
    saved = {k: sys.modules.get(k) for k in blocked}
    sys.modules.update(blocked)  # a None entry makes `import cupy` raise ImportError
    try:
        mod = importlib.reload(importlib.import_module(f"hal.backends.{name}"))
        classes = [c for _, c in inspect.getmembers(mod, inspect.isclass)
                   if issubclass(c, Backend) and c.__module__.startswith(f"hal.backends.{name}")]
        assert classes, f"hal.backends.{name} defines no Backend"
        for cls in classes:
            assert not inspect.isabstract(cls), (cls, cls.__abstractmethods__)
            assert cls.name and cls.device_type and cls.dist_backend
            avail = cls.probe()
            assert isinstance(avail, hal.Availability) and avail.reason
            if name == "mlu":  # torch_mlu is the SDK that makes the MLU available
                assert not avail.available
            if name == "cuda":  # torch.cuda decides; CuPy and Triton are extras, named unavailable
                assert avail.available == torch.cuda.is_available(), avail.reason
                if avail.available:
                    assert "cupy_pool_interop: unavailable" in avail.reason
                    assert "triton_kernels: unavailable" in avail.reason
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        hal.refresh()


def test_typed_errors_form_one_family():
    for cls in (hal.BackendUnavailableError, hal.NotSupportedError, hal.OpNotFoundError,
                hal.CollectiveError, hal.CollectiveTimeoutError):
        assert issubclass(cls, HalError)
    e = hal.NotSupportedError("ReduceOp.BAND", "mlu", ["cncl does not implement it"])
    assert e.reasons == ["cncl does not implement it"] and "cncl" in str(e)


def test_host_stream_and_event_semantics():
    b = hal.get_backend("cpu")
    s = b.create_stream()
    assert b.current_stream() is not s
    with b.use_stream(s):
        assert b.current_stream() is s
        inner = b.create_stream()
        with inner:
            assert b.current_stream() is inner
        assert b.current_stream() is s
    e1, e2 = b.create_event(enable_timing=True), b.create_event(enable_timing=True)
    e1.record()
    torch.randn(256, 256) @ torch.randn(256, 256)
    e2.record()
    assert e1.elapsed_time(e2) > 0 and e1.query() and s.query()
    with pytest.raises(RuntimeError, match="recorded"):
        b.create_event(True).elapsed_time(b.create_event(True).record())


def test_cpu_properties_are_plain_data():
    props = hal.get_backend("cpu").device_properties(0)
    d = props.as_dict()
    json.dumps(d)
    assert d["capability"] is None and "bfloat16" in d["dtypes"] and d["total_memory"] > 2**30


def test_check_reduce_op_rejects_before_any_call():
    class Limited(hal.get_backend("cpu").__class__):
        unsupported_reduce_ops = frozenset({"BAND", "BOR", "BXOR", "PREMUL_SUM"})
    with pytest.raises(hal.NotSupportedError, match="ReduceOp.BXOR"):
        Limited().check_reduce_op("bxor")
    Limited().check_reduce_op("sum")


def test_cli_collectives_cpu_json_all_pass():
    r = run_cli("hal", "collectives", "--device", "cpu", "--world-size", "2", "--format", "json")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["passed"] and doc["world_size"] == 2
    rows = doc["rows"]
    assert {r["dtype"] for r in rows} >= {"float32", "bfloat16", "float16", "int64"}
    assert {r["op"] for r in rows if r["collective"] == "all_reduce"} == {"sum", "max", "min", "avg", "product"}
    assert all(r["status"] in ("pass", "skip") for r in rows)
    assert sum(r["status"] == "pass" for r in rows) >= 30


@pytest.mark.parametrize("args,needle", [
    (["collectives", "--device", "nosuch"], "backend 'nosuch' is unavailable"),
    (["collectives", "--device", "mlu"], "torch_mlu"),
    (["collectives", "--world-size", "0"], "--world-size must be at least 1"),
    (["collectives", "--dtypes", "float8"], "unknown dtype 'float8'"),
])
def test_cli_bad_input_is_one_line_exit_2(args, needle):
    r = run_cli("hal", *args)
    assert r.returncode == 2
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_cli_usage_error_exit_2():
    r = run_cli("hal", "frobnicate")
    assert r.returncode == 2 and "Traceback" not in r.stderr
