"""The CUDA redirect is complete by construction: torch.cuda's public API of the running torch is
covered name by name, and the stand-ins for torch classes subclass what torch checks against.

Runs under every torch the project supports (2.4.1 and the default): the enumeration is of the
running torch, never a version string."""
from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import torch

from hal.conformance.runtime import cuda_api

FIX = Path(__file__).resolve().parent / "fixtures" / "runtime"


def test_every_torch_cuda_public_name_is_redirected_or_listed_with_a_reason():
    unknown = sorted(n for n in torch.cuda.__all__ if cuda_api.classify(n) == "unknown")
    assert unknown == [], f"torch {torch.__version__}: torch.cuda names neither redirected nor listed: {unknown}"
    for table in (cuda_api.LEFT_AS_IS, cuda_api.UNSUPPORTED):
        assert all(isinstance(r, str) and len(r) > 10 for r in table.values())
    assert not set(cuda_api.STAND_INS) & (set(cuda_api.LEFT_AS_IS) | set(cuda_api.UNSUPPORTED))


def _touched_by_torch() -> set[str]:
    """torch.cuda names that torch._dynamo.device_interface and the optimizer health checks use."""
    from torch.optim import optimizer
    names: set[str] = set()
    for mod in ("torch._dynamo.device_interface", ):
        path = Path(torch.__file__).parent / (mod.split(".", 1)[1].replace(".", "/") + ".py")
        names |= set(re.findall(r"torch\.cuda\.(\w+)", path.read_text()))
    names |= set(re.findall(r"torch\.cuda\.(\w+)", inspect.getsource(optimizer)))
    return {n for n in names if not n.startswith("_") and n in torch.cuda.__all__}


def test_names_torch_itself_touches_are_stand_ins():
    touched = _touched_by_torch()
    assert {"Event", "Stream", "is_current_stream_capturing"} & touched or {"Event", "Stream"} <= touched
    missing = sorted(n for n in touched if n not in cuda_api.STAND_INS and n not in cuda_api.LEFT_AS_IS)
    assert missing == [], f"torch uses torch.cuda names the audit does not redirect: {missing}"


_PROBE = r"""
import inspect, json, sys, torch
from hal.conformance.runtime.redirect import DeviceRedirect
real = {n: getattr(torch.cuda, n) for n in ("Stream", "Event", "device", "device_of", "StreamContext")}
def checked_against(cls):
    # what torch checks a stand-in against: torch.Stream/Event and every pure-Python torch base of the real class
    out = [b for b in cls.__mro__[1:] if b is not object and b.__module__.startswith("torch")
           and not b.__name__.startswith(("_Cuda", "_dummy")) and "Cuda" not in b.__name__ and b.__name__ != "ABC"]
    return out
r = DeviceRedirect("cpu")
r.install()
res = {"bad": []}
try:
    for name, cls in real.items():
        stand = getattr(torch.cuda, name)
        if not inspect.isclass(stand):
            res["bad"].append(f"{name} is not a class")
            continue
        wanted = checked_against(cls) + ([cls] if name in ("device", "device_of", "StreamContext") else [])
        wanted += [getattr(torch, name)] if name in ("Stream", "Event") and hasattr(torch, name) else []
        for base in wanted:
            if not issubclass(stand, base):
                res["bad"].append(f"torch.cuda.{name} stand-in is not a subclass of {base.__module__}.{base.__qualname__}")
    import torch._dynamo.device_interface as di      # asserts on Stream/Event in torch 2.4/2.5
    class Probe(di.DeviceInterface):
        Event = torch.cuda.Event
        Stream = torch.cuda.Stream
    model = torch.nn.Linear(4, 2).to("cuda")
    for opt_cls in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):
        opt = opt_cls(model.parameters(), lr=0.1)
        model(torch.randn(3, 4, device="cuda")).sum().backward()
        opt.step()
    res["capturing"] = torch.cuda.is_current_stream_capturing()
    res["isinstance_device"] = isinstance(torch.cuda.device(0), torch.cuda.device)
    s = torch.cuda.Stream()
    res["stream_is_torch_stream"] = isinstance(s, torch.Stream)
    props = torch.cuda.get_device_properties(0)
    real_props = getattr(torch._C, "_CudaDeviceProperties", None)
    res["missing_props"] = [a for a in dir(real_props) if not a.startswith("_") and not hasattr(props, a)] if real_props else []
finally:
    r.remove()
print(json.dumps(res))
"""


def test_stand_ins_subclass_what_torch_checks_and_optimizers_build_and_step():
    """In a fresh interpreter (torch._dynamo keeps the classes it saw): the DeviceInterfaceMeta
    assertion of torch 2.4/2.5, the optimizer's CUDA-graph health check and isinstance checks."""
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["bad"] == []
    assert res["capturing"] is False and res["isinstance_device"] is True and res["stream_is_torch_stream"] is True
    assert res["missing_props"] == []


def test_stream_and_event_bases_follow_the_running_torch():
    for bases, kind in ((cuda_api.stream_bases(), "Stream"), (cuda_api.event_bases(), "Event")):
        assert getattr(torch, kind) in bases
        try:
            from torch import _streambase
        except ImportError:
            continue
        old = getattr(_streambase, f"_{kind}Base")
        # torch 2.4/2.5: a separate class that dynamo asserts on; newer: a deprecated alias subclass
        assert (old in bases) == (not issubclass(old, getattr(torch, kind)))


def test_map_location_forms_are_sent_to_the_present_device():
    from hal.conformance.runtime.redirect import DeviceRedirect
    r = DeviceRedirect("cpu")
    assert r._map_location("cuda") == "cpu" and r._map_location(torch.device("cuda", 1)) == "cpu"
    assert r._map_location(0) == "cpu" and r._map_location("cpu") == "cpu"
    assert r._map_location({"cuda:1": "cuda:0", "cpu": "cpu"}) == {"cuda:1": "cpu", "cpu": "cpu"}
    storage = torch.ones(2).untyped_storage()
    restore = r._map_location(None)
    assert restore(storage, "cuda:0").device.type == "cpu"   # a checkpoint saved on a GPU
    assert restore(storage, "cpu") is None                   # torch's default for the rest
    user = r._map_location(lambda s, loc: s.cuda())          # a CUDA-only callable
    assert user(storage, "cuda:0").device.type == "cpu"
    assert {k[0] for k in r.records} == {"runtime-redirect-cuda-device"}


def test_public_script_patterns_run_to_ok_with_findings_on_the_program_lines(tmp_path):
    from hal.conformance.runtime import audit_target
    target = FIX / "cuda_patterns.py"
    s = audit_target({"target": str(target), "kind": "script", "device": "mlu", "args": ["3"], "steps": None,
                      "timeout": 240, "out": str(tmp_path)})
    assert s["run"]["status"] == "ok", s["run"]
    assert s["run"]["optimizer_steps"] == 3 and s["run"]["output_tail"][-1] == "patterns done"
    src = target.read_text().splitlines()
    line = {key: i + 1 for i, text in enumerate(src) for key in
            ("torch.manual_seed(0)", "# map_location", "# set_default_device", "# device context manager",
             "torch.cuda.CUDAGraph()", "graph.replay()", "# torch.compile", "torch.cuda.Stream()",
             "# Module.to(int)")
            if key in text}
    found = {(f["rule"], f["line"]) for f in s["findings"]}
    assert ("runtime-redirect-cuda-device", line["# map_location"]) in found
    assert ("runtime-redirect-cuda-device", line["# set_default_device"]) in found
    assert ("runtime-redirect-cuda-api", line["# device context manager"]) in found
    assert ("runtime-redirect-cuda-graph", line["torch.cuda.CUDAGraph()"]) in found
    assert ("runtime-redirect-cuda-graph", line["graph.replay()"]) in found
    assert ("runtime-redirect-compile", line["# torch.compile"]) in found
    assert ("runtime-redirect-cuda-api", line["torch.cuda.Stream()"]) in found
    assert ("runtime-redirect-cuda-device", line["# Module.to(int)"]) in found
    # torch.manual_seed calls torch.cuda.manual_seed_all itself: not a call the program made
    assert not any(ln == line["torch.manual_seed(0)"] for _, ln in found)
    assert any(o["op"] == "aten::addmm" for o in s["ops"])


def test_mp_spawn_ranks_run_with_the_redirect_and_nccl_bound_at_import():
    from conftest import free_port
    from hal.conformance.runtime import audit_target
    port = free_port()
    s = audit_target({"target": str(FIX / "spawn_nccl.py"), "kind": "script", "device": "mlu", "args": [port],
                      "steps": None, "timeout": 180, "out": None})
    assert s["run"]["status"] == "ok", s["run"]
    assert s["run"]["output_tail"][-2:] == ["rank 0 trained", "spawn done"]
    # the worker ran under the capture too: its ops are the run's (the parent itself ran none)
    assert [w["status"] for w in s["run"]["spawned"]] == ["ok"] and s["run"]["optimizer_steps"] == 2
    assert any(o["op"] == "aten::addmm" and o["phase"] == "forward" for o in s["ops"])


def test_function_stand_ins_look_like_the_originals():
    """torch introspects some torch.cuda functions: torch 2.14's dynamo reads
    ``torch.cuda.use_mem_pool.__wrapped__`` on first import (which broke every torchvision program under
    the audit). Each function stand-in carries its original's name, docstring and ``__wrapped__``."""
    import inspect

    from hal.conformance.runtime.redirect import DeviceRedirect
    originals = {n: getattr(torch.cuda, n) for n in dir(torch.cuda) if inspect.isfunction(getattr(torch.cuda, n))}
    r = DeviceRedirect("cpu")
    r.install()
    try:
        replaced = {n: getattr(torch.cuda, n) for n in originals if getattr(torch.cuda, n) is not originals[n]}
        functions = {n: f for n, f in replaced.items() if inspect.isfunction(f)}
        assert "synchronize" in functions and "manual_seed_all" in functions
        for name, fn in functions.items():
            assert fn.__name__ == originals[name].__name__, name
            assert fn.__wrapped__ is originals[name], name  # what dynamo follows
    finally:
        r.remove()
    assert all(getattr(torch.cuda, n) is f for n, f in originals.items())


def test_every_torch_accelerator_public_name_is_redirected_or_listed_with_a_reason():
    """torch.accelerator (torch >= 2.6): its __all__, its submodules and theirs, of the running torch."""
    names = cuda_api.accelerator_names()
    if not hasattr(torch, "accelerator"):  # torch 2.4: nothing to redirect, and install is a no-op
        assert names == [] and cuda_api.install_accelerator(object()) == {}
        return
    assert {"is_available", "current_accelerator", "device_index", "memory"} <= set(names)
    unknown = sorted(n for n in names if cuda_api.classify_accelerator(n) == "unknown")
    assert unknown == [], f"torch {torch.__version__}: torch.accelerator names neither redirected nor listed: {unknown}"
    for table in (cuda_api.ACCELERATOR_LEFT_AS_IS, cuda_api.ACCELERATOR_UNSUPPORTED):
        assert all(isinstance(r, str) and len(r) > 10 for r in table.values())


def test_torch_accelerator_answers_as_the_cuda_machine_and_is_restored():
    from hal.conformance.runtime.redirect import DeviceRedirect
    acc = getattr(torch, "accelerator", None)
    if acc is None:
        r = DeviceRedirect("cpu")
        r.install()
        r.remove()
        assert not hasattr(torch, "accelerator") and not any(k.startswith("accelerator.") for k in r.stand_ins)
        return
    subs = [getattr(acc, s) for s in ("memory", "random", "graphs") if hasattr(acc, s)]
    originals = {(m, n): getattr(m, n) for m in (acc, *subs) for n in dir(m) if n in cuda_api.ACCELERATOR_STAND_INS}
    real_device_index = acc.device_index
    r = DeviceRedirect("cpu")
    r.install()
    try:
        assert acc.is_available() is True and acc.current_accelerator() == torch.device("cuda")
        assert acc.device_count() == 1 and acc.current_device_index() == 0
        assert issubclass(acc.device_index, real_device_index)
        with acc.device_index(0):
            acc.synchronize()
        assert isinstance(acc.current_stream(), torch.Stream)
        assert acc.memory.memory_allocated() == 0 and acc.get_memory_info()[0] > 0
        assert torch.float16 in acc.get_device_capability()["supported_dtypes"]
        graph = hasattr(acc, "Graph")  # torch 2.11's torch.accelerator has none (2.13's has)
        if graph:
            with acc.Graph() as _g:
                y = torch.ones(2) * 2
            assert y.sum().item() == 4.0
        patched = [k for k, v in originals.items() if getattr(*k) is v]
        assert patched == [], f"left unpatched: {patched}"
        # a test is a program here (its file is outside torch and HAL): each call is recorded
        assert {k[0] for k in r.records} >= {"runtime-redirect-accelerator"} | (
            {"runtime-redirect-cuda-graph"} if graph else set())
    finally:
        r.remove()
    assert all(getattr(*k) is v for k, v in originals.items())
    assert acc.device_index is real_device_index
