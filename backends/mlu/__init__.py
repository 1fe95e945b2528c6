"""The MLU backend: Cambricon MLU through torch_mlu (CNNL kernels, CNCL collectives).

Written against torch_mlu's public API (torch_mlu r2.4, ../shared/reference/mlu.md section 1):
``import torch_mlu`` registers the ``"mlu"`` PrivateUse1 device and ``torch.mlu`` (mirroring
``torch.cuda``). Devices and properties come from ``torch.mlu.device_count`` /
``get_device_properties`` (``major``/``minor`` are the MLU architecture generation, not a CUDA SM
version); memory from torch.mlu's caching-allocator statistics; streams and events are
``torch.mlu.Stream`` / ``Event`` wrapped in :class:`hal.streams.TorchStream`; collectives use the
``torch.distributed`` backend ``"cncl"`` (ReduceOp BAND/BOR/BXOR/PREMUL_SUM are rejected with
NotSupportedError before any call); autocast is ``torch.amp.autocast("mlu")``; profiler device
time is ``ProfilerActivity.PrivateUse1``. torch_mlu is imported only in :meth:`MluBackend.probe`
and at first use. What HAL knows about the MLU without a device (ops, dtypes, fallback, TF32, CNCL,
the CUDA -> MLU environment-variable map) is data in ``manifest.json`` (see
:mod:`hal.capabilities`); nothing in it was measured on an MLU.

Thread-safety: stateless apart from torch_mlu's own per-thread current device/stream.
"""
from __future__ import annotations

from hal.backends.mlu.backend import MluBackend, mlu_module

__all__ = ["MluBackend", "mlu_module"]
