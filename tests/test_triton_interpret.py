"""The CUDA backend's Triton kernels under Triton's CPU interpreter, against float64 torch (no GPU needed).

``TRITON_INTERPRET=1`` must be set before Triton is first imported, and the pytest process may have
imported Triton already (or may import it later for other tests): so each test runs this file as a
script in a fresh ``python`` subprocess with ``TRITON_INTERPRET=1`` (``python tests/test_triton_interpret.py
CASE`` runs one case by hand). Inside, the kernel wrappers are pointed at CPU tensors
(``_rows.KERNEL_DEVICE = "cpu"``) and the SM count is injected (:func:`_rows.set_sm_count`), so the
launch paths that query the GPU are exercised with known values. Shapes are small (the interpreter
is slow) but take every path: the fused narrow-row norm backward, the two-stage wide-row backward
with the dx row in registers and looped over column tiles, several and partial weight-gradient row
groups, weight/bias present and absent, the routing decision both ways.

Skipped, with the reason, where Triton is not importable (torch 2.13.0's CPU build brings none) and where numpy
is 2.4 or newer (torch 2.4.1's venv, whose Triton is 3.0.0; Triton 3.6's interpreter fails there on loop bounds:
``pip install "numpy<2.4"``). CI's third leg, ``make test-triton-interpret``, has both (Triton 3.6.0, the GPU
machine's, and numpy < 2.4 in ``.venv-triton``) and sets ``HAL_REQUIRE_BACKENDS=triton-interpret``, under which
those skips (their reasons start ``"triton-interpret: "``) fail instead (tests/conftest.py).
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest



def _has_triton() -> bool:
    """Whether a Triton package is installed (found without importing it: the subprocesses import it)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def _numpy_too_new() -> str:
    """Triton 3.6's interpreter calls ``int()`` on 1-element arrays (loop bounds), which numpy >= 2.4
    refuses: '' when the installed numpy is older, else the reason to skip."""
    try:
        from importlib.metadata import version
        major, minor = (int(p) for p in version("numpy").split(".")[:2])
    except Exception:
        return ""
    return f"numpy {major}.{minor} >= 2.4 breaks Triton 3.6's interpreter (int() of a 1-element array)" \
        if (major, minor) >= (2, 4) else ""


_HAS_TRITON = _has_triton()
_UNUSABLE = _numpy_too_new() if _HAS_TRITON else "triton is not importable: the interpreter tests need it"
# prefixed so that HAL_REQUIRE_BACKENDS=triton-interpret (CI's third leg) turns the skip into a failure
pytestmark = [pytest.mark.skipif(bool(_UNUSABLE), reason=f"triton-interpret: {_UNUSABLE}")]

CASES = ["norms_layer", "norms_rms", "add_rms", "norm_plans", "routing", "softmax_silu", "cross_entropy",
         "linear_cross_entropy"]


@pytest.mark.parametrize("case", CASES)
def test_interpreted(case):
    env = {**os.environ, "TRITON_INTERPRET": "1", "HAL_CUDA_ROUTING": ""}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), case], capture_output=True, text=True,
                         timeout=600, env=env, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, f"case {case} failed:\n{out.stdout[-4000:]}\n{out.stderr[-8000:]}"
    assert f"case {case} ok" in out.stdout, out.stdout[-2000:]


# ---- the worker (runs in the subprocess) ----------------------------------------------------------
def _setup():
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    import torch
    from hal.backends.cuda.kernels import _rows
    _rows.KERNEL_DEVICE = "cpu"
    return torch


def _rand(torch, shape, seed, dtype=None, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g) * scale
    return t.to(dtype or torch.float32)


TOL = {"float32": dict(rtol=1e-4, atol=1e-4), "float16": dict(rtol=4e-3, atol=4e-3)}


def _close(torch, got, want, dtype, what, scale_atol=1.0):
    tol = dict(TOL[str(dtype).replace("torch.", "")])
    tol["atol"] *= scale_atol
    torch.testing.assert_close(got.detach().double(), want.detach().double(), equal_nan=True, msg=lambda m: f"{what}: {m}",
                               **tol)


def _leaves(torch, *ts):
    return ([None if t is None else t.clone().requires_grad_() for t in ts],
            [None if t is None else t.double().requires_grad_() for t in ts])


# (rows, N, sms): fused narrow backward; two-stage with dx in registers (N=4100 -> block 8192) and
# several / partial row groups; two-stage with the dx row looped over column tiles (N=9000)
NORM_SHAPES = [(7, 300, 4), (40, 4100, 64), (3, 9000, 4), (37, 9000, 64)]


def case_norms_layer():
    torch = _setup()
    import torch.nn.functional as F
    from hal.backends.cuda.kernels import _rows, norms, routing
    with routing.using("triton"):
        for rows, n, sms in NORM_SHAPES:
            _rows.set_sm_count(torch.device("cpu"), sms)
            for has_w, has_b in ((True, True), (False, False), (True, False), (False, True)):
                for dtype in ((torch.float32, torch.float16) if n == 9000 and has_w and has_b else (torch.float32,)):
                    x = _rand(torch, (rows, n), 1, dtype, 2.0) + 0.5
                    w = _rand(torch, (n,), 2, dtype) if has_w else None
                    b = _rand(torch, (n,), 3, dtype) if has_b else None
                    dy = _rand(torch, (rows, n), 4, dtype)
                    (xk, wk, bk), (xd, wd, bd) = _leaves(torch, x, w, b)
                    y = norms.layer_norm(xk, (n,), wk, bk, 1e-5)
                    assert type(y.grad_fn).__name__ == "LayerNormFunctionBackward", y.grad_fn
                    y.backward(dy)
                    yd = F.layer_norm(xd, (n,), wd, bd, 1e-5)
                    yd.backward(dy.double())
                    what = f"layer_norm {rows}x{n} w={has_w} b={has_b} {dtype} sms={sms}"
                    _close(torch, y, yd, dtype, what)
                    _close(torch, xk.grad, xd.grad, dtype, what + " dx")
                    # dw/db sum over rows: the tolerance scales with the row count
                    if has_w:
                        _close(torch, wk.grad, wd.grad, dtype, what + " dw", rows)
                    if has_b:
                        _close(torch, bk.grad, bd.grad, dtype, what + " db", rows)
        # rows with a gap between them (a column slice; the outputs are allocated like the rows) and a 3-D
        # input: contiguous outputs of the input's shape, gradients into the slice
        _rows.set_sm_count(torch.device("cpu"), 4)
        wide = _rand(torch, (6, 2, 40), 5).requires_grad_()
        w, b = _rand(torch, (30,), 6), _rand(torch, (30,), 7)
        y = norms.layer_norm(wide[..., 5:35], (30,), w, b, 1e-5)
        assert y.shape == (6, 2, 30) and y.is_contiguous(), (y.shape, y.stride())
        y.backward(_rand(torch, (6, 2, 30), 8))
        wd = wide.detach().double().requires_grad_()
        yd = F.layer_norm(wd[..., 5:35], (30,), w.double(), b.double(), 1e-5)
        yd.backward(_rand(torch, (6, 2, 30), 8).double())
        _close(torch, y, yd, torch.float32, "layer_norm strided rows")
        _close(torch, wide.grad, wd.grad, torch.float32, "layer_norm strided rows dx")
    print("case norms_layer ok")


def case_norms_rms():
    torch = _setup()
    import torch.nn.functional as F
    from hal.backends.cuda.kernels import _rows, norms, routing
    with routing.using("triton"):
        for rows, n, sms in NORM_SHAPES:
            _rows.set_sm_count(torch.device("cpu"), sms)
            for has_w in (True, False):
                x, w, dy = _rand(torch, (rows, n), 5, scale=2.0), _rand(torch, (n,), 6) if has_w else None, \
                    _rand(torch, (rows, n), 7)
                (xk, wk), (xd, wd) = _leaves(torch, x, w)
                y = norms.rms_norm(xk, (n,), wk, 1e-6)
                assert type(y.grad_fn).__name__ == "RmsNormFunctionBackward", y.grad_fn
                y.backward(dy)
                F.rms_norm(xd, (n,), wd, 1e-6).backward(dy.double())
                what = f"rms_norm {rows}x{n} w={has_w} sms={sms}"
                _close(torch, y, F.rms_norm(x.double(), (n,), None if w is None else w.double(), 1e-6),
                       torch.float32, what)
                _close(torch, xk.grad, xd.grad, torch.float32, what + " dx")
                if has_w:
                    _close(torch, wk.grad, wd.grad, torch.float32, what + " dw", rows)
        # 3-D input over two trailing dims, inference (no autograd): the forward kernel alone
        x3 = _rand(torch, (2, 3, 4, 25), 8)
        with torch.no_grad():
            _close(torch, norms.rms_norm(x3, (4, 25), None, 1e-6), F.rms_norm(x3.double(), (4, 25), None, 1e-6),
                   torch.float32, "rms_norm 3-D infer")
    print("case norms_rms ok")


def case_add_rms():
    torch = _setup()
    import torch.nn.functional as F
    from hal.backends.cuda.kernels import _rows, norms, routing
    with routing.using("triton"):
        for rows, n, sms in NORM_SHAPES:
            _rows.set_sm_count(torch.device("cpu"), sms)
            x, r, w = _rand(torch, (rows, n), 9), _rand(torch, (rows, n), 10), _rand(torch, (n,), 11)
            dy, dh = _rand(torch, (rows, n), 12), _rand(torch, (rows, n), 13)
            (xk, rk, wk), (xd, rd, wd) = _leaves(torch, x, r, w)
            y, h = norms.add_rms_norm(xk, rk, (n,), wk, 1e-6)
            torch.autograd.backward([y, h], [dy, dh])
            hd = xd + rd
            hd = hd + (h.detach().double() - hd).detach()  # the kernel normalises h rounded to float32
            torch.autograd.backward([F.rms_norm(hd, (n,), wd, 1e-6), hd], [dy.double(), dh.double()])
            what = f"add_rms_norm {rows}x{n} sms={sms}"
            assert torch.equal(h.detach(), x + r), what
            for got, want, name in ((xk, xd, "dx"), (rk, rd, "dr"), (wk, wd, "dw")):
                _close(torch, got.grad, want.grad, torch.float32, f"{what} {name}", rows if name == "dw" else 1)
    print("case add_rms ok")


def case_norm_plans():
    """Every kind of backward plan by name (``norms.plan_named``; the name round-trips), against float64:
    fused, two-stage with the dx row in registers and looped; and no rows at all (zero weight and bias
    gradients)."""
    torch = _setup()
    import torch.nn.functional as F
    from hal.backends.cuda.kernels import _rows, norms
    _rows.set_sm_count(torch.device("cpu"), 4)
    norms.PART_BLOCK_P = 2  # the partial sums' adding-up kernel loops over its rows (4-8 of them here)
    names = ["fused p1 w4", "fused p2 w4", "fused p1 w4 s2", "fused p2 w4 s4", "two-stage", "two-stage single w4",
             "two-stage looped w4"]
    for rows, n in ((7, 300), (37, 9000), (0, 300)):
        x, w, b, dy = (_rand(torch, (rows, n), 30, scale=2.0) + 0.5, _rand(torch, (n,), 31), _rand(torch, (n,), 32),
                       _rand(torch, (rows, n), 33))
        _, _, mean, rstd = norms.norm_forward(x, None, w, b, 1e-5, False, n)
        (xd, wd, bd), _ = _leaves(torch, x.double(), w.double(), b.double())
        F.layer_norm(xd, (n,), wd, bd, 1e-5).backward(dy.double())
        for name in names:
            plan = norms.plan_named(name, n)
            assert name == "two-stage" or plan.name == name, (name, plan)
            assert norms.plan_named(plan.name, n) == plan
            dx, dw, db = norms.norm_backward(dy, x, w, b, mean, rstd, None, False, n, plan=plan)
            what = f"layer_norm bwd {rows}x{n} plan {name}"
            _close(torch, dx, xd.grad, torch.float32, what + " dx")
            _close(torch, dw, wd.grad, torch.float32, what + " dw", max(rows, 1))
            _close(torch, db, bd.grad, torch.float32, what + " db", max(rows, 1))
    for bad in ("fused", "fused p1", "two-stage w4", "fused p1 w4 db-apart", "fused p1 w4 s3", "single"):
        try:
            norms.plan_named(bad, 300)
        except ValueError:
            continue
        raise AssertionError(f"plan_named accepted {bad!r}")
    # add_rms_norm's backward (a dh) takes its own tuned entry where it has one, else rms_norm's
    block = norms.next_power_of_2(300)
    norms.BWD_TUNED[("rms_norm", "float32", block)] = "fused p2 w4"
    norms.BWD_TUNED[("add_rms_norm", "float32", block)] = "two-stage"
    norms._bwd_params.clear()
    assert norms.bwd_plan(300, torch.float32, True).name == "fused p2 w4"
    assert norms.bwd_plan(300, torch.float32, True, has_dh=True) == norms.two_stage_plan(300)
    del norms.BWD_TUNED[("add_rms_norm", "float32", block)]
    norms._bwd_params.clear()
    assert norms.bwd_plan(300, torch.float32, True, has_dh=True).name == "fused p2 w4"
    print("case norm_plans ok")


def case_routing():
    """Below the table's threshold the call is torch's (its autograd too); at or above, the kernel's."""
    torch = _setup()
    import torch.nn.functional as F
    from hal.backends.cuda.kernels import norms, routing
    n = 64
    x, w, b = _rand(torch, (8, n), 14), _rand(torch, (n,), 15), _rand(torch, (n,), 16)
    launched = []
    real = norms.norm_forward

    def spy(*a, **k):
        launched.append(1)
        return real(*a, **k)

    norms.norm_forward = spy
    try:
        table = {"measured": "test", "default": None, "ops": {"layer_norm": {"float32": {"infer": 512, "train": 1024}}}}
        with routing.using(table):
            assert routing.decide("layer_norm", torch.float32, "infer", 512)
            assert not routing.decide("layer_norm", torch.float32, "train", 512)
            # 8 x 64 = 512 elements: infer takes the kernel, train goes to torch (autograd is torch's)
            with torch.no_grad():
                y_k = norms.layer_norm(x, (n,), w, b, 1e-5)
            assert launched == [1]
            xg = x.clone().requires_grad_()
            y_t = norms.layer_norm(xg, (n,), w, b, 1e-5)
            assert launched == [1], "a train call below its threshold launched the kernel"
            assert "NativeLayerNorm" in type(y_t.grad_fn).__name__, y_t.grad_fn
            assert torch.equal(y_t.detach(), F.layer_norm(x, (n,), w, b, 1e-5))
            torch.testing.assert_close(y_k, y_t.detach(), rtol=1e-5, atol=1e-5)
            # rms_norm: null threshold -> always torch, bit-equal to torch's function
            assert torch.equal(norms.rms_norm(x, (n,), w, 1e-6), F.rms_norm(x, (n,), w, 1e-6))
            assert launched == [1]
        with routing.using("triton"):
            y = norms.layer_norm(x.clone().requires_grad_(), (n,), w, b, 1e-5)
            assert type(y.grad_fn).__name__ == "LayerNormFunctionBackward"
            assert launched == [1, 1]
        # the shipped table sends this small call to torch
        assert not routing.decide("layer_norm", torch.float32, "infer", x.numel())
        norms.layer_norm(x, (n,), w, b, 1e-5)
        assert launched == [1, 1]
        # calls the kernel cannot take go to torch whatever the table says: softmax over dim 0
        from hal.backends.cuda.kernels import softmax
        with routing.using("triton"):
            assert torch.equal(softmax.softmax(x, 0), torch.softmax(x, 0))
            assert torch.equal(norms.layer_norm(x.double(), (n,)), F.layer_norm(x.double(), (n,)))  # float64
    finally:
        norms.norm_forward = real
    print("case routing ok")


def case_softmax_silu():
    torch = _setup()
    import torch.nn.functional as F
    from hal.backends.cuda.kernels import routing, silu_and_mul, softmax
    with routing.using("triton"):
        for shape in ((5, 129), (2, 3, 77)):
            for log in (False, True):
                x, dy = _rand(torch, shape, 17, scale=3.0), _rand(torch, shape, 18)
                (xk,), (xd,) = _leaves(torch, x)
                y = (softmax.log_softmax if log else softmax.softmax)(xk)
                assert type(y.grad_fn).__name__ == "SoftmaxFunctionBackward"
                y.backward(dy)
                yd = (torch.log_softmax if log else torch.softmax)(xd, -1)
                yd.backward(dy.double())
                _close(torch, y, yd, torch.float32, f"softmax log={log} {shape}")
                _close(torch, xk.grad, xd.grad, torch.float32, f"softmax log={log} {shape} dx")
        # the two-pass backward (rows longer than BWD_SINGLE_MAX on a GPU), forced on short rows, tile 64
        for log in (False, True):
            y = softmax.softmax_forward(_rand(torch, (4, 300), 21, scale=3.0), log)
            dy = _rand(torch, (4, 300), 22)
            _close(torch, softmax.softmax_backward(dy, y, log, torch.float32, plan=(False, 64, 1)),
                   softmax.softmax_backward(dy, y, log, torch.float32).double(), torch.float32, f"two-pass log={log}")
        x, dy = _rand(torch, (6, 2 * 333), 19, scale=3.0), _rand(torch, (6, 333), 20)
        (xk,), (xd,) = _leaves(torch, x)
        y = silu_and_mul.silu_and_mul(xk)
        y.backward(dy)
        a, b = xd.chunk(2, -1)
        yd = F.silu(a) * b
        yd.backward(dy.double())
        _close(torch, y, yd, torch.float32, "silu_and_mul")
        _close(torch, xk.grad, xd.grad, torch.float32, "silu_and_mul dx")
    print("case softmax_silu ok")


def case_cross_entropy():
    torch = _setup()
    import torch.nn.functional as F
    from hal.backends.cuda.kernels import _rows, cross_entropy, routing
    with routing.using("triton"):
        # 129 classes: one program per row; 20000 classes with 1 SM: one looping program per row;
        # with 64 SMs: split into chunks and combined
        for rows, v, sms in ((7, 129, 4), (5, 20000, 1), (5, 20000, 64)):
            _rows.set_sm_count(torch.device("cpu"), sms)
            for dtype in (torch.float32, torch.float16):
                x = _rand(torch, (rows, v), 21, dtype, 2.0)
                t = torch.randint(0, v, (rows,), generator=torch.Generator().manual_seed(22))
                t[1] = -100
                for reduction in ("mean", "none", "sum"):
                    (xk,), (xd,) = _leaves(torch, x)
                    loss = cross_entropy.cross_entropy(xk, t, reduction=reduction)
                    ref = F.cross_entropy(xd, t, reduction=reduction)
                    what = f"cross_entropy {rows}x{v} {dtype} sms={sms} {reduction}"
                    _close(torch, loss, ref, dtype, what)
                    g = _rand(torch, ref.shape, 23, dtype)
                    loss.backward(g)
                    ref.backward(g.double())
                    _close(torch, xk.grad, xd.grad, dtype, what + " dx")
        # more rows than the reduction's one program takes per step (its loop: the step made small here), a third
        # of them ignored, and a gradient that is not contiguous (an expanded scalar)
        cross_entropy._REDUCE_BLOCK = 16
        rows, v = 45, 17
        x = _rand(torch, (rows, v), 24, scale=3.0)
        t = torch.randint(0, v, (rows,), generator=torch.Generator().manual_seed(25))
        t[::3] = 5
        for reduction in ("mean", "sum", "none"):
            (xk,), (xd,) = _leaves(torch, x)
            loss = cross_entropy.cross_entropy(xk, t, ignore_index=5, reduction=reduction)
            ref = F.cross_entropy(xd, t, ignore_index=5, reduction=reduction)
            what = f"cross_entropy {rows}x{v} ignore_index=5 {reduction}"
            _close(torch, loss, ref, torch.float32, what, 10.0)
            g = torch.tensor(0.5).expand(ref.shape)
            loss.backward(g)
            ref.backward(g.double())
            _close(torch, xk.grad, xd.grad, torch.float32, what + " dx")
        # every row ignored: the mean is NaN (0 / 0, as torch's) and the gradient 0
        (xk,), _ = _leaves(torch, x[:4])
        loss = cross_entropy.cross_entropy(xk, torch.full((4,), 5), ignore_index=5)
        assert torch.isnan(loss).item(), loss
        loss.backward()
        assert torch.equal(xk.grad, torch.zeros_like(xk)), xk.grad
    print("case cross_entropy ok")


def case_linear_cross_entropy():
    """The fused head on the cross-entropy kernels: one chunk (the kernels' own reduction and scale) and several
    (the loop), the vocabulary padded (97 classes -> 128) and not, with and without bias, a gradient wanted or
    not (no_grad: no autograd Function), ignored rows, a grad_output other than 1; and every row ignored."""
    torch = _setup()
    import torch.nn.functional as F
    from hal.backends.cuda.kernels import linear_cross_entropy as lce
    assert lce.device_ce(torch.zeros(1)) is not None, "the kernels' chunk step must run on the CPU here"
    n, h, v = 21, 16, 97
    x, w, b = _rand(torch, (n, h), 31), _rand(torch, (v, h), 32, scale=0.3), _rand(torch, (v,), 33)
    t = torch.randint(0, v, (n,), generator=torch.Generator().manual_seed(34))
    t[2] = t[9] = -100
    for chunk in (None, 8):  # None: all 21 rows in one chunk
        for pad in (True, False):
            for bias in (None, b):
                for reduction in ("mean", "sum"):
                    what = f"linear_cross_entropy chunk={chunk} pad={pad} bias={bias is not None} {reduction}"
                    (xk, wk, bk), (xd, wd, bd) = _leaves(torch, x, w, bias)
                    ref = F.cross_entropy(F.linear(xd, wd, bd), t, reduction=reduction)
                    with torch.no_grad():
                        got = lce.linear_cross_entropy(xk, wk, t, bk, reduction=reduction, chunk_size=chunk,
                                                       pad_vocab=pad)
                    assert got.grad_fn is None, what
                    _close(torch, got, ref, torch.float32, what + " no_grad")
                    loss = lce.linear_cross_entropy(xk, wk, t, bk, reduction=reduction, chunk_size=chunk, pad_vocab=pad)
                    _close(torch, loss, ref, torch.float32, what)
                    (loss * 0.75).backward()
                    (ref * 0.75).backward()
                    _close(torch, xk.grad, xd.grad, torch.float32, what + " dx")
                    _close(torch, wk.grad, wd.grad, torch.float32, what + " dw")
                    assert wk.grad.shape == (v, h), (what, wk.grad.shape)
                    if bias is not None:
                        _close(torch, bk.grad, bd.grad, torch.float32, what + " db")
    # every row ignored: the mean is NaN (torch's 0 / 0) and the gradients 0, one chunk and several
    for chunk in (None, 8):
        xk = x.clone().requires_grad_()
        loss = lce.linear_cross_entropy(xk, w, torch.full_like(t, -100), chunk_size=chunk)
        assert torch.isnan(loss), (chunk, loss)
        loss.backward()
        assert torch.equal(xk.grad, torch.zeros_like(x)), chunk
    print("case linear_cross_entropy ok")


if __name__ == "__main__":
    globals()[f"case_{sys.argv[1]}"]()
