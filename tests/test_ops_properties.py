"""Property tests (hypothesis): every hal.ops op against torch on random shapes (empty, one element,
non-contiguous, broadcasting), dtypes and special values; a fallback's result equals the native one."""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hal.ops

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
SPECIAL = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e30, -1e30, 1e-30]
settings.register_profile("hal", deadline=None, max_examples=60,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("hal")


@st.composite
def tensors(draw, min_dims=1, max_dims=3, min_side=0, max_side=9, dtypes=DTYPES):
    shape = draw(st.lists(st.integers(min_side, max_side), min_size=min_dims, max_size=max_dims))
    dtype = draw(st.sampled_from(dtypes))
    seed = draw(st.integers(0, 2**31 - 1))
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3
    if x.numel() and draw(st.booleans()):
        idx = draw(st.lists(st.integers(0, x.numel() - 1), max_size=3))
        vals = draw(st.lists(st.sampled_from(SPECIAL), min_size=len(idx), max_size=len(idx)))
        x.view(-1)[idx] = torch.tensor(vals, dtype=torch.float64)
    x = x.to(dtype)
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided"]))
    if layout == "transposed" and x.dim() >= 2:
        x = x.transpose(0, -1).contiguous().transpose(0, -1)  # same values, non-contiguous strides
    elif layout == "strided" and x.dim() >= 1 and x.shape[-1] > 1:
        x = torch.repeat_interleave(x, 2, dim=-1)[..., ::2]
    return x


def same(a, b):
    torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)


@given(tensors(), st.data())
def test_softmax_family(x, data):
    dim = data.draw(st.integers(-x.dim(), x.dim() - 1))
    same(hal.ops.softmax(x, dim), torch.softmax(x, dim))
    same(hal.ops.log_softmax(x, dim), torch.log_softmax(x, dim))


@given(tensors())
def test_activations(x):
    same(hal.ops.gelu(x), F.gelu(x))
    same(hal.ops.gelu(x, approximate="tanh"), F.gelu(x, approximate="tanh"))
    same(hal.ops.silu(x), F.silu(x))


@given(tensors(min_side=1))
def test_norms(x):
    n = x.shape[-1]
    w = torch.linspace(0.5, 1.5, n, dtype=x.dtype)
    same(hal.ops.layer_norm(x, (n,), w, None, 1e-5), F.layer_norm(x, (n,), w, None, 1e-5))
    same(hal.ops.rms_norm(x, (n,), w, 1e-6), F.rms_norm(x, (n,), w, 1e-6))


@given(tensors(min_side=1, dtypes=[torch.float32, torch.float64]))
def test_silu_and_mul_and_add_rms_norm(x):
    x2 = torch.cat([x, x * 0.5], dim=-1)
    half = x.shape[-1]
    same(hal.ops.silu_and_mul(x2), F.silu(x2[..., :half]) * x2[..., half:])
    normed, h = hal.ops.add_rms_norm(x, x, (half,), None, 1e-6)
    same(h, x + x)
    same(normed, F.rms_norm(x + x, (half,), None, 1e-6))


@given(st.integers(0, 4), st.integers(1, 5), st.integers(0, 5), st.integers(0, 3),
       st.sampled_from([torch.float32, torch.float64]), st.booleans())
def test_matmul_broadcasting(b, m, k, n, dtype, transpose):
    g = torch.Generator().manual_seed(b * 1000 + m * 100 + k * 10 + n)
    a = torch.randn(b, 1, m, k, generator=g, dtype=dtype)
    c = torch.randn(3, k, n, generator=g, dtype=dtype)
    if transpose:
        c = c.transpose(-1, -2).contiguous().transpose(-1, -2)
    same(hal.ops.matmul(a, c), torch.matmul(a, c))


@given(st.integers(1, 6), st.integers(1, 7), st.sampled_from(["mean", "sum", "none"]), st.floats(0, 0.3))
def test_cross_entropy_and_embedding(n, c, reduction, smoothing):
    g = torch.Generator().manual_seed(n * 10 + c)
    logits = torch.randn(n, c, generator=g)
    target = torch.randint(0, c, (n,), generator=g)
    target[0] = -100
    same(hal.ops.cross_entropy(logits, target, reduction=reduction, label_smoothing=smoothing),
         F.cross_entropy(logits, target, reduction=reduction, label_smoothing=smoothing))
    w = torch.randn(c, 4, generator=g)
    idx = torch.randint(0, c, (n, 2), generator=g)
    same(hal.ops.embedding(idx, w), F.embedding(idx, w))


@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 6), st.sampled_from([4, 8]), st.booleans())
def test_attention(b, h, t, d, causal):
    g = torch.Generator().manual_seed(b * 100 + h * 10 + t)
    q, k, v = (torch.randn(b, h, t, d, generator=g) for _ in range(3))
    same(hal.ops.scaled_dot_product_attention(q, k, v, is_causal=causal),
         F.scaled_dot_product_attention(q, k, v, is_causal=causal))


@given(tensors(min_side=1), st.sampled_from(["softmax", "log_softmax", "gelu", "silu"]))
def test_fallback_result_equals_native(x, name):
    """The same op through the fallback path (no implementation on this device) equals the native call."""
    native = getattr(hal.ops, name)
    args = (x, -1) if "softmax" in name else (x,)
    opdef = hal.ops.REGISTRY.get(name)
    forced = hal.ops.define_op(f"fallback_of_{name}", opdef.aten, opdef.reference, register_cpu=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hal.ops.HalFallbackWarning)
        same(forced(*args), native(*args))
