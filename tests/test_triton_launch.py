"""The direct Triton launch (hal.backends.cuda.kernels.launcher).

Three groups:

- the specialisation helpers against Triton's own specialiser (``native_specialize_impl``, which runs
  on the CPU): wherever Triton imports;
- a contract test of :class:`Launcher`'s choices (direct, through Triton, when to cache) against a
  stand-in kernel and compiled kernel with the attributes of Triton 3.6's: pure Python, runs in CI;
- every kernel call site on a real GPU under ``HAL_TRITON_LAUNCH=check``, where each direct launch
  first asks Triton which compiled kernel it would run and fails on a mismatch, with results equal
  to Triton's own launch: wherever torch.cuda and Triton work (the H200), skipped elsewhere with the
  reason, prefixed "cuda:" so ``HAL_REQUIRE_BACKENDS=cuda`` turns the skip into a failure.
"""
from __future__ import annotations

import inspect

import pytest
import torch
from conftest import triton_gpu_missing

from hal.backends.cuda.kernels import launcher as L


def _triton_specialiser():
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend
    except Exception as exc:  # no Triton (CI): the specialiser tests skip
        pytest.skip(f"triton is not importable ({type(exc).__name__}: {exc})")
    return lambda v: native_specialize_impl(BaseBackend, v, False, True, True)


INTS = [0, 1, 2, 15, 16, 17, -1, -16, 4096, 50257, 2**31 - 16, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**40,
        2**63 - 1, 2**63, 2**63 + 16, 2**64 - 1]


def test_int_class_splits_integers_exactly_as_tritons_specialiser_does():
    spec = _triton_specialiser()
    for a in INTS:
        for b in INTS:
            assert (L.int_class(a) == L.int_class(b)) == (spec(a) == spec(b)), (a, b, spec(a), spec(b))


def test_aligned_agrees_with_tritons_pointer_specialisation():
    spec = _triton_specialiser()
    base = torch.zeros(64, dtype=torch.float32)
    for off in range(8):
        v = base[off:]
        assert L.aligned(v) == (spec(v)[1] == "D"), off
    assert L.aligned(base, base[4:])
    assert not L.aligned(base, base[1:])


# ---- contract test: Launcher's choices against a stand-in of Triton 3.6's kernel objects -----------------------

class _Param:
    def __init__(self, name, default=inspect.Parameter.empty):
        self.name, self.default = name, default


class _Run:
    """The compiled kernel's launcher: ``launch`` is the C entry point (records its arguments)."""

    def __init__(self, log, scratch=0):
        self.log = log
        self.launch_cooperative_grid, self.launch_pdl = False, False
        self.global_scratch_size, self.profile_scratch_size = scratch, 0

    def launch(self, *a):
        self.log.append(("direct", a))


class _Compiled:
    def __init__(self, log, scratch=0):
        self.run, self.function, self.packed_metadata = _Run(log, scratch), 77, (4, 1, 0)


class _Kernel:
    """``k(X, n, BLOCK, FLAG=True)``: two runtime arguments, two constexprs (one with a default)."""

    def __init__(self, scratch=0):
        self.log, self.scratch = [], scratch
        self.params = [_Param("X"), _Param("n"), _Param("BLOCK"), _Param("FLAG", True)]

    def __getitem__(self, grid):
        def run(*args, **meta):
            self.log.append(("triton", grid, args, meta))
            return _Compiled(self.log, self.scratch)
        return run


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(L, "MODE", "bound")
    monkeypatch.setattr(L, "_current_device", lambda: 0)
    monkeypatch.setattr(L, "_raw_stream", lambda dev: 1234)
    monkeypatch.setattr(L, "_hooks_idle", lambda: True)
    monkeypatch.setattr(L.torch.cuda, "device", lambda idx: _NullContext())
    return monkeypatch


class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_contract_second_launch_of_a_key_calls_the_c_launcher_with_every_argument_in_order(stand_in):
    k = _Kernel()
    run = L.Launcher(k)
    run((4, 1, 1), (0, "f32", 32), ("X", 32), {"BLOCK": 64, "num_warps": 4})
    run((5, 2, 1), (0, "f32", 32), ("X2", 32), {"BLOCK": 64, "num_warps": 4})
    assert k.log[0] == ("triton", (4, 1, 1), ("X", 32), {"BLOCK": 64, "num_warps": 4})
    # grid, stream, function, cooperative, pdl, scratch x2, packed metadata, launch metadata, hooks x2,
    # then the runtime arguments and the constexprs after them (BLOCK from meta, FLAG's default)
    assert k.log[1] == ("direct", (5, 2, 1, 1234, 77, False, False, None, None, (4, 1, 0), None, None, None,
                                   "X2", 32, 64, True))
    assert run.direct == 1


def test_contract_what_launches_through_triton_every_time(stand_in):
    k = _Kernel()
    run = L.Launcher(k)
    for _ in range(2):
        run((1, 1, 1), None, ("X", 1), {"BLOCK": 8})           # no key: an unaligned pointer
        run((1, 1, 1), (-1, "f32"), ("X", 1), {"BLOCK": 8})    # CPU tensors (the interpreter)
    assert [e[0] for e in k.log] == ["triton"] * 4 and run.direct == 0
    run((1, 1, 1), (0, "a"), ("X", 1), {"BLOCK": 8})
    stand_in.setattr(L, "_hooks_idle", lambda: False)           # a profiler's launch hook
    run((1, 1, 1), (0, "a"), ("X", 1), {"BLOCK": 8})
    stand_in.setattr(L, "_hooks_idle", lambda: True)
    stand_in.setattr(L, "_current_device", lambda: 1)           # another current device
    run((1, 1, 1), (0, "a"), ("X", 1), {"BLOCK": 8})
    stand_in.setattr(L, "_current_device", lambda: 0)
    stand_in.setattr(L, "MODE", "triton")                        # HAL_TRITON_LAUNCH=triton
    run((1, 1, 1), (0, "a"), ("X", 1), {"BLOCK": 8})
    assert [e[0] for e in k.log[4:]] == ["triton"] * 4 and run.direct == 0
    stand_in.setattr(L, "MODE", "bound")
    run((1, 1, 1), (0, "a"), ("X", 1), {"BLOCK": 8})
    assert k.log[-1][0] == "direct" and run.direct == 1 and run.via_triton == 8
    assert L.launch_counts()["_Kernel"]["via_triton"] >= 8


def test_contract_check_mode_asks_triton_before_every_direct_launch(stand_in):
    asked = []
    stand_in.setattr(L.Launcher, "_check", lambda self, hit, args, meta: asked.append(args))
    stand_in.setattr(L, "MODE", "check")
    k = _Kernel()
    run = L.Launcher(k)
    for i in range(3):
        run((1, 1, 1), (0, "a"), ("X", i), {"BLOCK": 8})
    assert [e[0] for e in k.log] == ["triton", "direct", "direct"] and asked == [("X", 1), ("X", 2)]


def test_contract_a_kernel_needing_scratch_memory_or_a_missing_constexpr_is_never_launched_directly(stand_in):
    k = _Kernel(scratch=128)
    run = L.Launcher(k)
    for _ in range(3):
        run((1, 1, 1), (0,), ("X", 1), {"BLOCK": 8})
    k2 = _Kernel()
    run2 = L.Launcher(k2)
    for _ in range(3):
        run2((1, 1, 1), (0,), ("X", 1), {})  # BLOCK has no default and is not in meta
    assert [e[0] for e in k.log + k2.log] == ["triton"] * 6 and run.direct == run2.direct == 0


def test_contract_the_cache_of_a_kernel_is_bounded(stand_in):
    run = L.Launcher(_Kernel())
    for i in range(L.MAX_KEYS + 5):
        run((1, 1, 1), (0, i), ("X", i), {"BLOCK": 8})
    assert len(run._hits) <= L.MAX_KEYS


# ---- every call site on a real GPU, checked against Triton's own choice ---------------------------------------

gpu = pytest.mark.skipif(bool(triton_gpu_missing()), reason=triton_gpu_missing() or "-")


def _launchers():
    from hal.backends.cuda.kernels import cross_entropy, norms, silu_and_mul, softmax
    return [v for m in (norms, softmax, silu_and_mul, cross_entropy) for v in vars(m).values()
            if isinstance(v, L.Launcher)]


def _calls(dtype):
    """Every kernel call site at a few shapes: (name, thunk returning the outputs)."""
    from hal.backends.cuda.kernels import cross_entropy as ce, norms, silu_and_mul as sm, softmax as sx
    g = torch.Generator(device="cuda").manual_seed(0)

    def r(*s):
        return torch.randn(*s, device="cuda", generator=g).to(dtype)
    out = []
    for rows, n in ((3, 1000), (64, 4096), (5, 20000)):
        x, w, b, res = r(rows, n), r(n), r(n), r(rows, n)
        dy = r(rows, n)
        wide = r(rows, n + 7)[:, :n]  # a column slice: row stride n + 7, unaligned rows
        for is_rms, bias in ((True, None), (False, b)):
            y, h, mean, rstd = norms.norm_forward(x, res if is_rms else None, w, bias, 1e-5, is_rms, n)
            out.append((f"norm fwd rms={is_rms} {rows}x{n}", lambda x=x, w=w, bias=bias, is_rms=is_rms, res=res, n=n:
                        norms.norm_forward(x, res if is_rms else None, w, bias, 1e-5, is_rms, n)[:2]))
            out.append((f"norm fwd slice rms={is_rms} {rows}x{n}", lambda w=w, bias=bias, is_rms=is_rms, wide=wide, n=n:
                        norms.norm_forward(wide, None, w, bias, 1e-5, is_rms, n)[0]))
            for plan in (norms.bwd_plan(n, dtype, is_rms), norms.two_stage_plan(n)):
                out.append((f"norm bwd rms={is_rms} fused={plan.fused} {rows}x{n}",
                            lambda dy=dy, h=h, x=x, w=w, bias=bias, mean=mean, rstd=rstd, is_rms=is_rms, plan=plan, n=n:
                            norms.norm_backward(dy, h if is_rms else x, w, bias, mean, rstd,
                                                dy if is_rms else None, is_rms, n, plan=plan)))
        out.append((f"softmax {rows}x{n}", lambda x=x: sx.softmax_forward(x, False)))
        out.append((f"log_softmax {rows}x{n}", lambda x=x: sx.softmax_forward(x, True)))
        out.append((f"softmax bwd {rows}x{n}", lambda x=x, dy=dy: sx.softmax_backward(dy, sx.softmax_forward(x, False),
                                                                                       False, dtype)))
        out.append((f"silu_and_mul {rows}x{n}", lambda x=x: sm.silu_and_mul_forward(x)))
        out.append((f"silu_and_mul bwd {rows}x{n}", lambda x=x, dy=dy, n=n: sm.silu_and_mul_backward(dy[:, : n // 2], x)))
        t = torch.randint(0, n, (rows,), device="cuda", generator=g)
        out.append((f"ce {rows}x{n}", lambda x=x, t=t, rows=rows: ce.ce_forward(x, t, -100)[2][:2 * rows]))
        x2, t2, stats = ce.ce_forward(x, t, -100)
        for red in ("mean", "sum"):
            out.append((f"ce reduce {red} {rows}x{n}", lambda t2=t2, stats=stats, red=red:
                        ce.ce_reduce(stats, t2, red, dtype, -100)))
        ones = torch.ones(rows, device="cuda")
        one = torch.ones((), device="cuda", dtype=dtype)
        out.append((f"ce bwd {rows}x{n}", lambda x2=x2, t2=t2, stats=stats, ones=ones:
                    ce.ce_backward(x2, t2, stats, ones, False, -100)))
        out.append((f"ce bwd scaled {rows}x{n}", lambda x2=x2, t2=t2, stats=stats, one=one:
                    ce.ce_backward(x2, t2, stats, one, True, -100)))
        out.append((f"ce bwd no grad {rows}x{n}", lambda x2=x2, t2=t2, stats=stats:
                    ce.ce_backward(x2, t2, stats, None, False, -100)))
    return out


def _flat(o):
    if isinstance(o, torch.Tensor):
        return [o]
    return [t for p in o if p is not None for t in _flat(p)]


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_call_site_launches_directly_what_triton_would_launch(monkeypatch, dtype):
    monkeypatch.setattr(L, "MODE", "triton")
    calls = _calls(dtype)
    want = [[t.clone() for t in _flat(f())] for _, f in calls]
    monkeypatch.setattr(L, "MODE", "check")  # each direct launch asks Triton first, raises on a mismatch
    before = sum(run.direct for run in _launchers())
    for _ in range(2):  # the first call of a key goes through Triton, the second directly
        for (name, f), ref in zip(calls, want):
            got = _flat(f())
            assert len(got) == len(ref), name
            for a, b in zip(got, ref):
                assert torch.equal(a, b), name
    torch.cuda.synchronize()
    assert sum(run.direct for run in _launchers()) > before + len(calls) // 2


@gpu
def test_a_launch_hook_sends_launches_back_through_triton(monkeypatch):
    from triton import knobs

    from hal.backends.cuda.kernels import softmax as sx
    monkeypatch.setattr(L, "MODE", "bound")
    x = torch.randn(4, 256, device="cuda")
    sx.softmax_forward(x, False)
    seen = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        direct = sx._FWD.direct
        y = sx.softmax_forward(x, False)
        assert sx._FWD.direct == direct and len(seen) == 1
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    torch.testing.assert_close(y, torch.softmax(x, -1))
    sx.softmax_forward(x, False)
    assert sx._FWD.direct == direct + 1
