"""The CUDA backend (CuPy, Triton, NCCL). Minimal probe; the full backend is being built (issue 7)."""
from __future__ import annotations

from hal.backend import Availability
from hal.backends.null import NullBackend


class CudaBackend(NullBackend):
    name = "cuda"
    device_type = "cuda"
    priority = 200
    dist_backend = "nccl"
    device_files = ("/dev/nvidia[0-9]*",)

    @classmethod
    def probe(cls) -> Availability:
        try:
            import cupy  # noqa: F401
        except Exception as exc:
            return Availability.no(f"cupy is not importable ({type(exc).__name__}: {exc})")
        import torch
        if not torch.cuda.is_available():
            return Availability.no("torch.cuda.is_available() is False")
        return Availability.no("the CUDA backend is not implemented yet")
