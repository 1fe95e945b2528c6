"""The precision tracers' batched statistics and deferred comparisons (issue 17, overhead).

``error_stats_many`` judges a whole step's comparisons in a few padded, vectorised passes: its
results must not depend on how requests are grouped (padding, buckets, chunks) and must match the
metric definitions computed element by element. The tracer queues comparisons while the step runs
and judges them on exit, so a sample must keep the value an op produced even when the program
later changes that tensor in place. The float64 shadow runs on the device when its backend computes
float64 natively, unless ``HAL_PRECISION_SHADOW_DEVICE=cpu`` keeps it on the CPU (the CUDA test runs
on the GPU machine and skips elsewhere with the backend's reason).
"""
from __future__ import annotations

import math

import pytest
import torch
from hal.conformance.precision import attention, metrics, shadow
from hal.conformance.precision import thresholds
from hal.conformance.precision.metrics import StatsRequest, error_stats, error_stats_many
from hal.conformance.precision.shadow import _HOMES, ENV_SHADOW_DEVICE, float64_home
from hal.conformance.precision.tracer import StepTracer
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import cuda_backend_missing

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def _request(seed: int, n: int, dtype: torch.dtype, noise: float, special: bool, rule: str, normwise: bool):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(n, generator=g, dtype=torch.float64) * 10 ** (seed % 7 - 3)
    t = (r * (1 + noise * torch.randn(n, generator=g, dtype=torch.float64))).to(dtype)
    if special and n > 2:
        t, r = t.clone(), r.clone()
        t[0], r[1], t[-1], r[-1] = math.nan, math.inf, -math.inf, -math.inf
    return StatsRequest(t, r, dtype, 1e-3, 1e-5 if seed % 2 else 0.0, normwise, rule)


_requests = st.lists(st.builds(_request, st.integers(0, 10 ** 6), st.sampled_from([1, 2, 7, 300, 1024, 1025, 5000]),
                               st.sampled_from(_DTYPES), st.sampled_from([0.0, 1e-6, 1e-3, 0.3]), st.booleans(),
                               st.sampled_from(["element", "aggregate"]), st.booleans()), min_size=1, max_size=40)


def _same(a: dict, b: dict) -> bool:
    for k, v in a.items():
        w = b[k]
        if isinstance(v, float) and isinstance(w, float):
            if not (v == w or (math.isnan(v) and math.isnan(w)) or abs(v - w) <= 1e-9 * max(abs(v), abs(w))):
                return False
        elif v != w:
            return False
    return a.keys() == b.keys()


@settings(max_examples=40, deadline=None)
@given(_requests)
def test_batched_statistics_do_not_depend_on_grouping(reqs):
    together = error_stats_many(reqs)
    alone = [error_stats_many([q])[0] for q in reqs]
    assert all(_same(a, b) for a, b in zip(together, alone))


@pytest.mark.parametrize("length_class", [1, metrics._DEVICE_LENGTH_CLASS])  # the CPU's buckets, and a device's
def test_batched_statistics_match_the_definitions(monkeypatch, length_class):
    # several chunks and padded rows; a device's classes: rows of 1025 and 1500 elements in one matrix
    monkeypatch.setitem(metrics._CHUNK_ELEMENTS, "cpu", 2048 if length_class == 1 else 1 << 16)
    monkeypatch.setitem(metrics._LENGTH_CLASS, "cpu", length_class)
    calls = []
    rows = metrics._stats_rows
    monkeypatch.setattr(metrics, "_stats_rows", lambda reqs, idx, *a: calls.append(len(idx)) or rows(reqs, idx, *a))
    reqs = [_request(s, n, dt, 1e-3, s % 3 == 0, "element", s % 2 == 0)
            for s, (n, dt) in enumerate([(5, torch.float32), (1500, torch.float16), (4096, torch.bfloat16),
                                         (3000, torch.float32), (33, torch.float64), (1025, torch.float16)])]
    for q, s in zip(reqs, error_stats_many(reqs)):
        t, r = q.target.double().tolist(), q.ref.tolist()
        fin = [math.isfinite(a) and math.isfinite(b) for a, b in zip(t, r)]
        d = [abs(a - b) if f else 0.0 for a, b, f in zip(t, r, fin)]
        ar = [abs(b) if f else 0.0 for b, f in zip(r, fin)]
        nonfin = sum(1 for a, b, f in zip(t, r, fin) if not f and not (a == b or (math.isnan(a) and math.isnan(b))))
        rms_ref = math.sqrt(sum(x * x for x in ar) / max(1, sum(fin)))
        scale = [max(x, rms_ref) if q.normwise else x for x in ar]
        bad = sum(1 for x, sc, f in zip(d, scale, fin) if f and x > sc * q.rtol + q.atol)
        assert s["n"] == len(t) and s["nan_inf_mismatch"] == nonfin
        assert s["max_abs"] == pytest.approx(max(d), rel=1e-12, abs=0)
        assert s["mean_rel"] == pytest.approx(sum(d) / sum(ar), rel=1e-9)
        assert s["rms_rel"] == pytest.approx(math.sqrt(sum(x * x for x in d) / sum(x * x for x in ar)), rel=1e-9)
        assert s["mismatch_frac"] == pytest.approx((bad + nonfin) / len(t), rel=1e-12)
        assert ("ulp_max" in s) == (q.target_dtype in (torch.float16, torch.bfloat16))
        if "ulp_max" in s:  # d / ulp(ref) in the target's format, normal range (ulp of a zero ref: that of 1.0)
            bits, min_exp = (10, -13) if q.target_dtype == torch.float16 else (7, -125)
            ulps = [x / 2.0 ** (max(math.frexp(a if a > 0 else 1.0)[1] - 1, min_exp) - bits) for x, a in zip(d, ar)]
            assert s["ulp_max"] == pytest.approx(max(ulps), rel=1e-12)
    # one matrix holds every dtype; CPU: rows of 5 and 33 together, 1500 and 1025 (and 4096 and 3000) over the
    # chunk; a device's classes: the rows of 5-1500 elements together, then 3000 and 4096
    assert sorted(calls) == ([1, 1, 1, 1, 2] if length_class == 1 else [2, 4])


def test_ulps_of_tiny_references_count_from_the_formats_smallest_normal():
    """A reference below the target format's normal range (a float64 subnormal too) has the ULP of the format's
    smallest normal: the error in ULPs stays finite (torch 2.4's ldexp made it inf for a subnormal reference)."""
    r = torch.tensor([1e-310, 1e-300, 0.0, 3.0], dtype=torch.float64)
    d = torch.tensor([2.0 ** -130, 2.0 ** -131, 0.0, 2.0 ** -6], dtype=torch.float64)
    for dtype, bits, min_exp in ((torch.bfloat16, 7, -125), (torch.float16, 10, -13)):
        s = error_stats_many([StatsRequest(r + d, r, dtype, 1e-3, 0.0, False)])[0]
        ulps = [x / 2.0 ** (max(math.frexp(a if a > 0 else 1.0)[1] - 1, min_exp) - bits) for x, a in
                zip(d.tolist(), r.tolist())]
        assert s["ulp_max"] == pytest.approx(max(ulps), rel=1e-12) and math.isfinite(s["ulp_max"])
        assert s["ulp_mean"] == pytest.approx(sum(ulps) / 4, rel=1e-12)


@settings(max_examples=25, deadline=None)
@given(_requests)
def test_a_devices_queued_statistics_equal_the_cpus(reqs):
    """On a device the statistics take the masked path without the finiteness test's synchronisation, lay out their
    matrices by one join and masked scatter per dtype (:func:`metrics._padded_runs`), and read every matrix's results
    after all are queued: run that way on the CPU, they equal the CPU's own, also for targets that require grad (the
    program's outputs, judged after the step: its device layout once kept their grad, and the statistics failed)."""
    want = error_stats_many(reqs)
    import dataclasses
    import unittest.mock
    graded = [dataclasses.replace(q, target=q.target.detach().requires_grad_()) for q in reqs]
    with unittest.mock.patch.object(metrics, "_queued", lambda dev: True), unittest.mock.patch.object(
            metrics, "_padded", lambda xs, lens, home, lengths, slot: metrics._padded_runs(xs, lens, home, lengths)):
        got, got_graded = error_stats_many(reqs), error_stats_many(graded)
    assert all(_same(a, b) and _same(a, c) for a, b, c in zip(want, got, got_graded))


@given(st.lists(st.tuples(st.one_of(st.integers(1, 40), st.sampled_from([8, 40])), st.sampled_from(_DTYPES),
                          st.booleans()), min_size=1, max_size=8), st.booleans())
@settings(max_examples=60, deadline=None)
def test_both_padded_layouts_hold_each_row_then_zeros(rows_, given_lengths):
    """The CPU's copies (one per run of rows of one length and dtype, full-length runs straight into their rows) and
    the devices' masked scatter (one per run of a dtype) lay out the same float64 matrix, with the rows sorted as the
    statistics sort them; rows may be 2-D and require grad (a program's tensor, judged later)."""
    rows_ = sorted(rows_, key=lambda r: (str(r[1]), -r[0]))
    lens = [n for n, _, _ in rows_]
    g = torch.Generator().manual_seed(sum(lens))
    xs = []
    for n, dt, grad in rows_:
        x = torch.randn(n, generator=g, dtype=torch.float64).to(dt)
        if grad and n % 2 == 0:
            x = x.view(2, n // 2).requires_grad_()
        xs.append(x)
    metrics._padded_rows([torch.full((n,), math.nan) for n in lens], lens, "test")  # the slot holds garbage first
    rows = metrics._padded_rows(xs, lens, "test")
    lengths = torch.tensor(lens, dtype=torch.float64).unsqueeze(1) if given_lengths else None
    scattered = metrics._padded_runs(xs, lens, torch.device("cpu"), lengths)
    assert rows.dtype == scattered.dtype == torch.float64 and rows.shape == (len(lens), max(lens))
    assert torch.equal(rows, scattered)
    for row, x, n in zip(rows, xs, lens):
        assert torch.equal(row[:n], x.detach().reshape(-1).double()) and not row[n:].any()


@given(st.lists(st.integers(1, 12), min_size=1, max_size=4), st.integers(1, 60), st.booleans())
@settings(max_examples=60, deadline=None)
def test_sampled_values_are_the_values_at_the_sample_positions(shape, max_elements, transposed):
    """The gather by flat index (``torch.take``) reads the positions of the multi-dimensional sample index,
    on views with any strides too."""
    t = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    if transposed and t.dim() > 1:
        t = t.transpose(0, -1)
    values, may_alias = metrics.sampled_values(t, max_elements)
    idx = metrics.sample_index(t.shape, max_elements)
    if idx is None:
        assert may_alias and torch.equal(values, t.reshape(-1))
    else:
        assert not may_alias and values.shape == (max_elements,) and torch.equal(values, t[idx])


def _mixed_requests(seed: int, count: int) -> list:
    dts = [torch.float32, torch.float16, torch.bfloat16]
    return [_request(seed + i, [7, 300, 1025, 5000, 16000][(seed + i) % 5], dts[i % 3], 1e-3, i % 4 == 0,
                     ["element", "aggregate"][i % 2], i % 3 == 0) for i in range(count)]


def test_statistics_on_reused_scratch_buffers_equal_fresh_ones(monkeypatch):
    """The CPU statistics take their matrices from per-thread scratch buffers kept between calls: a call after
    others of other shapes (the buffers hold their values, or are larger) gives what fresh buffers give, and
    no two of one pass share a buffer."""
    first, other = _mixed_requests(0, 14), _mixed_requests(100, 9)
    reused = error_stats_many(first)
    error_stats_many(other)
    again = error_stats_many(first)
    monkeypatch.setattr(metrics, "SCRATCH_MAX_ELEMENTS", 0)  # every matrix allocated per call
    fresh = error_stats_many(first)
    assert all(_same(a, b) and _same(a, c) for a, b, c in zip(fresh, reused, again))


def test_statistics_in_threads_equal_one_thread():
    """Thread-safety: each thread has its own scratch buffers (torch releases the GIL inside the passes)."""
    import threading
    sets = [_mixed_requests(1000 * k, 8) for k in range(4)]
    want = [error_stats_many(reqs) for reqs in sets]
    got: dict = {}

    def work(k: int) -> None:
        got[k] = [error_stats_many(sets[k]) for _ in range(5)]
    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(sets))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(_same(a, b) for k in range(len(sets)) for run in got[k] for a, b in zip(want[k], run))


def test_scratch_keeps_nothing_above_its_bound():
    big = metrics.scratch("test-big", 2, metrics.SCRATCH_MAX_ELEMENTS)
    assert big.shape == (2, metrics.SCRATCH_MAX_ELEMENTS) and ("test-big", torch.float64) not in metrics._scratch.bufs
    small = metrics.scratch("test-small", 3, 5)
    assert small.shape == (3, 5) and small.data_ptr() == metrics.scratch("test-small", 2, 4).data_ptr()


def test_row_sums_that_overflow_take_the_exact_path():
    """The fast path trusts finite row sums; values whose sum overflows (every element finite) must still be
    judged exactly: finite, no NaN/Inf mismatch, the errors they really have."""
    r = torch.full((64,), 1e308, dtype=torch.float64)
    t = r * (1 + 1e-9)
    s = error_stats(t, r, target_dtype=torch.float64, rtol=1e-6, atol=0.0, normwise=False)
    assert s["nan_inf_mismatch"] == 0 and not s["exceeds"]
    assert s["max_abs"] == pytest.approx(1e299, rel=1e-6) and math.isfinite(s["mean_rel"])


def test_single_comparison_is_one_request_of_the_batch():
    q = _request(3, 700, torch.float16, 1e-3, True, "aggregate", True)
    s = error_stats(q.target, q.ref, target_dtype=q.target_dtype, rtol=q.rtol, atol=q.atol, normwise=q.normwise,
                    rule=q.rule)
    assert _same(s, error_stats_many([q])[0])
    with pytest.raises(ValueError, match="elements"):
        error_stats_many([StatsRequest(torch.ones(3), torch.ones(4), torch.float32, 1e-3, 0.0, False)])


#: ways a program overwrites an op's output before the step ends; the tracer sees each through the op's schema
_OVERWRITES = {
    "in place": lambda y: y.mul_(0.0).add_(1e6),  # as x += ..., AccumulateGrad or clip_grad_norm_ do
    "through a view": lambda y: y.view(-1)[:64].fill_(1e6),
    "out=": lambda y: torch.add(y, 1e6, out=y),
    "foreach list": lambda y: torch._foreach_mul_([y], 0.0),  # as GradScaler's unscale_ and foreach optimizers
}


class _Mutates(torch.nn.Module):
    """A linear whose output (``what="output"``), or whose input (``"input"``: a tanh's result), the program
    changes before the step ends: the deferred comparison must see the value the op produced, and the
    float64 shadow computed at the step's end the value the op read."""

    def __init__(self, overwrite, what: str = "output"):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.overwrite = overwrite
        self.what = what

    def forward(self, x):
        h = torch.tanh(x)
        y = self.lin(h)
        self.overwrite(y if self.what == "output" else h)
        return y.sum()


@pytest.mark.parametrize("how", sorted(_OVERWRITES))
def test_deferred_comparisons_keep_the_value_the_op_produced(how):
    m = _Mutates(_OVERWRITES[how], "output")
    x = torch.randn(4, 16)
    with torch.no_grad():
        ref = StepTracer(m, "reference")
        with ref:
            m(x)
        tr = StepTracer(m, "target", reference_samples=ref.samples)
        with tr:
            m(x)
    lin = [r for r in tr.records if r.op == "addmm"]
    assert lin and lin[0].local is not None and lin[0].total is not None  # filled by finalize on exit
    assert lin[0].local["max_abs"] < 1e-4 and lin[0].total["max_abs"] < 1e-4
    assert tr.finalize_ms > 0


@pytest.mark.parametrize("how", sorted(_OVERWRITES))
def test_deferred_shadows_read_the_inputs_the_op_read(how):
    m = _Mutates(_OVERWRITES[how], "input")
    tr = StepTracer(m, "target", record_module_outputs=False)
    with torch.no_grad(), tr:
        m(torch.randn(4, 16))
    lin = [r for r in tr.records if r.op == "addmm"]
    assert lin and lin[0].shadow_error is None and lin[0].local["max_abs"] < 1e-4, lin[0].local


class _Tower(torch.nn.Module):
    """Layers of one shape: their ops' float64 shadows are computed in batched calls (matrix products, softmax
    and point-wise ops in one plain op each; layer norm and the rest through vmap, as there are
    ``VMAP_MIN_GROUP`` layers)."""

    def __init__(self, layers: int = shadow.VMAP_MIN_GROUP, width: int = 32):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.LayerNorm(width), torch.nn.Linear(width, width), torch.nn.GELU())
            for _ in range(layers))

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return torch.softmax(x, -1).pow(2).sum()


def _traced_tower(device: str = "cpu"):
    torch.manual_seed(0)
    m = _Tower().to(device)
    tr = StepTracer(m, "target", record_module_outputs=False)
    with tr:
        m(torch.randn(8, 32, device=device)).backward()
    return tr


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    bool(cuda_backend_missing()), reason=cuda_backend_missing() or "-"))])
def test_batched_shadows_equal_the_op_by_op_shadows(monkeypatch, device):
    monkeypatch.setattr(shadow, "_UNBATCHABLE", set())
    batched = _traced_tower(device)
    assert not shadow._UNBATCHABLE  # no batched call failed (a failure falls back to one by one, silently)
    # layers of one shape: each of their ops' shadows in one call for all of them, some through vmap
    sh = batched.shadow
    assert sh.batched_calls > 0 and sh.vmap_calls > 0 and sh.batched_jobs >= shadow.VMAP_MIN_GROUP * sh.batched_calls
    monkeypatch.setattr(shadow.Shadow, "_run_batched", lambda self, jobs, direct: None)  # every job on its own
    alone = _traced_tower(device)
    assert alone.shadow.batched_calls == 0
    assert [r.key for r in batched.records] == [r.key for r in alone.records]
    for a, b in zip(batched.records, alone.records):
        assert (a.local is None) == (b.local is None) and a.shadow_error == b.shadow_error, (a.key, a.shadow_error)
        if a.local is not None:
            assert a.local["max_abs"] == pytest.approx(b.local["max_abs"], rel=1e-6, abs=1e-12), a.key
            assert a.local["exceeds"] == b.local["exceeds"]


def test_prefetched_upcasts_are_the_upcasts_one_by_one(monkeypatch):
    """The upcast cache's prefetch casts the small floating inputs of a flush together (one flatten, one cast, views):
    each cached copy equals its own cast (a transposed view's too), nothing else is cached (integers, float64 already
    home, tensors over the size bound), and a later get() is a hit."""
    monkeypatch.setattr(shadow, "PREFETCH_MAX_ELEMENTS", 64)
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(4, 6, generator=g), torch.randn(5, generator=g).to(torch.bfloat16)
    c = torch.randn(3, 7, generator=g).t()  # not contiguous
    big, ints, f64 = torch.randn(65, generator=g), torch.arange(5), torch.randn(3, dtype=torch.float64, generator=g)
    cache = shadow.UpcastCache()
    cache.prefetch([a, b, c, c, big, ints, f64, torch.randn(4, 6, generator=g).half()])
    assert cache.misses == 2  # a and c (float32) together; b and the float16 tensor alone in their dtypes: not cast
    for x in (a, c):
        up = cache.get(x)
        assert up.dtype == torch.float64 and up.shape == x.shape and torch.equal(up, x.double())
    assert cache.hits == 2 and cache.misses == 2
    assert torch.equal(cache.get(b), b.double()) and cache.misses == 3  # cast alone on its first get()
    a.add_(1)  # a new version: no stale copy
    assert torch.equal(cache.get(a), a.double()) and cache.misses == 4


def test_shadows_are_the_same_with_inputs_upcast_together_or_one_by_one(monkeypatch):
    joined = []
    monkeypatch.setattr(shadow, "flatten_join", lambda ts: joined.append(len(ts)) or metrics.flatten_join(ts))
    together = _traced_tower("cpu")
    assert joined and max(joined) > 1  # some inputs were upcast together
    monkeypatch.setattr(shadow, "PREFETCH_MAX_ELEMENTS", 0)
    alone = _traced_tower("cpu")
    assert [r.key for r in together.records] == [r.key for r in alone.records]
    assert [r.local for r in together.records] == [r.local for r in alone.records]


def test_the_outputs_of_one_op_call_share_one_float64_call(monkeypatch):
    """native_layer_norm's three outputs and its backward's three gradients are each compared, from one
    float64 call per op call: the same judgements as one call per output."""
    def traced():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16))
        tr = StepTracer(m, "target", record_module_outputs=False)
        with tr:
            m(torch.randn(8, 16)).sum().backward()
        return tr
    shared = traced()
    norms = [r for r in shared.records if r.op.startswith("native_layer_norm")]
    assert sorted((r.op, r.out_index) for r in norms) == [(op, i) for op in ("native_layer_norm",
                                                                            "native_layer_norm_backward")
                                                          for i in range(3)]
    assert all(r.local is not None and r.shadow_error is None for r in norms), [(r.key, r.shadow_error) for r in norms]
    assert shared.shadow.shared_jobs == 4  # outputs 1 and 2 of each call
    plan = shadow.Shadow.plan

    def alone(self, *a, **k):  # no sibling: every output's job makes its own call
        self._last_call = None
        return plan(self, *a, **k)
    monkeypatch.setattr(shadow.Shadow, "plan", alone)
    each = traced()
    assert each.shadow.shared_jobs == 0
    assert [r.key for r in shared.records] == [r.key for r in each.records]
    for a, b in zip(shared.records, each.records):
        assert (a.local is None) == (b.local is None) and a.shadow_error == b.shadow_error, a.key
        if a.local is not None:
            assert a.local["max_abs"] == b.local["max_abs"] and a.local["exceeds"] == b.local["exceeds"], a.key


@pytest.mark.parametrize("group", [1, 2])
def test_a_script_shadow_compares_a_large_output_on_its_fixed_sample(group):
    """A script target's shadow of an op without a sampled variant is computed whole and compared at the fixed
    sample of ``max_elements`` positions, computed alone or in a group."""
    from hal.conformance.precision.script import _SampledShadow
    sh = _SampledShadow(max_elements=16)
    g = torch.Generator().manual_seed(3)
    jobs = []
    for _ in range(group):
        x = torch.randn(8, 8, generator=g)
        out = torch.ops.aten.cumsum.default(x, 0)  # along the rows: no sampled variant (BATCHWISE needs another dim)
        jobs.append(sh.plan(torch.ops.aten.cumsum.default, (x, 0), {}, out, 0))
    assert [j.how for j in jobs] == ["full"] * group
    wants = [(j.target.detach()[metrics.sample_index((8, 8), 16)],
              torch.cumsum(j.inputs[0].double(), 0)[metrics.sample_index((8, 8), 16)]) for j in jobs]
    sh.flush(jobs)
    for j, (target, ref) in zip(jobs, wants):
        assert j.error is None and j.how.startswith("elements 16/64")
        assert torch.equal(j.target, target) and j.ref.dtype == torch.float64
        torch.testing.assert_close(j.ref, ref, rtol=1e-12, atol=1e-12)


def test_planned_shadows_are_computed_early_past_their_memory_bound(monkeypatch):
    """A step whose planned shadows keep more than ``defer_bytes`` of program memory alive computes them as
    it goes: the same judgements, none of them batched across the bound."""
    monkeypatch.setattr(shadow, "_UNBATCHABLE", set())
    torch.manual_seed(0)
    m = _Tower()
    early = StepTracer(m, "target", record_module_outputs=False)
    early.defer_bytes = 0
    with early:
        m(torch.randn(8, 32)).backward()
    # computed inside the dispatch, one by one: no vmap was tried there (it fails there, and would mark the op)
    assert early.shadow.batched_calls == 0 and not early._jobs and not shadow._UNBATCHABLE
    at_end = _traced_tower()
    assert [r.key for r in early.records] == [r.key for r in at_end.records]
    for a, b in zip(early.records, at_end.records):
        assert (a.local is None) == (b.local is None) and a.shadow_error == b.shadow_error
        if a.local is not None:
            assert a.local["max_abs"] == pytest.approx(b.local["max_abs"], rel=1e-6, abs=1e-12), a.key


def test_outputs_nobody_writes_are_compared_in_place_not_copied():
    """Copy-on-write: a small output queued for the statistics is the program's own tensor until an op is
    about to write it; a step that writes nothing copies nothing."""
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh())
    outs = []
    for mod in m:
        mod.register_forward_hook(lambda _m, _a, o: outs.append(o))
    tr = StepTracer(m, "target", record_module_outputs=False)
    with torch.no_grad(), tr:
        m(torch.randn(4, 16))
        queued = [job.target for _, job in tr._jobs]  # the planned float64 shadows' compared outputs
        assert len(queued) == 2 and tr._held
        assert {t.untyped_storage().data_ptr() for t in queued} == {o.untyped_storage().data_ptr() for o in outs}
    assert not tr._held  # finalize let go of them
    assert [r.op for r in tr.records] == ["addmm", "tanh"] and all(not r.local["exceeds"] for r in tr.records)


class _Casts(torch.nn.Module):
    """Autocast's two kinds of cast, by hand: a narrowing one (float32 to bfloat16: rounds) and widening ones
    (bfloat16 to float32, float32 to float64: exact), then a cast in place of its output (``mul_``)."""

    def forward(self, x):
        low = x.to(torch.bfloat16)
        back = low.to(torch.float32)
        wide = back.to(torch.float64)
        back.mul_(3.0)  # the program writes a widened output before the judging: its comparison keeps its value
        return low, back, wide


def test_exact_casts_are_compared_with_themselves_not_shadowed():
    """A widening cast (or a same-dtype copy) keeps every value: its record is compared with itself (zero local
    error, its own scale), no float64 shadow is planned for it; a narrowing cast is shadowed and shows its rounding."""
    from hal.conformance.precision.tracer import EXACT_CAST, exact_cast
    tr = StepTracer(_Casts(), "target", record_module_outputs=False)
    x = torch.randn(64, 33) * 100
    with torch.no_grad(), tr:
        tr.model(x)
        assert len(tr._jobs) == 1  # the narrowing cast's only
    casts = [r for r in tr.records if r.op == "_to_copy"]
    assert [(r.dtype, r.sampling == EXACT_CAST) for r in casts] == [("bfloat16", False), ("float32", True),
                                                                    ("float64", True)]
    narrow, widened, wider = casts
    assert narrow.local["max_abs"] > 0 and not narrow.local["exceeds"]  # bfloat16's rounding, within its tolerance
    for r in (widened, wider):
        assert r.shadow_error is None and r.local["max_abs"] == 0 and r.local["n"] == 64 * 33
        assert r.local["cosine"] == 1.0 and not r.local["exceeds"]
    bf = x.to(torch.bfloat16).double()
    assert widened.local["rms_ref"] == pytest.approx(float(bf.pow(2).mean().sqrt()), rel=1e-9)  # before the mul_
    ops = torch.ops.aten
    assert exact_cast(ops._to_copy.default, (torch.zeros(2, dtype=torch.float16),), torch.zeros(2))
    assert exact_cast(ops._to_copy.default, (torch.zeros(2),), torch.zeros(2))  # a copy in its own dtype
    assert not exact_cast(ops._to_copy.default, (torch.zeros(2),), torch.zeros(2, dtype=torch.float16))
    assert not exact_cast(ops._to_copy.default, (torch.zeros(2, dtype=torch.int64),), torch.zeros(2))
    assert not exact_cast(ops.clone.default, (torch.zeros(2),), torch.zeros(2))


class _SparseOperands(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(40, 40))

    def forward(self, adj1, adj2, features):
        # two adds of one key (a batch of two for a dense operand), a large product and a sparse output
        h = (self.w + adj1) * (self.w + adj2)
        return torch.spmm(adj1, torch.mm(h, self.w)), features.to_sparse()


def test_ops_on_sparse_operands_are_shadowed_whole_and_sparse_outputs_are_counted(monkeypatch):
    """A sparse operand (a graph network's adjacency) is never stacked into a batch: stacked, the point-wise direct
    form failed on it and marked ``add`` unbatchable for the rest of the process. A large product of one is shadowed
    whole (its sampled form sliced rows of it: ``as_strided`` on SparseCPU, unshadowed). A sparse output, an op's or
    a module's, is counted, not sampled (``reshape`` on a sparse tensor raised inside the program's op)."""
    monkeypatch.setattr(shadow, "_UNBATCHABLE", set())
    adj1, adj2 = [(torch.rand(40, 40, generator=torch.Generator().manual_seed(i)) < 0.2).float().to_sparse()
                  for i in (1, 2)]
    tr = StepTracer(_SparseOperands(), "target", max_elements=256)
    with tr:
        out, sparse = tr.model(adj1, adj2, torch.randn(8, 8))
        out.sum().backward()
    ops = [r for r in tr.records if r.kind == "op"]
    assert not shadow._UNBATCHABLE and sparse.layout == torch.sparse_coo
    assert [r.op for r in ops if r.phase == "forward"] == ["add", "add", "mul", "mm", "mm", "sum"]
    assert all(r.shadow_error is None and r.local and not r.local["exceeds"] for r in ops), \
        [(r.op, r.shadow_error) for r in ops]
    spmm = [r for r in ops if r.op == "mm" and r.phase == "forward"][1]
    assert spmm.shape == (40, 40) and spmm.sampling == "full" and spmm.local["n"] == 1600
    assert dict(tr.sparse_ops) == {"_to_sparse": 1, "<module>": 1}  # the op's output, and the module's


def test_float64_shadows_stay_on_the_cpu_unless_the_device_computes_float64(monkeypatch):
    assert float64_home(torch.device("cpu")) == torch.device("cpu")
    monkeypatch.setattr("hal.conformance.precision.shadow._HOMES", {})
    monkeypatch.delenv(ENV_SHADOW_DEVICE, raising=False)
    assert float64_home(torch.device("meta")) == torch.device("cpu")  # no backend for it: the CPU
    from hal.backends.mlu import MluBackend
    # an MLU computes float64 as float32 (torch_mlu): its float64 shadow would be no reference
    assert "float64" not in MluBackend().native_dtypes((5, 0))


@pytest.mark.skipif(bool(cuda_backend_missing()), reason=cuda_backend_missing() or "-")
def test_on_cuda_shadows_run_on_the_device_unless_the_cpu_is_asked_for(monkeypatch):
    dev = torch.device("cuda", torch.cuda.current_device())
    monkeypatch.setenv(ENV_SHADOW_DEVICE, "cpu")
    _HOMES.clear()
    assert float64_home(dev) == torch.device("cpu")
    monkeypatch.delenv(ENV_SHADOW_DEVICE, raising=False)
    _HOMES.clear()
    assert float64_home(dev) == dev  # CUDA computes float64 natively: the default home
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to(dev)
    x = torch.randn(32, 64, device=dev)
    tr = StepTracer(m, "target")
    with tr:
        m(x).float().sum().backward()
    assert tr.shadow.homes == {str(dev)}
    ops = [r for r in tr.records if r.kind == "op" and r.local is not None]
    assert ops and all(not r.local["exceeds"] for r in ops), [(r.op, r.local) for r in ops if r.local["exceeds"]]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    bool(cuda_backend_missing()), reason=cuda_backend_missing() or "-"))])
def test_a_script_targets_reference_samples_move_to_where_its_statistics_run(device):
    """At the first top-level forward the reference samples go, in one copy, to the float64 home of the
    program's device (CUDA: the GPU itself); on the CPU they are left as they are."""
    from hal.conformance.precision.script import ProgramPrecision
    pp = ProgramPrecision({"precision_role": "target"}, modules=None)
    samples = {("forward", "m", "mm", 0, 0): torch.randn(4096, dtype=torch.float64),
               ("forward", "m", "add", 0, 0): torch.randn(7, dtype=torch.float64),
               ("backward", "m", "mm", 0, 0): torch.randn(2, 3, dtype=torch.float64)}
    before = {k: v.clone() for k, v in samples.items()}
    kept = dict(samples)
    pp.ref, pp.ref_usable = {"samples": samples}, True
    pp._prepare_statistics(torch.nn.Linear(4, 4).to(device), ())
    for k, v in samples.items():
        assert v.device.type == device and v.shape == before[k].shape and torch.equal(v.cpu(), before[k]), k
        assert (v is kept[k]) == (device == "cpu"), k


def _direct_cases(g: torch.Generator = None):
    aten = torch.ops.aten

    def r(*shape):
        return torch.randn(*shape, generator=g)
    return {  # op, arguments of one job (each job of a group gets fresh values), output index[, keyword arguments]
        "add, broadcast rank": lambda: (aten.add.Tensor, (r(4, 8), r(8)), 0),
        "mul, 0-dim operand": lambda: (aten.mul.Tensor, (r(3, 5), r(())), 0),
        "frexp, first of two outputs": lambda: (aten.frexp.Tensor, (r(4, 8),), 0),
        "addmm, 1-d bias": lambda: (aten.addmm.default, (r(6), r(5, 7), r(7, 6)), 0),
        "bmm": lambda: (aten.bmm.default, (r(2, 5, 7), r(2, 7, 3)), 0),
        "softmax, last dim": lambda: (aten._softmax.default, (r(5, 9), -1, False), 0),
        "sum over dims": lambda: (aten.sum.dim_IntList, (r(2, 3, 4), [0, -1]), 0),
        "sum over every dim, kept": lambda: (aten.sum.dim_IntList, (r(3, 5), [], True), 0),
        "cast to float16": lambda: (aten._to_copy.default, (r(4, 8),), 0, {"dtype": torch.float16}),
        "cast of integers": lambda: (aten._to_copy.default, (torch.randint(-9, 9, (4, 8), generator=g),), 0,
                                     {"dtype": torch.bfloat16}),
    }


@pytest.mark.parametrize("case", sorted(_direct_cases()))
def test_direct_batched_forms_equal_single_float64_calls(monkeypatch, case):
    """Each op family with a direct batched form (no vmap): a group of three jobs computed in one call gives
    each job the float64 result of its own op."""
    monkeypatch.setattr(shadow, "_UNBATCHABLE", set())
    sh = shadow.Shadow()
    jobs, singles = [], []
    g = torch.Generator().manual_seed(1)  # one stream: every job of the group gets its own values
    for _ in range(3):
        func, args, k, *kw = _direct_cases(g)[case]()
        kw = kw[0] if kw else {}
        out = func(*args, **kw)
        out = out[k] if isinstance(out, tuple) else out
        jobs.append(sh.plan(func, args, kw, out, k))
        singles.append(shadow.Shadow().run(func, args, kw, out, k)[1])
    assert shadow._direct_form(jobs[0]) is not None
    sh.flush(jobs)
    assert sh.batched_calls == 1 and sh.vmap_calls == 0 and not shadow._UNBATCHABLE
    for j, want in zip(jobs, singles):
        assert j.ref.dtype == torch.float64 and j.ref.shape == want.shape
        torch.testing.assert_close(j.ref, want, rtol=1e-12, atol=1e-12)


def test_warm_statistics_takes_every_dtype_and_rule_once_per_device(monkeypatch):
    from hal.conformance.precision import metrics
    seen = []
    real = metrics._stats_rows

    def spy(requests, idx, dev, out):
        real(requests, idx, dev, out)
        for i in idx:
            q = requests[i]
            seen.append((q.target_dtype, q.rule, q.target.numel(), bool(out[i]["nan_inf_mismatch"])))
    monkeypatch.setattr(metrics, "_stats_rows", spy)
    monkeypatch.setattr(metrics, "_warmed", set())
    metrics.warm_statistics(torch.device("cpu"))
    assert {(d, r, nonfinite) for d, r, _, nonfinite in seen} == {
        (d, r, nf) for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
        for r in ("element", "aggregate") for nf in (False, True)}
    assert {n for *_, n, _ in seen} == {5, 8}  # rows of two lengths: the padded layout
    n = len(seen)
    metrics.warm_statistics(torch.device("cpu"))
    assert len(seen) == n  # once per device


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    bool(cuda_backend_missing()), reason=cuda_backend_missing() or "-"))])
def test_samples_taken_together_equal_samples_taken_one_by_one(device):
    """``take_samples`` (one transfer per device and dtype: a script's gradients and parameters) gives each
    tensor's ``take_sample`` values, small and sampled, strided, empty and of mixed dtypes, and copies: writing a
    tensor afterwards leaves its sample as it was."""
    g = torch.Generator().manual_seed(3)
    ts = [torch.randn(5000, generator=g), torch.randn(40, 30, generator=g).t(), torch.randn(7, generator=g).half(),
          torch.randn(0), torch.randn(3, generator=g).bfloat16(), torch.randn(64, 64, generator=g),
          torch.randn(9, generator=g, dtype=torch.float64)]  # alone in its group, and float64 already
    ts = [t.to(device) for t in ts]
    one = [metrics.take_sample(t, 1024) for t in ts]
    together = metrics.take_samples(ts, 1024)
    for t, a, b in zip(ts, one, together):
        assert b.dtype == torch.float64 and b.device.type == "cpu" and torch.equal(a, b), t.shape
    for t in ts:
        t.add_(1)
    assert all(torch.equal(a, b) for a, b in zip(one, together))


@pytest.mark.parametrize("causal, mask, scale", [(False, None, None), (True, None, 0.3), (False, "bool", None),
                                                 (False, "float", 0.5)])
def test_math_attention_grads_are_the_attention_gradients(causal, mask, scale):
    """The written-out attention backward (the shadow of a device attention kernel's backward) gives autograd's
    gradients of ``F.scaled_dot_product_attention`` in float64: causal, boolean and additive masks, a given scale."""
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    dout = torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64)
    m = {None: None, "bool": torch.rand(5, 5, generator=g) > 0.3, "float": torch.randn(5, 5, generator=g).double()}[mask]
    if mask == "bool":
        m.fill_diagonal_(True)  # no fully masked row
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal, scale=scale)
    want = torch.autograd.grad(out, (q, k, v), dout)
    kw = {"attn_mask": m, "is_causal": causal, "scale": scale}
    got = attention.math_attention_grads(dout, q.detach(), k.detach(), v.detach(), **kw)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # given the forward output, as a kernel is: the same gradients, then their magnitudes, which bound them
    got = attention.math_attention_grads(dout, q.detach(), k.detach(), v.detach(), out=out.detach(), magnitudes=True, **kw)
    assert len(got) == 2 * attention.GRADIENTS
    for a, b, mag in zip(got, want, got[attention.GRADIENTS:]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
        # up to the rounding the comparison above allows (a gradient that is 0 in exact arithmetic computes as ~1e-16)
        assert mag.shape == b.shape and bool((mag + 1e-12 >= b.abs() * (1 - 1e-12)).all())
    # a key and value shared by every head (broadcast): their gradients summed over the heads, as autograd's
    k1, v1 = (t.detach()[:, :1].clone().requires_grad_() for t in (k, v))
    out = F.scaled_dot_product_attention(q, k1, v1, **kw)
    want = torch.autograd.grad(out, (q, k1, v1), dout)
    got = attention.math_attention_grads(dout, q.detach(), k1.detach(), v1.detach(), out=out.detach(), **kw)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _kernel_args(func, values: dict):
    """Positional and keyword arguments of ``func`` by its schema's names (``values``; the rest made up)."""
    args, kwargs = [], {}
    for a in func._schema.arguments:
        v = values.get(a.name, {"dropout_p": 0.0, "grad_input_mask": [True, True, True, False], "max_q": 5,
                                 "max_k": 5, "compute_log_sumexp": True, "return_debug_mask": False}.get(a.name))
        if a.kwarg_only:
            kwargs[a.name] = v
        else:
            args.append(v)
    return tuple(args), kwargs


@pytest.mark.parametrize("kernel", sorted(attention._DEVICE_ATTENTION))
def test_device_attention_kernels_are_shadowed_by_the_math_attention(kernel):
    """A device-only attention kernel (flash, efficient, cudnn: their arguments read by schema name, whose positions
    differ between torch versions) is shadowed by the float64 math attention with its causal flag and scale, and its
    backward by the math attention's gradients, one float64 call for the three (a float64 call of the device
    backward gave NaN and inf on the H200); a dropout or the bias gradient is not shadowed, and says so."""
    import torch.nn.functional as F
    aten = torch.ops.aten
    fwd, bwd = getattr(aten, kernel).default, getattr(aten, kernel + "_backward").default
    g = torch.Generator().manual_seed(11)
    q, k, v, dout = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(4))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    values = {"query": q, "key": k, "value": v, "grad_out": dout, "grad_out_": dout, "is_causal": True, "scale": 0.3,
              "out": out, "logsumexp": torch.zeros(2, 3, 5), "philox_seed": torch.zeros((), dtype=torch.int64),
              "philox_offset": torch.zeros((), dtype=torch.int64)}
    q64, k64, v64, d64 = (t.double() for t in (q, k, v, dout))
    sh = shadow.Shadow()
    args, kwargs = _kernel_args(fwd, values)
    job = sh.plan(fwd, args, kwargs, torch.zeros_like(q), 0)
    args, kwargs = _kernel_args(bwd, values)
    grads = [sh.plan(bwd, args, kwargs, torch.zeros_like(q), i) for i in range(3)]
    sh.flush([job, *grads])
    assert job.error is None and all(j.error is None for j in grads), [job.error] + [j.error for j in grads]
    torch.testing.assert_close(job.ref, F.scaled_dot_product_attention(q64, k64, v64, is_causal=True, scale=0.3))
    want = attention.math_attention_grads(d64, q64, k64, v64, out=out.double(), is_causal=True, scale=0.3,
                                          magnitudes=True)
    for j, w, mag in zip(grads, want, want[attention.GRADIENTS:]):
        torch.testing.assert_close(j.ref, w)
        torch.testing.assert_close(j.magnitude, mag)
    assert sh.shared_jobs == 2
    with pytest.raises(shadow.UnshadowedError, match="bias gradient"):
        sh.plan(bwd, args, kwargs, torch.zeros_like(q), 3)
    args, kwargs = _kernel_args(bwd, {**values, "dropout_p": 0.1})
    with pytest.raises(shadow.UnshadowedError, match="dropout"):
        sh.plan(bwd, args, kwargs, torch.zeros_like(q), 0)


@pytest.mark.parametrize("kernel", sorted(attention._DEVICE_ATTENTION))
def test_large_device_attention_is_shadowed_on_query_rows_and_whole_heads(kernel):
    """A large device attention kernel's sampled shadow on the CPU (the kernel itself never called: its outputs stand
    in as the float64 math attention's, so each sample must equal the same place of them): the forward on a run of
    query rows with the causal mask written out for those rows, the backward on whole heads, one call for the
    three gradients."""
    import torch.nn.functional as F
    aten = torch.ops.aten
    fwd, bwd = getattr(aten, kernel).default, getattr(aten, kernel + "_backward").default
    g = torch.Generator().manual_seed(12)
    q, k, v, dout = (torch.randn(2, 3, 24, 8, generator=g, dtype=torch.float64) for _ in range(4))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    grads = attention.math_attention_grads(dout, q, k, v, is_causal=True, scale=0.3)
    values = {"query": q, "key": k, "value": v, "grad_out": dout, "grad_out_": dout, "is_causal": True, "scale": 0.3,
              "out": out, "logsumexp": torch.zeros(2, 3, 24), "philox_seed": torch.zeros((), dtype=torch.int64),
              "philox_offset": torch.zeros((), dtype=torch.int64)}
    sh = shadow.Shadow(max_elements=64)
    args, kwargs = _kernel_args(fwd, values)
    job = sh.plan(fwd, args, kwargs, out, 0)
    args, kwargs = _kernel_args(bwd, values)
    jobs = [sh.plan(bwd, args, kwargs, grads[i], i) for i in range(3)]
    sh.flush([job, *jobs])
    assert job.how == "block 64/1152" and all(j.how == "heads 1/6" for j in jobs), [job.how] + [j.how for j in jobs]
    for j in (job, *jobs):
        assert j.error is None and j.target.numel() < 1152, j.error
        torch.testing.assert_close(j.target, j.ref, rtol=1e-10, atol=1e-12)
    assert sh.shared_jobs == 2


class _Attention(torch.nn.Module):
    def __init__(self, width: int = 128, heads: int = 2):
        super().__init__()
        self.heads, self.qkv = heads, torch.nn.Linear(width, 3 * width)

    def forward(self, x):
        b, n, w = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.skipif(bool(cuda_backend_missing()), reason=cuda_backend_missing() or "-")
@pytest.mark.parametrize("max_elements", [None, 1024])
@pytest.mark.parametrize("backend", ["FLASH_ATTENTION", "EFFICIENT_ATTENTION"])
def test_on_cuda_device_attention_and_its_backward_are_shadowed(backend, max_elements):
    """The device attention kernels in float16 on the GPU: forward and backward (query, key and value gradients)
    get a float64 shadow (the math attention) with no NaN or inf, and the kernels are within the element rule
    against it (the float64 call of the efficient backward itself gave NaN and inf: every element mismatched);
    whole, and sampled (``max_elements`` 1024: query rows of a head forward, whole heads backward)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    m = _Attention().to(dev).half()
    x = torch.randn(2, 64, 128, device=dev, dtype=torch.float16, requires_grad=True)
    tr = StepTracer(m, "target", **({} if max_elements is None else {"max_elements": max_elements}))
    with tr, sdpa_kernel(getattr(SDPBackend, backend)):
        m(x).float().pow(2).mean().backward()
    att = [r for r in tr.records if r.op.startswith("scaled_dot_product_attention")]
    assert all((r.sampling == "full") == (max_elements is None) for r in att), [r.sampling for r in att]
    assert sorted((r.phase, r.out_index) for r in att) == [("backward", 0), ("backward", 1), ("backward", 2),
                                                           ("forward", 0)], [(r.op, r.phase) for r in tr.records]
    for r in att:
        assert r.shadow_error is None and r.local is not None, (r.phase, r.out_index, r.shadow_error)
        assert r.local["nan_inf_mismatch"] == 0 and not r.local["exceeds"], (r.phase, r.out_index, r.local)


@pytest.mark.parametrize("bias", [True, False])
def test_onednns_lstm_layer_and_its_backward_are_shadowed_by_the_written_out_lstm(bias):
    """On the CPU an ``nn.LSTM`` runs as oneDNN's ``mkldnn_rnn_layer`` and ``mkldnn_rnn_layer_backward``, which have
    no float64 kernel (nor a counterpart in the float64 run, which takes ATen's cell ops): the forward's shadow is the
    LSTM written out step by step (:func:`recurrent.math_lstm_layer`), one float64 call for output, h and c, the
    backward's its seven gradients by autograd through that (the backward was unchecked before: neither shadowed nor
    compared), both directions (``reverse``), with and without biases."""
    from torch.utils._python_dispatch import TorchDispatchMode
    calls = []

    class Capture(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__.startswith("mkldnn_rnn_layer"):
                calls.append((func, args, kwargs or {}, out))
            return out

    torch.manual_seed(0)
    m = torch.nn.LSTM(5, 7, num_layers=2, bias=bias, bidirectional=True, batch_first=True)
    x = torch.randn(3, 4, 5, requires_grad=True)
    with Capture():
        out, (h, c) = m(x)
        (out.square().sum() + h.sum() + c.pow(3).sum()).backward()
    if not calls:
        pytest.skip("this torch build does not run nn.LSTM through oneDNN on the CPU")
    fwd = [c for c in calls if c[0].overloadpacket.__name__ == "mkldnn_rnn_layer"]
    bwd = [c for c in calls if c[0].overloadpacket.__name__ == "mkldnn_rnn_layer_backward"]
    assert {bool(a[7]) for _, a, _, _ in fwd} == {False, True} and len(bwd) == len(fwd) == 4  # both directions met
    sh = shadow.Shadow()
    for func, args, kwargs, res in fwd + bwd:
        outs = res[:3] if func in (f[0] for f in fwd) else res
        jobs = [sh.plan(func, args, kwargs, outs[i], i) for i in range(len(outs))]
        sh.flush(jobs)
        for j, o in zip(jobs, outs):
            assert j.error is None and j.ref.dtype == torch.float64, j.error
            torch.testing.assert_close(j.ref, o.double(), rtol=1e-4, atol=1e-5)
    assert sh.shared_jobs == 2 * len(fwd) + 6 * len(bwd)


class _Sdpa(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def _coarse_cpu_attention(dtype) -> bool:
    """Whether the CPU's fused attention kernel is the coarse float16 one of torch 2.4 (measured on peaked attention, q
    and k scaled 3: output rms_rel 1.2e-3 and dQ 3.9e-3 against float64, where torch 2.13's are 2.1e-4 and 3.3e-4,
    within float16's rounding; bfloat16 alike on both): its own error, which the local rule reports."""
    return dtype == torch.float16 and torch.__version__.startswith("2.4.")


def _peaked_attention(dtype, seed: int = 0):
    """Query, key, value and an incoming gradient in ``dtype`` with query and key scaled 3: peaked attention, where
    ``dS = P * (dP - D)`` cancels (``benchmarks/study_attention_tolerance.py``)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(8, 4, 64, 16, generator=g, dtype=torch.float64) for _ in range(4))
    return [t.to(dtype) for t in (q * 3, k * 3, v, do)]


@pytest.mark.parametrize("max_elements", [None, 4096])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_correct_16bit_fused_attention_backward_is_within_the_local_rule(dtype, max_elements):
    """The CPU's fused attention kernel in 16 bits on peaked attention, through the tracer: its backward's gradients
    are within the local rule (judged on the kernel's own forward output and at least the magnitudes of their
    products, :func:`attention.math_attention_grads`); the output-relative scale alone had made a correct kernel's
    dQ and dK exceed (bfloat16 1.9% and 1.1% of the elements, float16 10% and 6%): a false "introduced" first
    divergence in an HF-style BERT loop. Whole and sampled (whole heads). torch 2.4's coarse float16 kernel
    (:func:`_coarse_cpu_attention`) exceeds it: every gradient."""
    q, k, v, do = (t.requires_grad_(i < 3) for i, t in enumerate(_peaked_attention(dtype)))
    m = _Sdpa()
    tr = StepTracer(m, "target", **({} if max_elements is None else {"max_elements": max_elements}))
    with tr:
        m(q, k, v).backward(do)
    back = [r for r in tr.records if r.phase == "backward" and r.op.startswith("scaled_dot_product_attention")]
    assert sorted(r.out_index for r in back) == [0, 1, 2], [(r.op, r.phase) for r in tr.records]
    for r in back:
        assert r.shadow_error is None and r.local["exceeds"] == _coarse_cpu_attention(dtype), (r.out_index, r.local)
    assert all((r.sampling == "full") == (max_elements is None) for r in back), [r.sampling for r in back]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_wrong_16bit_attention_backward_still_exceeds_the_local_rule(dtype):
    """The magnitudes widen the rule only where the products cancel: gradients of attention whose probabilities were
    rounded to 4 bits (dV off), or whose softmax scale is 3% off (dQ and dK), exceed it; the kernel's own gradients
    do not."""
    import torch.nn.functional as F
    q, k, v, do = _peaked_attention(dtype, seed=1)
    bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v)[:2]

    thr = thresholds.threshold_for("_scaled_dot_product_flash_attention_for_cpu_backward", dtype, 64)

    def judged(grads, o=out):
        sh = shadow.Shadow()
        jobs = [sh.plan(bwd, (do, q, k, v, o, lse, 0.0, False), {}, grads[i], i) for i in range(3)]
        sh.flush(jobs)
        return [s["exceeds"] for s in error_stats_many([StatsRequest(j.target, j.ref, dtype, thr["rtol_eff"], thr["atol"],
                                                                      True, magnitude=j.magnitude) for j in jobs])]

    assert judged(bwd(do, q, k, v, out, lse, 0.0, False)) == [_coarse_cpu_attention(dtype)] * 3

    def autograd_grads(forward):
        x = [t.detach().float().requires_grad_() for t in (q, k, v)]
        o = forward(*x)
        o.backward(do.float())
        return [t.grad.to(dtype) for t in x], o.detach().to(dtype)

    def rounded_probabilities(q_, k_, v_):
        p = torch.softmax(q_ @ k_.transpose(-1, -2) / 4, -1)
        return (p + (torch.round(p * 16) / 16 - p).detach()) @ v_
    grads, o = autograd_grads(rounded_probabilities)
    assert judged(grads, o)[2], "probabilities rounded to 4 bits: dV"
    grads, o = autograd_grads(lambda q_, k_, v_: F.scaled_dot_product_attention(q_, k_, v_, scale=0.25 * 1.03))
    assert judged(grads, o)[:2] == [True, True], "a softmax scale 3% off: dQ and dK"
