"""The null backend: the skeleton a chip vendor copies to add a device family (docs/writing-a-backend.md).

A device whose torch extension provides ``torch.<device_type>`` with ``torch.cuda``'s API gets
devices, memory statistics, streams, events and RNG from :class:`hal.TorchDeviceBackend`; the class
below is then identity and data. This one is never available (``torch_null`` does not exist, so the
probe says so). It is not in HAL's entry points; a vendor's copy registers itself in its own
``pyproject.toml``::

    [project.entry-points."hal.backends"]
    mychip = "hal_mychip:MyChipBackend"

and ships its data next to the module: ``env_map.tsv`` (CUDA variable -> yours), ``manifest.json``
(which ATen ops have kernels), ``migration_rules.yaml`` (how CUDA source maps to your device).
"""
from __future__ import annotations

from typing import Any, Optional

from hal.device_backend import TorchDeviceBackend


class NullBackend(TorchDeviceBackend):
    """Identity and data only; everything else is TorchDeviceBackend's over ``torch.null``."""

    name = "null"                        # entry-point name, what users pass to --device
    device_type = "null"                 # torch device type of your tensors (PrivateUse1 renamed)
    torch_plugin = "torch_null"          # imported by the probe and at first use, never at import
    priority = -1                        # cpu 0, cuda 200, mlu 300: higher wins automatic selection
    dist_backend = "gloo"                # the torch.distributed backend your collective library registers
    profiler_activity = "PrivateUse1"
    visible_devices_env = "NULL_VISIBLE_DEVICES"
    device_files = ()                    # e.g. ("/dev/mychip*",): HAL warns when the card is there, the SDK not
    unsupported_reduce_ops = frozenset()  # e.g. {"BXOR"}: rejected before any call

    # What really differs from torch.cuda's conventions, if anything:
    def native_dtypes(self, capability: Optional[tuple[int, int]]) -> tuple[str, ...]:
        return ("float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool")

    def register_ops(self, registry: Any) -> None:
        from hal.ops import register_torch_impls
        register_torch_impls(registry, self.device_type)  # + registry.register(op, ..., impl="mykernels")
