"""The cached Triton launch (hal.backends.cuda.kernels.launch) against a stand-in kernel: pure Python, runs in CI.

The stand-in has the parts of Triton 3.6's JITFunction the cache uses (``kernel[grid](*args, **meta)``
returning a compiled kernel, ``params`` with names and defaults) and a compiled kernel whose
``[grid](*all_args, stream=)`` records what it was given; the real thing runs on the H200 (every
kernel test in tests/test_triton_kernels.py goes through it, benchmarks/h200_kernels.sh).
"""
from __future__ import annotations

import inspect

import pytest
import torch

from hal.backends.cuda.kernels import launch as L


class _Param:
    def __init__(self, name, default=inspect.Parameter.empty):
        self.name = name
        self._param = inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)


class _Compiled:
    def __init__(self, log):
        self.log, self.run = log, object()

    def __getitem__(self, grid):
        return lambda *args, stream=None: self.log.append(("compiled", grid, args, stream))


class _Kernel:
    """``k(X, n, BLOCK, FLAG=True)``: two runtime args, two constexprs (one with a default)."""

    def __init__(self, returns=True):
        self.log, self.returns = [], returns
        self.params = [_Param("X"), _Param("n"), _Param("BLOCK"), _Param("FLAG", True)]

    def __getitem__(self, grid):
        def run(*args, **meta):
            self.log.append(("triton", grid, args, meta))
            return _Compiled(self.log) if self.returns else None
        return run


@pytest.fixture(autouse=True)
def _cpu_device(monkeypatch):
    monkeypatch.setattr(L, "MODE", "cached")
    monkeypatch.setattr(L, "current_device", lambda: 0)
    monkeypatch.setattr(L, "current_stream", lambda: 1234)
    monkeypatch.setattr(L, "on_device", lambda first: True)
    L._compiled.clear()
    yield
    L._compiled.clear()


def test_second_launch_goes_to_the_compiled_kernel_with_every_parameter_in_order():
    k, x = _Kernel(), torch.zeros(64)
    L.launch(k, (4,), x, 32, BLOCK=64, num_warps=4)
    L.launch(k, (4,), x, 48, BLOCK=64, num_warps=4)
    assert [e[0] for e in k.log] == ["triton", "compiled"]
    _, grid, args, stream = k.log[1]
    # the grid padded to 3 dims, runtime args then constexprs (BLOCK from the call, FLAG's default), the stream
    assert grid == (4, 1, 1) and args[1:] == (48, 64, True) and args[0] is x and stream == 1234
    assert L.cached() == 1


@pytest.mark.parametrize("change", ["int_divisible", "int_one", "int64", "dtype", "alignment", "constexpr",
                                    "num_warps", "device"])
def test_anything_triton_specialises_on_makes_a_new_key(change, monkeypatch):
    k = _Kernel()
    base = torch.zeros(64)
    L.launch(k, (1,), base, 32, BLOCK=64, num_warps=4)
    x, n, meta = base, 32, dict(BLOCK=64, num_warps=4)
    if change == "int_divisible":
        n = 33
    elif change == "int_one":
        n = 1
    elif change == "int64":
        n = 1 << 40
    elif change == "dtype":
        x = torch.zeros(64, dtype=torch.float16)
    elif change == "alignment":
        x = base[1:]  # 4 bytes past a 16-byte aligned start
    elif change == "constexpr":
        meta["BLOCK"] = 128
    elif change == "num_warps":
        meta["num_warps"] = 8
    else:
        monkeypatch.setattr(L, "current_device", lambda: 1)
    L.launch(k, (1,), x, n, **meta)
    assert [e[0] for e in k.log] == ["triton", "triton"]
    assert L.cached() == 2


def test_nothing_is_cached_when_turned_off_or_under_the_interpreter(monkeypatch):
    k = _Kernel(returns=False)  # the interpreter returns no compiled kernel
    for _ in range(2):
        L.launch(k, (1,), torch.zeros(4), 16, BLOCK=4)
    assert [e[0] for e in k.log] == ["triton", "triton"] and L.cached() == 0
    monkeypatch.setattr(L, "MODE", "triton")
    k = _Kernel()
    for _ in range(2):
        L.launch(k, (1,), torch.zeros(4), 16, BLOCK=4)
    assert [e[0] for e in k.log] == ["triton", "triton"] and L.cached() == 0


def test_cpu_tensors_are_never_cached(monkeypatch):
    monkeypatch.undo()
    monkeypatch.setattr(L, "MODE", "cached")
    k = _Kernel()
    for _ in range(2):
        L.launch(k, (1,), torch.zeros(4), 16, BLOCK=4)
    assert [e[0] for e in k.log] == ["triton", "triton"] and L.cached() == 0


def test_a_parameter_with_no_value_and_no_default_is_not_cached():
    k = _Kernel()
    for _ in range(2):
        L.launch(k, (1,), torch.zeros(4), 16)  # BLOCK missing: Triton would raise; the cache must not guess
    assert [e[0] for e in k.log] == ["triton", "triton"] and L.cached() == 0
