"""audit_target end to end: real programs in a real child process, on this CPU-only machine.

Nothing here runs on an MLU: every MLU status is predicted from the capability data and the tests
check that it says so (target.verified False)."""
from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from conftest import free_port
from hal.conformance.runtime import audit_target

FIX = Path(__file__).resolve().parent / "fixtures" / "runtime"


def _mlu_capabilities() -> str:
    """'': the MLU capability data ships with the package, so a query that raises is a failure of
    the test that needs it, never a skip."""
    from hal.capabilities import op_status
    assert op_status("mlu", "aten::addmm", dtypes=("float32",)).status == "native"
    return ""


def audit(target: str, kind: str = "script", device: str = "mlu", **kw) -> dict:
    req = {"target": str(FIX / target) if kind in ("script", "func", "onnx") else target, "kind": kind,
           "device": device, "args": kw.pop("args", []), "steps": kw.pop("steps", None),
           "timeout": kw.pop("timeout", 60), "precision": False, "profile": False, "out": kw.pop("out", None)}
    req.update(kw)
    return audit_target(req)


def _by_op(sections: dict) -> dict:
    out: dict = {}
    for o in sections["ops"]:
        out.setdefault(o["op"], []).append(o)
    return out


def test_cuda_only_training_script_runs_redirected_with_findings(tmp_path):
    s = audit("cuda_train.py", args=["40"], steps=3, out=str(tmp_path))
    run = s["run"]
    assert run["status"] == "ok", run
    assert run["steps"] == 3 and run["optimizer_steps"] == 3
    assert run["output_tail"][0].startswith("step 0 loss ") and run["output_tail"][1].startswith("step 1 loss ")
    assert s["target"]["device"] == "mlu" and s["target"]["available"] is False and s["target"]["verified"] is False
    ops = _by_op(s)
    assert {"aten::addmm", "aten::native_layer_norm", "aten::embedding"} <= set(ops)
    assert {o["phase"] for o in ops["aten::addmm"]} == {"forward"}
    assert "backward" in {o["phase"] for o in ops["aten::native_layer_norm_backward"]}
    assert any(o["phase"] == "optimizer" for o in s["ops"])
    assert ops["aten::addmm"][0]["dtypes"] == ["bfloat16"]  # CUDA autocast ran as CPU bf16 autocast
    assert not any(o["verified"] for o in s["ops"])
    rules = {(f["rule"], f["line"]) for f in s["findings"]}
    src = (FIX / "cuda_train.py").read_text().splitlines()
    line_of = {needle: i + 1 for i, text in enumerate(src) for needle in
               ("Net().cuda()", "torch.cuda.amp.GradScaler()", "torch.cuda.amp.autocast()", "is_available()",
                "torch.cuda.synchronize()", 'device="cuda"')
               if needle in text}
    assert ("runtime-redirect-cuda-device", line_of["Net().cuda()"]) in rules
    assert ("runtime-redirect-cuda-device", line_of['device="cuda"']) in rules
    assert ("runtime-redirect-grad-scaler", line_of["torch.cuda.amp.GradScaler()"]) in rules
    assert ("runtime-redirect-autocast", line_of["torch.cuda.amp.autocast()"]) in rules
    assert ("runtime-redirect-cuda-available", line_of["is_available()"]) in rules
    assert ("runtime-redirect-cuda-api", line_of["torch.cuda.synchronize()"]) in rules
    assert all(f["path"] == str(FIX / "cuda_train.py") for f in s["findings"])
    autocast = next(f for f in s["findings"] if f["rule"] == "runtime-redirect-autocast")
    assert autocast["severity"] == "warning" and "bfloat16" in autocast["message"] and autocast["count"] == 3
    # the child's spec and result files lived in out and were removed: nothing is left behind
    assert list(tmp_path.iterdir()) == []


def test_cuda_habits_dataloader_properties_nvtx_and_autocast_decorator_run_redirected():
    s = audit("cuda_extras.py")
    assert s["run"]["status"] == "ok", s["run"]
    assert s["run"]["steps"] == 12 and s["run"]["output_tail"][-1] == "extras done 0"
    found = {(f["rule"], f["line"]): f for f in s["findings"]}
    src = (FIX / "cuda_extras.py").read_text().splitlines()
    line = {key: i + 1 for i, text in enumerate(src) for key in
            ("get_device_properties", "range_push", ".to(0", '@torch.autocast("cuda"', '.to("cuda")') if key in text}
    assert found[("runtime-redirect-cuda-api", line["get_device_properties"])]["count"] == 1
    assert found[("runtime-redirect-cuda-api", line["range_push"])]["count"] == 12
    assert found[("runtime-redirect-cuda-device", line[".to(0"])]["count"] == 24  # .to(0) and .cuda(), 12 steps
    assert ("runtime-redirect-cuda-device", line['.to("cuda")']) in found
    assert ("runtime-redirect-autocast", line['@torch.autocast("cuda"']) in found
    assert "bfloat16" in _by_op(s)["aten::addmm"][0]["dtypes"]


def test_nccl_init_is_redirected_to_gloo(tmp_path, monkeypatch):
    port = free_port()
    monkeypatch.setenv("AUDIT_FIXTURE_DIST", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    s = audit("cuda_train.py", args=["5"], steps=1)
    assert s["run"]["status"] == "ok", s["run"]
    nccl = [f for f in s["findings"] if f["rule"] == "runtime-redirect-nccl"]
    assert len(nccl) == 1 and "'nccl'" in nccl[0]["message"] and nccl[0]["line"] == 12


def test_fallback_ops_are_predicted_for_mlu_and_float64_is_flagged():
    s = audit("fallback_ops.py", steps=2)
    assert s["run"]["status"] == "ok", s["run"]
    ops = _by_op(s)
    reached = {"aten::mode", "aten::i0", "aten::renorm", "aten::special_bessel_j0", "aten::_linalg_eigh"}
    assert reached <= set(ops)
    assert "aten::_ctc_loss.Tensor" in ops or "aten::_ctc_loss" in ops
    eigh = ops["aten::_linalg_eigh"][0]
    assert eigh["dtypes"] == ["float64"] and any("float32" in n for n in eigh["dtype_notes"])
    assert eigh["calls_per_step"] == 1.0
    why = _mlu_capabilities()
    if why:
        pytest.skip(why)
    ctc = ops.get("aten::_ctc_loss.Tensor") or ops["aten::_ctc_loss"]
    for name in reached:
        assert ops[name][0]["status"] == "fallback", ops[name][0]
    assert ctc[0]["status"] == "fallback"
    for name in ("aten::addmm", "aten::cat", "aten::index_select", "aten::mean"):
        assert ops[name][0]["status"] in ("native", "composite"), ops[name][0]
    mode = ops["aten::mode"][0]
    # mode(h) with h [3, 8] float32: inputs 96 B, outputs values 12 B + int64 indices 24 B, once per step
    assert mode["bytes_per_step"] == 96 + 12 + 24 and mode["verified"] is False


@pytest.mark.parametrize("script,status,error_part", [
    ("crash_raise.py", "error", "RuntimeError: boom from the audited program"),
    ("crash_os_exit.py", "crashed", "os._exit(7)"),
    ("crash_segfault.py", "crashed", "SIGSEGV"),
    ("crash_missing_import.py", "error", "ModuleNotFoundError"),
    ("crash_sys_exit.py", "error", "sys.exit(3)"),
    # the worker's traceback in the message is cut to its cause (cut at 2000 characters it had lost it)
    ("crash_in_dataloader_worker.py", "error",
     "ValueError: Caught ValueError in DataLoader worker process 0 -> ValueError: bad item 3"),
])
def test_failing_programs_become_run_status(script, status, error_part):
    s = audit(script, timeout=30)
    assert s["run"]["status"] == status and error_part in s["run"]["error"], s["run"]
    assert s["run"]["output_tail"], "the last lines the program printed are kept"


def test_forked_workers_exiting_with_os_exit_do_not_report_for_the_program():
    s = audit("forked_workers.py")
    assert s["run"]["status"] == "ok" and s["run"]["error"] is None, (s["run"]["error"], s["run"]["output_tail"])
    assert s["run"]["output_tail"][-1] == "program finished", s["run"]["output_tail"]


def test_forked_children_get_the_programs_sigterm_disposition_not_the_audits():
    # with the audit's Python handler a worker could miss Pool.terminate's SIGTERM and hang the pool
    s = audit("forked_sigterm.py")
    assert s["run"]["status"] == "ok", s["run"]
    assert s["run"]["output_tail"] == ["default SIG_DFL", "own programs_own_handler", "program finished"]


def test_hang_is_stopped_by_timeout_and_leaves_no_process():
    before = {p.pid for p in psutil.process_iter()}
    # the grandchild must start before the bound: importing torch alone took over 10 s on a busy box
    s = audit("hang_with_child.py", timeout=25)
    assert s["run"]["status"] == "timeout" and "25 s" in s["run"]["error"]
    started = [line for line in s["run"]["output_tail"] if line.startswith("grandchild ")]
    assert started, s["run"]
    grandchild = int(started[0].split()[1])
    assert grandchild not in before
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE


def test_megabytes_of_output_keep_only_a_bounded_tail():
    s = audit("noisy.py", timeout=60)
    run = s["run"]
    assert run["status"] == "ok" and run["output_bytes"] > 5_000_000
    assert len(run["output_tail"]) <= 40 and run["output_tail"][-1] == "last line of a noisy program"
    assert all(len(line) <= 410 for line in run["output_tail"])


def test_inference_program_stops_after_n_forward_passes():
    s = audit("inference_loop.py", steps=4, timeout=60)
    assert s["run"]["status"] == "ok" and s["run"]["steps"] == 4
    assert s["run"]["output_tail"][-1] == "forward 4"
    addmm = _by_op(s)["aten::addmm"][0]
    assert addmm["phase"] == "inference" and addmm["count"] == 8 and addmm["calls_per_step"] == 2.0


def test_func_targets_module_callable_and_hal_ops_fallbacks():
    s = audit("workload_funcs.py:module_and_inputs", kind="func", steps=3)
    assert s["run"]["status"] == "ok" and s["run"]["steps"] == 3
    assert _by_op(s)["aten::gelu"][0]["count"] == 3
    s = audit("workload_funcs.py:step_callable", kind="func", steps=2)
    assert s["run"]["steps"] == 2 and any(o["phase"] == "optimizer" for o in s["ops"])
    s = audit("workload_funcs.py:own_training_loop", kind="func", steps=3)
    assert s["run"]["status"] == "ok" and s["run"]["optimizer_steps"] == 3
    s = audit("workload_funcs.py:uses_hal_ops", kind="func", steps=2)
    assert s["run"]["status"] == "ok", s["run"]
    hal = [o for o in s["ops"] if o["source"] == "hal.ops"]
    assert len(hal) == 1 and hal[0]["op"] == "aten::softshrink" and hal[0]["status"] == "fallback"
    assert hal[0]["count"] == 2 and hal[0]["calls_per_step"] == 1.0
    assert hal[0]["verified"] is False  # it fell back on the CPU run, not on the (absent) MLU
    s = audit("workload_funcs.py:uses_hal_ops", kind="func", device="cpu", steps=2)
    hal = [o for o in s["ops"] if o["source"] == "hal.ops"]
    assert len(hal) == 1 and hal[0]["verified"] is True  # the target itself ran it


def test_cpu_target_is_measured_and_verified():
    s = audit("inference_loop.py", device="cpu", steps=2)
    assert s["target"]["available"] and s["target"]["verified"]
    # measured words: native where the CPU key has a kernel, composite where a composite kernel ran it
    assert all(o["verified"] and o["status"] in ("native", "composite") for o in s["ops"])
    assert {o["status"] for o in s["ops"]} == {"native", "composite"}
    assert s["findings"] == []  # no CUDA use in this program


@pytest.mark.parametrize("name", ["gpt", "cnn", "moe"])
def test_reference_models_audit_training_and_inference(name):
    from hal.models import WORKLOAD_NAMES
    if name not in WORKLOAD_NAMES:
        pytest.skip(f"reference model {name} not installed")
    s = audit(name, kind="model", steps=2, timeout=120)
    assert s["run"]["status"] == "ok", s["run"]
    assert s["run"]["steps"] == 2 and s["run"]["mode"] == "train+infer"
    phases = {o["phase"] for o in s["ops"]}
    assert {"forward", "backward", "optimizer", "inference"} <= phases
    assert not any(o["verified"] for o in s["ops"])
    if name in ("gpt", "moe"):  # attention: the CPU's kernel choice is reported as the portable op
        assert not any(o["op"].endswith("_for_cpu") for o in s["ops"])
        sdpa = [o for o in s["ops"] if o["op"] == "aten::scaled_dot_product_attention"]
        assert {o["phase"] for o in sdpa} == {"forward", "backward", "inference"}
        assert all(o["captured_as"].startswith("aten::_scaled_dot_product_flash_attention_for_cpu") for o in sdpa)


def test_bad_requests_raise_value_error(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        audit_target({"target": str(tmp_path / "nope.py"), "kind": "script", "device": "mlu"})
    with pytest.raises(ValueError, match="unknown device"):
        audit("crash_raise.py", device="tpu-xyz")
    with pytest.raises(ValueError, match="unknown audit kind"):
        audit("crash_raise.py", kind="binary")
    with pytest.raises(ValueError, match="unknown reference model"):
        audit("resnet9000", kind="model")
    with pytest.raises(ValueError, match="steps"):
        audit("crash_raise.py", steps=0)


def _onnx_model(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper
    w = helper.make_tensor("W", TensorProto.FLOAT, [4, 3], [0.1] * 12)
    nodes = [helper.make_node("Gemm", ["X", "W"], ["G"], name="fc"),
             helper.make_node("Relu", ["G"], ["R"]),
             helper.make_node("Softmax", ["R"], ["S"], axis=1),
             helper.make_node("Cast", ["S"], ["D"], to=TensorProto.DOUBLE),
             helper.make_node("Erf", ["D"], ["E"]),
             helper.make_node("MyFancyOp", ["E"], ["Y"], domain="com.example")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, [2, 3])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.example", 1)]), str(path))


def test_onnx_model_maps_op_types_onto_the_target(tmp_path):
    pytest.importorskip("onnx")
    path = tmp_path / "m.onnx"
    _onnx_model(path)
    s = audit_target({"target": str(path), "kind": "onnx", "device": "mlu"})
    assert s["run"]["status"] == "skipped" and s["run"]["nodes"] == 6
    by_type = {o["onnx_op"]: o for o in s["ops"]}
    assert by_type["Gemm"]["op"] == "aten::addmm" and by_type["Gemm"]["dtypes"] == ["float32"]
    assert by_type["MyFancyOp"]["status"] == "unknown" and "com.example" in by_type["MyFancyOp"]["reason"]
    assert any("float32" in n for n in by_type["Erf"]["dtype_notes"])  # float64 input on MLU
    assert s["target"]["verified"] is False
    why = _mlu_capabilities()
    if why:
        pytest.skip(why)
    assert by_type["Gemm"]["status"] in ("native", "composite")
    assert by_type["Softmax"]["status"] in ("native", "composite")


def test_onnx_bad_file_is_a_value_error(tmp_path):
    pytest.importorskip("onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf at all \x00\xff")
    with pytest.raises(ValueError, match="not a readable ONNX model"):
        audit_target({"target": str(bad), "kind": "onnx", "device": "mlu"})



@pytest.mark.contract
def test_contract_mlu_fallback_warnings_on_a_cpu_run_are_not_measurements():
    """A stand-in program prints torch_mlu's warning text while running on the CPU target: the text
    proves nothing there, so mode ran natively on the CPU (measured) and nothing is a fallback. The
    MLU side (the warning on an MLU run is a measured fallback) is in test_contract_verified_boundary."""
    s = audit("mlu_warning_standin.py", device="cpu")
    ops = _by_op(s)
    assert ops["aten::mode"][0]["status"] == "native" and ops["aten::mode"][0]["verified"] is True
    assert ops["aten::addmm"][0]["status"] == "native" and ops["aten::addmm"][0]["verified"] is True


@pytest.mark.parametrize("fail", [False, True])
def test_plain_spawn_processes_run_redirected_and_audited(fail):
    # pytorch/examples mnist_hogwild trains in mp.Process workers with the spawn start method: without the
    # audit's wrapper they start with no redirect and fail at their first CUDA call, and their ops are missed
    from hal.conformance.report.digest import _run_line
    s = audit("spawned_processes.py", args=["fail"] if fail else [], timeout=120)
    run = s["run"]
    assert run["status"] == "ok", run
    workers = run["spawned"]
    assert sorted(w["process"] for w in workers) == ["Process-1", "Process-2"] and all(w["rank"] is None for w in workers)
    # the two workers' lines may interleave (each print is two writes on an unbuffered stdout)
    trained = "\n".join(run["output_tail"])
    assert "worker 0 trained on cpu" in trained
    assert _by_op(s)["aten::gelu"][0]["count"] == 2  # each worker's two forward passes (the largest of any process)
    by_status = sorted((w["status"], w["optimizer_steps"]) for w in workers)
    if fail:
        assert by_status == [("error", 0), ("ok", 2)] and run["output_tail"][-1] == "exit codes [0, 1]"
        assert "2 worker processes audited, 1 failed (Process-2: ValueError: worker 1 failed on purpose)" in _run_line(s)
    else:
        assert by_status == [("ok", 2), ("ok", 2)] and "worker 1 trained on cpu" in trained
        assert _run_line(s).endswith("; 2 worker processes audited")


def test_a_spawn_pools_tasks_are_not_cut_by_the_step_bound():
    s = audit("spawn_pool_train.py", steps=1, timeout=90)
    assert s["run"]["status"] == "ok" and "trained [True, True, True, True]" in s["run"]["output_tail"], s["run"]
    assert not s["run"].get("spawned")
    # the child's os._exit skipped multiprocessing's finalizers: the resource tracker warned of the pool's semaphores
    assert not any("leaked semaphore" in line for line in s["run"]["output_tail"]), s["run"]["output_tail"]


@pytest.mark.parametrize("steps,inference", [(None, False), (1, False), (1, True)])
def test_the_programs_atexit_handlers_run_redirected_after_it_ends(tmp_path, steps, inference):
    """The child ends with os._exit: without running them itself, a final checkpoint saved at exit was lost. They run
    after a normal end and after the step bound stopped the program, on the redirected device, with the bound no
    longer counting (the handler's forward is not stopped); one that fails is printed as the interpreter prints it
    and the others still run."""
    ckpt = tmp_path / "final.pt"
    s = audit("atexit_handlers.py", args=[str(ckpt)] + ["--inference"] * inference, steps=steps, timeout=60)
    out = s["run"]["output_tail"]
    assert s["run"]["status"] == "ok" and s["run"]["error"] is None, s["run"]
    assert ("program done" in out) == (steps is None), out
    assert out[-1] == "checkpoint saved at exit" and any("a failing exit handler" in line for line in out), out
    import torch
    assert set(torch.load(ckpt, weights_only=True)) == {"weight", "bias"}


def test_a_program_hanging_in_an_atexit_handler_is_stopped_and_says_where():
    # the timeout must leave the program time to reach its exit: 8 s did not on an H100 host running 16 test workers
    # (the run was stopped before its atexit handlers, so the error rightly did not name them)
    s = audit("atexit_handlers.py", args=["/dev/null", "--hang-at-exit"], timeout=30)
    assert s["run"]["status"] == "timeout", s["run"]
    assert "timeout (in its atexit handlers) and was stopped" in s["run"]["error"], s["run"]["error"]
    assert "hanging at exit" in s["run"]["output_tail"], s["run"]["output_tail"]


def test_an_mp_spawn_workers_traceback_in_the_error_is_cut_to_its_cause():
    """``mp.spawn`` re-raises a rank's failure with the rank's whole traceback in the message (as the DataLoader does,
    test above): the run's error keeps the first line and the exception the traceback ends with."""
    from torch.multiprocessing.spawn import ProcessRaisedException

    from hal.conformance.runtime.exception_text import exception_text
    trace = ('Traceback (most recent call last):\n  File "train.py", line 9, in run\n    step(model)\n'
             '    ^^^^^^^^^^^\nValueError: loss is nan\n')
    exc = ProcessRaisedException(f"\n\n-- Process 1 terminated with the following error:\n{trace}", 1, 1234)
    assert exception_text(exc) == ("ProcessRaisedException: -- Process 1 terminated with the following error -> "
                                   "ValueError: loss is nan")
    assert exception_text(ValueError("two\nlines"), limit=7) == "ValueEr"  # no traceback in it: as it is, cut
