"""The CUDA backend: probe, devices, CuPy-pool memory with DLPack, streams shared with CuPy, the op
registry's Triton routing, ATen routing and a training step through the kernels.

The GPU tests skip with the backend's own probe reason where CUDA is not usable (CI); the tests at
the top run everywhere and check what the backend does without CuPy, Triton or a GPU.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import hal
import hal.ops

_INFO = {i.name: i for i in hal.list_backends()}.get("cuda")
CUDA_OK = bool(_INFO and _INFO.available)
needs_cuda = pytest.mark.skipif(not CUDA_OK, reason=f"cuda: {_INFO.reason if _INFO else 'backend not installed'}")


# ---- everywhere -------------------------------------------------------------------------------
def test_entry_point_and_probe_reason():
    assert _INFO is not None and _INFO.target == "hal.backends.cuda:CudaBackend"
    from hal.backends.cuda import CudaBackend
    assert _INFO.cls is CudaBackend and CudaBackend.dist_backend == "nccl" and CudaBackend.device_type == "cuda"
    if not CUDA_OK:
        assert _INFO.reason and "torch.cuda.is_available() is False" in _INFO.reason


def test_contract_cuda_available_without_cupy_or_triton(monkeypatch):
    """Availability is torch.cuda's alone: with CuPy and Triton unimportable (a stand-in torch.cuda
    that says one device is there) the probe says available and names what is missing and why."""
    from hal.backends.cuda import CudaBackend
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    av = CudaBackend.probe()
    assert av.available, av.reason
    assert "cupy_pool_interop: unavailable (cupy is not importable" in av.reason
    assert "triton_kernels: unavailable (triton is not importable" in av.reason
    extras = CudaBackend.extras()
    assert not extras["cupy_pool_interop"].available and not extras["triton_kernels"].available
    from hal.ops import torch_impl
    reg = hal.ops.OpRegistry()
    for name, (aten, reaches, fn) in torch_impl.OPS.items():
        reg.define(name, aten, fn, reaches=reaches)
    b = CudaBackend()
    b.register_ops(reg)  # torch's kernels only, with the reason
    assert b.kernel_status.startswith("torch kernels only: triton kernels unavailable")
    assert reg.resolve("softmax", "cuda", "float32").ok


def test_library_sets_no_site_settings():
    """NCCL_NVLS_ENABLE & co. are site settings exported by the scripts that need them, not by HAL."""
    import os
    import subprocess
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "TORCH_SYMM_MEM"))}
    code = ("import os; from hal.backends.cuda import CudaBackend; CudaBackend(); "
            "print(sorted(k for k in os.environ if k.startswith(('NCCL_', 'TORCH_SYMM_MEM'))))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr[-1000:])


def test_peaks_table_has_provenance():
    import json
    import pathlib
    from hal.backends.cuda import CudaBackend
    table = json.loads(pathlib.Path(CudaBackend.data_file("peaks.json")).read_text())["devices"]
    assert table and all(row["peaks"] and "measured" in row["source"] or "datasheet" in row["source"]
                         for row in table.values())


def test_package_imports_without_sdks(tmp_path):
    """In a fresh process, importing the backend's modules imports neither CuPy nor Triton. Stand-in
    ``cupy`` and ``triton`` packages first on the path record any import, so the check can fail on a
    machine without the SDKs as well as on the GPU host."""
    for sdk in ("cupy", "triton"):
        (tmp_path / sdk).mkdir()
        (tmp_path / sdk / "__init__.py").write_text("STAND_IN = True\n")
    code = ("import sys\n"
            "for m in ('hal.backends.cuda', 'hal.backends.cuda.kernels', 'hal.backends.cuda.interop', "
            "'hal.backends.cuda.aten'):\n    __import__(m)\n"
            "print(sorted(m for m in ('cupy', 'triton') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    # the stand-ins are visible to that process: an import of them would have been seen
    seen = subprocess.run([sys.executable, "-c", "import cupy, triton; print(cupy.STAND_IN and triton.STAND_IN)"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert seen.stdout.strip() == "True", seen.stderr


def test_rows_view_logic():
    from hal.backends.cuda.kernels._rows import as_rows, next_power_of_2
    assert [next_power_of_2(n) for n in (1, 2, 3, 1000, 4096, 70001)] == [1, 2, 4, 1024, 4096, 131072]
    base = torch.randn(10, 300)
    v = as_rows(base[:, 20:276])
    assert v.data_ptr() == base[:, 20:276].data_ptr() and v.stride() == (300, 1)  # a view, not a copy
    t = as_rows(base.t())
    assert t.is_contiguous() and torch.equal(t, base.t())
    assert as_rows(torch.randn(2, 3, 5)).shape == (6, 5)


def test_predicates_reject_with_reasons():
    from hal.backends.cuda import kernels
    cpu = torch.randn(4, 8)
    assert "cpu" in kernels.supports_softmax(cpu)
    meta = torch.empty(4, 8, device="meta")
    assert "not cuda" in kernels.supports_layer_norm(meta, (8,))


# ---- on a GPU -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cuda():
    if not CUDA_OK:
        pytest.skip(f"cuda: {_INFO.reason if _INFO else 'backend not installed'}")
    return hal.get_backend("cuda")


@needs_cuda
def test_versions_and_properties(cuda):
    v = cuda.versions()
    assert {"torch", "cupy", "cuda_torch"} <= set(v), v
    p = cuda.device_properties(0)
    assert p.capability >= (7, 0) and p.total_memory > 0 and "bfloat16" in p.dtypes
    assert p.extra["multi_processor_count"] > 0
    if "H200" in p.name:
        assert p.peaks["copy_bytes_per_s"] == 4.3e12 and "H200" in p.peaks_source
    with pytest.raises(IndexError):
        cuda.device_properties(cuda.device_count())


@needs_cuda
def test_allocate_is_cupy_pool_memory_shared_with_torch(cuda):
    import cupy
    from hal.backends.cuda import interop
    pool = cupy.get_default_memory_pool()
    before = pool.used_bytes()
    t = cuda.allocate((1024, 257), torch.bfloat16)
    assert pool.used_bytes() - before >= 1024 * 257 * 2
    t.fill_(1.5)
    view = interop.cupy_from_tensor(t)  # bf16 -> uint16 view of the same bytes
    assert view.data.ptr == t.data_ptr()
    f = cuda.allocate((100,), torch.float32)
    c = interop.cupy_from_tensor(f)
    c[...] = cupy.arange(100, dtype=cupy.float32)  # written by CuPy, read by torch: zero copy
    assert torch.equal(f.cpu(), torch.arange(100, dtype=torch.float32))
    back = interop.tensor_from_cupy(c)
    assert back.data_ptr() == f.data_ptr()
    del t, view, f, c, back
    assert pool.used_bytes() <= before + 512  # blocks went back to the pool


@needs_cuda
def test_memory_stats_peak_is_torch_peak_plus_cupy(cuda):
    cuda.synchronize()
    cuda.reset_peak_memory_stats()
    x = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    del x
    s = cuda.memory_stats()
    import cupy
    assert s.peak == torch.cuda.max_memory_allocated() + cupy.get_default_memory_pool().used_bytes()
    assert s.peak >= 32 << 20 and "cupy" in s.source and s.total > s.free > 0


@needs_cuda
def test_streams_round_trip_with_cupy(cuda):
    import cupy
    from hal.backends.cuda import interop
    s = cuda.create_stream()
    cs = interop.cupy_stream_from_torch(s)
    assert cs.ptr == s.raw.cuda_stream
    x = torch.randn(1 << 20, device="cuda")
    cuda.synchronize()
    with cs:  # CuPy work on the torch stream ...
        arr = interop.cupy_from_tensor(x)
        arr *= 2
    with cuda.use_stream(s):  # ... is ordered before torch work on the same stream
        y = x + 1
    s.synchronize()
    assert torch.allclose(y, interop.tensor_from_cupy(arr) + 1)
    native = cupy.cuda.Stream(non_blocking=True)
    ts = interop.torch_stream_from_cupy(native)
    assert ts.raw.cuda_stream == native.ptr
    with cuda.use_stream(ts):
        z = torch.ones(10, device="cuda") * 3
    ev = ts.record_event()
    ev.synchronize()
    assert ts.query() and z.sum().item() == 30


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_registry_routes_to_triton_with_reasons(cuda, dtype):
    pytest.importorskip("triton", reason="cuda: triton is not importable")
    x = torch.randn(64, 100, device="cuda", dtype=dtype)
    for op in ("softmax", "log_softmax", "layer_norm", "rms_norm", "add_rms_norm", "silu_and_mul", "cross_entropy"):
        res = hal.ops.resolve(op, x.device, dtype)
        assert res.impl is not None and res.impl.impl == "triton", (op, res)
    res = hal.ops.REGISTRY.resolve("softmax", "cuda", str(dtype).split(".")[1], (x, 0), {})
    assert res.impl.impl == "torch" and any("not the last dim" in r for r in res.rejected)
    torch.testing.assert_close(hal.ops.softmax(x, 0), torch.softmax(x, 0))  # non-last dim: torch's kernel
    res64 = hal.ops.resolve("softmax", x.device, torch.float64)
    assert res64.impl.impl == "torch"


@needs_cuda
def test_aten_routing_switch(cuda):
    pytest.importorskip("triton", reason="cuda: triton is not importable")
    from hal.backends.cuda import aten
    model = torch.nn.Sequential(torch.nn.Linear(96, 96), torch.nn.LayerNorm(96), torch.nn.Softmax(-1)).cuda()
    x = torch.randn(33, 96, device="cuda", requires_grad=True)
    ref = model(x)
    ref.sum().backward()
    g_ref = x.grad.clone()
    x.grad = None
    before = dict(aten.CALLS)
    with aten.routed():
        out = model(x)
        (out.sum()).backward()
        lsm = F.log_softmax(x, 0)
    assert aten.CALLS["native_layer_norm"] > before["native_layer_norm"]
    assert aten.CALLS["_softmax"] > before["_softmax"] and aten.CALLS["_log_softmax"] > before["_log_softmax"]
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x.grad, g_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lsm, torch.log_softmax(x, 0))
    assert not aten.is_routed()
    n = dict(aten.CALLS)
    torch.softmax(x, -1)
    assert aten.CALLS == n


@needs_cuda
def test_training_step_through_hal_ops_matches_torch(cuda):
    pytest.importorskip("triton", reason="cuda: triton is not importable")
    torch.manual_seed(0)
    d, vocab = 128, 1000
    emb = torch.randn(vocab, d, device="cuda", dtype=torch.bfloat16) * 0.02
    w_in = (torch.randn(d, 4 * d, device="cuda", dtype=torch.bfloat16) * 0.05).requires_grad_()
    w_out = (torch.randn(2 * d, vocab, device="cuda", dtype=torch.bfloat16) * 0.05).requires_grad_()
    g = torch.ones(d, device="cuda", dtype=torch.bfloat16).requires_grad_()
    tokens = torch.randint(0, vocab, (64,), device="cuda")
    target = torch.randint(0, vocab, (64,), device="cuda")

    def step(ops):
        h = emb[tokens]
        y, _ = ops.add_rms_norm(h, h, (d,), g, 1e-6)
        logits = ops.silu_and_mul(y @ w_in) @ w_out
        loss = ops.cross_entropy(logits, target)
        grads = torch.autograd.grad(loss, (w_in, w_out, g))
        return loss, grads

    import types

    from hal.ops import torch_impl
    loss, grads = step(hal.ops)
    assert hal.ops.resolve("cross_entropy", emb.device, torch.bfloat16).impl.impl == "triton"
    ref_loss, ref_grads = step(types.SimpleNamespace(**{k: v[2] for k, v in torch_impl.OPS.items()}))
    torch.testing.assert_close(loss, ref_loss, rtol=2e-2, atol=2e-2)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a.float(), b.float(), rtol=5e-2, atol=5e-3)
