"""The chunked fused linear + cross-entropy against float64 ``F.cross_entropy(x @ W.T + b)``.

Runs on the CPU (the Function is plain torch); on CUDA too when a GPU is present. Checks the loss
and the gradients of input, weight and bias for both reductions, ignore_index, bias or none,
3-D inputs, several chunk sizes (one row per chunk, uneven last chunk, one chunk), grad_output
scaling, no-grad inference, and that no tensor as large as the full logits is ever allocated.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from hal.backends.cuda.kernels.linear_cross_entropy import chunk_rows, linear_cross_entropy, supports

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
TOL = {torch.float32: dict(rtol=2e-4, atol=2e-5), torch.bfloat16: dict(rtol=3e-2, atol=3e-3)}


def _inputs(n, h, v, dtype, device, bias, seed=0, ignore_frac=0.2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, generator=g)
    w = torch.randn(v, h, generator=g) * 0.3
    b = torch.randn(v, generator=g) if bias else None
    t = torch.randint(0, v, (n,), generator=g)
    t[torch.rand(n, generator=g) < ignore_frac] = -100
    x, w = x.to(dtype), w.to(dtype)
    b = None if b is None else b.to(dtype)
    return x, w, b, t


def _ref(x, w, b, t, reduction, grad_out=1.0):
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    bd = None if b is None else b.double().requires_grad_()
    loss = F.cross_entropy(F.linear(xd, wd, bd), t, ignore_index=-100, reduction=reduction)
    grads = torch.autograd.grad(loss * grad_out, [p for p in (xd, wd, bd) if p is not None])
    return loss, grads


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk", [1, 7, 64, None])
@pytest.mark.parametrize("pad", [None, True])  # None: as PAD_FROM_ROWS says (45 rows: unpadded); True: 97 -> 128 classes
def test_matches_float64(device, dtype, reduction, bias, chunk, pad):
    x, w, b, t = _inputs(45, 24, 97, dtype, "cpu", bias)
    ref_loss, ref_grads = _ref(x, w, b, t, reduction, grad_out=0.75)
    params = [p.to(device).requires_grad_() for p in (x, w, b) if p is not None]
    xg, wg = params[0], params[1]
    bg = params[2] if bias else None
    loss = linear_cross_entropy(xg, wg, t.to(device), bg, reduction=reduction, chunk_size=chunk, pad_vocab=pad)
    assert loss.dtype == dtype and loss.dim() == 0
    _assert_matches(loss, torch.autograd.grad(loss * 0.75, params), ref_loss, ref_grads, dtype)


def _assert_matches(loss, grads, ref_loss, ref_grads, dtype):
    """The loss and the gradients (of ``loss * 0.75``) against float64's, within ``dtype``'s tolerance."""
    tol = TOL[dtype]
    torch.testing.assert_close(loss.double().cpu(), ref_loss.detach(), **tol)
    for got, want in zip(grads, ref_grads):
        assert got.dtype == dtype and got.shape == want.shape
        scale = want.abs().max().item()
        torch.testing.assert_close(got.double().cpu(), want, rtol=tol["rtol"], atol=tol["atol"] + tol["rtol"] * scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("pad", [False, True])
def test_one_chunk_of_few_rows_keeps_the_logits_gradient_for_the_backward(device, dtype, reduction, bias, pad):
    """No more rows than hidden, one chunk: the forward keeps the logits' gradient and the backward scales it and runs
    the matmuls (no pass over a finished weight gradient); gradients as float64's with grad_output 0.75. (The
    vocabulary is padded on the Triton path only.)"""
    x, w, b, t = _inputs(20, 48, 97, dtype, "cpu", bias)
    ref_loss, ref_grads = _ref(x, w, b, t, reduction, grad_out=0.75)
    params = [p.to(device).requires_grad_() for p in (x, w, b) if p is not None]
    loss = linear_cross_entropy(params[0], params[1], t.to(device), params[2] if bias else None, reduction=reduction,
                                pad_vocab=pad)
    assert loss.grad_fn.deferred
    assert loss.grad_fn.saved_tensors[2].shape == (20, 128 if pad and device == "cuda" else 97)
    _assert_matches(loss, torch.autograd.grad(loss * 0.75, params), ref_loss, ref_grads, dtype)
    # more rows than hidden: the gradients are finished in the forward, as before
    x2 = torch.randn(64, 48, device=device, dtype=dtype, requires_grad=True)
    loss2 = linear_cross_entropy(x2, params[1], torch.randint(0, 97, (64,), device=device))
    assert not loss2.grad_fn.deferred


def test_3d_input_matches_reference_op_and_dispatch():
    import hal.ops as H
    x, w, _, t = _inputs(24, 16, 50, torch.float32, "cpu", False)
    x3, t3 = x.view(2, 12, 16), t.view(2, 12)
    ref = H.linear_cross_entropy(x3, w, t3)  # the reference op (torch_impl) through hal.ops on the CPU
    torch.testing.assert_close(ref, F.cross_entropy(x @ w.T, t))
    xg = x3.clone().requires_grad_()
    got = linear_cross_entropy(xg, w, t3, chunk_size=5)
    torch.testing.assert_close(got, ref)
    got.backward()
    xr = x3.clone().requires_grad_()
    H.linear_cross_entropy(xr, w, t3).backward()
    assert xg.grad.shape == (2, 12, 16)
    torch.testing.assert_close(xg.grad, xr.grad)


def test_no_grad_and_all_ignored():
    x, w, _, t = _inputs(10, 8, 30, torch.float32, "cpu", False, ignore_frac=0.0)
    with torch.no_grad():
        loss = linear_cross_entropy(x.requires_grad_(), w, t, chunk_size=3)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, F.cross_entropy(x.detach() @ w.T, t))
    t_all = torch.full_like(t, -100)
    assert torch.isnan(linear_cross_entropy(x.detach(), w, t_all))  # torch's mean over 0 rows
    assert linear_cross_entropy(x.detach(), w, t_all, reduction="sum").item() == 0.0
    xg = x.detach().requires_grad_()
    linear_cross_entropy(xg, w, t_all, reduction="sum").backward()
    assert torch.equal(xg.grad, torch.zeros_like(xg))


class _Largest(TorchDispatchMode):
    """Records the numel of the largest tensor any op returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(o, torch.Tensor):
                self.largest = max(self.largest, o.numel())
        return out


def test_never_materialises_full_logits():
    n, h, v, chunk = 256, 8, 300, 16
    x, w, _, t = _inputs(n, h, v, torch.float32, "cpu", False)
    xg, wg = x.requires_grad_(), w.requires_grad_()
    with _Largest() as mode:
        loss = linear_cross_entropy(xg, wg, t, chunk_size=chunk)
        loss.backward()
    bound = max(chunk * v, v * h, n * h)
    assert mode.largest <= bound < n * v, (mode.largest, bound)
    with _Largest() as ref_mode:  # the check can see full logits: the reference allocates them
        F.cross_entropy(x @ w.T, t)
    assert ref_mode.largest >= n * v


def test_chunk_rows_and_supports():
    # 256 MiB / (50257 * 6 B) = 890 rows fit, 888 as a multiple of 8: 8192 rows make 10 chunks of 824 (819.2 up to 8)
    assert chunk_rows(8192, 50257, 2, 256 << 20) == 824
    assert chunk_rows(4096, 50304, 4, 256 << 20) == 1024  # 1328 fit: 4 even chunks, not 3 x 1328 + 112
    assert chunk_rows(1330, 50304, 4, 256 << 20) == 672  # 2 chunks of 665, up to a multiple of 8
    assert chunk_rows(1328, 50304, 4, 256 << 20) == 1328  # one chunk
    assert chunk_rows(10, 50257, 4) == 10
    assert chunk_rows(10**6, 10**9, 4) == 1
    assert chunk_rows(8192, 50257, 4, 256 << 20) * 50257 * 4 <= 256 << 20
    x, w, _, t = _inputs(4, 8, 16, torch.float32, "cpu", False)
    assert supports(x, w, t) is None
    assert "reduction" in supports(x, w, t, reduction="none")
    assert "weight" in supports(x, w.T.contiguous(), t)
    assert "target" in supports(x, w, t[:3])
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(x, w, t, reduction="none")
