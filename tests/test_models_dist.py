"""Distributed reference workloads with real 2-process gloo runs launched by torchrun:
data-parallel gpt gradients equal single-process gradients on the global batch; MoE expert
parallel equals the single-process MoE."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from hal.models import get_workload


def _torchrun(module: str, *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", module, *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def test_data_parallel_gpt_gradients_equal_single_process(tmp_path):
    grads, report = tmp_path / "grads.pt", tmp_path / "dp.json"
    p = _torchrun("hal.models.dp", "--model", "gpt", "--config", "tiny", "--device", "cpu", "--steps", "2",
                  "--warmup", "1", "--baseline", "--dump-grads", str(grads), "--out", str(report))
    assert "scaling efficiency" in p.stdout
    res = json.loads(report.read_text())
    assert res["world_size"] == 2 and res["dist_backend"] == "gloo" and res["global_batch"] == 8
    assert res["step_time_s"] > 0 and res["samples_per_s"] > 0 and 0 < res["comm_share"] < 1
    assert res["peak_memory_bytes"] > 0 and res["t1_s"] > 0
    assert abs(res["scaling_efficiency"] - res["t1_s"] / (2 * res["step_time_s"])) < 1e-12

    # single process, same seed, the whole global batch (index 0)
    w = get_workload("gpt", "tiny").build("cpu", torch.float32, seed=0)
    w.backward(w.example_batch(8, index=0))
    dp = torch.load(grads)
    ref = {n: p.grad for n, p in w.model.named_parameters()}
    assert dp.keys() == ref.keys() and len(dp) > 10
    for name, g in dp.items():
        torch.testing.assert_close(g, ref[name], rtol=1e-5, atol=1e-6, msg=name)
    # a half-batch gradient is not the global one: the comparison can fail
    w2 = get_workload("gpt", "tiny").build("cpu", torch.float32, seed=0)
    w2.backward({k: v[:4] for k, v in w2.example_batch(8, index=0).items()})
    assert not torch.allclose(w2.model.wte.weight.grad, dp["wte.weight"], rtol=1e-5, atol=1e-6)


def test_moe_expert_parallel_equals_single_process(tmp_path):
    from hal.models.ep import single_process_reference
    _torchrun("hal.models.ep", "--config", "tiny", "--device", "cpu", "--global-batch", "4", "--out", str(tmp_path))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    ref = single_process_reference("tiny", 4, 0)
    torch.testing.assert_close(torch.cat([r["logits"] for r in ranks]), ref["logits"], rtol=1e-5, atol=1e-5)
    # each rank holds only its experts (2 of 4 per layer), together all of them, with equal gradients
    g0, g1 = ranks[0]["expert_grads"], ranks[1]["expert_grads"]
    assert g0 and g1 and not set(g0) & set(g1)
    assert set(g0) | set(g1) == set(ref["expert_grads"])
    assert all(".experts.0." in n or ".experts.1." in n for n in g0)
    for name, g in {**g0, **g1}.items():
        torch.testing.assert_close(g, ref["expert_grads"][name], rtol=1e-5, atol=1e-6, msg=name)
