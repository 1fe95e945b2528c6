"""The generic TorchDeviceBackend: a new chip is a class of identity and data (docs/writing-a-backend.md).

On a machine with a GPU, ``python examples/backend_in_50_lines.py cuda`` runs the whole conformance
suite on the example backend (benchmarks/gpu_arch_check.sh does); here the class is checked for
size, registration and its probe's reason."""
from __future__ import annotations

import importlib.util
import pathlib

import hal
from hal.backends.null import NullBackend

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "backend_in_50_lines.py"


def _example():
    spec = importlib.util.spec_from_file_location("backend_in_50_lines", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_backend_is_about_50_lines_and_registers():
    assert len(EXAMPLE.read_text().splitlines()) <= 55
    cls = _example().make_backend("cuda")
    assert issubclass(cls, hal.TorchDeviceBackend) and cls.name == "example-cuda"
    info = hal.register_backend(cls)
    try:
        listed = {i.name: i for i in hal.list_backends()}
        assert listed["example-cuda"].cls is cls
        real = listed["cuda"]
        assert info.available == real.available  # the same probe as the real CUDA backend's
        if not info.available:
            assert "torch.cuda.is_available() is False" in info.reason
    finally:
        hal.unregister_backend("example-cuda")
    assert "example-cuda" not in {i.name for i in hal.list_backends()}


def test_null_skeleton_is_identity_and_data():
    assert issubclass(NullBackend, hal.TorchDeviceBackend)
    av = NullBackend.probe()
    assert not av.available and "torch_null is not importable" in av.reason
    assert len((ROOT / "backends" / "null" / "__init__.py").read_text().splitlines()) <= 50


def test_register_backend_replaces_an_installed_plugin_and_restores_it():
    from hal.backends.cpu import CpuBackend

    class MyCpu(CpuBackend):
        """DeepSpeed's set_accelerator: a user's subclass takes the name of an installed backend."""

    info = hal.register_backend(MyCpu)
    try:
        assert info.available and type(hal.get_backend("cpu")) is MyCpu
        assert type(hal.backend_for_device_type("cpu")) is MyCpu
    finally:
        hal.unregister_backend("cpu")
    assert type(hal.get_backend("cpu")) is CpuBackend
