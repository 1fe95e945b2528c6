"""Device time per op when the timed profiled steps record the device activity only
(:mod:`hal.conformance.profiling.attribution`).

The events are torch's own ``FunctionEvent`` objects, built here as ``torch.profiler`` builds them from
a CUDA trace (no GPU on CI): device events with ``device_type`` CUDA, operators carrying the kernels they
launched (``append_kernel``). The real profiler path runs on the H200 (``tests/test_cuda_smoke.py``).
"""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from hal.conformance.profiling import attribution
from hal.conformance.profiling.profiler import device_attribution, device_split

_ids = iter(range(1, 1 << 30))


def _device(name: str, us: float) -> FunctionEvent:
    return FunctionEvent(id=next(_ids), name=name, thread=0, start_us=0, end_us=us, device_type=DeviceType.CUDA)


def _op(name: str, kernels: dict) -> FunctionEvent:
    e = FunctionEvent(id=next(_ids), name=name, thread=0, start_us=0, end_us=10)
    for k, us in kernels.items():
        e.append_kernel(k, 0, us)
    return e


GEMM, ADD = "sm90_xmma_gemm_bf16", "vectorized_elementwise_kernel<CUDAFunctor_add>"


def test_a_kernel_two_ops_launch_is_split_in_their_proportion():
    timed = [_device(GEMM, 300.0), _device(GEMM, 300.0), _device(ADD, 40.0), _device("Memcpy HtoD (Pageable)", 5.0),
             _op("cudaLaunchKernel", {})]                    # a runtime call: host side, not device time
    attr = [_op("aten::addmm", {GEMM: 30.0}), _op("aten::mm", {GEMM: 10.0}), _op("aten::add", {ADD: 4.0}),
            _op("[hal profiling] harness sync", {GEMM: 99.0})]  # a user range is no operator
    per_op, unattributed = attribution.attribute(attribution.device_event_times(timed),
                                                 attribution.kernel_owners(attr))
    assert per_op == pytest.approx({"aten::addmm": 450.0, "aten::mm": 150.0, "aten::add": 40.0})
    assert unattributed == {"Memcpy HtoD (Pageable)": 5.0}  # the attribution step launched no copy


def test_device_split_and_the_section_say_what_was_attributed():
    timed = [_device(GEMM, 90.0), _device("Memcpy DtoH (Device -> Pageable)", 10.0)]
    split = device_split(timed, [_op("aten::mm", {GEMM: 1.0})])
    assert split["per_op_us"] == {"aten::mm": 90.0} and split["total_us"] == 100.0
    assert split["memcpy"] == {"Memcpy DtoH (Device -> Pageable)": 1}
    sec = device_attribution(split, ["CUDA"])
    assert sec["attribution_steps"] == 1 and sec["attributed_pct"] == pytest.approx(90.0)
    assert sec["unattributed_kernels"] == [{"name": "Memcpy DtoH (Device -> Pageable)", "ms": 0.01}]
    assert device_attribution(None, ["CPU"])["attribution_steps"] == 0


@given(st.dictionaries(st.sampled_from(["k1", "k2", "k3", "k4"]),
                       st.lists(st.floats(0.5, 1e4), min_size=1, max_size=4), min_size=1),
       st.dictionaries(st.sampled_from(["k1", "k2", "k3"]),
                       st.dictionaries(st.sampled_from(["aten::a", "aten::b", "aten::c"]), st.floats(0.1, 1e3),
                                       min_size=1), max_size=3))
def test_attributed_and_unattributed_time_add_up_to_the_timed_total(timed_us, owners):
    timed = [_device(k, us) for k, runs in timed_us.items() for us in runs]
    times = attribution.device_event_times(timed)
    per_op, unattributed = attribution.attribute(times, owners)
    assert sum(per_op.values()) + sum(unattributed.values()) == pytest.approx(sum(map(sum, timed_us.values())))
    assert set(unattributed) == set(timed_us) - set(owners)
