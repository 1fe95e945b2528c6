"""Export a workload's inference path to ONNX and check it with ``onnx.checker``.

Uses torch's TorchScript-based exporter (``dynamo=False``), which needs only the ``onnx`` package;
torch >= 2.9 defaults to the ``torch.export`` exporter, which also needs ``onnxscript``. Exported
graphs: gpt/moe prefill (``tokens -> logits``, without the KV cache), cnn (``images -> logits``, eval
mode). The MoE graph contains data-dependent routing traced for the example batch's routing,
so it is valid ONNX but reproduces the model only for inputs that route alike (stated, not hidden).
"""
from __future__ import annotations

import inspect
import os
import warnings
from typing import Any, Optional

import torch


def export_onnx(workload: Any, path: "str | os.PathLike", batch: Optional[dict] = None, opset: int = 17) -> dict:
    """Export ``workload`` (built) to ``path`` and run ``onnx.checker.check_model``.

    Returns ``{"path", "inputs", "nodes", "opset"}``. Raises ImportError when onnx is missing."""
    import onnx
    batch = batch if batch is not None else workload.example_batch()
    module, args, names = workload.onnx_inputs(batch)
    module.eval()
    kwargs: dict[str, Any] = {"input_names": names, "output_names": ["logits"], "opset_version": opset}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kwargs["dynamo"] = False
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), **kwargs)
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    return {"path": str(path), "inputs": names, "nodes": len(model.graph.node), "opset": opset}
