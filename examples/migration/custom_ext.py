"""A fused op built as a custom CUDA extension, with apex and flash-attention fallbacks."""
import os

import torch
from torch.utils.cpp_extension import load, load_inline

try:
    import apex  # expect: vendor-import
    from apex.optimizers import FusedAdam  # expect: vendor-import
except ImportError:
    FusedAdam = torch.optim.Adam
try:
    from flash_attn import flash_attn_func  # expect: vendor-import
except ImportError:
    flash_attn_func = None
import xformers.ops as xops  # expect: vendor-import
import triton  # expect: triton-import
import triton.language as tl  # expect: triton-import

HERE = os.path.dirname(__file__)
fused = load(name="fused_gelu",  # expect: cpp-extension
             sources=[os.path.join(HERE, "fused_gelu.cpp"),
                      os.path.join(HERE, "fused_gelu_kernel.cu")],  # expect: cuda-source
             extra_cuda_cflags=["-O3"], verbose=False)
cpu_only = load(name="cpu_helpers", sources=["helpers.cpp"])
inline = load_inline(name="inl", cpp_sources="", cuda_sources="__global__ void k() {}")  # expect: cpp-extension


@triton.jit
def add_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs), mask=offs < n)


def attention(q, k, v):
    if flash_attn_func is not None and q.is_cuda:  # expect: is-cuda
        return flash_attn_func(q, k, v)
    return xops.memory_efficient_attention(q, k, v)
