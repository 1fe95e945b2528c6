"""Real architectures from ``transformers`` (hal.models.hf): every one builds offline from its config,
trains and infers on the CPU; greedy decoding through the KV cache equals decoding without it; the
names resolve everywhere a workload name is taken (model sets, hal-audit, hal matrix)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from hal.models import expand_models, get_workload, model_sets, workload_class
from hal.models.hf import ARCHITECTURES, HF_NAMES
from tests.conftest import run_cli

DECODING = ("causal-lm", "seq2seq", "speech-seq2seq")


@pytest.mark.parametrize("name", HF_NAMES)
def test_every_architecture_trains_and_infers_from_its_config(name):
    arch = ARCHITECTURES[name[3:]]
    w = get_workload(name).build("cpu", torch.float32, seed=0)
    assert type(w.model).__name__ == arch.model_class
    batch = w.example_batch()
    before = [p.detach().clone() for p in w.model.parameters()]
    losses = [w.train_step(batch) for _ in range(3)]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], losses  # it learns the batch
    assert sum(not torch.equal(a, p) for a, p in zip(before, w.model.parameters())) > len(before) // 2
    out = w.infer(batch)
    b = w.config.batch_size
    if arch.task in DECODING:
        assert out.shape == (b, w.config.new_tokens) and out.dtype == torch.long
    else:
        assert out.shape[0] == b and out.is_floating_point() and torch.isfinite(out).all()
    # the same seed gives the same model and batch, wherever it is built
    again = get_workload(name).build("cpu", torch.float32, seed=0)
    assert again.train_step(again.example_batch()) == losses[0]


def _no_cache_tokens(w, batch):
    """Greedy tokens recomputed from the full sequence at every step (no KV cache)."""
    m, n = w.model, w.config.new_tokens
    if w.arch.task == "causal-lm":
        ids = batch["input_ids"]
        for _ in range(n):
            ids = torch.cat([ids, m(input_ids=ids, use_cache=False).logits[:, -1:].argmax(-1)], dim=1)
        return ids[:, -n:]
    enc = {k: v for k, v in batch.items() if k != "labels"}
    dec = torch.full((w.config.batch_size, 1), m.config.decoder_start_token_id)
    for _ in range(n):
        dec = torch.cat([dec, m(**enc, decoder_input_ids=dec, use_cache=False).logits[:, -1:].argmax(-1)], dim=1)
    return dec[:, 1:]


@pytest.mark.parametrize("name", ["hf:llama", "hf:mixtral", "hf:t5", "hf:whisper"])
def test_greedy_decoding_through_the_kv_cache_equals_decoding_without_it(name):
    w = get_workload(name).build("cpu", torch.float64, seed=1)
    batch = w.example_batch()
    cached = w.infer(batch)  # leaves the model in eval mode
    with torch.no_grad():
        assert torch.equal(cached, _no_cache_tokens(w, batch))


def test_names_and_sets():
    sets = model_sets()
    assert sets["real"] == HF_NAMES and len(HF_NAMES) >= 12
    families = {a.family for a in ARCHITECTURES.values()}
    assert {"decoder LLM", "MoE LLM", "encoder", "vision", "speech", "seq2seq"} <= families
    assert expand_models(["gpt", "all", "hf:llama"]) == ["gpt", "cnn", "moe", *HF_NAMES]
    with pytest.raises(ValueError, match="hf:llama, hf:qwen2"):
        workload_class("hf:gpt5")
    with pytest.raises(ValueError, match="unknown reference model 'resnet'; one of gpt, cnn, moe or hf:<arch>"):
        expand_models(["resnet"])
    assert workload_class("hf:bert") is workload_class("hf:bert") and workload_class("hf:bert").name == "hf:bert"


def test_estimates_count_parameters_and_flops_and_leave_the_random_stream_alone():
    w = get_workload("hf:qwen2_moe").build("cpu", torch.bfloat16, seed=0)
    state = torch.get_rng_state()
    est = w.estimates()
    assert torch.equal(state, torch.get_rng_state())
    assert est["parameters"] == w.parameter_count() and est["flops_per_step"] > 0
    assert est["memory"]["total_bytes"] == 4 * 2 * est["parameters"] and est["memory"]["lower_bound"]
    assert w.estimates(mode="infer")["flops_per_step"] * 3 == est["flops_per_step"]


def test_hal_audit_takes_an_hf_model_and_predicts_its_mlu_ops(tmp_path):
    r = run_cli("hal-audit", "hf:mixtral", "--device", "mlu", "--steps", "1", "--out", str(tmp_path / "o"),
                "--format", "json")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((tmp_path / "o" / "audit.json").read_text())
    ops = {o["op"]: o["status"] for o in doc["ops"]}
    assert doc["target"]["verified"] is False and doc["run"]["status"] == "ok"
    # the router's top-k and one_hot run on the device; one_hot's CPU-only class check is not predicted
    assert {"aten::topk", "aten::scatter_.value"} <= set(ops) and "aten::aminmax" not in ops
    r = run_cli("hal-audit", "hf:gpt5", "--device", "mlu", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "unknown hf architecture 'hf:gpt5'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x").exists()


def test_float64_reference_runs_a_model_that_makes_float_tensors_without_a_dtype():
    """CLIP's causal mask is ``torch.full(shape, torch.finfo(dtype).min)`` with no dtype: the float64
    reference makes it in float64 (the default dtype while it runs), and puts float32 back after."""
    from hal.conformance.precision import compare_workload
    d = compare_workload("hf:clip", device="cpu", dtype=torch.float32, steps=1, seed=0).as_dict()
    assert d["verdict"] in ("pass", "warning", "fail") and d["metrics"]
    assert torch.get_default_dtype() == torch.float32
