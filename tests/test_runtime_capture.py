"""Op capture, step limiter, prediction and ONNX mapping, in process (no audited child)."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from hal.conformance.runtime.capture import ModuleTracker, OpCapture, aten_name
from hal.conformance.runtime.child import parse_mlu_fallback
from hal.conformance.runtime.predict import build_ops
from hal.conformance.runtime.stepping import StepLimiter, StopAudit


def test_aten_name_matches_the_dispatcher_spelling():
    assert aten_name(torch.ops.aten.addmm.default) == "aten::addmm"
    assert aten_name(torch.ops.aten.add.Tensor) == "aten::add.Tensor"
    assert aten_name(torch.ops.aten.mean.dim) == "aten::mean.dim"


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 3)
        self.norm = torch.nn.LayerNorm(3)

    def forward(self, x):
        return self.norm(self.fc(x)).relu()


def _captured(fn):
    modules = ModuleTracker()
    cap = OpCapture(modules)
    limiter = StepLimiter(None, cap)
    modules.on_top_level_forward = limiter.before_top_level_forward
    modules.install()
    limiter.install()
    try:
        with cap:
            fn()
    finally:
        modules.remove()
        limiter.remove()
    return {(r["op"], r["phase"]): r for r in cap.records()}, limiter


def test_capture_records_phase_module_dtype_shape_and_bytes():
    torch.manual_seed(0)
    net = _Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(4, 6)

    def step():
        loss = net(x).sum()
        loss.backward()
        opt.step()
        with torch.no_grad():
            net(x)

    recs, limiter = _captured(step)
    addmm = recs[("aten::addmm", "forward")]
    assert addmm["count"] == 1 and addmm["dtypes"] == ["float32"] and addmm["modules"] == ["_Net.fc"]
    assert addmm["shapes"][0] == [[3], [4, 6], [6, 3]]
    # bytes: inputs (3 + 24 + 18 floats) and the output (12 floats)
    assert addmm["bytes"] == (3 + 24 + 18 + 12) * 4
    assert recs[("aten::native_layer_norm", "forward")]["modules"] == ["_Net.norm"]
    assert ("aten::native_layer_norm_backward", "backward") in recs
    assert ("aten::threshold_backward", "backward") in recs
    assert any(phase == "optimizer" for _, phase in recs)  # SGD's update ran inside step()
    assert recs[("aten::addmm", "inference")]["count"] == 1
    assert limiter.optimizer_steps == 1


def test_step_limiter_stops_after_n_optimizer_steps():
    net = _Net()
    opt = torch.optim.Adam(net.parameters())
    modules = ModuleTracker()
    cap = OpCapture(modules)
    limiter = StepLimiter(3, cap)
    modules.on_top_level_forward = limiter.before_top_level_forward
    modules.install()
    limiter.install()
    done = 0
    try:
        with pytest.raises(StopAudit):
            for _ in range(100):
                net(torch.randn(2, 6)).sum().backward()
                opt.step()
                done += 1
    finally:
        modules.remove()
        limiter.remove()
    assert limiter.optimizer_steps == 3 and done == 2  # the third step() raised after completing


def test_step_limiter_counts_inference_forwards_but_not_training_forwards():
    net = _Net()
    limiter = StepLimiter(2)
    modules = ModuleTracker()
    modules.on_top_level_forward = limiter.before_top_level_forward
    modules.install()
    try:
        for _ in range(5):  # grad-mode forwards (training without an optimizer): never counted
            net(torch.randn(1, 6))
        assert limiter.inference_forwards == 0
        with torch.no_grad():
            net(torch.randn(1, 6))
            net(torch.randn(1, 6))
            with pytest.raises(StopAudit):
                net(torch.randn(1, 6))
    finally:
        modules.remove()
    assert limiter.steps == 2


def test_build_ops_costs_fallbacks_per_step_and_flags_float64(monkeypatch):
    class _Status:
        def __init__(self, status):
            self.status, self.reason, self.dtype_notes, self.via, self.hints = status, "test", (), (), ()

    import hal.conformance.runtime.predict as predict
    monkeypatch.setattr(predict, "capability_query",
                        lambda: (lambda backend, op, dtypes=(), arch=None: _Status("fallback" if op == "aten::mode" else "native"), ""))
    records = [{"op": "aten::mode", "phase": "forward", "device_type": "cpu", "count": 6, "bytes": 600,
                "dtypes": ["float64"], "modules": [], "shapes": []},
               {"op": "aten::addmm", "phase": "forward", "device_type": "cpu", "count": 3, "bytes": 300,
                "dtypes": ["float32"], "modules": ["M.fc"], "shapes": []}]
    ops = build_ops(records, "mlu", steps=3)
    mode, addmm = ops  # fallbacks sort first
    assert mode["status"] == "fallback" and mode["calls_per_step"] == 2.0 and mode["bytes_per_step"] == 200
    assert any("float64" in n and "float32" in n for n in mode["dtype_notes"])
    assert addmm["status"] == "native" and addmm["bytes_per_step"] == 0 and not addmm["verified"]
    # torch_mlu's warning is a measurement only on an MLU run (ops on mlu tensors); on a CPU run it is not
    on_mlu = [dict(r, device_type="mlu") for r in records]
    measured = build_ops(on_mlu, "mlu", steps=3, measured={"device_type": "mlu", "mlu_fallbacks": {"aten::mode": 1}})
    assert all(o["verified"] for o in measured)
    assert {o["op"]: o["status"] for o in measured} == {"aten::mode": "fallback", "aten::addmm": "native"}
    on_cpu = build_ops(records, "cpu", steps=3, measured={"device_type": "cpu", "mlu_fallbacks": {"aten::mode": 1}})
    assert {o["op"]: o["status"] for o in on_cpu} == {"aten::mode": "native", "aten::addmm": "native"}
    on_mlu[0]["op"] = "aten::mode.dimname"
    overload = build_ops(on_mlu, "mlu", steps=3, measured={"device_type": "mlu", "mlu_fallbacks": {"aten::mode.default": 1}})
    assert {o["op"]: o["status"] for o in overload} == {"aten::mode.dimname": "native", "aten::addmm": "native"}


@pytest.mark.contract
def test_contract_torch_mlu_fallback_warning_text_is_parsed():
    """The warning text as torch_mlu's MLUFallback.cpp prints it (a stand-in string, not a device run)."""
    msg = ("The operator 'aten::nanmedian' is not currently supported on the MLU backend and will fall back "
           "to run on the CPU. This may have performance implications.")
    assert parse_mlu_fallback(msg) == "aten::nanmedian"
    assert parse_mlu_fallback("The operator 'aten::softshrink' fails on the MLU backend and will fall back") \
        == "aten::softshrink"
    assert parse_mlu_fallback("some other warning") is None


def test_capture_sees_ctc_loss_as_the_aten_ops_a_backend_must_run():
    lp = torch.randn(10, 2, 5).log_softmax(2).requires_grad_()

    def run():
        F.ctc_loss(lp, torch.randint(1, 5, (2, 3)), torch.full((2,), 10), torch.full((2,), 3)).backward()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        recs, _ = _captured(run)
    ops = {op for op, _ in recs}
    assert {"aten::_ctc_loss.Tensor", "aten::_ctc_loss_backward.Tensor"} <= ops or \
        {"aten::_ctc_loss", "aten::_ctc_loss_backward"} <= ops
