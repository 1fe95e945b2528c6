"""Each workload's inference path exports to ONNX and passes onnx.checker."""
from __future__ import annotations

import pytest
import torch

from hal.models import WORKLOAD_NAMES, get_workload

onnx = pytest.importorskip("onnx", reason="onnx is not installed (pip install 'hal-portability[onnx]')")


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_onnx_export_passes_checker(name, tmp_path):
    from hal.models.onnx_export import export_onnx
    w = get_workload(name).build("cpu", torch.float32, seed=0)
    info = export_onnx(w, tmp_path / f"{name}.onnx")
    model = onnx.load(info["path"])
    onnx.checker.check_model(model, full_check=True)
    assert info["nodes"] > 5 and [i.name for i in model.graph.input][:1] == info["inputs"]
    ops = {n.op_type for n in model.graph.node}
    assert ("Conv" in ops) if name == "cnn" else ("MatMul" in ops or "Gemm" in ops)
