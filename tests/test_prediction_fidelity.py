"""Issue 19: predictions follow the target's code paths and versions; predicted matrix cells claim
nothing they did not measure. Real programs, real captures, real subprocesses (the audit child)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from hal.capabilities import op_status, parse_arch, target_equivalent
from hal.conformance.runtime import audit_target
from hal.conformance.runtime.capture import OpCapture
from hal.conformance.runtime.predict import build_ops

LSTM_LM = textwrap.dedent('''
    import torch, torch.nn as nn
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    class RNNModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Embedding(50, 16)
            self.rnn = nn.LSTM(16, 16, 2, dropout=0.2)
            self.decoder = nn.Linear(16, 50)
        def forward(self, x, h):
            out, h = self.rnn(self.encoder(x), h)
            return self.decoder(out).view(-1, 50), h
    model = RNNModel().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    hidden = tuple(torch.zeros(2, 3, 16, device=dev) for _ in range(2))
    data = torch.randint(0, 50, (13, 3), device=dev)
    for i in range(0, 12, 4):
        hidden = tuple(h.detach() for h in hidden)
        model.zero_grad()
        out, hidden = model(data[i:i + 4], hidden)
        loss = nn.functional.cross_entropy(out, data[i + 1:i + 5].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        opt.step()
''')


def test_lstm_language_model_training_predicted_for_mlu_without_a_false_fallback(tmp_path):
    script = tmp_path / "word_lm.py"
    script.write_text(LSTM_LM)
    res = audit_target({"target": str(script), "kind": "script", "device": "mlu", "steps": 2, "timeout": 120,
                        "out": str(tmp_path / "out")})
    assert res["run"]["status"] == "ok", res["run"]
    ops = res["ops"]
    bad = [(o["op"], o["status"]) for o in ops if o["status"] in ("fallback", "unsupported")]
    assert not bad, bad
    names = {o["op"] for o in ops}
    assert not any(n.startswith("aten::mkldnn_rnn_layer") for n in names)
    rnn = [o for o in ops if o["op"] in ("aten::_cudnn_rnn", "aten::_cudnn_rnn_backward")]
    assert {o["op"] for o in rnn} == {"aten::_cudnn_rnn", "aten::_cudnn_rnn_backward"}
    for o in rnn:
        assert o["status"] == "native" and not o["verified"]
        assert o["captured_as"] == "aten::lstm.input"  # the call, not the CPU's mkldnn_rnn_layer
        assert "lstm.input" in o["reason"]


def test_safe_softmax_version_skew_is_reported_as_such_never_unsupported():
    st = op_status("mlu", "aten::_safe_softmax", dtypes=("float32",))
    assert st.status == op_status("mlu", "aten::_softmax", dtypes=("float32",)).status == "native"
    assert "torch 2.4" in st.reason and "aten::_softmax" in st.reason
    assert target_equivalent("mlu", "aten::_safe_softmax")[0] == "aten::_softmax"
    assert target_equivalent("mlu", "aten::_softmax") is None  # exists in torch 2.4: no rewrite
    rec = {"op": "aten::_safe_softmax", "phase": "forward", "device_type": "cpu", "count": 2, "bytes": 64,
           "dtypes": ["float32"], "modules": [], "shapes": [[[2, 4]]]}
    (op,) = build_ops([rec], "mlu", 1)
    assert (op["op"], op["captured_as"], op["status"]) == ("aten::_softmax", "aten::_safe_softmax", "native")
    assert "version skew" in op["reason"] and "does not have" in op["reason"]
    # an op newer than torch 2.4 with no known equivalent: unknown with that reason, not unsupported
    newer = [o for o in sorted(_ops_213_not_24()) if o not in ("aten::_safe_softmax",)][:1]
    if newer:
        st = op_status("mlu", newer[0])
        assert st.status != "unsupported", st


def _ops_213_not_24() -> set[str]:
    from hal.capabilities import optable, versions
    return set(optable.load()["ops"]) - set(versions.ops_of("2.4.0"))


def _train(target):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(m.parameters())
    with OpCapture(target=target) as cap:
        scaler = torch.cuda.amp.GradScaler()
        for _ in range(2):
            opt.zero_grad()
            scaler.scale(m(torch.randn(4, 8)).sum()).backward()
            scaler.step(opt)
            scaler.update()
    return {r["op"] for r in cap.records()}


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
def test_predicting_capture_takes_the_accelerator_paths_and_restores_torch():
    host = _train(None)
    pred = _train("mlu")
    assert not any(o.startswith("aten::_foreach_") for o in host)
    # the host's scaler runs its kernels only where torch enables it: with CUDA present (the GPU machine), not on CI
    amp = {"aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_amp_update_scale_"}
    assert (amp <= host) if torch.cuda.is_available() else not amp & host
    assert {"aten::_foreach_add_.Scalar", "aten::_foreach_lerp_.Scalar",
            "aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_amp_update_scale_",
            "aten::native_dropout", "aten::native_dropout_backward"} <= pred
    assert "aten::bernoulli_.float" in host and "aten::bernoulli_.float" not in pred
    # everything is put back: the host paths again
    import torch.optim.optimizer as o
    assert "cpu" not in o._get_foreach_kernels_supported_devices()
    assert "dropout" not in vars(torch._VF) and torch.amp.GradScaler is torch.amp.grad_scaler.GradScaler
    assert _train(None) == host


def test_predicting_one_hot_skips_the_cpu_only_class_check():
    """ATen checks one_hot's classes with min()/aminmax and a host sync on CPU tensors only; a MoE
    router calls it every step, so the host's check must not be predicted to fall back on MLU."""
    x = torch.tensor([[0, 3], [2, 1]])
    want = torch.nn.functional.one_hot(x, 4)
    with OpCapture(target=None) as host:
        torch.nn.functional.one_hot(x, 4)
    with OpCapture(target="mlu") as pred:
        got = torch.nn.functional.one_hot(x, 4)
        derived = torch.nn.functional.one_hot(x)  # num_classes from max(): the device computes it too
    host_ops, pred_ops = {r["op"] for r in host.records()}, {r["op"] for r in pred.records()}
    assert torch.equal(got, want) and got.dtype == torch.long and derived.shape == (2, 2, 4)
    assert host_ops & {"aten::aminmax", "aten::min"} and "aten::_local_scalar_dense" in host_ops
    assert {"aten::zeros", "aten::scatter_.value"} <= pred_ops
    assert not pred_ops & {"aten::aminmax", "aten::min"} and "aten::max" in pred_ops
    with OpCapture(target="mlu"), pytest.raises(RuntimeError, match="out of bounds"):
        torch.nn.functional.one_hot(torch.tensor([5]), 4)  # a bad class still fails, as scatter_ does there
    assert torch.nn.functional.one_hot is torch._C._nn.one_hot  # put back


def test_host_kernels_are_mapped_to_what_cuda_dispatches():
    def rec(op, dtypes, shapes):
        return {"op": op, "phase": "forward", "device_type": "cpu", "count": 1, "bytes": 0, "dtypes": dtypes,
                "modules": [], "shapes": shapes}
    recs = [rec("aten::_scaled_dot_product_flash_attention_for_cpu", ["float32"], [[[2, 4, 8, 16]] * 3]),
            rec("aten::_scaled_dot_product_flash_attention_for_cpu_backward", ["bfloat16"], [[[2, 4, 8, 16]] * 3]),
            rec("aten::native_batch_norm", ["float32"], [[[8, 4, 6, 6], [4], [4]]]),
            rec("aten::native_batch_norm", ["float32"], [[[8, 4], [4], [4]]])]
    got = [(o["op"], o.get("captured_as")) for o in build_ops(recs, "cuda", 1)]
    assert ("aten::_scaled_dot_product_efficient_attention", recs[0]["op"]) in got
    assert ("aten::_scaled_dot_product_cudnn_attention_backward", recs[1]["op"]) in got
    assert ("aten::cudnn_batch_norm", "aten::native_batch_norm") in got
    assert ("aten::native_batch_norm", None) in got  # 2-d input: cuDNN does not run it
    # a measured run keeps what ran
    measured = build_ops(recs[:1], "cuda", 1, {"device_type": "cpu"})
    assert measured[0]["op"] == recs[0]["op"]


def test_arch_gates_bf16_and_tf32_notes_and_the_cli_rejects_a_bad_arch(tmp_path):
    assert parse_arch("mlu370") == 3 and parse_arch("mlu590") == 5 and parse_arch("5.0") == 5
    with pytest.raises(ValueError):
        parse_arch("mlu999x")
    assert op_status("mlu", "aten::mm", ("bfloat16",), arch=parse_arch("mlu370")).status == "unsupported"
    assert op_status("mlu", "aten::mm", ("bfloat16",), arch=parse_arch("mlu590")).status == "native"
    rec = {"op": "aten::convolution", "phase": "forward", "device_type": "cpu", "count": 1, "bytes": 0,
           "dtypes": ["float32"], "modules": [], "shapes": []}
    assert any("TF32" in n for n in build_ops([rec], "mlu", 1, arch=5)[0]["dtype_notes"])
    assert not any("TF32" in n for n in build_ops([rec], "mlu", 1, arch=3)[0]["dtype_notes"])
    p = subprocess.run([sys.executable, "-m", "hal.cli.audit", str(tmp_path / "x.py"), "--device", "mlu",
                        "--arch", "nonsense"], capture_output=True, text=True, timeout=120)
    (tmp_path / "x.py").write_text("print(1)\n")
    p = subprocess.run([sys.executable, "-m", "hal.cli.audit", str(tmp_path / "x.py"), "--device", "mlu",
                        "--arch", "nonsense", "--out", str(tmp_path / "o")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_predicted_matrix_cell_states_op_support_only_and_renders_hatched(tmp_path):
    from hal.conformance.matrix import render
    from hal.conformance.matrix.cell import evaluate
    from hal.conformance.matrix.schema import MEASURED_STATUSES, PREDICTED_STATUSES, document
    cell = evaluate({"backend": "mlu", "model": "cnn", "mode": "train", "dtype": "float32", "config": "tiny",
                     "steps": 1, "precision": True})
    assert not cell.verified
    assert cell.status in PREDICTED_STATUSES and cell.status not in MEASURED_STATUSES
    assert "precision not measured" in cell.reason and "TF32" in cell.reason
    assert "step_ms" not in cell.figures and cell.figures["precision"] == "not measured"
    assert any(o.startswith("aten::_foreach_") for o in cell.ops) or "aten::add_.Tensor" in cell.ops
    doc = document([cell], [], [])
    html = render.to_html(doc)
    td = next(line for line in html.split("<td") if "precision not measured" in line and "class='st pred'" in line)
    assert "background-color:" in td and "background:" not in td.replace("background-color:", "")
    assert render.COLOURS[cell.status] != render.COLOURS["pass"]
    assert 'fill="url(#pred)"' in render.to_svg(doc)
    md = render.to_markdown(doc)
    assert f"{cell.status} (predicted)" in md and "| pass" not in md


def test_convolution_is_not_a_false_cuda_fallback():
    """_convolution picks cuDNN on CUDA in C++; the CPU trace only shows oneDNN/slow-conv callees, which
    once made every CNN a predicted CUDA fallback (the H200 measured it composite: fidelity.json)."""
    from hal.capabilities import op_status
    for op in ("aten::convolution", "aten::_convolution"):
        st = op_status("cuda", op, dtypes=("float32",))
        assert st.status == "composite", st.reason
        assert "aten::cudnn_convolution" in st.via
