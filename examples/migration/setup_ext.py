"""setup.py of a CUDA extension package."""
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(
    name="fused_ops",
    ext_modules=[CUDAExtension("fused_ops._C", ["csrc/ops.cpp", "csrc/ops_kernel.cu"])],  # expect: cpp-extension, cuda-source
    cmdclass={"build_ext": BuildExtension},
)
