"""The CUDA backend (torch.cuda, CuPy, Triton, NCCL): the reference platform users migrate from.

Entry point ``hal.backends.cuda:CudaBackend``. This package imports without CuPy, Triton or a GPU
(CI has none); the probe says why the backend is unavailable there. See docs/cuda-backend.md.
"""
from hal.backends.cuda.backend import CudaBackend

__all__ = ["CudaBackend"]
