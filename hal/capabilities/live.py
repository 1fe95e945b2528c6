"""A capability manifest read from the live dispatcher of the installed torch (cpu, cuda).

Imported by :mod:`hal.capabilities.manifest` (the CPU manifest is live unless one is shipped) and by
:mod:`hal.capabilities.generate` (which writes it to a file); it imports neither, so the two no
longer form an import cycle. ``SCHEMA`` is the manifest format's version string.
"""
from __future__ import annotations

import torch

SCHEMA = "hal-capabilities/1"


def build_live(backend: str, dispatch_key: str, generated_by: str) -> dict:
    """A manifest for ``backend`` from the live dispatcher: every ATen overload with a kernel
    registered directly for ``dispatch_key``."""
    from hal.capabilities.trace import aten_ops  # the tracer's torch internals load only when a manifest is built
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    native = [op for op in aten_ops() if has(op, dispatch_key)]
    return {"schema": SCHEMA, "backend": backend, "dispatch_key": dispatch_key, "predicted": False,
            "provenance": {"source": f"torch._C._dispatch_has_kernel_for_dispatch_key(op, {dispatch_key!r}) over "
                                     "torch._C._dispatch_get_all_op_names()",
                           "torch": torch.__version__, "torch_pairing": torch.__version__.split("+")[0],
                           "cuda": getattr(torch.version, "cuda", None), "built_with_torch": torch.__version__,
                           "generated_by": generated_by},
            "native": {"aten": native},
            # stock torch has no automatic CPU fallback: an op without a kernel for the key raises
            "fallback": {"default_enabled": False,
                         "note": f"torch raises NotImplementedError for an op with no {dispatch_key} kernel"}}
