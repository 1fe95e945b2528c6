"""A complete HAL backend for any torch device module, defined and registered in a notebook or test.

    python examples/backend_in_50_lines.py cuda      # registers "example-cuda" and runs the conformance suite on it

The class is identity and data; devices, memory statistics, streams, events and RNG come from
:class:`hal.TorchDeviceBackend`. A vendor's package has the same class plus an entry point.
"""
from __future__ import annotations

import sys

import hal


def make_backend(device_type: str) -> type:
    """A backend class named ``example-<device_type>`` over ``torch.<device_type>``."""

    class ExampleBackend(hal.TorchDeviceBackend):
        name = f"example-{device_type}"
        priority = -10  # never chosen automatically over the real one
        dist_backend = "nccl" if device_type == "cuda" else "gloo"
        profiler_activity = "CUDA" if device_type == "cuda" else "PrivateUse1"
        visible_devices_env = f"{device_type.upper()}_VISIBLE_DEVICES"

        env_map = classmethod(lambda cls: {"CUDA_VISIBLE_DEVICES": cls.visible_devices_env})

        def register_ops(self, registry) -> None:
            from hal.ops import register_torch_impls
            register_torch_impls(registry, device_type)

    ExampleBackend.device_type = device_type
    return ExampleBackend


def main(argv: list[str]) -> int:
    """Register the example backend for ``argv[0]`` (default cuda) and run the conformance suite on it."""
    import os

    import pytest
    device_type = argv[0] if argv else "cuda"
    info = hal.register_backend(make_backend(device_type))
    print(f"{info.name}: available={info.available} ({info.reason})", flush=True)
    if not info.available:
        return 2
    os.environ["HAL_CONFORMANCE_BACKENDS"] = info.name
    # collectives spawn processes, which discover backends by entry point, not by in-process registration
    args = ["-q", "-p", "no:cacheprovider", "-k", "not collectives", "--pyargs", "hal.testing.conformance"]
    return int(pytest.main(args + argv[1:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
