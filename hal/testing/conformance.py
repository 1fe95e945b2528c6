"""The backend-agnostic conformance suite (IREE's CTS model): every backend runs the same tests.

Use from a test module::

    from hal.testing.conformance import *  # noqa: F401,F403  (the tests and the fixtures)

The ``hal_backend`` fixture is parametrised over every installed backend (or only the names in
``$HAL_CONFORMANCE_BACKENDS``, comma-separated); a backend that is not available here is skipped
with its own probe reason. A vendor's plugin package runs the suite on its backend by importing
this module in its tests. Tests use real tensors, real streams and real processes; nothing is mocked.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

import hal
import hal.ops
from hal.errors import NotSupportedError
from hal.streams import Event, Stream


def _names() -> list[str]:
    wanted = os.environ.get("HAL_CONFORMANCE_BACKENDS")
    names = [i.name for i in hal.list_backends()]
    return [n for n in names if not wanted or n in wanted.split(",")]


@pytest.fixture(params=_names())
def hal_backend(request) -> hal.Backend:
    info = {i.name: i for i in hal.list_backends()}[request.param]
    if not info.available:
        pytest.skip(f"{info.name}: {info.reason}")
    return hal.get_backend(info.name)


def _data(shape=(257, 33), dtype=torch.float32, seed=0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# ---- devices ----------------------------------------------------------------------------------
def test_identity_and_devices(hal_backend):
    b = hal_backend
    assert b.name and b.device_type and isinstance(b.priority, int) and b.dist_backend
    assert b.device_count() >= 1
    props = b.device_properties(0)
    assert props.total_memory > 0 and "float32" in props.dtypes
    with pytest.raises(IndexError):
        b.device_properties(b.device_count())


# ---- memory -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
def test_memory_round_trip(hal_backend, dtype):
    host = _data(dtype=dtype) if dtype.is_floating_point else torch.randint(-1000, 1000, (257, 33))
    dev = hal_backend.to_device(host)
    assert dev.device.type == hal_backend.device_type and dev.dtype == dtype
    back = hal_backend.to_host(dev)
    assert back.device.type == "cpu" and torch.equal(back, host)
    buf = hal_backend.allocate((7, 5), dtype)
    assert tuple(buf.shape) == (7, 5) and buf.dtype == dtype and buf.device.type == hal_backend.device_type
    hal_backend.copy(buf, hal_backend.to_device(host[:7, :5]))
    assert torch.equal(hal_backend.to_host(buf), host[:7, :5])


def test_copy_on_a_stream_is_ordered(hal_backend):
    b = hal_backend
    host = _data((1024, 256), seed=1).pin_memory() if b.device_type != "cpu" else _data((1024, 256), seed=1)
    s = b.create_stream()
    with b.use_stream(s):
        dev = b.to_device(host, stream=s)
        dst = b.allocate(dev.shape, dev.dtype)
        b.copy(dst, dev * 2, stream=s)
        out = b.to_host(dst, stream=s)
    s.synchronize()
    assert torch.equal(out, host * 2)


def test_memory_stats_follow_allocations(hal_backend):
    b = hal_backend
    b.synchronize()
    b.reset_peak_memory_stats()
    before = b.memory_stats()
    assert before.total > 0 and 0 <= before.free <= before.total and before.peak >= 0
    big = b.allocate((64, 1024, 1024), torch.uint8)  # 64 MiB
    big.fill_(1)  # touch the pages (the OS counts host memory only once written)
    b.synchronize()
    during = b.memory_stats()
    assert during.allocated - before.allocated >= 48 * 2**20, (before, during)
    assert during.peak >= during.allocated - 16 * 2**20
    assert during.peak_reserved is None or during.peak_reserved >= during.reserved - 16 * 2**20
    del big
    b.empty_cache()
    assert b.memory_stats().peak >= during.allocated - 16 * 2**20  # peak survives the free


# ---- streams and events -----------------------------------------------------------------------
def test_streams_and_events_are_real_objects(hal_backend):
    b = hal_backend
    s = b.create_stream()
    e = b.create_event()
    assert isinstance(s, Stream) and isinstance(e, Event) and isinstance(b.current_stream(), Stream)
    with b.use_stream(s):
        cur = b.current_stream()
        assert cur is s or getattr(cur, "raw", None) == getattr(s, "raw", object())
    e.record(s)
    e.synchronize()
    assert e.query() and s.query()


def test_event_ordering_and_timing(hal_backend):
    b = hal_backend
    s1, s2 = b.create_stream(), b.create_stream()
    start, end = b.create_event(enable_timing=True), b.create_event(enable_timing=True)
    x = b.to_device(_data((512, 512), seed=2))
    with b.use_stream(s1):
        start.record(s1)
        for _ in range(8):
            x = x @ x.T / 512
        end.record(s1)
    s2.wait_event(end)  # s2 work now follows s1's
    with b.use_stream(s2):
        y = x + 1
    s2.synchronize()
    assert end.query()
    ms = start.elapsed_time(end)
    assert ms > 0, ms
    assert torch.isfinite(b.to_host(y)).all()
    with pytest.raises(RuntimeError):
        b.create_event().elapsed_time(b.create_event())


# ---- RNG --------------------------------------------------------------------------------------
def test_rng_seed_state_and_generator(hal_backend):
    b = hal_backend
    dev = b.torch_device()
    b.manual_seed(1234)
    first = torch.rand(4096, device=dev)
    b.manual_seed(1234)
    assert torch.equal(torch.rand(4096, device=dev), first)  # the seed decides the stream
    state = b.get_rng_state()
    assert isinstance(state, torch.Tensor) and state.device.type == "cpu" and state.dtype == torch.uint8
    a = torch.rand(4096, device=dev)
    b.set_rng_state(state)
    assert torch.equal(torch.rand(4096, device=dev), a)  # restoring the state replays the stream
    assert not torch.equal(a, first)
    g1, g2 = b.generator(7), b.generator(7)
    assert g1.device.type == b.device_type
    x = torch.rand(4096, device=dev, generator=g1)
    assert torch.equal(x, torch.rand(4096, device=dev, generator=g2))
    b.set_rng_state(state)
    torch.rand(4096, device=dev, generator=b.generator(8))  # a private generator leaves the default alone
    assert torch.equal(torch.rand(4096, device=dev), a)


# ---- environment ------------------------------------------------------------------------------
def test_env_map_and_visible_devices_in_a_child(hal_backend, tmp_path):
    b = hal_backend
    table = b.env_map()
    assert all(k.isupper() and (v is None or v.isupper()) for k, v in table.items()), table
    if b.visible_devices_env is None:
        with pytest.raises(NotSupportedError):
            b.restrict_devices_env([0])
        return
    assert table.get("CUDA_VISIBLE_DEVICES") == b.visible_devices_env
    assert b.translate_env({"CUDA_VISIBLE_DEVICES": "0", "HOME": "/x"}) == {b.visible_devices_env: "0"}
    env = b.restrict_devices_env([b.device_count() - 1])
    assert b.visible_devices(env) == [str(b.device_count() - 1)]
    code = f"import hal; print(hal.backend_for_device_type({b.device_type!r}).device_count())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "1", (out.stdout, out.stderr[-2000:])


# ---- in-process registration ------------------------------------------------------------------
def test_register_backend_in_process(hal_backend):
    b = hal_backend
    derived = type(f"Conformance{type(b).__name__}", (type(b),), {"name": f"conformance-{b.name}", "priority": -100})
    info = hal.register_backend(derived)
    try:
        assert info.available and info.distribution == "(registered in process)"
        assert f"conformance-{b.name}" in {i.name for i in hal.list_backends()}
        inst = hal.get_backend(f"conformance-{b.name}")
        assert type(inst) is derived and inst.device_count() == b.device_count()
        hal.refresh()  # a registration survives the entry-point cache being dropped
        assert type(hal.get_backend(f"conformance-{b.name}")) is derived
    finally:
        hal.unregister_backend(f"conformance-{b.name}")
    assert f"conformance-{b.name}" not in {i.name for i in hal.list_backends()}
    with pytest.raises(hal.BackendUnavailableError):
        hal.get_backend(f"conformance-{b.name}")
    with pytest.raises(TypeError):
        hal.register_backend(object)


# ---- op registry -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_registry_dispatch_matches_torch(hal_backend, dtype):
    x = hal_backend.to_device(_data((67, 129), dtype, seed=3))
    tol = dict(rtol=1.6e-2, atol=1e-5) if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(hal.ops.softmax(x, -1), torch.softmax(x, -1), **tol)
    torch.testing.assert_close(hal.ops.log_softmax(x, 0), torch.log_softmax(x, 0), **tol)
    torch.testing.assert_close(hal.ops.silu(x), torch.nn.functional.silu(x), **tol)
    w = hal_backend.to_device(torch.ones(129, dtype=dtype))
    torch.testing.assert_close(hal.ops.rms_norm(x, (129,), w, 1e-6),
                               x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(dtype),
                               rtol=2e-2, atol=2e-2)
    res = hal.ops.resolve("softmax", x.device, dtype)
    assert res.ok, res.rejected


def test_registry_fallback_policy_and_log(hal_backend):
    dev_type = hal_backend.device_type
    name = f"conformance_only_float64_{dev_type}"

    def reference(x):
        """2x + 1 with torch's kernels."""
        return x * 2 + 1

    op = hal.ops.define_op(name, f"hal::{name}", reference, register_cpu=False)
    hal.ops.REGISTRY.register(name, dev_type, reference, dtypes={"float64"})
    x = hal_backend.to_device(_data((5, 7), seed=4))
    with hal.ops.fallback_policy("error"):
        with pytest.raises(NotSupportedError) as ei:
            op(x)
    assert any("float32" in r for r in ei.value.reasons)
    hal.ops.clear_fallback_log()
    out = op(x, fallback="cpu")
    assert out.device == x.device and torch.equal(hal_backend.to_host(out), hal_backend.to_host(x) * 2 + 1)
    recs = [r for r in hal.ops.fallback_log() if r.op == name]
    assert len(recs) == 1 and recs[0].dtypes == ("float32",) and recs[0].shapes == ((5, 7),)
    expected_bytes = 0 if dev_type == "cpu" else 2 * 5 * 7 * 4
    assert recs[0].bytes_copied == expected_bytes and recs[0].seconds >= 0
    with pytest.warns(hal.ops.HalFallbackWarning):
        op(x, fallback="warn")
    x64 = hal_backend.to_device(_data((5, 7), torch.float64, seed=4))
    assert torch.equal(hal_backend.to_host(op(x64, fallback="error")), hal_backend.to_host(x64) * 2 + 1)


# ---- collectives -----------------------------------------------------------------------------
def test_collectives_two_real_processes(hal_backend):
    from hal.testing import collectives
    if hal_backend.device_type != "cpu" and hal_backend.device_count() < 2:
        pytest.skip(f"{hal_backend.name}: collectives need 2 devices, {hal_backend.device_count()} visible")
    t0 = time.monotonic()
    rows = collectives.run(hal_backend.name, 2, timeout_s=60, dtypes=("float32", "bfloat16", "int64"))
    failed = [r for r in rows if r.status == "fail"]
    assert not failed, failed
    assert {r.collective for r in rows} >= {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                             "all_to_all", "barrier"}
    assert time.monotonic() - t0 < 120
