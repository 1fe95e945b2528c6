"""The step bound covers evaluation loops and hand-written SGD, says which bound stopped the run,
and the child's own I/O survives a program that takes over stdout/stderr (issue 16)."""
from __future__ import annotations

from pathlib import Path

import pytest

from hal.conformance.runtime import audit_target

FIX = Path(__file__).resolve().parent / "fixtures" / "runtime"


def audit(target: str, args=(), steps=None, timeout=60) -> dict:
    return audit_target({"target": str(FIX / target), "kind": "script", "device": "mlu", "args": list(args),
                         "steps": steps, "timeout": timeout, "out": None})


@pytest.mark.parametrize("mode", ["sgd", "optim-eval"])
def test_evaluation_loops_and_optimizer_free_training_are_bounded(mode):
    s = audit("eval_heavy.py", [mode], steps=2)
    run = s["run"]
    assert run["status"] == "ok", run
    # one training step ran, then the 100000-forward evaluation was cut after 2 forward passes
    assert run["stopped_by"] == "forward passes" and run["backward_passes"] == 1 and run["steps"] == 1
    assert run["seconds"] < 45
    assert {"aten::addmm", "aten::tanh_backward"} <= {o["op"] for o in s["ops"]}


def test_backward_passes_bound_a_program_without_an_optimizer(tmp_path):
    prog = tmp_path / "manual_sgd.py"
    prog.write_text("import torch\nw = torch.randn(4, requires_grad=True)\nfor i in range(10**6):\n"
                    "    (w * w).sum().backward()\n    with torch.no_grad():\n        w -= 0.1 * w.grad\n"
                    "    w.grad = None\n")
    s = audit_target({"target": str(prog), "kind": "script", "device": "mlu", "args": [], "steps": 3,
                      "timeout": 60, "out": None})
    assert s["run"]["status"] == "ok" and s["run"]["stopped_by"] == "backward passes", s["run"]
    assert s["run"]["backward_passes"] == 3 and s["run"]["steps"] == 3


def test_which_bound_stopped_the_run_is_named():
    s = audit("inference_loop.py", steps=3)
    assert s["run"]["status"] == "ok" and s["run"]["stopped_by"] == "forward passes" and s["run"]["steps"] == 3
    s = audit("stdout_games.py", steps=5)  # ends by itself before any bound
    assert s["run"]["status"] == "ok" and s["run"]["stopped_by"] is None


@pytest.mark.parametrize("args,status", [([], "ok"), (["raise"], "error")])
def test_program_closing_and_replacing_stdout_keeps_the_capture(args, status):
    s = audit("stdout_games.py", args)
    run = s["run"]
    assert run["status"] == status, run
    assert run["output_tail"][0] == "before the takeover"
    ops = {o["op"] for o in s["ops"]}
    assert "aten::gelu" in ops  # captured after stdout, stderr and fd 1 were closed
    if status == "error":
        assert run["error"] == "RuntimeError: failed after closing stderr"
        assert run["output_tail"][-1] == "RuntimeError: failed after closing stderr"  # via the child's own fd


def test_an_evaluation_before_the_first_step_of_an_optimizer_program_does_not_end_the_audit(tmp_path):
    """nanoGPT's pattern: optimizer built, estimate_loss() (no_grad forwards) at iteration 0, then train."""
    prog = tmp_path / "eval_first.py"
    prog.write_text("import torch\nm = torch.nn.Linear(4, 4)\nopt = torch.optim.AdamW(m.parameters())\n"
                    "for it in range(100):\n    with torch.no_grad():\n        for _ in range(10):\n"
                    "            m(torch.randn(2, 4))\n    m(torch.randn(2, 4)).sum().backward()\n    opt.step()\n")
    s = audit_target({"target": str(prog), "kind": "script", "device": "mlu", "args": [], "steps": 2,
                      "timeout": 60, "out": None})
    run = s["run"]
    assert run["status"] == "ok" and run["optimizer_steps"] == 1 and run["stopped_by"] == "forward passes", run
    assert any(o["phase"] == "optimizer" for o in s["ops"])
