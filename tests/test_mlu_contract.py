"""Contract tests: the MLU backend run against a stand-in ``torch_mlu`` module.

No MLU and no torch_mlu exist here. The stand-in implements the documented public API surface of
torch_mlu r2.4 (../shared/reference/mlu.md section 1: ``torch.mlu.is_available / device_count /
current_device / set_device / synchronize / get_device_properties`` with the fields of
``registerMLUDeviceProperties``, the allocator statistics, ``Stream / Event / current_stream /
stream``) backed by host objects, and records every call. The tests check that the backend calls
the right names with the right signatures and maps the results correctly. They say nothing about
real MLU behaviour: every result here is a contract check, not a device result.
"""
from __future__ import annotations

import contextlib
import importlib.util
import sys
import types

import pytest
import torch

import hal
from hal.errors import NotSupportedError

pytestmark = pytest.mark.contract


class _Props:
    """Fields of torch_mlu's ``_MLUDeviceProperties`` (Module.cpp registerMLUDeviceProperties)."""

    def __init__(self, name, major, minor):
        self.name, self.major, self.minor = name, major, minor
        self.isa_version, self.multi_processor_count, self.cluster_count = 592, 48, 12
        self.core_num_per_cluster, self.total_memory, self.supports_linear_memory = 4, 48 << 30, True


class _StandInMlu(types.ModuleType):
    """``torch.mlu`` with the documented signatures; records calls in ``calls``."""

    def __init__(self, archs):
        super().__init__("torch.mlu")
        self.calls: list[tuple] = []
        self._archs = archs
        self._current = 0
        mod = self

        class Event:
            def __init__(self, enable_timing=False, blocking=False, interprocess=False):
                mod.calls.append(("Event", enable_timing))
                self.enable_timing, self.t = enable_timing, None

            def record(self, stream=None):
                mod.calls.append(("Event.record", stream))
                import time
                self.t = time.perf_counter()

            def synchronize(self):
                mod.calls.append(("Event.synchronize",))

            def query(self):
                return True

            def elapsed_time(self, end):
                if not (self.enable_timing and end.enable_timing) or self.t is None or end.t is None:
                    raise RuntimeError("events not recorded with timing")
                return (end.t - self.t) * 1e3

            def hardware_time(self):  # torch_mlu extra
                return 0

        class Stream:
            def __init__(self, device=None, priority=0, **kwargs):
                mod.calls.append(("Stream", device, priority))
                self.device, self.priority = device, priority

            def synchronize(self):
                mod.calls.append(("Stream.synchronize",))

            def query(self):
                return True

            def wait_event(self, event):
                mod.calls.append(("Stream.wait_event", event))

            def wait_stream(self, stream):
                mod.calls.append(("Stream.wait_stream", stream))

            def record_event(self, event=None):
                event = event or Event()
                event.record(self)
                return event

        class StreamContext:
            def __init__(self, stream):
                self.stream = stream

            def __enter__(self):
                mod.calls.append(("stream.enter", self.stream))

            def __exit__(self, *exc):
                mod.calls.append(("stream.exit", self.stream))

        self.Stream, self.Event, self.StreamContext = Stream, Event, StreamContext
        self._default = {}

    def is_available(self):
        return True

    def device_count(self):
        return len(self._archs)

    def current_device(self):
        return self._current

    def set_device(self, device):
        self.calls.append(("set_device", device))
        self._current = int(device)

    def synchronize(self, device=None):
        self.calls.append(("synchronize", device))

    def get_device_properties(self, device):
        self.calls.append(("get_device_properties", device))
        major, minor = self._archs[device]
        return _Props(f"MLU{major}90 stand-in", major, minor)

    def is_bf16_supported(self):
        return self.get_device_properties(self._current).major >= 5

    def memory_allocated(self, device=None):
        self.calls.append(("memory_allocated", device))
        return 1000 + (device or 0)

    def max_memory_allocated(self, device=None):
        self.calls.append(("max_memory_allocated", device))
        return 3000

    def memory_reserved(self, device=None):
        self.calls.append(("memory_reserved", device))
        return 4096

    def mem_get_info(self, device=None):
        self.calls.append(("mem_get_info", device))
        return (40 << 30, 48 << 30)

    def reset_peak_memory_stats(self, device=None):
        self.calls.append(("reset_peak_memory_stats", device))

    def empty_cache(self):
        self.calls.append(("empty_cache",))

    def current_stream(self, device=None):
        self.calls.append(("current_stream", device))
        return self._default.setdefault(device, self.Stream(device))

    def stream(self, stream):
        return self.StreamContext(stream)


@contextlib.contextmanager
def _stand_in_installed():
    """Insert ``torch_mlu`` + ``torch.mlu`` (two devices: arch 5.0 and 3.0); removed afterwards."""
    mlu = _StandInMlu([(5, 0), (3, 0)])
    fake = types.ModuleType("torch_mlu")
    fake.__version__ = "1.22.0+torch2.4.0 (stand-in)"
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "torch_mlu", fake)
        mp.setattr(torch, "mlu", mlu, raising=False)
        hal.refresh()
        try:
            yield mlu
        finally:
            mp.undo()
            hal.refresh()


@pytest.fixture
def stand_in():
    with _stand_in_installed() as mlu:
        yield mlu


@pytest.fixture
def backend(stand_in):
    from hal.backends.mlu import MluBackend
    return MluBackend()


def test_contract_probe_available_and_discovered(stand_in):
    from hal.backends.mlu import MluBackend
    av = MluBackend.probe()
    assert av.available and "2 MLU device(s)" in av.reason
    info = {i.name: i for i in hal.list_backends()}["mlu"]
    assert info.available
    assert hal.get_backend("mlu").name == "mlu"


def test_contract_probe_reason_when_not_available(stand_in, monkeypatch):
    from hal.backends.mlu import MluBackend
    monkeypatch.setattr(stand_in, "is_available", lambda: False)
    av = MluBackend.probe()
    assert not av.available and "torch.mlu.is_available() is False" in av.reason


def test_contract_device_properties_arch_semantics(backend, stand_in):
    assert backend.device_count() == 2
    p5, p3 = backend.device_properties(0), backend.device_properties(1)
    assert p5.capability == (5, 0) and p3.capability == (3, 0)
    assert "MLU architecture generation" in p5.extra["capability_meaning"]
    assert p5.extra["cluster_count"] == 12 and p5.extra["core_num_per_cluster"] == 4
    assert p5.total_memory == 48 << 30
    # bf16 only from architecture 5 (torch.mlu.is_bf16_supported: major >= 5); float8 from 6
    assert "bfloat16" in p5.dtypes and "bfloat16" not in p3.dtypes
    assert "float8_e4m3fn" not in p5.dtypes
    assert p5.downcasts == {"float64": "float32", "complex128": "complex64"}
    assert "float64" not in p5.dtypes
    assert backend.supports_dtype(torch.bfloat16, 0) and not backend.supports_dtype(torch.bfloat16, 1)
    with pytest.raises(IndexError):
        backend.device_properties(2)
    assert ("get_device_properties", 0) in stand_in.calls


def test_contract_memory_stats_use_torch_mlu_allocator(backend, stand_in):
    st = backend.memory_stats(1)
    assert (st.allocated, st.reserved, st.peak) == (1001, 4096, 3000)
    assert (st.free, st.total) == (40 << 30, 48 << 30)
    assert "torch.mlu" in st.source
    backend.reset_peak_memory_stats(1)
    backend.empty_cache()
    names = [c[0] for c in stand_in.calls]
    for n in ("memory_allocated", "memory_reserved", "max_memory_allocated", "mem_get_info",
              "reset_peak_memory_stats", "empty_cache"):
        assert n in names
    assert ("reset_peak_memory_stats", 1) in stand_in.calls


def test_contract_streams_and_events(backend, stand_in):
    s = backend.create_stream(device=0, priority=-1)
    assert ("Stream", 0, -1) in stand_in.calls
    assert isinstance(s.raw, stand_in.Stream)
    ev = backend.create_event(enable_timing=True)
    assert ("Event", True) in stand_in.calls
    with backend.use_stream(s):
        ev.record(s)
    assert ("stream.enter", s.raw) in stand_in.calls and ("stream.exit", s.raw) in stand_in.calls
    end = s.record_event(backend.create_event(enable_timing=True))
    assert end.elapsed_time(ev) <= 0 <= ev.elapsed_time(end)
    cur = backend.current_stream(0)
    cur.wait_event(ev)
    assert ("Stream.wait_event", ev.raw) in stand_in.calls
    s.synchronize()
    backend.synchronize(0)
    assert ("synchronize", 0) in stand_in.calls


@pytest.mark.parametrize("op", ["BAND", "BOR", "BXOR", "PREMUL_SUM", "band"])
def test_contract_reduce_op_rejected_before_any_call(backend, monkeypatch, op):
    import torch.distributed as dist

    def boom(*a, **k):  # any torch.distributed call would be a contract violation
        raise AssertionError("torch.distributed was called")

    monkeypatch.setattr(dist, "all_reduce", boom)
    monkeypatch.setattr(dist, "init_process_group", boom)
    with pytest.raises(NotSupportedError, match="cncl"):
        backend.check_reduce_op(op)
    backend.check_reduce_op("SUM")
    assert backend.dist_backend == "cncl"


def test_contract_autocast_uses_mlu_device_type(backend, monkeypatch):
    seen = {}

    class Recorder:
        def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
            seen.update(device_type=device_type, dtype=dtype, enabled=enabled)

    monkeypatch.setattr(torch.amp, "autocast", Recorder)
    backend.autocast(torch.float16)
    assert seen == {"device_type": "mlu", "dtype": torch.float16, "enabled": True}
    backend.set_device(1)  # arch 3.0: no bfloat16
    with pytest.raises(NotSupportedError, match="architecture major >= 5"):
        backend.autocast(torch.bfloat16)
    backend.set_device(0)
    backend.autocast(torch.bfloat16)
    assert seen["dtype"] == torch.bfloat16


def test_contract_profiler_activity_is_privateuse1(backend):
    from torch.profiler import ProfilerActivity
    assert backend.profiler_activity == "PrivateUse1"
    assert ProfilerActivity.PrivateUse1 in backend.profiler_activities()


def test_contract_env_map_from_manifest(backend):
    env = backend.env_map()
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "PYTORCH_MLU_ALLOC_CONF"
    assert env["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "PYTORCH_NO_MLU_MEMORY_CACHING"
    assert env["CUDA_LAUNCH_BLOCKING"] is None  # no MLU equivalent: setting it only warns


def test_contract_register_ops_uses_manifest(backend):
    """HAL ops whose reached ATen ops are all native on the MLU are registered; others fall back."""
    from hal.ops import OpRegistry, torch_impl
    reg = OpRegistry()
    for name, (aten, reaches, fn) in torch_impl.OPS.items():
        reg.define(name, aten, fn, reaches=reaches)
    # an op whose only reached ATen op has no MLU kernel (torch_mlu would fall back to the CPU)
    reg.define("nanmedian", "aten::nanmedian.dim", lambda x, d: torch.nanmedian(x, d),
               reaches=("aten::nanmedian.dim_values",))
    backend.register_ops(reg)
    softmax = reg.resolve("softmax", "mlu", "float32")
    assert softmax.ok and reg.resolve("softmax", "mlu", "bfloat16").ok  # current device arch 5.0
    assert not reg.resolve("softmax", "mlu", "float64").ok  # computed as float32, not natively
    # torch_mlu registers scaled_dot_product_attention itself (its CPU reach does not matter)
    assert reg.resolve("scaled_dot_product_attention", "mlu", "float16").ok
    res = reg.resolve("nanmedian", "mlu", "float32")
    assert not res.ok and "no implementation registered for mlu" in res.rejected[0]


def test_stand_in_does_not_leak():
    """Self-contained (any order): install the stand-in, remove it, and the state is what it was
    before; torch_mlu is absent and mlu unavailable afterwards where the probe said so before."""
    real = importlib.util.find_spec("torch_mlu") is not None
    before = ("torch_mlu" in sys.modules, hasattr(torch, "mlu"))
    with _stand_in_installed():
        assert "torch_mlu" in sys.modules and {i.name: i for i in hal.list_backends()}["mlu"].available
    assert ("torch_mlu" in sys.modules, hasattr(torch, "mlu")) == before
    if not real:  # an MLU-absence assertion holds only where the probe says the MLU is absent
        assert not before[0] and not {i.name: i for i in hal.list_backends()}["mlu"].available


def test_contract_supports_dtype_asks_the_device_named(backend, stand_in):
    """Device 0 is arch 5.0 (bfloat16), device 1 arch 3.0 (none): the answer is the named device's."""
    assert backend.supports_dtype(torch.bfloat16, 0)
    assert not backend.supports_dtype(torch.bfloat16, 1)
    backend.set_device(1)
    assert not backend.supports_dtype(torch.bfloat16)  # None: the current device
    backend.set_device(0)


def test_contract_visible_devices_env(backend):
    assert backend.visible_devices_env == "MLU_VISIBLE_DEVICES"
    assert backend.env_map()["CUDA_VISIBLE_DEVICES"] == "MLU_VISIBLE_DEVICES"
    assert backend.translate_env({"CUDA_VISIBLE_DEVICES": "1", "CUDA_LAUNCH_BLOCKING": "1"}) == \
        {"MLU_VISIBLE_DEVICES": "1"}
    assert backend.visible_devices(backend.restrict_devices_env([1, 0], {})) == ["1", "0"]
