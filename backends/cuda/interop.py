"""Zero-copy exchange between CuPy and torch on CUDA: arrays through DLPack, streams by handle.

Nothing here copies data or synchronises: a tensor made from a CuPy array shares its memory (and
keeps the array's memory-pool block alive until the tensor is freed), and a stream converted
either way is the same ``cudaStream_t``, so work queued through either library is ordered on it.
CuPy is imported inside each function (this module imports without it).
"""
from __future__ import annotations

from typing import Any

import torch

from hal.streams import TorchStream


def tensor_from_cupy(array: Any) -> torch.Tensor:
    """A torch tensor sharing ``array``'s memory (DLPack; no copy)."""
    return torch.from_dlpack(array)


def cupy_from_tensor(tensor: torch.Tensor) -> Any:
    """A CuPy array sharing ``tensor``'s memory (DLPack; no copy). bfloat16 is not a CuPy dtype:
    such tensors come back as a uint16 view of the same bytes."""
    import cupy
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
        return cupy.from_dlpack(tensor).view(cupy.uint16)
    return cupy.from_dlpack(tensor)


def _raw_torch_stream(stream: Any) -> Any:
    return stream.raw if isinstance(stream, TorchStream) else stream


def cupy_stream_from_torch(stream: Any) -> Any:
    """``cupy.cuda.ExternalStream`` over a torch CUDA stream (or a HAL :class:`TorchStream`)."""
    import warnings

    import cupy
    raw = _raw_torch_stream(stream)
    with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream for Stream.from_external
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(int(raw.cuda_stream), int(raw.device.index or 0))


def torch_stream_from_cupy(stream: Any, device: Any = None) -> TorchStream:
    """A HAL stream over ``torch.cuda.ExternalStream`` wrapping a CuPy stream's handle.

    The CuPy stream must outlive the returned object (torch does not own an external stream)."""
    dev = getattr(stream, "device_id", None) if device is None else device
    raw = torch.cuda.ExternalStream(int(stream.ptr), device=torch.device("cuda", int(dev or 0)))
    return TorchStream(raw, torch.cuda)
