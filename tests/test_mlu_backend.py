"""The MLU backend on this machine, where torch_mlu is absent (no stand-in here: see
test_mlu_contract.py for the API contract against a stand-in module)."""
from __future__ import annotations

import importlib.util
import inspect
import os
import subprocess
import sys

import pytest

import hal
from hal.backend import Backend

#: these tests check the *absent*-SDK path; where torch_mlu is installed they cannot apply
absent_only = pytest.mark.skipif(importlib.util.find_spec("torch_mlu") is not None,
                                 reason="torch_mlu is installed here: the absent-SDK path cannot be reached")


@absent_only
def test_probe_names_torch_mlu_when_absent():
    from hal.backends.mlu import MluBackend
    av = MluBackend.probe()
    assert not av.available
    assert "torch_mlu" in av.reason


def test_importing_the_backend_does_not_import_torch_mlu():
    code = ("import sys, hal.backends.mlu, hal.capabilities; "
            "print('torch_mlu' in sys.modules)")
    # torch >= 2.5 may autoload an installed torch_mlu itself on `import torch`: that is not our import
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_whole_interface_is_implemented():
    """DeepSpeed's accelerator check: the class has no abstract method left, with its SDK absent."""
    from hal.backends.mlu import MluBackend
    assert not inspect.isabstract(MluBackend)
    assert issubclass(MluBackend, Backend)
    abstract = {n for n, v in inspect.getmembers(Backend) if getattr(v, "__isabstractmethod__", False)}
    for name in abstract:
        assert getattr(MluBackend, name) is not getattr(Backend, name), name
    assert (MluBackend.name, MluBackend.device_type, MluBackend.dist_backend) == ("mlu", "mlu", "cncl")
    assert MluBackend.profiler_activity == "PrivateUse1"
    assert MluBackend.unsupported_reduce_ops == {"BAND", "BOR", "BXOR", "PREMUL_SUM"}
    assert MluBackend.data_file("manifest.json") is not None


@absent_only
def test_hal_backends_lists_mlu_unavailable_with_reason():
    out = subprocess.run([sys.executable, "-m", "hal.cli.main", "backends"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("mlu"))
    assert " no " in line and "torch_mlu is not importable" in line


@absent_only
def test_discovery_keeps_the_reason():
    info = {i.name: i for i in hal.list_backends()}["mlu"]
    assert not info.available and "torch_mlu" in info.reason
    assert "mlu" in hal.backend_errors()


def test_env_map_is_data_without_the_sdk():
    from hal.backends.mlu import MluBackend
    env = MluBackend.env_map()
    assert env["CUDA_VISIBLE_DEVICES"] == "MLU_VISIBLE_DEVICES"
    assert sum(v is not None for v in env.values()) == 23
