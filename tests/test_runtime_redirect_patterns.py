"""``hal-audit --device mlu`` (the real console script, a real child process) runs the CUDA patterns
that stopped public programs (issue 16): torch.accelerator, nn.DataParallel, CUDA generators and
mp.spawn workers. Each fixture runs unchanged on a CUDA GPU; here (no GPU, no MLU) every MLU status
is predicted. Runs under every supported torch: torch.accelerator exists from 2.6 on only, and the
accelerator fixture takes torch.cuda on 2.4 (where the audit must not need torch.accelerator)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from conftest import free_port, run_cli

FIX = Path(__file__).resolve().parent / "fixtures" / "runtime"
HAS_ACCEL = hasattr(torch, "accelerator")


def _audit(tmp_path: Path, script: str, *args: str, steps: str | None = None, devices: str | None = None) -> dict:
    out = tmp_path / "out"
    p = run_cli("hal-audit", str(FIX / script), "--device", "mlu", *(["--steps", steps] if steps else []),
                *(["--devices", devices] if devices else []),
                "--out", str(out), "--format", "json", "--", *args, timeout=400)
    if p.returncode != 0:  # the run's own account first (the JSON's tail is mostly the op table)
        run = json.loads((out / "audit.json").read_text()).get("run", {}) if (out / "audit.json").exists() else {}
        raise AssertionError((p.returncode, p.stderr[-2000:], {k: run.get(k) for k in (
            "status", "error", "steps", "stopped_by", "spawned", "output_tail")}))
    return json.loads((out / "audit.json").read_text())


def _lines(script: str, *needles: str) -> dict[str, int]:
    src = (FIX / script).read_text().splitlines()
    return {n: i + 1 for i, text in enumerate(src) for n in needles if n in text}


def _found(rep: dict) -> dict[tuple[str, int], dict]:
    return {(f["rule"], f["line"]): f for f in rep["findings"]}


def _ops(rep: dict) -> set[str]:
    return {o["op"] for o in rep["ops"]}


def test_torch_accelerator_program_takes_its_accelerator_path(tmp_path):
    rep = _audit(tmp_path, "accelerator_train.py")
    run = rep["run"]
    assert run["status"] == "ok", run
    assert run["output_tail"][0] == "device cuda count 1 index 0"  # the accelerator path, not the CPU one
    assert run["output_tail"][-1] == "accelerator done cuda"
    assert run["optimizer_steps"] == 4 and {"aten::addmm", "aten::_log_softmax"} <= _ops(rep)
    assert rep["target"]["verified"] is False
    found = _found(rep)
    if HAS_ACCEL:
        names = ("is_available", "current_accelerator", "device_count", "current_device_index", "synchronize",
                 "device_index", "memory_allocated")
        line = _lines("accelerator_train.py", *(f"# {n}" for n in names))
        for n in names:
            f = found[("runtime-redirect-accelerator", line[f"# {n}"])]
            assert f"torch.accelerator.{n}()" in f["message"] and f["severity"] == "warning", f
            assert "torch 2.4" in f["fix"]
        # torch's own calls (the DataLoader asks current_device_index for pinning) are no findings
        assert all(f["path"].endswith("accelerator_train.py") for f in rep["findings"]
                   if f["rule"] == "runtime-redirect-accelerator")
    else:  # torch 2.4: no torch.accelerator, nothing to redirect; torch.cuda was taken instead
        assert not any(rule == "runtime-redirect-accelerator" for rule, _ in found)
        assert any(rule == "runtime-redirect-cuda-available" for rule, _ in found)


def test_data_parallel_runs_one_replica_on_the_cpu_with_a_finding(tmp_path):
    rep = _audit(tmp_path, "data_parallel.py")
    assert rep["run"]["status"] == "ok", rep["run"]
    assert rep["run"]["output_tail"][-1] == "data parallel done (2, 5)"
    assert rep["run"]["optimizer_steps"] == 3 and "aten::convolution" in _ops(rep)
    line = _lines("data_parallel.py", "# DataParallel(model).cuda()", "# DataParallel(model.features)",
                  "# device_ids=[0]", "# functional")
    found = _found(rep)
    for key, asked in (("# DataParallel(model).cuda()", "None"), ("# DataParallel(model.features)", "None"),
                       ("# device_ids=[0]", "[0]"), ("# functional", "[0]")):
        f = found[("runtime-redirect-data-parallel", line[key])]
        assert f"device_ids={asked}" in f["message"] and "single replica" in f["message"], f
        assert f["severity"] == "warning" and "DistributedDataParallel" in f["fix"]
    assert ("runtime-redirect-cuda-device", line["# DataParallel(model).cuda()"]) in found


def test_cuda_generators_and_seeds_work_and_repeat(tmp_path):
    rep = _audit(tmp_path, "cuda_generator.py")
    assert rep["run"]["status"] == "ok", rep["run"]
    assert rep["run"]["output_tail"][-1] == "generator done 1234 (5,) (6,)"  # the fixture asserted repeatability
    assert {"aten::normal_", "aten::randperm.generator"} <= _ops(rep)
    line = _lines("cuda_generator.py", '# Generator(device="cuda")', '# Generator("cuda:0")', "# cuda manual_seed",
                  "# cuda manual_seed_all", '# randn(generator=g, device="cuda")')
    found = _found(rep)
    assert "device='cuda'" in found[("runtime-redirect-generator", line['# Generator(device="cuda")'])]["message"]
    assert "device='cuda:0'" in found[("runtime-redirect-generator", line['# Generator("cuda:0")'])]["message"]
    assert "manual_seed" in found[("runtime-redirect-cuda-api", line["# cuda manual_seed"])]["message"]
    assert "manual_seed_all" in found[("runtime-redirect-cuda-api", line["# cuda manual_seed_all"])]["message"]
    assert ("runtime-redirect-cuda-device", line['# randn(generator=g, device="cuda")']) in found


def test_mp_spawn_workers_run_redirected_and_their_ops_are_merged(tmp_path):
    port = free_port()
    rep = _audit(tmp_path, "spawn_ranks.py", port, steps="2")
    run = rep["run"]
    assert run["status"] == "ok", run
    assert run["output_tail"][-1] == "spawn done"
    # each rank was bounded by --steps in its own process and reported its result
    assert [(w["rank"], w["status"], w["optimizer_steps"], w["stopped_by"]) for w in run["spawned"]] == [
        (0, "ok", 2, "optimizer steps"), (1, "ok", 2, "optimizer steps")]
    assert run["optimizer_steps"] == 2 and run["stopped_by"] == "optimizer steps"
    by_key = {(o["op"], o["phase"]): o for o in rep["ops"]}
    assert ("aten::addmm", "forward") in by_key and ("aten::tanh_backward", "backward") in by_key
    assert by_key[("aten::addmm", "forward")]["modules"] == ["DistributedDataParallel.module.proj"]
    assert any(o["op"].startswith("c10d::allreduce") for o in rep["ops"])  # DDP's gradient all-reduce
    assert by_key[("aten::addmm", "forward")]["count"] == 2  # one rank's two forwards, not the sum of ranks
    line = _lines("spawn_ranks.py", "# nccl in the worker", "# DDP on cuda:rank")
    found = _found(rep)
    assert found[("runtime-redirect-nccl", line["# nccl in the worker"])]["count"] == 2  # both ranks
    assert ("runtime-redirect-ddp-device-ids", line["# DDP on cuda:rank"]) in found
    assert ("runtime-redirect-cuda-device", line["# DDP on cuda:rank"]) in found


def test_devices_n_lets_a_program_that_needs_n_gpus_run_its_n_ranks(tmp_path):
    """pytorch/examples distributed/ddp/example.py exits "Unable to locate sufficient 2 gpus" under the redirect's
    one device. With ``--devices 2`` the program finds two, spawns a rank per device, and each rank runs audited on
    the CPU (NCCL as gloo) with the device it set as its current one."""
    port = free_port()
    one = _audit(tmp_path / "one", "needs_two_gpus.py", port)
    assert one["run"]["output_tail"] == ["Unable to locate sufficient 2 gpus to run this example (1). Exiting."]
    assert one["run"]["steps"] == 0 and not one["run"].get("spawned")
    out = tmp_path / "two"
    p = run_cli("hal-audit", str(FIX / "needs_two_gpus.py"), "--device", "mlu", "--devices", "2", "--out", str(out),
                "--format", "json", "--", port, timeout=400)
    assert p.returncode == 0, (p.stderr[-2000:], p.stdout[-2000:])
    run = json.loads((out / "audit.json").read_text())["run"]
    assert run["status"] == "ok" and run["output_tail"][-1] == "trained on 2 gpus", run
    assert run["devices"] == 2 and "devices" not in one["run"]
    printed = "\n".join(run["output_tail"])  # the two ranks' lines may interleave
    assert "rank 0 on cuda:0" in printed and "rank 1 on cuda:1" in printed, printed
    assert [(w["rank"], w["status"], w["optimizer_steps"]) for w in run["spawned"]] == [(0, "ok", 3), (1, "ok", 3)]
    bad = run_cli("hal-audit", str(FIX / "needs_two_gpus.py"), "--devices", "0", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "--devices" in bad.stderr and "Traceback" not in bad.stderr


def test_cuda_calls_the_backward_pass_runs_are_redirected(tmp_path):
    """Tensor.backward, torch.autograd.grad (and on torch >= 2.5 torch.autograd.backward) dispatch to the redirect's
    function mode, whose handler runs with the mode off: a custom Function's backward or a tensor hook that made CUDA
    tensors failed ("PyTorch is not linked with support for cuda devices"; DTensor's backward in pytorch/examples
    tensor_parallelism)."""
    rep = _audit(tmp_path, "cuda_in_backward.py")
    assert rep["run"]["status"] == "ok" and rep["run"]["output_tail"][-1] == "backward ran on cpu", rep["run"]
    assert rep["run"]["optimizer_steps"] == 2
    line = _lines("cuda_in_backward.py", "# cuda in a Function's backward", "# cuda in a tensor hook")
    found = _found(rep)
    for where in line.values():
        assert ("runtime-redirect-cuda-device", where) in found, sorted(found)


def test_a_tensor_parallel_model_sharded_by_fsdp_trains_on_a_cuda_mesh_made_for_the_run_device(tmp_path):
    """init_device_mesh("cuda", ...) under the redirect: FSDP over the CUDA mesh refused the DTensor parameters that
    tensor parallelism had made on the CPU ("Expects DTensor to be moved to cuda but got cpu"; pytorch/examples
    tensor_parallelism fsdp_tp_example). The mesh is the run device's, and both ranks train through DTensor's
    forward and backward."""
    port = free_port()
    rep = _audit(tmp_path, "tensor_parallel_fsdp.py", port, devices="2")
    run = rep["run"]
    assert run["status"] == "ok", run
    assert [(w["rank"], w["status"], w["optimizer_steps"]) for w in run["spawned"]] == [(0, "ok", 3), (1, "ok", 3)]
    printed = "\n".join(run["output_tail"])
    assert "rank 0 trained" in printed and "rank 1 trained" in printed, printed
    mesh = _found(rep)[("runtime-redirect-device-mesh", _lines("tensor_parallel_fsdp.py", "# a CUDA mesh")["# a CUDA mesh"])]
    assert mesh["message"].startswith("DeviceMesh('cuda', ...) was made as a cpu mesh") and "mlu" in mesh["fix"], mesh
