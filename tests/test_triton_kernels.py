"""The CUDA backend's Triton kernels against a float64 reference, forward and backward.

Runs wherever torch.cuda and Triton work (CuPy is not needed: the kernels take torch tensors); skips
elsewhere with the reason, prefixed "cuda:" so HAL_REQUIRE_BACKENDS=cuda turns the skip into a failure. Every
check compares with torch in float64 on the CPU (inputs rounded to the test dtype first) within a
per-dtype tolerance; outputs are allocated over memory poisoned with NaN, so an element the kernel
never writes fails the check. Shapes cover non-powers of two, one row, 3-D inputs, rows longer than
the single-block limit, non-contiguous inputs (transposed, column slices), NaN and Inf. The module's
calls take the kernels whatever the routing table says (``routing.using("triton")``); the routing
cases compare both routes.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import triton_gpu_missing

from hal.backend import dtype_name

pytestmark = pytest.mark.skipif(bool(triton_gpu_missing()), reason=triton_gpu_missing() or "-")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
       torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}
GRAD_TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float16: dict(rtol=4e-3, atol=4e-3),
            torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}
SHAPES = [(1, 1000), (67, 129), (3, 5, 257), (8, 4096)]


@pytest.fixture(scope="module", autouse=True)
def _kernels_take_every_call():
    from hal.backends.cuda.kernels import routing
    with routing.using("triton"):
        yield


@pytest.fixture(scope="module")
def k():
    from hal.backends.cuda.kernels import cross_entropy, norms, silu_and_mul, softmax
    return {"softmax": softmax, "norms": norms, "silu": silu_and_mul, "ce": cross_entropy}


def poison():
    """Leave NaN in the caching allocator's free blocks so unwritten outputs show up."""
    junk = torch.full((64 << 20,), float("nan"), device="cuda")
    del junk


def rand(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def check(out, ref, dtype, tol=TOL):
    assert out.dtype == dtype or dtype is None
    torch.testing.assert_close(out.detach().cpu().double(), ref.detach().double(), equal_nan=True, **tol[out.dtype])


# ---- softmax / log_softmax --------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES + [(2, 70001)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_forward(k, dtype, shape, log):
    x = rand(shape, dtype, 1, scale=3.0)
    poison()
    out = (k["softmax"].log_softmax if log else k["softmax"].softmax)(x.cuda())
    ref = (torch.log_softmax if log else torch.softmax)(x.double(), -1)
    check(out, ref, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(67, 129), (5, 16384), (3, 20000), (2, 70001)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_backward(k, dtype, shape, log):
    x = rand(shape, dtype, 2).cuda().requires_grad_()
    dy = rand(shape, dtype, 3)
    y = (k["softmax"].log_softmax if log else k["softmax"].softmax)(x)
    poison()
    y.backward(dy.cuda())
    xd = x.detach().cpu().double().requires_grad_()
    (torch.log_softmax if log else torch.softmax)(xd, -1).backward(dy.double())
    check(x.grad, xd.grad, dtype, GRAD_TOL)


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("n", [1000, 4096, 20000])
def test_softmax_backward_single_and_two_pass_plans_agree(k, log, n):
    sx = k["softmax"]
    y = sx.softmax_forward(rand((7, n), torch.float32, 5).cuda(), log)
    dy = rand((7, n), torch.float32, 6).cuda()
    single = sx.bwd_plan(n)
    assert single[0]  # rows up to BWD_SINGLE_MAX take the single pass
    two_pass = (False, sx.BWD_TILE, 8)
    a = sx.softmax_backward(dy, y, log, torch.float32, plan=single)
    b = sx.softmax_backward(dy, y, log, torch.float32, plan=two_pass)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not sx.bwd_plan(sx.BWD_SINGLE_MAX + 1)[0]


def test_softmax_output_dtype_and_noncontiguous(k):
    base = rand((300, 64), torch.bfloat16, 4).cuda()
    xt = base.t()  # last dim not contiguous: copied to rows
    check(k["softmax"].softmax(xt), torch.softmax(xt.cpu().double(), -1), torch.bfloat16)
    xs = base[:, 5:50]  # a column slice: a strided view, no copy
    check(k["softmax"].log_softmax(xs), torch.log_softmax(xs.cpu().double(), -1), torch.bfloat16)
    out = k["softmax"].softmax(base, -1, torch.float32)
    assert out.dtype == torch.float32
    check(out, torch.softmax(base.cpu().double(), -1), torch.float32)


@pytest.mark.parametrize("n", [33, 70001])
def test_softmax_nan_inf(k, n):
    x = rand((5, n), torch.float32, 5)
    x[1, 3] = float("nan")
    x[2, 7] = float("inf")
    x[3, 9] = -float("inf")
    x[4, :] = -float("inf")
    for log in (False, True):
        out = (k["softmax"].log_softmax if log else k["softmax"].softmax)(x.cuda())
        ref = (torch.log_softmax if log else torch.softmax)(x.double(), -1)
        assert torch.equal(out.cpu().isnan(), ref.isnan())
        check(out, ref, torch.float32)


# ---- layer_norm / rms_norm / add_rms_norm ------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_layer_norm_forward(k, dtype, shape):
    n = shape[-1]
    x, w, b = rand(shape, dtype, 6, 2.0) + 0.5, rand((n,), dtype, 7), rand((n,), dtype, 8)
    poison()
    out = k["norms"].layer_norm(x.cuda(), (n,), w.cuda(), b.cuda(), 1e-5)
    check(out, F.layer_norm(x.double(), (n,), w.double(), b.double(), 1e-5), dtype)
    out = k["norms"].layer_norm(x.cuda(), (n,))
    check(out, F.layer_norm(x.double(), (n,)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_rms_norms_forward(k, dtype, shape):
    n = shape[-1]
    x, r, w = rand(shape, dtype, 9, 2.0), rand(shape, dtype, 10), rand((n,), dtype, 11)
    poison()
    check(k["norms"].rms_norm(x.cuda(), (n,), w.cuda(), 1e-6), F.rms_norm(x.double(), (n,), w.double(), 1e-6), dtype)
    check(k["norms"].rms_norm(x.cuda(), (n,)), F.rms_norm(x.double(), (n,), eps=torch.finfo(dtype).eps), dtype)
    y, h = k["norms"].add_rms_norm(x.cuda(), r.cuda(), (n,), w.cuda(), 1e-6)
    h_ref = x + r  # rounded to the storage dtype, as the unfused sequence stores it
    assert torch.equal(h.cpu(), h_ref)
    check(y, F.rms_norm(h_ref.double(), (n,), w.double(), 1e-6), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(67, 129), (4, 3, 4096)])
def test_norms_backward(k, dtype, shape):
    n = shape[-1]
    dy, dh = rand(shape, dtype, 12), rand(shape, dtype, 13)

    def leaves(*ts):
        return [t.cuda().requires_grad_() for t in ts], [t.double().requires_grad_() for t in ts]

    (x, w, b), (xd, wd, bd) = leaves(rand(shape, dtype, 14), rand((n,), dtype, 15), rand((n,), dtype, 16))
    k["norms"].layer_norm(x, (n,), w, b, 1e-5).backward(dy.cuda())
    F.layer_norm(xd, (n,), wd, bd, 1e-5).backward(dy.double())
    for got, want in ((x, xd), (w, wd), (b, bd)):
        check(got.grad, want.grad, dtype, GRAD_TOL)

    (x, w), (xd, wd) = leaves(rand(shape, dtype, 17), rand((n,), dtype, 18))
    k["norms"].rms_norm(x, (n,), w, 1e-6).backward(dy.cuda())
    F.rms_norm(xd, (n,), wd, 1e-6).backward(dy.double())
    check(x.grad, xd.grad, dtype, GRAD_TOL)
    check(w.grad, wd.grad, dtype, GRAD_TOL)

    (x, r, w), (xd, rd, wd) = leaves(rand(shape, dtype, 19), rand(shape, dtype, 20), rand((n,), dtype, 21))
    y, h = k["norms"].add_rms_norm(x, r, (n,), w, 1e-6)
    torch.autograd.backward([y, h], [dy.cuda(), dh.cuda()])
    hd = xd + rd  # the kernel normalises h rounded to the storage dtype: so does the reference
    hd = hd + (h.detach().cpu().double() - hd).detach()
    torch.autograd.backward([F.rms_norm(hd, (n,), wd, 1e-6), hd], [dy.double(), dh.double()])
    for got, want in ((x, xd), (r, rd), (w, wd)):
        check(got.grad, want.grad, dtype, GRAD_TOL)


def test_norms_noncontiguous_multidim_and_nan(k):
    x = rand((64, 96), torch.float32, 22).cuda()
    xt = x.t()
    check(k["norms"].layer_norm(xt, (64,)), F.layer_norm(xt.cpu().double(), (64,)), torch.float32)
    xs = x[:, 10:74]
    check(k["norms"].rms_norm(xs, (64,), None, 1e-6), F.rms_norm(xs.cpu().double(), (64,), None, 1e-6), torch.float32)
    x4 = rand((2, 3, 4, 5), torch.float32, 23)
    check(k["norms"].layer_norm(x4.cuda(), (4, 5)), F.layer_norm(x4.double(), (4, 5)), torch.float32)
    xn = rand((4, 33), torch.float32, 24)
    xn[1, 2], xn[2, 3] = float("nan"), float("inf")
    for got, ref in ((k["norms"].layer_norm(xn.cuda(), (33,)), F.layer_norm(xn.double(), (33,))),
                     (k["norms"].rms_norm(xn.cuda(), (33,), None, 1e-6), F.rms_norm(xn.double(), (33,), None, 1e-6))):
        assert torch.equal(got.cpu().isnan(), ref.isnan())
        check(got, ref, torch.float32)


# ---- silu_and_mul ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 2000), (67, 258), (3, 5, 2 * 4099)])
def test_silu_and_mul(k, dtype, shape):
    x = rand(shape, dtype, 25, 3.0)
    poison()
    a, b = x.double().chunk(2, -1)
    check(k["silu"].silu_and_mul(x.cuda()), F.silu(a) * b, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul_backward_noncontiguous_nan(k, dtype):
    base = rand((40, 300), dtype, 26, 3.0)
    base[3, 5], base[4, 7] = float("nan"), float("inf")
    xs = base.cuda()[:, 20:276]  # strided view (row stride 300, not 256): no copy
    x = rand((40, 256), dtype, 32, 3.0).cuda().requires_grad_()
    a, b = xs.cpu().double().chunk(2, -1)
    check(k["silu"].silu_and_mul(xs), F.silu(a) * b, dtype)
    dy = rand((40, 128), dtype, 27)
    k["silu"].silu_and_mul(x).backward(dy.cuda())
    xd = x.detach().cpu().double().requires_grad_()
    aa, bb = xd.chunk(2, -1)
    (F.silu(aa) * bb).backward(dy.double())
    check(x.grad, xd.grad, dtype, GRAD_TOL)


# ---- cross_entropy --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,classes", [(1, 1000), (67, 129), (16, 32000), (3, 131072), (600, 32000)])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy(k, dtype, rows, classes, reduction):
    x = rand((rows, classes), dtype, 28, 2.0)
    t = torch.randint(0, classes, (rows,), generator=torch.Generator().manual_seed(29))
    if rows > 2:
        t[1] = -100
    xc = x.cuda().requires_grad_()
    loss = k["ce"].cross_entropy(xc, t.cuda(), reduction=reduction)
    xd = x.double().requires_grad_()
    ref = F.cross_entropy(xd, t, reduction=reduction)
    check(loss, ref, dtype)
    g = rand(ref.shape, dtype, 30)
    poison()
    loss.backward(g.cuda())
    ref.backward(g.double())
    check(xc.grad, xd.grad, dtype, GRAD_TOL)


def test_cross_entropy_sum_ignore_nan(k):
    x = rand((6, 77), torch.float32, 31)
    x[2, 4] = float("nan")
    t = torch.tensor([1, 2, 3, -100, 5, 6])
    got = k["ce"].cross_entropy(x.cuda(), t.cuda(), reduction="none")
    ref = F.cross_entropy(x.double(), t, reduction="none")
    assert torch.equal(got.cpu().isnan(), ref.isnan())
    check(got, ref, torch.float32)
    x[2, 4] = 0.0
    check(k["ce"].cross_entropy(x.cuda(), t.cuda(), reduction="sum"), F.cross_entropy(x.double(), t, reduction="sum"),
          torch.float32)
    allignored = torch.full((6,), 7)
    assert torch.isnan(k["ce"].cross_entropy(x.cuda(), allignored.cuda(), ignore_index=7)).item()


# ---- wide-row norm backward (two-stage: dx row kernel + column-tiled dw/db) ---------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 8192), (64, 16384), (2, 32768), (1024, 12288), (3, 4097)])
def test_norms_backward_wide(k, dtype, shape):
    n = shape[-1]
    dy = rand(shape, dtype, 40)
    x, w, b = rand(shape, dtype, 41, 2.0) + 0.5, rand((n,), dtype, 42), rand((n,), dtype, 43)
    # dw/db sum over the rows: the tolerance grows with the row count (float64 reference)
    wtol = {dt: dict(rtol=t["rtol"], atol=t["atol"] * max(1, shape[0] // 8)) for dt, t in GRAD_TOL.items()}
    for has_w, has_b in ((True, True), (False, False), (True, False)):
        xc = x.cuda().requires_grad_()
        wc = w.cuda().requires_grad_() if has_w else None
        bc = b.cuda().requires_grad_() if has_b else None
        poison()
        k["norms"].layer_norm(xc, (n,), wc, bc, 1e-5).backward(dy.cuda())
        xd = x.double().requires_grad_()
        wd = w.double().requires_grad_() if has_w else None
        bd = b.double().requires_grad_() if has_b else None
        F.layer_norm(xd, (n,), wd, bd, 1e-5).backward(dy.double())
        check(xc.grad, xd.grad, dtype, GRAD_TOL)
        if has_w:
            check(wc.grad, wd.grad, dtype, wtol)
        if has_b:
            check(bc.grad, bd.grad, dtype, wtol)
    xc, wc = x.cuda().requires_grad_(), w.cuda().requires_grad_()
    k["norms"].rms_norm(xc, (n,), wc, 1e-6).backward(dy.cuda())
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    F.rms_norm(xd, (n,), wd, 1e-6).backward(dy.double())
    check(xc.grad, xd.grad, dtype, GRAD_TOL)
    check(wc.grad, wd.grad, dtype, wtol)
    r, dh = rand(shape, dtype, 44), rand(shape, dtype, 45)
    xc, rc, wc = x.cuda().requires_grad_(), r.cuda().requires_grad_(), w.cuda().requires_grad_()
    y, h = k["norms"].add_rms_norm(xc, rc, (n,), wc, 1e-6)
    torch.autograd.backward([y, h], [dy.cuda(), dh.cuda()])
    xd, rd, wd = x.double().requires_grad_(), r.double().requires_grad_(), w.double().requires_grad_()
    hd = xd + rd
    hd = hd + (h.detach().cpu().double() - hd).detach()
    torch.autograd.backward([F.rms_norm(hd, (n,), wd, 1e-6), hd], [dy.double(), dh.double()])
    check(xc.grad, xd.grad, dtype, GRAD_TOL)
    check(rc.grad, rd.grad, dtype, GRAD_TOL)
    check(wc.grad, wd.grad, dtype, wtol)


# ---- backward plans (norms.BWD_TUNED): every kind at every tuned width, against float64 ------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1000, 4096, 5000, 16384, 32768])
@pytest.mark.parametrize("kind", ["shipped", "fused p1", "fused p8", "fused p1 s2", "fused p2 s4", "two-stage",
                                  "two-stage single"])
def test_norm_backward_plans(k, dtype, n, kind):
    norms = k["norms"]
    m = 37  # not a multiple of any strip: the last program's strip is short
    dy = rand((m, n), dtype, 50)
    x, w, b = rand((m, n), dtype, 51, 2.0) + 0.5, rand((n,), dtype, 52), rand((n,), dtype, 53)
    wtol = {dt: dict(rtol=t["rtol"], atol=t["atol"] * 4) for dt, t in GRAD_TOL.items()}
    block = norms.next_power_of_2(n)
    warps = 16 if block >= 8192 else 4
    if kind == "two-stage single" and block > 16384:
        pytest.skip("the dx row is held in registers up to 16384 wide (the tuner's range)")
    for is_rms in (False, True):
        if kind == "shipped":
            plan = norms.bwd_plan(n, dtype, is_rms)
            tuned = norms.BWD_TUNED.get(("rms_norm" if is_rms else "layer_norm", dtype_name(dtype), block))
            assert plan == (norms.default_bwd_plan(n) if tuned is None else norms.plan_named(tuned, n))
        elif kind.startswith("two-stage"):
            plan = norms.plan_named("two-stage" if kind == "two-stage" else f"two-stage single w{warps}", n)
            assert plan.single == (kind != "two-stage" or block <= norms.DX_SINGLE_MAX)
        else:
            words = kind.split()  # "fused pP [sS]" -> "fused pP wW [sS]"
            plan = norms.plan_named(" ".join(words[:2] + [f"w{warps}"] + words[2:]), n)
            assert plan.fused and plan.split == (int(words[2][1:]) if len(words) > 2 else 1)
        bias = None if is_rms else b.cuda()
        xc, wc = x.cuda(), w.cuda()
        _, _, mean, rstd = norms.norm_forward(xc, None, wc, bias, 1e-5, is_rms, n)
        poison()
        dx, dw, db = norms.norm_backward(dy.cuda(), xc, wc, bias, mean, rstd, None, is_rms, n, plan=plan)
        xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
        bd = None if is_rms else b.double().requires_grad_()
        y = F.rms_norm(xd, (n,), wd, 1e-5) if is_rms else F.layer_norm(xd, (n,), wd, bd, 1e-5)
        y.backward(dy.double())
        check(dx, xd.grad, dtype, GRAD_TOL)
        check(dw, wd.grad, dtype, wtol)
        if not is_rms:
            check(db, bd.grad, dtype, wtol)


def test_norms_rows_past_the_kernel_limit_go_to_torch(k):
    x = rand((4, 65536), torch.float32, 46).cuda().requires_grad_()
    w = rand((65536,), torch.float32, 47).cuda().requires_grad_()
    y = k["norms"].layer_norm(x, (65536,), w, None, 1e-5)
    assert "LayerNormFunction" not in type(y.grad_fn).__name__  # torch's kernel and autograd
    y.sum().backward()
    xd, wd = x.detach().cpu().double().requires_grad_(), w.detach().cpu().double().requires_grad_()
    F.layer_norm(xd, (65536,), wd, None, 1e-5).sum().backward()
    check(x.grad, xd.grad, torch.float32, GRAD_TOL)


# ---- routing: the same call through torch's kernel and through the Triton kernel -------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_routed_to_torch_equals_kernel(k, dtype):
    from hal.backends.cuda.kernels import routing
    n = 1024
    x, w, b, dy = rand((64, n), dtype, 48), rand((n,), dtype, 49), rand((n,), dtype, 50), rand((64, n), dtype, 51)
    grads = {}
    for route in ("torch", "triton"):
        with routing.using(route):
            xc, wc, bc = (t.cuda().requires_grad_() for t in (x, w, b))
            y = k["norms"].layer_norm(xc, (n,), wc, bc, 1e-5)
            assert ("LayerNormFunction" in type(y.grad_fn).__name__) == (route == "triton"), y.grad_fn
            if route == "torch":
                assert torch.equal(y, F.layer_norm(x.cuda(), (n,), w.cuda(), b.cuda(), 1e-5))
            y.backward(dy.cuda())
            s = k["softmax"].softmax(x.cuda(), -1)
            ce = k["ce"].cross_entropy(x.cuda(), torch.arange(64, device="cuda"))
            grads[route] = (y.detach(), xc.grad, wc.grad, bc.grad, s, ce)
    for a, b_ in zip(grads["torch"], grads["triton"]):
        check(b_, a.cpu().double(), dtype, GRAD_TOL)


def test_hal_ops_dispatch_takes_the_kernel_wrapper_directly(k):
    """hal.ops caches the self-checking kernel wrapper itself (no predicate chain per call), with its size
    route: cache entries are ``(implementation, plain, low, high, (floor of each grad state))``, the floors
    copied from routing's, plain torch's builtin."""
    import hal.ops as H
    from hal.backends.cuda.kernels import routing
    from hal.ops import torch_impl
    x = rand((8, 256), torch.float32, 52).cuda()
    check(H.rms_norm(x, (256,), None, 1e-6), F.rms_norm(x.cpu().double(), (256,), None, 1e-6), torch.float32)
    entries = [v for cache in H._caches for v in cache.values() if v[0] is k["norms"].rms_norm]
    floors = routing.dispatch_floors()
    by_grad = tuple(floors[("rms_norm", torch.float32, g)] for g in (0, 1, 2))
    assert entries and entries[0][1] is torch_impl.direct("rms_norm") and entries[0][4] == by_grad
    assert entries[0][2:4] == (min(by_grad), max(by_grad))


# ---- timing report (not a test): python tests/test_triton_kernels.py OUT.json ----------------------
def _timing_report(path: str) -> None:
    """GPU time of the paths issue 23 measured slow (wide-row norm backward, cross_entropy at 32000
    classes) and host time per call at decode-size shapes, HAL kernels vs torch, written to ``path``
    as JSON rows {"kernel","dtype","shape","direction","timing","hal_us","torch_us"}. Eager, CUDA
    events (device) or perf_counter around synchronised loops (wall); no CUDA graph."""
    import json
    import time

    import hal.ops as H
    from hal.backends.cuda.kernels import cross_entropy, norms, routing

    def device_us(fn, n=20):
        fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            fn()
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e) / n * 1e3

    def wall_us(fn, n=200):
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e6

    rows = []

    def row(kernel, dtype, shape, direction, timing, hal, ref):
        r = {"kernel": kernel, "dtype": str(dtype).replace("torch.", ""), "shape": list(shape),
             "direction": direction, "timing": timing}
        try:
            timer = device_us if timing == "device" else wall_us
            r["hal_us"], r["torch_us"] = timer(hal), timer(ref)
            r["speedup_vs_torch"] = r["torch_us"] / r["hal_us"]
        except Exception as exc:  # one failing case must not lose the others
            r["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(r)
        print(json.dumps(r), flush=True)

    def norms_bwd(dt, m, n):
        x = torch.randn(m, n, device="cuda", dtype=dt, requires_grad=True)
        w = torch.randn(n, device="cuda", dtype=dt, requires_grad=True)
        b = torch.randn(n, device="cuda", dtype=dt, requires_grad=True)
        dy = torch.randn_like(x)
        with routing.using("triton"):
            yl, yr = norms.layer_norm(x, (n,), w, b, 1e-5), norms.rms_norm(x, (n,), w, 1e-6)
        assert "LayerNormFunction" in type(yl.grad_fn).__name__
        tl_, tr = F.layer_norm(x, (n,), w, b, 1e-5), F.rms_norm(x, (n,), w, 1e-6)

        def bwd(y, ins):
            return lambda: torch.autograd.grad(y, ins, dy, retain_graph=True)
        row("layer_norm", dt, (m, n), "bwd", "device", bwd(yl, (x, w, b)), bwd(tl_, (x, w, b)))
        row("rms_norm", dt, (m, n), "bwd", "device", bwd(yr, (x, w)), bwd(tr, (x, w)))

    def ce(dt, m, v):
        xc = torch.randn(m, v, device="cuda", dtype=dt, requires_grad=True)
        tc = torch.randint(0, v, (m,), device="cuda")
        xd = xc.detach()
        with routing.using("triton"):
            row("cross_entropy", dt, (m, v), "fwd", "device", lambda: cross_entropy.cross_entropy(xd, tc),
                lambda: F.cross_entropy(xd, tc))
            lc = cross_entropy.cross_entropy(xc, tc)
        ltc = F.cross_entropy(xc, tc)
        row("cross_entropy", dt, (m, v), "bwd", "device", lambda: torch.autograd.grad(lc, xc, retain_graph=True),
            lambda: torch.autograd.grad(ltc, xc, retain_graph=True))

    def host(dt):
        # decode-size call through hal.ops: with the routing table in use (torch below its thresholds),
        # then with the kernel forced
        xs, ws = torch.randn(8, 4096, device="cuda", dtype=dt), torch.randn(4096, device="cuda", dtype=dt)
        row("rms_norm", dt, (8, 4096), "fwd", "wall", lambda: H.rms_norm(xs, (4096,), ws, 1e-6),
            lambda: F.rms_norm(xs, (4096,), ws, 1e-6))
        with routing.using("triton"):
            row("rms_norm[kernel forced]", dt, (8, 4096), "fwd", "wall", lambda: H.rms_norm(xs, (4096,), ws, 1e-6),
                lambda: F.rms_norm(xs, (4096,), ws, 1e-6))

    for dt in (torch.float32, torch.bfloat16):
        for m, n in ((4096, 16384), (2048, 32768), (8192, 8192), (16384, 4096), (65536, 1024)):
            norms_bwd(dt, m, n)
        ce(dt, 4096, 32000)
        ce(dt, 16, 32000)
        host(dt)
    with open(path, "w") as f:
        json.dump({"routing": routing.table()["source"], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    import sys
    _timing_report(sys.argv[1])
