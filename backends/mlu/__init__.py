"""The MLU backend (torch_mlu, CNNL, CNCL). Minimal probe; the full backend is being built (issue 5)."""
from __future__ import annotations

from hal.backend import Availability
from hal.backends.null import NullBackend


class MluBackend(NullBackend):
    name = "mlu"
    device_type = "mlu"
    priority = 300
    dist_backend = "cncl"
    device_files = ("/dev/cambricon_dev*",)

    @classmethod
    def probe(cls) -> Availability:
        try:
            import torch_mlu  # noqa: F401
        except Exception as exc:
            return Availability.no(f"torch_mlu is not importable ({type(exc).__name__}: {exc})")
        return Availability.no("the MLU backend is not implemented yet")
