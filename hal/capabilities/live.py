"""A capability manifest read from the live dispatcher of the installed torch (cpu, cuda).

Imported by :mod:`hal.capabilities.manifest` (the CPU manifest is live unless one is shipped) and by
:mod:`hal.capabilities.generate` (which writes it to a file); it imports neither, so the two no
longer form an import cycle. ``SCHEMA`` is the manifest format's version string.
"""
from __future__ import annotations

import torch

SCHEMA = "hal-capabilities/1"

#: TF32 rules of the live backends, by backend (:mod:`hal.capabilities.tf32` reads them): CUDA computes float32
#: convolutions in TF32 by default from compute capability 8.0 (cuDNN), matmuls only when allowed (cuBLAS; also set
#: by ``torch.set_float32_matmul_precision("high")``)
LIVE_TF32 = {"cuda": {"conv": True, "matmul": False,
                      "flags": {"conv": "torch.backends.cudnn.allow_tf32",
                                "matmul": "torch.backends.cuda.matmul.allow_tf32"},
                      "arch_min_major": 8}}


def build_live(backend: str, dispatch_key: str, generated_by: str) -> dict:
    """A manifest for ``backend`` from the live dispatcher: every ATen overload with a kernel
    registered directly for ``dispatch_key``."""
    from hal.capabilities.trace import aten_ops  # the tracer's torch internals load only when a manifest is built
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    native = [op for op in aten_ops() if has(op, dispatch_key)]
    data = {"schema": SCHEMA, "backend": backend, "dispatch_key": dispatch_key, "predicted": False,
            "provenance": {"source": f"torch._C._dispatch_has_kernel_for_dispatch_key(op, {dispatch_key!r}) over "
                                     "torch._C._dispatch_get_all_op_names()",
                           "torch": torch.__version__, "torch_pairing": torch.__version__.split("+")[0],
                           "cuda": getattr(torch.version, "cuda", None), "built_with_torch": torch.__version__,
                           "generated_by": generated_by},
            "native": {"aten": native},
            # stock torch has no automatic CPU fallback: an op without a kernel for the key raises
            "fallback": {"default_enabled": False,
                         "note": f"torch raises NotImplementedError for an op with no {dispatch_key} kernel"}}
    if backend in LIVE_TF32:
        data["tf32_defaults"] = LIVE_TF32[backend]
    return data
