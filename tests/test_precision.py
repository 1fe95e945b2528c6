"""Precision comparison against float64: blame, thresholds, metrics, drift, calibration, CLI."""
from __future__ import annotations

import collections
import json
import math
import subprocess
import sys

import pytest
import torch
from hal.conformance.precision import PrecisionResult, compare_module, shadow
from hal.conformance.precision import thresholds as th
from hal.conformance.precision.blocks import block, block_of
from hal.conformance.precision.calibration import calibrate, op_verdict
from hal.conformance.precision.drift import drift_stats
from hal.conformance.precision.metrics import error_stats, sample_index, take_sample
from hal.conformance.precision.shadow import Shadow
from hal.conformance.precision.tracer import EXACT_CAST, StepTracer
from hypothesis import given, settings
from hypothesis import strategies as st


class NaiveSoftmaxFP16(torch.nn.Module):
    """Softmax written naively in float16: exp overflows to Inf for logits > ~11, then Inf/Inf = NaN."""

    def forward(self, x):
        h = x.half()
        e = h.exp()
        return (e / e.sum(-1, keepdim=True)).float()


class Net(torch.nn.Module):
    def __init__(self, naive: bool):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.act = NaiveSoftmaxFP16() if naive else torch.nn.Softmax(-1)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def _inputs(scale):
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 16, generator=g) * scale


def test_naive_fp16_softmax_is_blamed_on_the_custom_layer():
    res = compare_module(lambda: Net(naive=True), _inputs(20.0), steps=2)
    fd = res.first_divergence
    assert fd is not None
    assert fd["module"] == "act" and fd["op"] in ("exp", "div")
    assert fd["kind"] == "introduced" and fd["inputs_within"] is True
    assert fd["metric"] == "nan_inf_mismatch" and fd["value"] > 0
    assert res.verdict == "fail"
    # the Linear before is within tolerance; the Linear after only inherited the NaNs
    fc1 = [r for r in res.rows(kind="op", phase="forward") if r["module"] == "fc1"]
    assert fc1 and all(r["status"] == "ok" for r in fc1)
    fc2 = [r for r in res.rows(kind="op", phase="forward") if r["module"] == "fc2"]
    assert fc2 and all(r["status"] == "inherited" for r in fc2)
    d = res.as_dict()
    json.dumps(d)  # JSON-ready, non-finite values spelled as strings
    assert d["first_divergence"]["module"] == "act"


def test_all_float32_model_passes_with_errors_reported():
    res = compare_module(lambda: Net(naive=False), _inputs(1.0), steps=3)
    assert res.verdict == "pass", res.summary["verdict_reasons"]
    assert res.first_divergence is None
    ops = res.rows(kind="op")
    assert ops and all(r["local"] is not None and r["total"] is not None for r in ops)
    # errors are real: float32 differs from float64, within the float32 thresholds
    assert max(r["total"]["max_abs"] for r in ops) > 0
    assert all(r["threshold"]["rtol"] == 1.3e-6 for r in ops)
    assert {r["kind"] for r in res.metrics} >= {"op", "module", "gradient", "parameter", "loss"}
    dr = res.drift
    assert len(dr["losses_target"]) == 3 and dr["max_rel_dev"] < 1e-5 and dr["r2"] > 0.999
    d = res.as_dict()
    assert d["reference"] == {"device": "cpu", "dtype": "float64"} and d["verified"] is True
    assert "dtype_tolerances" in d["thresholds"]


def test_bfloat16_autocast_is_judged_at_bfloat16_tolerance():
    res = compare_module(lambda: Net(naive=False), _inputs(1.0), autocast=torch.bfloat16, steps=2)
    mm = [r for r in res.rows(kind="op", phase="forward") if r["op"] == "addmm"]
    assert mm and all(r["dtype"] == "bfloat16" for r in mm)
    assert all(r["threshold"]["rtol"] == 1.6e-2 for r in mm)
    assert all(r["local"]["max_abs"] > 0 and not r["local"]["exceeds"] for r in mm)
    assert "ulp_max" in mm[0]["local"] and mm[0]["local"]["ulp_max"] <= 1.0
    assert res.verdict in ("pass", "warning")


def test_markdown_summary_names_the_blamed_op():
    res = compare_module(lambda: Net(naive=True), _inputs(20.0), steps=1)
    md = res.to_markdown()
    assert "first divergence (introduced): module `act`" in md
    assert isinstance(res, PrecisionResult)


def test_sampling_compares_a_fixed_subset_and_agrees_with_full():
    def lin():
        return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    x = torch.randn(128, 64)
    full = compare_module(lin, x, sample=False)
    samp = compare_module(lin, x, max_elements=2048)
    assert samp.summary["sampled"] > 0 and full.summary["sampled"] == 0
    f = {(r["phase"], r["module"], r["op"], r["occurrence"]): r for r in full.rows(kind="op")}
    for r in samp.rows(kind="op"):
        if r["sampling"] != "full":
            ref = f[(r["phase"], r["module"], r["op"], r["occurrence"])]
            assert r["local"]["n"] < ref["local"]["n"]
            assert r["local"]["max_abs"] <= ref["local"]["max_abs"] * 1.0001 + 1e-12
    assert samp.verdict == full.verdict == "pass"


def test_untagged_elementwise_activations_get_a_sampled_shadow():
    """LeakyReLU, Hardswish, ELU and Hardtanh (ReLU6) have ATen ops torch does not tag point-wise (the backwards,
    hardswish itself): outputs over HUGE_FACTOR x max_elements were left unshadowed (pytorch/examples' GAT: its
    32 M-element LeakyReLU backward); they are shadowed on a block, and the block's error agrees with the whole."""
    def net():
        return torch.nn.Sequential(torch.nn.Linear(16, 512), torch.nn.LeakyReLU(0.1), torch.nn.Hardswish(),
                                   torch.nn.ELU(), torch.nn.Hardtanh(), torch.nn.Linear(512, 4))
    x = torch.randn(256, 16)
    ops = {("forward", "hardswish"), ("backward", "leaky_relu_backward"), ("backward", "hardswish_backward"),
           ("backward", "elu_backward"), ("backward", "hardtanh_backward")}
    samp = compare_module(net, x, max_elements=512)  # 131072-element outputs: over 64 x 512
    full = compare_module(net, x, sample=False)
    rows = [r for r in samp.rows(kind="op") if (r["phase"], r["op"]) in ops]
    assert {(r["phase"], r["op"]) for r in rows} == ops
    f = {(r["phase"], r["module"], r["op"], r["occurrence"]): r for r in full.rows(kind="op")}
    for r in rows:
        assert r["sampling"].startswith("block ") and r["local"]["n"] == 512, r
        ref = f[(r["phase"], r["module"], r["op"], r["occurrence"])]
        assert r["local"]["max_abs"] <= ref["local"]["max_abs"] * 1.0001 + 1e-12
    assert samp.verdict == "pass"


class _ToBfloat16(torch.nn.Module):
    def forward(self, x):
        return x.to(torch.bfloat16).float()


def test_large_casts_and_layer_norms_get_a_sampled_shadow():
    """A cast (``_to_copy``: autocast makes dozens a step) and ``native_layer_norm`` with its backward had no sampled
    shadow: outputs over HUGE_FACTOR x max_elements went unshadowed (on the H200, 22 of the 38 unshadowed outputs of
    the CUDA autocast fixture's step, 524288 elements each). A cast is shadowed on a block, a layer norm (and its
    input gradient) on a run of rows computed from those rows alone; their errors agree with the whole op's."""
    def net():
        return torch.nn.Sequential(torch.nn.Linear(16, 512), torch.nn.LayerNorm(512), _ToBfloat16(),
                                   torch.nn.Linear(512, 4))
    x = torch.randn(256, 16)
    samp = compare_module(net, x, max_elements=512)  # 131072-element outputs: over 64 x 512
    full = compare_module(net, x, sample=False)
    want = {("forward", "native_layer_norm", 0): "rows ", ("backward", "native_layer_norm_backward", 0): "rows ",
            ("forward", "_to_copy", 0): "block "}
    f = {(r["phase"], r["module"], r["op"], r["occurrence"], r["out_index"]): r for r in full.rows(kind="op")}
    seen = set()
    for r in samp.rows(kind="op"):
        kind = want.get((r["phase"], r["op"], r["out_index"]))
        if kind is None or r["shape"] != [256, 512]:
            continue
        if r["sampling"] == EXACT_CAST:  # float32 <- bfloat16 keeps every value: compared with itself, on its sample
            assert r["op"] == "_to_copy" and r["dtype"] == "float32" and r["local"]["max_abs"] == 0, r
            assert r["local"]["n"] == 512
            continue
        assert r["shadow_error"] is None and r["sampling"].startswith(kind) and r["local"]["n"] == 512, r
        ref = f[(r["phase"], r["module"], r["op"], r["occurrence"], r["out_index"])]
        assert r["local"]["max_abs"] <= ref["local"]["max_abs"] * 1.0001 + 1e-12, (r["local"], ref["local"])
        assert r["local"]["max_abs"] > 0  # a rounding the sample sees
        seen.add((r["phase"], r["op"], r["dtype"]))
    assert seen == {("forward", "native_layer_norm", "float32"), ("backward", "native_layer_norm_backward", "float32"),
                    ("forward", "_to_copy", "bfloat16")}, seen
    # the bfloat16 round trip takes the float32 gradients and loss beyond float32's tolerance (a warning, rightly);
    # every op is within its own
    assert samp.verdict == full.verdict and samp.first_divergence is None is full.first_divergence


class _TinyEncoder(torch.nn.Module):
    def __init__(self, vocab: int = 64, width: int = 32, heads: int = 2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.layer = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens):
        return self.head(self.layer(self.embed(tokens)))


def test_attention_embedding_and_gradient_routing_get_a_sampled_shadow():
    """The large outputs of a transformer step that had no sampled shadow (the CUDA autocast fixture at its default
    size left 16 of 152 unshadowed on the CPU): the embedding, the attention kernel and its three gradients,
    ``select_backward`` (the packed q/k/v projection's gradient) and ``nll_loss_backward``. Each is shadowed on a
    sample (a block of the embedding's rows, query rows of the attention, whole heads of its backward, where the
    gradient lands, rows of the loss gradient), and the sample's error agrees with the whole op's."""
    tokens = torch.randint(0, 64, (4, 48), generator=torch.Generator().manual_seed(0))

    def loss(logits):
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())

    samp = compare_module(_TinyEncoder, (tokens,), loss_fn=loss, max_elements=256)
    full = compare_module(_TinyEncoder, (tokens,), loss_fn=loss, sample=False)
    want = {("forward", "embedding"): "block ", ("forward", "scaled_dot_product_attention"): "block ",
            ("backward", "scaled_dot_product_attention_backward"): "heads ",
            ("backward", "select_backward"): "block ", ("backward", "nll_loss_backward"): "rows "}
    f = {(r["phase"], r["module"], r["op"], r["occurrence"], r["out_index"]): r for r in full.rows(kind="op")}
    seen = collections.Counter()
    for r in samp.rows(kind="op"):
        kind = want.get((r["phase"], r["op"]))
        if kind is None:
            continue
        assert r["shadow_error"] is None and r["sampling"].startswith(kind), r
        ref = f[(r["phase"], r["module"], r["op"], r["occurrence"], r["out_index"])]
        assert ref["sampling"] == "full" and r["local"]["n"] < ref["local"]["n"], (r, ref)
        assert r["local"]["max_abs"] <= ref["local"]["max_abs"] * 1.0001 + 1e-12, (r["local"], ref["local"])
        seen[(r["phase"], r["op"])] += 1
    assert seen == {("forward", "embedding"): 1, ("forward", "scaled_dot_product_attention"): 1,
                    ("backward", "scaled_dot_product_attention_backward"): 3, ("backward", "select_backward"): 3,
                    ("backward", "nll_loss_backward"): 1}, seen
    assert samp.summary["shadow_failed"] == 0 and samp.verdict == full.verdict


@pytest.mark.parametrize("mask", [None, "causal", "masked", "float"])
def test_sampled_attention_compares_rows_and_heads_with_their_float64_attention(mask):
    """The CPU flash-attention kernel in float64 (so the shadow must equal it): its sampled shadow is the math
    attention of a run of query rows (a causal mask written out for those rows), its backward's the gradients of
    whole heads, one float64 call for the three; each target is the same place of the kernel's own output."""
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(5)
    q, k, v, dout = (torch.randn(2, 3, 40, 8, generator=g, dtype=torch.float64) for _ in range(4))
    keep = (torch.rand(40, 40, generator=g) > 0.3).fill_diagonal_(True)  # no fully masked row
    # what F.scaled_dot_product_attention hands the kernel for a boolean mask: -inf where it is False
    m = {None: None, "causal": None, "masked": torch.zeros(40, 40, dtype=torch.float64).masked_fill(~keep, -math.inf),
         "float": torch.randn(2, 1, 40, 40, generator=g, dtype=torch.float64)}[mask]
    causal = mask == "causal"
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, causal, attn_mask=m, scale=0.4)
    grads = aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
        dout, q, k, v, out, lse, 0.0, causal, attn_mask=m, scale=0.4)
    sh = Shadow(max_elements=96)
    tv, ref, how = sh.run(aten._scaled_dot_product_flash_attention_for_cpu.default, (q, k, v, 0.0, causal),
                          {"attn_mask": m, "scale": 0.4}, out, 0)
    assert how.startswith("block ") and 0 < tv.numel() < out.numel() and tv.untyped_storage().data_ptr() == \
        out.untyped_storage().data_ptr()
    torch.testing.assert_close(tv, ref, rtol=1e-10, atol=1e-12)
    bwd = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    args, kwargs = (dout, q, k, v, out, lse, 0.0, causal), {"attn_mask": m, "scale": 0.4}
    jobs = [sh.plan(bwd, args, kwargs, grads[i], i) for i in range(3)]
    sh.flush(jobs)
    for j in jobs:
        assert j.error is None and j.how == "heads 1/6" and j.target.numel() == 40 * 8, (j.error, j.how)
        torch.testing.assert_close(j.target, j.ref, rtol=1e-9, atol=1e-12)
    assert sh.shared_jobs == 2


def test_gradient_routing_embedding_and_loss_gradient_samples_are_exact():
    """``select_backward``, ``slice_backward`` and ``embedding`` are exact copies: their sampled shadows (where the
    gradient lands; the table rows of a block of indices) equal the float32 output exactly, and a wrong value
    written there is seen; so with ``nll_loss_backward``'s rows (-0.5 / 64 at each row's class: exact in float32).
    """
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(9)
    grad = torch.randn(8, 16, 32, generator=g)
    weight, idx = torch.randn(50, 32, generator=g), torch.randint(0, 50, (8, 16), generator=g)
    logp = torch.randn(64, 30, generator=g).log_softmax(-1)
    target = torch.randint(0, 30, (64,), generator=g)
    total = torch.tensor(64.0)
    cases = [(aten.select_backward.default, (grad, [3, 8, 16, 32], 0, 2), lambda o: o[2]),
             (aten.slice_backward.default, (grad, [8, 40, 32], 1, 5, 37, 2), lambda o: o[:, 5:37:2]),
             (aten.embedding.default, (weight, idx), lambda o: o),
             (aten.nll_loss_backward.default, (torch.tensor(0.5), logp, target, None, 1, -100, total), lambda o: o)]
    for func, args, lands in cases:
        out = func(*args)
        sh = Shadow(max_elements=100)
        tv, ref, how = sh.run(func, args, {}, out, 0)
        assert 0 < tv.numel() <= 128 < out.numel() and not how.startswith("full"), (func, how)
        assert torch.equal(tv.double(), ref), func
        lands(out).mul_(1.5)  # a kernel writing the wrong values where the gradient lands
        tv, ref, _ = sh.run(func, args, {}, out, 0)
        assert not torch.equal(tv.double(), ref), func


@pytest.mark.parametrize("transposed, groups, max_elements", [(False, 1, 200), (False, 2, 200), (False, 4, 30),
                                                           (True, 1, 200), (True, 2, 30)])
def test_sampled_convolutions_are_their_parts_computed_alone(transposed, groups, max_elements):
    """A large convolution's output, input gradient and weight gradient (pytorch/examples' dcgan and imagenet left
    them unshadowed) are shadowed on a part computed from the matching parts of the arguments alone: a run of images,
    or one image and a run of one group's channels, and a run of one group's weight rows. In float64 the part must
    equal the same place of the whole op's result, for grouped and transposed convolutions."""
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 8, 9, 9, generator=g, dtype=torch.float64)
    w = torch.randn(*((8, 12 // groups) if transposed else (12, 8 // groups)), 3, 3, generator=g, dtype=torch.float64)
    b = torch.randn(12, generator=g, dtype=torch.float64)
    conf = ([2, 2], [1, 1], [1, 1], transposed, [1, 1] if transposed else [0, 0], groups)
    out = aten.convolution.default(x, w, b, *conf)
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    bwd = (grad, x, w, [12], *conf, [True, True, True])
    grads = aten.convolution_backward.default(*bwd)
    cases = [(aten.convolution.default, (x, w, b, *conf), out, 0), (aten.convolution_backward.default, bwd, grads[0], 0),
             (aten.convolution_backward.default, bwd, grads[1], 1)]
    for func, args, whole, i in cases:
        job = Shadow(max_elements=max_elements).plan(func, args, {}, whole, i)
        assert job.how != "full" and job.target.numel() < whole.numel(), (func, i, job.how)
        assert job.target.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()  # a view of the output
        tv, ref, _ = Shadow(max_elements=max_elements).run(func, args, {}, whole, i)
        assert torch.allclose(tv, ref, rtol=1e-10, atol=1e-10), (func, i, job.how, (tv - ref).abs().max())


def test_sampled_batch_norms_and_pooling_are_their_channels_and_planes_computed_alone():
    """Batch norm (training and not, and its backward's input gradient) on a run of channels, pooling (max with its
    indices, average, adaptive; 2-D and 3-D, and their backwards) on a block of whole planes: in float64 each part
    equals the same place of the whole op's result, and a training batch norm's shadow leaves the program's running
    statistics as they were."""
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(6)
    x = torch.randn(4, 6, 10, 10, generator=g, dtype=torch.float64)
    w, b = torch.randn(6, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64)
    rm, rv = torch.zeros(6, dtype=torch.float64), torch.ones(6, dtype=torch.float64)
    out, mean, invstd = aten.native_batch_norm.default(x, w, b, rm.clone(), rv.clone(), True, 0.1, 1e-5)
    gy = torch.randn(x.shape, generator=g, dtype=torch.float64)
    pooled, where = aten.max_pool2d_with_indices.default(x, [3, 3], [2, 2], [1, 1])
    gp = torch.randn(pooled.shape, generator=g, dtype=torch.float64)
    x3 = torch.randn(2, 3, 6, 6, 6, generator=g, dtype=torch.float64)
    cases = [(aten.native_batch_norm.default, (x, w, b, rm, rv, True, 0.1, 1e-5)),
             (aten._native_batch_norm_legit_no_training.default, (x, w, b, mean, invstd, 0.1, 1e-5)),
             (aten.native_batch_norm_backward.default, (gy, x, w, rm, rv, mean, invstd, True, 1e-5, [True, True, True])),
             (aten.max_pool2d_with_indices.default, (x, [3, 3], [2, 2], [1, 1])),
             (aten.max_pool2d_with_indices_backward.default, (gp, x, [3, 3], [2, 2], [1, 1], [1, 1], False, where)),
             (aten.avg_pool2d.default, (x, [2, 2], [2, 2])),
             (aten.avg_pool2d_backward.default, (gp, x, [3, 3], [2, 2], [1, 1], False, True, None)),
             (aten._adaptive_avg_pool2d.default, (x, [3, 3])),
             (aten.avg_pool3d.default, (x3, [2, 2, 2], [2, 2, 2]))]
    for func, args in cases:
        res = func(*args)
        whole = res[0] if isinstance(res, tuple) else res
        before = rm.clone(), rv.clone()
        tv, ref, how = Shadow(max_elements=60).run(func, args, {}, whole, 0)
        assert how.split()[0] in ("channels", "planes") and tv.numel() < whole.numel(), (func, how)
        assert torch.allclose(tv, ref, rtol=1e-10, atol=1e-10), (func, how, (tv - ref).abs().max())
        assert torch.equal(rm, before[0]) and torch.equal(rv, before[1]), func


def test_row_wise_ops_and_pointwise_ops_with_keywords_are_sampled_on_their_rows():
    """Ops whose output rows are each computed from the same rows of their arguments (cumulative sums and sums over
    other dims, flips, gathers, scatter-adds, padding, concatenation and stacking along other dims, upsampling and its
    backward, group norm and its backward; a concatenation along the rows where one tensor fills the run, the
    embedding's weight gradient) are shadowed on a run of rows (a size argument set to the run's), and a
    point-wise op with constant keywords (``gelu(approximate="tanh")``, HF GPT-2's activation) on a block: in float64
    each part equals the whole op's result there. Over dim 0 (a cumulative sum along the rows) there is no sample."""
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(8)
    x = torch.randn(16, 3, 40, generator=g, dtype=torch.float64)
    img = torch.randn(16, 4, 8, 8, generator=g, dtype=torch.float64)
    idx = torch.randint(0, 40, (16, 3, 40), generator=g)
    gn_out, mean, rstd = aten.native_group_norm.default(x, None, None, 16, 3, 40, 3, 1e-5)
    up = aten.upsample_bilinear2d.default(img, [16, 16], False)
    cases = [(aten.cumsum.default, (x, 2), {}), (aten.cumsum.default, (x, -1), {"dtype": torch.float64}),
             (aten.sum.dim_IntList, (x, [1]), {}), (aten.flip.default, (x, [1, 2]), {}),
             (aten.gather.default, (x, 2, idx), {}), (aten.scatter_add.default, (x, 2, idx, x * 2), {}),
             (aten.constant_pad_nd.default, (x, [1, 2, 0, 1], 0.5), {}), (aten.cat.default, ([x, x * 2], 1), {}),
             (aten.stack.default, ([x, x], 2), {}), (aten.upsample_bilinear2d.default, (img, [16, 16], False), {}),
             (aten.upsample_nearest2d.default, (img, [12, 12]), {}),
             (aten.upsample_bilinear2d_backward.default, (up, [16, 16], [16, 4, 8, 8], False), {}),
             (aten.native_group_norm.default, (x, None, None, 16, 3, 40, 3, 1e-5), {}),
             (aten.native_group_norm_backward.default, (x, x, mean, rstd, None, 16, 3, 40, 3, [True, False, False]), {}),
             (aten.gelu.default, (x,), {"approximate": "tanh"}), (aten.gelu_backward.default, (x, x), {"approximate": "tanh"}),
             (aten.cat.default, ([x[:3], x], 0), {})]  # along the rows: the run inside the second tensor
    tokens = torch.randint(0, 40, (16, 30), generator=g)
    dy = torch.randn(16, 30, 8, generator=g, dtype=torch.float64)
    for pad in (-1, 0, 30):  # none, outside the sampled rows (26-37 of 40), inside them
        cases += [(aten.embedding_dense_backward.default, (dy, tokens, 40, pad, scale), {}) for scale in (False, True)]
    for func, args, kwargs in cases:
        res = func(*args, **kwargs)
        whole = res[0] if isinstance(res, tuple) else res
        tv, ref, how = Shadow(max_elements=100).run(func, args, kwargs, whole, 0)
        assert how.split()[0] in ("rows", "block") and tv.numel() < whole.numel(), (func, how)
        assert torch.allclose(tv, ref, rtol=1e-10, atol=1e-10), (func, how, (tv - ref).abs().max())
    with pytest.raises(shadow.UnshadowedError):  # along the rows: nothing to cut, and too large for a whole shadow
        Shadow(max_elements=10).plan(aten.cumsum.default, (x, 0), {}, aten.cumsum.default(x, 0), 0)


@pytest.mark.parametrize("ignore", [-100, 0, 7])
def test_a_loss_over_a_large_input_is_shadowed_on_the_picked_log_probabilities(ignore):
    """``nll_loss_forward`` over a language model's tokens x vocabulary reads one value a row: its float64 shadow is the
    op on those values alone (a 512 x 50304 input made float64 was 0.1-0.27 s of nanoGPT's compared step on the CPU),
    with the ignored rows (an ignore_index inside the classes too) still ignored: equal to the whole op in float64,
    for every reduction, the loss and its row count."""
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 300, generator=g, dtype=torch.float64).log_softmax(-1)
    t = torch.randint(0, 300, (64,), generator=g)
    t[::5] = ignore
    for reduction in (0, 1, 2):
        res = aten.nll_loss_forward.default(x, t, None, reduction, ignore)
        sh = Shadow(max_elements=100)
        jobs = [sh.plan(aten.nll_loss_forward.default, (x, t, None, reduction, ignore), {}, res[i], i) for i in range(2)]
        sh.flush(jobs)
        for j, r in zip(jobs, res):
            assert j.error is None and j.how == "picked 64/19200" and j.inputs == [], (j.error, j.how)
            assert torch.allclose(j.ref, r, rtol=1e-12, atol=1e-12), (reduction, j.ref, r)


def test_convolution_samples_agree_with_the_whole_in_a_training_step():
    """The CNN's step with sampled convolutions (every output, input gradient and weight gradient over
    ``max_elements``) finds each op's error no larger than the whole op's, and leaves none unshadowed."""
    def net():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                                   torch.nn.Conv2d(16, 16, 3, padding=1, groups=4), torch.nn.ReLU(),
                                   torch.nn.ConvTranspose2d(16, 8, 2, stride=2), torch.nn.Flatten(),
                                   torch.nn.Linear(8 * 32 * 32, 4))
    x = torch.randn(4, 3, 16, 16)
    samp = compare_module(net, x, max_elements=64)  # conv outputs 4096+, weight gradients 432-2304 elements
    full = compare_module(net, x, sample=False)
    f = {(r["phase"], r["module"], r["op"], r["occurrence"], r["out_index"]): r for r in full.rows(kind="op")}
    conv = [r for r in samp.rows(kind="op") if r["op"].startswith("convolution") and r["out_index"] < 2]
    assert len(conv) == 8 and samp.summary["shadow_failed"] == 0, [(r["op"], r["sampling"]) for r in conv]
    for r in conv:
        ref = f[(r["phase"], r["module"], r["op"], r["occurrence"], r["out_index"])]
        if r["local"]["n"] == ref["local"]["n"]:  # the first conv's input gradient is not computed (no grad input)
            continue
        assert r["sampling"] != "full" and r["local"]["max_abs"] <= ref["local"]["max_abs"] * 1.0001 + 1e-12, r
    assert samp.verdict == full.verdict


@pytest.mark.parametrize("queued", [False, True])  # True: the device's code path (no early exits), on the CPU
def test_sentinel_values_compare_as_infinities(queued, monkeypatch):
    """torch.finfo(dtype).min/max are sentinels: a value of one of those magnitudes compares as that sign's infinity,
    on both sides. transformers fills attention masks with finfo(float32).min in the target and finfo(float64).min in
    the float64 reference, and autocast's cast of float32's min to bfloat16 is -inf (BERT under bf16 autocast failed
    on both). A computed value that overflows stays a mismatch (the naive float16 softmax's exp), and so does an
    infinity where the exact value is in range."""
    vals = torch.tensor([torch.finfo(torch.float32).min, -1.0, 2.0, 0.5], dtype=torch.float64)
    for dt in (torch.bfloat16, torch.float16):
        out = vals.to(torch.float32).to(dt)
        assert torch.isinf(out[0])
        for rule in ("element", "aggregate"):
            s = error_stats(out, vals, target_dtype=dt, rtol=1.6e-2, atol=1e-5, normwise=False, rule=rule)
            assert s["nan_inf_mismatch"] == 0 and not s["exceeds"], (dt, rule, s)
        wrong = out.clone()
        wrong[1] = -math.inf  # -1.0 is in range: an infinity there is an error
        s = error_stats(wrong, vals, target_dtype=dt, rtol=1.6e-2, atol=1e-5, normwise=False)
        assert s["nan_inf_mismatch"] == 1 and s["exceeds"], (dt, s)
    # an overflow of a computed value: exp(12) in float16 is inf, its float64 value is no sentinel
    e = torch.tensor([1.0, 12.0], dtype=torch.float64).exp()
    s = error_stats(e.to(torch.float16), e, target_dtype=torch.float16, rtol=1e-3, atol=1e-5, normwise=False)
    assert s["nan_inf_mismatch"] == 1 and s["exceeds"], s
    # the mask as each run builds it: one masked position in a row of ordinary values (a finite row sum)
    mask32 = torch.tensor([0.0, 0.0, torch.finfo(torch.float32).min, 0.5])
    mask64 = mask32.double().clone()
    mask64[2] = torch.finfo(torch.float64).min
    s = error_stats(mask32, mask64, target_dtype=torch.float32, rtol=1.3e-6, atol=1e-5, normwise=False, rule="aggregate")
    assert s["nan_inf_mismatch"] == 0 and not s["exceeds"] and s["max_abs"] == 0.0, s
    # a finite value against a sentinel is a mismatch
    s = error_stats(torch.tensor([1.0, 2.0]), mask64[1:3], target_dtype=torch.float32, rtol=1.3e-6, atol=1e-5,
                    normwise=False)
    assert s["nan_inf_mismatch"] == 1 and s["exceeds"]


def test_sample_index_is_deterministic_and_bounded():
    a = sample_index((100, 100), 500)
    b = sample_index((100, 100), 500)
    assert a is not None and all(torch.equal(x, y) for x, y in zip(a, b))
    assert sample_index((10, 10), 500) is None
    t = torch.arange(10000.).reshape(100, 100)
    assert take_sample(t, 500).numel() == 500


def test_error_stats_known_values():
    r = torch.linspace(1, 2, 1000, dtype=torch.float64)
    t = r * (1 + 1e-3)
    s = error_stats(t, r, target_dtype=torch.float32, rtol=1e-2, atol=0.0, normwise=False)
    assert s["mean_rel"] == pytest.approx(1e-3, rel=1e-6)
    assert s["rms_rel"] == pytest.approx(1e-3, rel=1e-6)
    assert s["max_rel"] == pytest.approx(1e-3, rel=1e-6)
    assert s["cosine"] == pytest.approx(1.0) and not s["exceeds"]
    s = error_stats(t, r, target_dtype=torch.float32, rtol=1e-4, atol=0.0, normwise=False)
    assert s["mismatch_frac"] == 1.0 and s["exceeds"]
    tn = t.clone()
    tn[0] = math.nan
    tn[1] = math.inf
    s = error_stats(tn, r, target_dtype=torch.float32, rtol=1e-2, atol=0.0, normwise=False)
    assert s["nan_inf_mismatch"] == 2 and s["exceeds"]


def test_aggregate_rule_judges_direction_only_above_the_atol_floor():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(4096, generator=g, dtype=torch.float64)
    unrelated = torch.randn(4096, generator=g, dtype=torch.float64)
    kw = dict(target_dtype=torch.float32, rtol=1.3e-6, atol=1e-5, normwise=True, rule="aggregate")
    # noise-level gradients (a masked position's ~1e-8, say): cosine and rms_rel are meaningless there
    s = error_stats(unrelated * 1e-8, ref * 1e-8, **kw)
    assert s["cosine"] < 0.5 and s["rms_rel"] > 1 and not s["exceeds"]
    # the same disagreement at a real scale is an error
    s = error_stats(unrelated, ref, **kw)
    assert s["exceeds"]
    s = error_stats(ref * (1 + 1e-7), ref, **kw)
    assert not s["exceeds"]


class FunctionalDropout(torch.nn.Module):
    """Dropout applied functionally from a float the module keeps, as T5's attention does."""

    def __init__(self):
        super().__init__()
        self.dropout = 0.5
        self.inner = torch.nn.Linear(8, 8)
        self.inner.attention_dropout = 0.25

    def forward(self, x):
        x = torch.nn.functional.dropout(x, p=self.dropout, training=self.training)
        return torch.nn.functional.dropout(self.inner(x), p=self.inner.attention_dropout, training=self.training)


def test_disable_dropout_also_zeroes_functional_dropout_probabilities():
    from hal.conformance.precision.compare import disable_dropout
    m = FunctionalDropout().train()
    m.keep = torch.nn.Dropout(0.3)
    assert disable_dropout(m) == 3
    assert m.dropout == 0.0 and m.inner.attention_dropout == 0.0 and m.keep.p == 0.0
    x = torch.randn(4, 8)
    assert torch.equal(m(x), m.inner(x))


def test_ulp_error_for_16_bit_types():
    r = torch.ones(4, dtype=torch.float64)
    t = torch.full((4,), 1 + 2 ** -10, dtype=torch.float16)  # one float16 ULP above 1.0
    s = error_stats(t, r, target_dtype=torch.float16, rtol=1e-3, atol=1e-5, normwise=False)
    assert s["ulp_max"] == pytest.approx(1.0)
    t = torch.full((4,), 1 + 2 ** -7, dtype=torch.bfloat16)
    s = error_stats(t, r, target_dtype=torch.bfloat16, rtol=1.6e-2, atol=1e-5, normwise=False)
    assert s["ulp_max"] == pytest.approx(1.0)


def test_reduction_thresholds_scale_with_k():
    mm = th.threshold_for("mm", torch.float32, 1000)
    add = th.threshold_for("add", torch.float32, 1000)
    assert mm["class"] == "reduction" and add["class"] == "elementwise"
    assert mm["rtol_eff"] == pytest.approx(1.3e-6 + 1000 * torch.finfo(torch.float32).eps)
    assert add["rtol_eff"] == 1.3e-6
    # 16-bit outputs accumulate in float32
    assert th.threshold_for("mm", torch.bfloat16, 100)["rtol_eff"] == pytest.approx(
        1.6e-2 + 100 * torch.finfo(torch.float32).eps)
    assert th.loosest([torch.float32, torch.bfloat16, torch.float16]) == torch.bfloat16


def test_drift_stats():
    d = drift_stats([1.0, 0.9, 0.8], [1.0, 0.9, 0.8])
    assert d["max_rel_dev"] == 0 and d["r2"] == 1.0
    d = drift_stats([1.1, 0.9, 0.8], [1.0, 0.9, 0.8])
    assert d["max_rel_dev"] == pytest.approx(0.1) and d["r2"] < 1.0
    assert drift_stats([1.0], [1.0])["r2"] is None
    with pytest.raises(ValueError):
        drift_stats([1.0], [1.0, 2.0])


def test_calibration_ratios_follow_msprobe_limits():
    base = {"rms_rel": 1e-3, "max_rel": 1e-2, "mean_rel": 1e-3, "nan_inf_mismatch": 0}
    assert op_verdict(dict(base, exceeds=False), base)["status"] == "pass"
    worse = {"rms_rel": 3e-3, "max_rel": 1e-2, "mean_rel": 1e-3, "nan_inf_mismatch": 0}
    assert op_verdict(dict(worse, exceeds=False), base)["status"] == "warning"
    assert op_verdict(dict(worse, exceeds=True), base)["status"] == "error"
    rows = [{"kind": "op", "phase": "forward", "module": "m", "op": "mm", "occurrence": 0, "out_index": 0,
             "local": dict(worse, exceeds=True)}]
    cal = calibrate(rows, [dict(rows[0], local=base)], "cuda")
    assert cal["counts"]["error"] == 1 and cal["ops"][0]["ratios"]["rms_rel"] == pytest.approx(3.0)


def test_calibration_unavailable_device_gives_reason():
    res = compare_module(lambda: Net(naive=False), _inputs(1.0), calibrate_with="cuda" if not
                         torch.cuda.is_available() else "cpu")
    assert res.calibration is None
    d = res.as_dict()
    assert d["calibration"] is None and d["calibration_reason"]


def test_unavailable_target_device_raises_typed_error():
    from hal.errors import BackendUnavailableError
    if torch.cuda.is_available():
        pytest.skip("cuda present")
    with pytest.raises(BackendUnavailableError):
        compare_module(lambda: Net(naive=False), _inputs(1.0), device="cuda")


def test_cli_bad_input_is_one_line_exit_2(tmp_path):
    p = subprocess.run([sys.executable, "-m", "hal.conformance.precision", "--model", "nope",
                        "--out", str(tmp_path / "x.json")], capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_device_attention_kernels_have_a_float64_cpu_shadow():
    """CUDA-only SDPA kernels (flash/efficient) are shadowed by float64 math attention on the CPU;
    checked here against CPU attention with the same argument layout (no GPU needed)."""
    aten = torch.ops.aten
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 8, 4, generator=g) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    out = torch.empty(2, 3, 8, 4)  # stands for the device kernel's output (the kernel itself is never called)
    _, got, how = Shadow().run(aten._scaled_dot_product_flash_attention.default, (q, k, v, 0.0, True), {}, out, 0)
    torch.testing.assert_close(got, want)
    _, got, _ = Shadow().run(aten._scaled_dot_product_efficient_attention.default, (q, k, v, None, False, 0.0, True),
                             {}, out, 0)
    torch.testing.assert_close(got, want)
    assert got.dtype == torch.float64 and how == "full"


def test_calibration_on_real_rows_grades_bfloat16_against_float32():
    """Calibrated verdicts on real comparisons: a bfloat16-autocast run graded against a float32
    run of the same model (standing in for a second device) is worse by more than msprobe's
    ratios, but within its own bfloat16 thresholds -> warnings, no errors."""
    x = _inputs(1.0)
    tgt = compare_module(lambda: Net(naive=False), x, autocast=torch.bfloat16)
    cal = compare_module(lambda: Net(naive=False), x)
    c = calibrate(tgt.metrics, cal.metrics, "cpu-float32")
    assert c["counts"]["warning"] > 0 and c["counts"]["error"] == 0
    mm = [o for o in c["ops"] if o["op"] == "addmm"]
    assert mm and all(o["ratios"]["rms_rel"] > 2 for o in mm)


class _Child(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.lin(x))


class _Parent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.child = _Child()

    def forward(self, x):
        h = x * 2.0  # the parent's own op, before and around its child
        return self.child(h) + h


def test_backward_ops_belong_to_the_innermost_module_whose_forward_made_their_node():
    """The module hooks mark where the autograd sequence counter stood as each forward began and ended;
    a backward op is looked up by its node's number (ops outside every module: ``<unattributed>``)."""
    m = _Parent()
    tr = StepTracer(m, "target", shadow=False)
    with tr:
        loss = (m(torch.randn(4, 8, requires_grad=True)) ** 2).sum()  # the loss: outside the model
        loss.backward()
    bwd = {(r.op, r.module) for r in tr.records if r.kind == "op" and r.phase == "backward"}
    assert {("tanh_backward", "child"), ("mm", "child.lin"), ("mul", "<root>"), ("pow", "<unattributed>")} <= bwd
    assert not tr._stack  # every pre-hook's module was popped by its post-hook


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=4), st.integers(1, 200), st.data())
def test_pointwise_sample_block_is_a_view_that_commutes_with_the_op(shape, max_elements, data):
    """The point-wise shadow compares a block of the output: the same block of every (broadcast) operand, as
    views, gives exactly that block of the op's result, and the block holds at most ``max_elements``."""
    shape = tuple(shape)
    bshape = tuple(1 if data.draw(st.booleans()) else s for s in shape[data.draw(st.integers(0, len(shape) - 1)):])
    a, b = torch.randn(shape), torch.randn(bshape)
    where = block(shape, max_elements)
    out = torch.addcmul(a, a, b)
    got = torch.addcmul(block_of(a, shape, where), block_of(a, shape, where), block_of(b, shape, where))
    want = block_of(out, shape, where)
    assert torch.equal(got, want) and 0 < want.numel() <= max(max_elements, 1)
    assert want.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()  # a view: no gather


def test_collectives_and_fsdp_buffer_copies_are_never_compared():
    """A functional collective (DTensor's redistributions: a float64 shadow of it on one rank's values is not its
    result) and FSDP2's copies into its all-gather buffer (whose padding is never written: compared, it was a false
    divergence of 1e38 on pytorch/examples fsdp_tp_example) carry their source's producer and are not recorded."""
    import importlib

    import torch.distributed._functional_collectives  # noqa: F401  registers _c10d_functional
    from hal.conformance.precision.tracer import _op_info
    info = _op_info(torch.ops._c10d_functional.all_reduce.default)
    assert info.passthrough and info.collective
    assert not _op_info(torch.ops.aten.mm.default).passthrough
    for module in ("torch.distributed.fsdp._fully_shard._fsdp_collectives",  # torch >= 2.6 registers fsdp:: ops
                   "torch.distributed._composable.fsdp._fsdp_collectives"):
        try:
            importlib.import_module(module)
        except ImportError:
            continue
    copy_in = getattr(getattr(torch.ops.fsdp, "all_gather_copy_in", None), "default", None) \
        if hasattr(torch.ops, "fsdp") else None
    if copy_in is not None:  # torch 2.4's FSDP2 copies with aten ops
        assert _op_info(copy_in).passthrough and not _op_info(copy_in).collective


def test_gpu_batch_norm_kernels_are_recorded_under_the_cpu_reference_s_name():
    """cuDNN's batch norm (and MIOpen's) is ``native_batch_norm`` in the CPU reference run: recorded under its own
    name, each of a CNN's batch norm outputs on an H100 (36 in the cnn model) had no total comparison. Its first three
    outputs (output, saved mean, saved inverse std) and the backward's three gradients are the comparable ones."""
    from hal.conformance.precision.tracer import _op_info
    for kernel, canonical in (("cudnn_batch_norm", "native_batch_norm"), ("miopen_batch_norm", "native_batch_norm"),
                              ("cudnn_batch_norm_backward", "native_batch_norm_backward"),
                              ("miopen_batch_norm_backward", "native_batch_norm_backward")):
        info = _op_info(getattr(torch.ops.aten, kernel).default)
        assert (info.name, info.n_out) == (canonical, 3) and not info.passthrough, (kernel, info)
    assert _op_info(torch.ops.aten.native_batch_norm.default).name == "native_batch_norm"
