"""Reference workloads on the CPU (tiny configs): interface, determinism, KV cache, training,
checkpoint/resume, estimates against measured memory."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
import torch

from hal.models import WORKLOAD_NAMES, config_names, get_workload
from hal.models.measure import measure_peak

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _built(name: str, **over):
    return get_workload(name, "tiny", **over).build("cpu", torch.float32, seed=0)


def test_registry_and_bad_input():
    assert WORKLOAD_NAMES == ("gpt", "cnn", "moe")
    assert "gpt2-small" in config_names("gpt")
    with pytest.raises(ValueError, match="one of gpt, cnn, moe"):
        get_workload("bert")
    with pytest.raises(ValueError, match="tiny"):
        get_workload("gpt", "huge")
    with pytest.raises(ValueError, match="unknown config field"):
        get_workload("gpt", "tiny", n_layers=3)
    with pytest.raises(ValueError, match="norm"):
        get_workload("gpt", "tiny", norm="batchnorm")


def test_no_device_specific_string_in_models():
    offenders = [str(p) for p in (ROOT / "models").rglob("*.py") if "cu" + "da" in p.read_text().lower()]
    assert offenders == []


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_deterministic_under_seed_and_loss_decreases(name):
    runs = []
    for _ in range(2):
        w = _built(name)
        batch = w.example_batch()
        runs.append(([w.train_step(batch) for _ in range(4)], w.infer(batch), w))
    (l1, o1, w1), (l2, o2, w2) = runs
    assert l1 == l2 and torch.equal(o1, o2)
    for p, q in zip(w1.model.parameters(), w2.model.parameters()):
        assert torch.equal(p, q)
    assert l1[-1] < l1[0] - 0.03, l1
    assert w1.step == 4
    other = get_workload(name).build("cpu", seed=1)
    assert not torch.equal(next(other.model.parameters()), next(w1.model.parameters())) or name == "cnn"
    assert not all(torch.equal(a, b) for a, b in zip(other.example_batch().values(), w1.example_batch().values()))


@pytest.mark.parametrize("name,over", [("gpt", {}), ("gpt", {"attention": "math"}),
                                       ("gpt", {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu"}), ("moe", {})])
def test_cached_decode_equals_uncached_generation(name, over):
    w = _built(name, **over)
    for _ in range(3):
        w.train_step(w.example_batch())
    prompt = w.example_batch()["tokens"][:, :8]
    cached = w.generate(prompt, 12, use_cache=True)
    uncached = w.generate(prompt, 12, use_cache=False)
    assert cached.shape == (prompt.shape[0], 12)
    assert torch.equal(cached, uncached)
    # the logits themselves agree, not only their argmax
    logits, cache = w.prefill(prompt)
    full = w.model(torch.cat([prompt, cached[:, :1]], 1))[:, -1]
    step = w.decode_step(cached[:, 0], cache)
    torch.testing.assert_close(step, full, rtol=1e-4, atol=1e-5)
    assert cache.length == 9 and cache.nbytes() == w.estimates(mode="infer")["memory"]["kv_cache"]


def test_math_and_sdpa_attention_agree():
    a, b = _built("gpt"), _built("gpt", attention="math")
    batch = a.example_batch()
    torch.testing.assert_close(a.forward_loss(batch), b.forward_loss(batch))


def test_bfloat16_parameters_train():
    w = get_workload("gpt").build("cpu", torch.bfloat16, seed=0)
    assert {p.dtype for p in w.model.parameters()} == {torch.bfloat16}
    batch = w.example_batch()
    losses = [w.train_step(batch) for _ in range(4)]
    assert losses[-1] < losses[0]


def test_cnn_inference_uses_eval_mode():
    w = _built("cnn")
    batch = w.example_batch()
    w.train_step(batch)
    bn = w.model.stem[1]
    before = bn.running_mean.clone()
    out = w.infer(batch)
    assert out.shape == (8, 4) and torch.equal(bn.running_mean, before)
    # eval mode: each sample's logits do not depend on the rest of the batch
    torch.testing.assert_close(w.infer({"images": batch["images"][:1]}), out[:1])


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_checkpoint_resume_is_bitwise_identical(name, tmp_path):
    over = {"dropout": 0.1} if name != "cnn" else {}   # dropout makes the RNG state matter
    straight = get_workload(name, "tiny", **over).build("cpu", seed=3)
    l_straight = [straight.train_step(straight.example_batch(index=i)) for i in range(6)]

    first = get_workload(name, "tiny", **over).build("cpu", seed=3)
    l_first = [first.train_step(first.example_batch(index=i)) for i in range(3)]
    first.save(tmp_path / "ckpt.pt")
    torch.manual_seed(1234)  # disturb the RNG: resume must restore it
    second = get_workload(name, "tiny", **over).build("cpu", seed=3)
    second.resume(tmp_path / "ckpt.pt")
    assert second.step == 3
    l_second = [second.train_step(second.example_batch(index=i)) for i in range(3, 6)]
    assert l_first + l_second == l_straight
    for p, q in zip(straight.model.parameters(), second.model.parameters()):
        assert torch.equal(p, q)
    sa, sb = straight.optimizer.state_dict()["state"], second.optimizer.state_dict()["state"]
    for k in sa:
        for key, val in sa[k].items():
            assert torch.equal(torch.as_tensor(val), torch.as_tensor(sb[k][key]))


def test_checkpoint_is_backend_portable_and_checked(tmp_path):
    w = _built("gpt")
    w.train_step(w.example_batch())
    sd = w.state_dict()
    tensors = []
    def walk(o):
        if isinstance(o, torch.Tensor):
            tensors.append(o)
        elif isinstance(o, dict):
            [walk(v) for v in o.values()]
        elif isinstance(o, (list, tuple)):
            [walk(v) for v in o]
    walk(sd)
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    assert sd["saved_on"] == "cpu" and sd["step"] == 1
    other = _built("cnn")
    with pytest.raises(ValueError, match="not a cnn checkpoint"):
        other.load_state_dict(sd)
    with pytest.raises(ValueError, match="differs"):
        _built("gpt", n_layer=3).load_state_dict(sd)


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_estimates_itemised(name):
    w = _built(name)
    est = w.estimates()
    mem = est["memory"]
    assert est["parameters"] == w.parameter_count()
    for item in ("parameters", "gradients", "optimizer_state", "activations", "total_bytes"):
        assert isinstance(mem[item], int) and mem[item] > 0, item
    assert mem["parameters"] == w.parameter_count() * 4
    assert mem["lower_bound"] is False and est["flops_per_step"] > 0


def test_gpt_flops_match_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode
    w = _built("gpt", attention="math")
    batch = w.example_batch()
    with FlopCounterMode(display=False) as fc:
        w.backward(batch)
    counted = fc.get_total_flops()
    assert abs(w.estimates()["flops_per_step"] - counted) / counted < 0.02


def test_kv_cache_formula():
    from hal.models.gpt import kv_cache_bytes
    w = get_workload("gpt", "gpt2-small")
    mem = w.estimates(batch_size=1, mode="infer")["memory"]
    assert mem["kv_cache"] == kv_cache_bytes(12, 12, 64, 1024, 4) == 2 * 12 * 12 * 64 * 1024 * 4 == 75497472
    assert get_workload("gpt", "gpt2-small").estimates()["parameters"] == 124439808  # GPT-2 small


@pytest.mark.parametrize("over", [{}, {"attention": "math"}, {"mlp": "swiglu", "pos": "rope", "norm": "rmsnorm"}])
def test_gpt_training_memory_estimate_within_10_percent_of_cpu_allocator(over):
    w = get_workload("gpt", "tiny", n_embd=128, vocab_size=512, seq_len=128, **over).build("cpu")
    batch = w.example_batch()
    w.train_step(batch)  # optimizer state exists from here on
    measured = measure_peak(lambda: w.train_step(batch), w.device, w.backend, [w.model, w.optimizer, batch])
    est = w.estimates()["memory"]
    assert measured["baseline_bytes"] >= est["parameters"] + est["optimizer_state"]
    err = (est["total_bytes"] - measured["peak_bytes"]) / measured["peak_bytes"]
    assert abs(err) < 0.10, (est, measured)


@pytest.mark.parametrize("name", ["gpt", "moe"])
def test_inference_memory_estimate_with_kv_cache_within_10_percent(name):
    w = get_workload(name, "tiny", n_embd=128, vocab_size=512, seq_len=128, prompt_len=32).build("cpu")
    batch = w.example_batch()
    measured = measure_peak(lambda: w.infer(batch), w.device, w.backend, [w.model, w.optimizer, batch])
    mem = w.estimates(mode="infer")["memory"]
    assert mem["kv_cache"] == 2 * 2 * 4 * 32 * (4 * 128) * 4  # 2 x layers x kv_heads x head_dim x tokens x bytes
    err = (mem["total_bytes"] - measured["peak_bytes"]) / measured["peak_bytes"]
    assert abs(err) < 0.10, (mem, measured)


def test_cnn_training_memory_estimate_within_10_percent_of_cpu_allocator():
    w = _built("cnn", batch_size=16, image_size=32)
    batch = w.example_batch()
    w.train_step(batch)
    measured = measure_peak(lambda: w.train_step(batch), w.device, w.backend, [w.model, w.optimizer, batch])
    err = (w.estimates()["memory"]["total_bytes"] - measured["peak_bytes"]) / measured["peak_bytes"]
    assert abs(err) < 0.10, err


def test_measure_peak_sees_a_known_allocation():
    def fn():
        a = torch.empty(1 << 20, dtype=torch.float32)  # 4 MiB
        b = torch.empty(1 << 19, dtype=torch.float32)  # 2 MiB while a is alive
        del a, b
    r = measure_peak(fn, torch.device("cpu"), None, [])
    assert 6 * 2**20 <= r["peak_bytes"] < 6 * 2**20 + 65536


def test_run_cli_train_and_infer(tmp_path, capsys):
    from hal.models.run import main
    out = tmp_path / "r.json"
    assert main(["--model", "gpt", "--steps", "3", "--out", str(out), "--save", str(tmp_path / "c.pt")]) == 0
    assert "estimate error" in capsys.readouterr().out
    res = json.loads(out.read_text())
    assert res["final_step"] == 6  # 2 warm-up + 3 timed + 1 measured for memory
    assert res["peak_memory"]["peak_bytes"] > 0 and abs(res["memory_estimate_error"]) < 0.10
    assert main(["--model", "gpt", "--mode", "infer", "--steps", "1", "--resume", str(tmp_path / "c.pt")]) == 0
    assert main(["--model", "gpt", "--config", "nope"]) == 2
    err = capsys.readouterr().err
    assert "one of tiny" in err and "Traceback" not in err


def test_run_cli_as_a_program():
    p = subprocess.run([sys.executable, "-m", "hal.models.run", "--model", "cnn", "--steps", "1", "--warmup", "0"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "samples/s" in p.stdout


@pytest.mark.parametrize("over", [{}, {"attention": "math", "norm": "rmsnorm", "mlp": "swiglu"}])
def test_gpt_ops_hal_matches_torch_and_calls_hal_ops(monkeypatch, over):
    """``ops="hal"`` trains like ``ops="torch"`` (same weights, losses within float32 noise) and its
    norms, activations, softmax and LM head + loss really go through hal.ops."""
    import hal.ops
    calls: dict = {}
    names = ["layer_norm", "rms_norm", "gelu", "silu", "softmax", "linear_cross_entropy"]
    for name in names:
        real = getattr(hal.ops, name)

        def counted(*a, _real=real, _name=name, **k):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*a, **k)
        monkeypatch.setattr(hal.ops, name, counted)
    runs = {}
    for ops in ("torch", "hal"):
        w = _built("gpt", ops=ops, **over)
        runs[ops] = (w, [w.train_step(w.example_batch(index=i)) for i in range(3)])
        if ops == "torch":
            assert calls == {}, calls
    torch.testing.assert_close(torch.tensor(runs["hal"][1]), torch.tensor(runs["torch"][1]), rtol=1e-4, atol=1e-5)
    for p, q in zip(runs["hal"][0].model.parameters(), runs["torch"][0].model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-5)
    norm = "rms_norm" if over else "layer_norm"
    cfg = runs["hal"][0].config
    assert calls[norm] == 3 * (2 * cfg.n_layer + 1), calls
    assert calls["linear_cross_entropy"] == 3
    assert calls["silu" if over else "gelu"] == 3 * cfg.n_layer
    if over:
        assert calls["softmax"] == 3 * cfg.n_layer
    assert runs["hal"][0].model.state_dict().keys() == runs["torch"][0].model.state_dict().keys()


def test_run_cli_ops_flag(tmp_path):
    from hal.models.run import main
    out = tmp_path / "r.json"
    assert main(["--model", "gpt", "--steps", "1", "--warmup", "0", "--ops", "hal", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["ops"] == "hal" and len(res["losses"]) == 1
    assert main(["--model", "cnn", "--steps", "1", "--ops", "hal"]) == 2  # cnn has no ops field
