"""Analytic estimates: parameters, FLOPs per step and itemised memory, for comparison with
:func:`hal.models.measure.measure_peak`.

Memory items (bytes): ``parameters``, ``gradients``, ``optimizer_state``, ``activations`` (what
autograd keeps for backward), ``loss_transient`` / ``optimizer_transient`` (buffers alive only at
the peak moment), ``kv_cache`` (inference: 2 x layers x kv_heads x head_dim x tokens x bytes).

Training peak model (checked against torch's allocator on CPU, see tests and docs/models.md):
gradients are set to None between steps, so the peak is the larger of

- *start of backward*: parameters + optimizer state + activations + loss transient, and
- *optimizer step*: parameters + optimizer state + gradients + optimizer transient.

``total_bytes`` is that peak; ``lower_bound`` is True when only model states (parameters,
gradients, optimizer state) are counted because activations could not be estimated.

GPT activations per layer, in units of b x s x h elements (pre-norm block, ``sdpa``, LayerNorm,
GELU MLP): norm outputs 2, qkv 3, attention output 1, residual outputs 2, MLP 2 x f/h (fc output
and GELU output) = 16 for f = 4h; plus the attention log-sum-exp (b x heads x s, float32). The
``math`` attention path keeps the softmax probabilities (b x heads x s x s) and a re-layout copy
of its output. SwiGLU keeps 4 x f/h; RoPE adds about 3 (rotated q and k and an intermediate); the composite RMSNorm one per norm. Cross-entropy keeps the
log-probabilities (b x s x vocab) and at the start of backward holds two more of that size.
"""
from __future__ import annotations

from typing import Any

import torch


def _bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def training_memory(params: int, grads: int, optimizer_state: int, activations: int, loss_transient: int,
                    optimizer_transient: int, extra: dict | None = None, exact: bool = True) -> dict:
    """Itemised training memory with the peak model of the module docstring."""
    backward_peak = params + optimizer_state + activations + loss_transient
    step_peak = params + optimizer_state + grads + optimizer_transient
    mem = {"parameters": params, "gradients": grads, "optimizer_state": optimizer_state,
           "activations": activations, "loss_transient": loss_transient,
           "optimizer_transient": optimizer_transient, **(extra or {}),
           "peak_phase": "backward" if backward_peak >= step_peak else "optimizer_step",
           "total_bytes": max(backward_peak, step_peak), "lower_bound": False, "exact_model": exact}
    return mem


def model_states_lower_bound(params: int, grads: int, optimizer_state: int) -> dict:
    """Model states only: labelled as a lower bound of the peak."""
    return {"parameters": params, "gradients": grads, "optimizer_state": optimizer_state,
            "total_bytes": params + grads + optimizer_state, "lower_bound": True}


def optimizer_transient(params: int, largest: int, bytes_per: int, foreach: bool) -> int:
    """Temporary bytes of one optimizer step: the multi-tensor (``foreach``) AdamW/SGD
    implementations make one parameter-sized list of temporaries (AdamW's sqrt of the second
    moment, SGD's weight-decayed gradients); the per-parameter loop two of the largest parameter."""
    return params * bytes_per if foreach else 2 * largest * bytes_per


# ---- gpt ---------------------------------------------------------------------------------------------
def gpt_parameters(cfg: Any) -> int:
    h, f, L, V = cfg.n_embd, cfg.ffn_dim, cfg.n_layer, cfg.vocab_size
    bias = 1 if cfg.bias else 0
    norm = 2 * h if cfg.norm == "layernorm" else h
    attn = 3 * h * h + 3 * h * bias + h * h + h * bias
    mats = 2 if cfg.mlp == "gelu" else 3
    mlp = mats * h * f + (mats - 1) * f * bias + h * bias
    emb = V * h + (cfg.seq_len * h if cfg.pos == "learned" else 0)
    return emb + L * (2 * norm + attn + mlp) + norm


def gpt_forward_flops(cfg: Any, batch: int, seq: int) -> int:
    """Matmul FLOPs of one forward (2 per multiply-add): linear layers, QK^T and AV (full square),
    and the head."""
    h, f, L, V = cfg.n_embd, cfg.ffn_dim, cfg.n_layer, cfg.vocab_size
    mats = 2 if cfg.mlp == "gelu" else 3
    per_token = L * (4 * h * h + mats * h * f) + h * V
    return 2 * batch * seq * per_token + L * 4 * batch * seq * seq * h


def gpt_activation_bytes(cfg: Any, dtype: torch.dtype, batch: int, seq: int) -> dict:
    e = _bytes(dtype)
    h, L, V, nh = cfg.n_embd, cfg.n_layer, cfg.vocab_size, cfg.n_head
    bsh = batch * seq * h
    units = 8 + (4 if cfg.mlp == "swiglu" else 2) * cfg.ffn_dim / h
    if cfg.pos == "rope":
        units += 3  # rotated q and k, plus a rotation intermediate
    if cfg.norm == "rmsnorm":
        units += 2  # the composite RMSNorm keeps one more tensor per norm
    per_layer = int(units * bsh) * e
    if cfg.attention == "math":
        per_layer += batch * nh * seq * seq * e  # softmax probabilities
    else:
        per_layer += batch * nh * seq * 4  # log-sum-exp (float32)
    if cfg.dropout:
        per_layer += 3 * bsh  # dropout masks (bool): attention output, MLP output, (embedding below)
    logprobs = batch * seq * V * e
    final = (3 if cfg.norm == "rmsnorm" else 2) * bsh * e
    return {"layers": L * per_layer, "embedding_and_final_norm": final, "log_probs": logprobs}


def gpt_estimates(cfg: Any, dtype: torch.dtype, batch: int, seq: int, mode: str = "train",
                  foreach: bool = True) -> dict:
    """Estimates for one training step (``mode="train"``) or one generation (``"infer"``)."""
    e = _bytes(dtype)
    P = gpt_parameters(cfg)
    if mode == "infer":
        prompt, gen = min(cfg.prompt_len, seq), cfg.gen_tokens
        kv = kv_cache_bytes_cfg(cfg, batch * cfg.seq_len, e)
        # prefill: the residual stream, a norm output and the MLP hidden pair of the prompt, alive
        # together; the logits of the last position only
        hidden = (3 + 2 * cfg.ffn_dim / cfg.n_embd) if cfg.mlp == "gelu" else (3 + 3 * cfg.ffn_dim / cfg.n_embd)
        transient = int(hidden * batch * prompt * cfg.n_embd) * e + batch * cfg.vocab_size * e
        flops = gpt_forward_flops(cfg, batch, prompt) + sum(
            2 * batch * (cfg.n_layer * (4 * cfg.n_embd ** 2 + (2 if cfg.mlp == "gelu" else 3) * cfg.n_embd * cfg.ffn_dim)
                         + cfg.n_embd * cfg.vocab_size) + cfg.n_layer * 4 * batch * (prompt + i) * cfg.n_embd
            for i in range(max(gen - 1, 0)))
        mem = {"parameters": P * e, "kv_cache": kv, "kv_cache_tokens": batch * cfg.seq_len,
               "prefill_transient": transient, "total_bytes": P * e + kv + transient, "lower_bound": False}
        return {"parameters": P, "flops_per_step": int(flops), "memory": mem, "mode": mode}
    acts = gpt_activation_bytes(cfg, dtype, batch, seq)
    logprobs = acts["log_probs"]
    mem = training_memory(params=P * e, grads=P * e, optimizer_state=2 * P * e,
                          activations=sum(acts.values()), loss_transient=2 * logprobs,
                          optimizer_transient=optimizer_transient(P, cfg.vocab_size * cfg.n_embd, e, foreach),
                          extra={"activations_detail": acts},
                          exact=cfg.norm == "layernorm" and cfg.mlp == "gelu" and cfg.pos == "learned")
    return {"parameters": P, "flops_per_step": 3 * gpt_forward_flops(cfg, batch, seq), "memory": mem,
            "mode": mode}


def kv_cache_bytes_cfg(cfg: Any, tokens: int, bytes_per: int) -> int:
    from hal.models.gpt import kv_cache_bytes
    return kv_cache_bytes(cfg.n_layer, cfg.n_head, cfg.head_dim, tokens, bytes_per)


# ---- cnn ---------------------------------------------------------------------------------------------
def _meta_trace(model_factory: Any, example: torch.Tensor) -> tuple[int, dict]:
    """Forward FLOPs (torch.utils.flop_counter on the meta device, no memory or compute) and output
    element counts per layer kind, from a model built on the meta device."""
    from torch.utils.flop_counter import FlopCounterMode
    with torch.device("meta"):
        model = model_factory()
    counts: dict[str, list[int]] = {"conv": [], "relu": [], "pool": []}
    hooks = []
    for m in model.modules():
        kind = ("conv" if isinstance(m, torch.nn.Conv2d) else "relu" if isinstance(m, torch.nn.ReLU)
                else "pool" if isinstance(m, torch.nn.MaxPool2d) else None)
        if kind is None and type(m).__name__ == "BasicBlock":
            kind = "block"
            counts.setdefault("block", [])
        if kind:
            hooks.append(m.register_forward_hook(lambda _m, _i, out, k=kind: counts[k].append(out.numel())))
    with FlopCounterMode(display=False) as fc:
        model(example.to("meta"))
    for h in hooks:
        h.remove()
    return int(fc.get_total_flops()), counts


def cnn_estimates(cfg: Any, dtype: torch.dtype, batch: int, mode: str = "train", foreach: bool = True) -> dict:
    """ResNet estimates. Activations: the input, every conv output (kept by its BatchNorm), every
    ReLU output (kept by ReLU and the next conv: one per stem, two per block) and max-pool output
    plus its int64 indices. Transient (backward, and inference): four tensors of the largest conv
    output (gradient in and out, and the convolution's own scratch/re-layout buffers, as the CPU
    allocator trace shows for the oneDNN convolution)."""
    from hal.models.cnn import ResNet
    e = _bytes(dtype)
    x = torch.empty(batch, cfg.channels, cfg.image_size, cfg.image_size)
    fwd, counts = _meta_trace(lambda: ResNet(cfg), x)
    with torch.device("meta"):
        m = ResNet(cfg)
    P = sum(p.numel() for p in m.parameters())
    buffers = sum(b.numel() * b.element_size() for b in m.buffers()) * e // 4
    if mode == "infer":
        largest = max(counts["conv"]) * e
        mem = {"parameters": P * e, "buffers": buffers, "input": x.numel() * e, "transient": 4 * largest,
               "total_bytes": P * e + buffers + x.numel() * e + 4 * largest, "lower_bound": False}
        return {"parameters": P, "flops_per_step": fwd, "memory": mem, "mode": mode}
    relu = counts["relu"] + [2 * n for n in counts.get("block", [])]
    acts = (x.numel() + sum(counts["conv"]) + sum(relu) + sum(counts["pool"])) * e + sum(counts["pool"]) * 8
    mem = training_memory(params=P * e, grads=P * e, optimizer_state=P * e, activations=acts,
                          loss_transient=4 * max(counts["conv"]) * e,
                          optimizer_transient=optimizer_transient(P, max(p.numel() for p in m.parameters()), e, foreach),
                          extra={"buffers": buffers}, exact=False)
    mem["total_bytes"] += buffers
    return {"parameters": P, "flops_per_step": 3 * fwd, "memory": mem, "mode": mode}


# ---- moe ---------------------------------------------------------------------------------------------
def moe_parameters(cfg: Any) -> int:
    h, f, L = cfg.n_embd, cfg.ffn_dim, cfg.n_layer
    bias = 1 if cfg.bias else 0
    dense_mlp = 2 * h * f + f * bias + h * bias
    moe = h * cfg.n_experts + cfg.n_experts * (2 * h * cfg.expert_ffn + cfg.expert_ffn + h)
    return gpt_parameters(cfg) - L * dense_mlp + L * moe


def moe_estimates(cfg: Any, dtype: torch.dtype, batch: int, seq: int, mode: str = "train",
                  foreach: bool = True) -> dict:
    """Single-process MoE estimates (every expert local). Per layer activations, in b x s x h units:
    attention half of the gpt block 8, plus per routed copy (k per token) the gathered row, the
    expert hidden and its GELU (2 x f/h), the expert output, and the weighted output; router
    probabilities in float32."""
    e = _bytes(dtype)
    h, L, V, k, E, fe = cfg.n_embd, cfg.n_layer, cfg.vocab_size, cfg.top_k, cfg.n_experts, cfg.expert_ffn
    P = moe_parameters(cfg)
    tokens = batch * seq
    expert_fwd = 2 * tokens * k * 2 * h * fe + 2 * tokens * h * E
    dense = gpt_forward_flops(cfg, batch, seq) - 2 * tokens * L * 2 * h * cfg.ffn_dim
    fwd = dense + L * expert_fwd
    if mode == "infer":
        est = gpt_estimates(cfg, dtype, batch, seq, "infer")
        est["parameters"] = P
        est["memory"]["parameters"] = P * e
        est["memory"]["total_bytes"] = P * e + est["memory"]["kv_cache"] + est["memory"]["prefill_transient"]
        return est
    bsh = tokens * h
    per_layer = int((8 + k * (3 + 2 * fe / h)) * bsh) * e + 3 * tokens * E * 4 + batch * cfg.n_head * seq * 4
    acts = {"layers": L * per_layer, "embedding_and_final_norm": 2 * bsh * e, "log_probs": tokens * V * e}
    mem = training_memory(params=P * e, grads=P * e, optimizer_state=2 * P * e,
                          activations=sum(acts.values()), loss_transient=2 * tokens * V * e,
                          optimizer_transient=optimizer_transient(P, cfg.vocab_size * h, e, foreach),
                          extra={"activations_detail": acts}, exact=False)
    return {"parameters": P, "flops_per_step": 3 * fwd, "memory": mem, "mode": mode}
