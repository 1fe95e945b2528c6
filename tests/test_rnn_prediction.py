"""Issue 19 follow-up: recurrent calls predicted as the target dispatches them, and measured runs that
speak the prediction's status words. Real programs, real captures, the real audit child."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hal.capabilities import load_manifest, op_status
from hal.conformance.runtime import audit_target
from hal.conformance.runtime.capture import OpCapture
from hal.conformance.runtime.predict import measured_status, rnn_target_ops

ROOT = Path(__file__).resolve().parent.parent
GRU_FIXTURE = ROOT / "benchmarks" / "fidelity_programs" / "gru_seq.py"
#: what the CPU's composite GRU decomposes into per step (forward and backward): none of it runs on the target
CPU_STEP_OPS = {"aten::sigmoid_", "aten::tanh_", "aten::sigmoid_backward", "aten::tanh_backward",
                "aten::unsafe_split.Tensor", "aten::sub.Tensor", "aten::mul_.Tensor", "aten::neg",
                "aten::transpose_", "aten::_unsafe_view", "aten::add_.Tensor", "aten::cat"}


def _audit(device: str, target: Path = GRU_FIXTURE) -> dict:
    res = audit_target({"target": str(target), "kind": "script", "device": device, "steps": None, "timeout": 120,
                        "args": []})
    assert res["run"]["status"] == "ok", res["run"]
    return res


def test_gru_predicted_for_cuda_is_one_cudnn_rnn_per_call_and_no_cpu_steps():
    if torch.cuda.is_available():  # there the audit measures the GRU on the GPU: nothing is predicted
        pytest.skip("cuda present")
    ops = _audit("cuda")["ops"]
    names = {o["op"] for o in ops}
    assert not names & CPU_STEP_OPS, names & CPU_STEP_OPS
    rnn = {(o["op"], o["phase"]): o for o in ops if o.get("captured_as") == "aten::gru.input"}
    assert {("aten::_cudnn_rnn", "forward"), ("aten::_cudnn_rnn_backward", "backward"),
            ("aten::set_.source_Storage", "forward")} <= set(rnn)
    fwd = rnn[("aten::_cudnn_rnn", "forward")]
    assert fwd["count"] == 3 and fwd["status"] == "native" and not fwd["verified"]  # 3 training steps, 3 calls
    assert "aten::gru.input" in fwd["reason"] and "cuDNN" in fwd["reason"] and "ATen calls" in fwd["reason"]
    assert rnn[("aten::_cudnn_rnn_backward", "backward")]["count"] == 3
    flat = [o for o in ops if o["op"] == "aten::_cudnn_rnn_flatten_weight"]
    assert flat and flat[0]["captured_as"] == "nn.RNNBase.flatten_parameters" and flat[0]["phase"] == "inference"
    assert not [o for o in ops if o["status"] in ("fallback", "unsupported", "unknown")]


def test_gru_predicted_for_mlu_takes_torch_mlus_path_without_a_false_fallback():
    """torch_mlu registers aten::lstm.input/lstm.data and _cudnn_rnn but no gru.input: the composite
    runs on the MLU step by step with the fused GRU cell it registers (never the CPU's cell math)."""
    ops = _audit("mlu")["ops"]
    names = {o["op"] for o in ops}
    assert not names & CPU_STEP_OPS, names & CPU_STEP_OPS
    assert "aten::_cudnn_rnn" not in names
    cell = {o["op"]: o for o in ops if o.get("captured_as") == "aten::gru.input"}
    assert {"aten::_thnn_fused_gru_cell", "aten::_thnn_fused_gru_cell_backward", "aten::mm"} <= set(cell)
    assert cell["aten::_thnn_fused_gru_cell"]["count"] == 3 * 10  # 3 calls x 10 time steps x 1 layer
    assert cell["aten::_thnn_fused_gru_cell"]["status"] == "native"
    assert "torch_mlu registers no aten::gru.input" in cell["aten::_thnn_fused_gru_cell"]["reason"]
    assert not [o for o in ops if o["status"] in ("fallback", "unsupported", "unknown")]


def test_torch_mlu_facts_the_rnn_mapping_rests_on():
    mlu = load_manifest("mlu").native_ops
    assert {"aten::lstm.input", "aten::lstm.data", "aten::_cudnn_rnn", "aten::_cudnn_rnn_backward",
            "aten::_thnn_fused_gru_cell", "aten::_thnn_fused_gru_cell_backward"} <= set(mlu)
    assert not {"aten::gru.input", "aten::gru.data", "aten::rnn_tanh.input", "aten::rnn_relu.input"} & set(mlu)
    cuda = load_manifest("cuda").native_ops
    for call in ("aten::gru.input", "aten::lstm.data", "aten::rnn_tanh.input"):
        for backend, cudnn in (("cuda", True), ("cuda", False), ("mlu", True)):
            plan = rnn_target_ops(backend, call, cudnn=cudnn)
            for op, _ in plan["forward"] + plan["backward"]:
                st = op_status(backend, op, ("float32",)).status
                assert st in ("native", "composite"), (backend, call, op, st)
    assert rnn_target_ops("mlu", "aten::lstm.input")["forward"][0][0] == "aten::_cudnn_rnn"
    assert "aten::_cudnn_rnn_flatten_weight" in cuda


def _run_rnns(target):
    torch.manual_seed(0)
    mods = [torch.nn.LSTM(4, 5, 2, dropout=0.3), torch.nn.GRU(4, 5, batch_first=True, bidirectional=True),
            torch.nn.RNN(4, 5, nonlinearity="relu")]
    grads = []
    with OpCapture(target=target) as cap:
        for i, m in enumerate(mods):
            torch.manual_seed(1)
            x = torch.randn(3, 2, 4, requires_grad=True)
            inp = torch.nn.utils.rnn.pack_padded_sequence(x, [3, 2]) if i == 0 else x
            out, _ = m(inp)
            (out.data if i == 0 else out).pow(2).sum().backward()
            grads.append((x.grad.clone(), [p.grad.clone() for p in m.parameters()]))
            with torch.no_grad():
                m(inp)
    return cap.records(), grads


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_rnn_calls_recorded_as_the_target_dispatches_with_host_numerics_and_nothing_changed_otherwise():
    host, g_host = _run_rnns(None)
    cpu, g_cpu = _run_rnns("cpu")
    pred, g_pred = _run_rnns("cuda")
    strip = [[{k: v for k, v in r.items()} for r in recs] for recs in (host, cpu)]
    assert strip[0] == strip[1]  # a CPU target: the capture is the host's own
    hops = {r["op"] for r in host}
    assert {"aten::tanh_", "aten::relu"} & hops and "aten::_cudnn_rnn" not in hops
    by = {(r["op"], r["phase"], r.get("captured_as")) for r in pred}
    for call in ("aten::lstm.data", "aten::gru.input", "aten::rnn_relu.input"):
        assert {("aten::_cudnn_rnn", "forward", call), ("aten::_cudnn_rnn", "inference", call),
                ("aten::_cudnn_rnn_backward", "backward", call)} <= by
    assert ("aten::_cudnn_init_dropout_state", "forward", "aten::lstm.data") in by
    assert not {r["op"] for r in pred if r.get("captured_as") is None} & (CPU_STEP_OPS | {"aten::relu"})
    for (gx_h, gp_h), (gx_p, gp_p) in zip(g_host, g_pred):  # the host computed the same gradients
        torch.testing.assert_close(gx_p, gx_h)
        for a, b in zip(gp_p, gp_h):
            torch.testing.assert_close(a, b)
    assert not {"gru", "lstm", "rnn_tanh", "rnn_relu"} & set(vars(torch._VF))
    assert "flatten_parameters" in vars(torch.nn.RNNBase) and \
        torch.nn.RNNBase.flatten_parameters.__qualname__ == "RNNBase.flatten_parameters"


def test_measured_cpu_run_speaks_the_prediction_words_from_the_dispatcher():
    """Target cpu (present): every op that ran is verified; native where the CPU key has a kernel,
    composite where PyTorch's composite kernel ran it -- the words the capability query uses."""
    ops = _audit("cpu")["ops"]
    assert all(o["verified"] for o in ops)
    words = {o["op"]: o["status"] for o in ops}
    assert words["aten::addmm"] == "native" and words["aten::t"] == "composite"
    assert "composite" in measured_status("aten::t", "cpu")[1].lower()
    for o in ops:
        has = torch._C._dispatch_has_kernel_for_dispatch_key(o["op"], "CPU")
        assert o["status"] == ("native" if has else "composite"), o
        assert o["status"] == op_status("cpu", o["op"], o["dtypes"]).status, o
    # the same words on another key: where the CUDA key has kernels (a CUDA build of torch, e.g. PyPI's
    # 2.4.1) aten::t runs through its composite; where it has none (a CPU-only build) the dispatcher cannot
    # tell, and the measured word stays native with that reason
    word, why = measured_status("aten::t", "cuda")
    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::empty.memory_format", "CUDA"):
        assert word == "composite", why
    else:
        assert word == "native" and "no CUDA kernels are registered" in why


def test_fidelity_compare_uses_the_same_words(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("fidelity", ROOT / "benchmarks" / "fidelity.py")
    fidelity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fidelity)
    compare = fidelity.compare
    pred = {"programs": {"p": {"ops": {"aten::t": "composite", "aten::addmm": "native", "aten::x": "native"}}}}
    meas = {"programs": {"p": {"ops": {"aten::t": "composite", "aten::addmm": "native", "aten::x": "composite"}}}}
    row = compare(pred, meas)["programs"][0]
    assert row["status_agreement"] == round(2 / 3, 4) and row["status_agreement_support"] == 1.0
    assert row["status_mismatches"] == [{"op": "aten::x", "predicted": "native", "measured": "composite"}]
    json.dumps(row)
