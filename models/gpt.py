"""``gpt``: a decoder-only language model trained with AdamW and served with a KV cache.

Architecture (GPT-2 family): token embedding + learned positions (or RoPE), pre-norm blocks of
causal self-attention and an MLP, a final norm and a head tied to the token embedding. Options:
``norm`` ``layernorm``/``rmsnorm``; ``mlp`` ``gelu`` (4h GELU) or ``swiglu`` (SiLU-gated);
``pos`` ``learned``/``rope``; ``attention`` ``sdpa`` (``F.scaled_dot_product_attention``) or
``math`` (explicit softmax(QK^T/sqrt(d))V, the reference path); ``ops`` ``torch`` (torch's own
modules and functions) or ``hal`` (the norms, the MLP activation, the math path's softmax and the
LM head + loss go through ``hal.ops``: ``layer_norm``/``rms_norm``, ``gelu``/``silu``, ``softmax``
and ``linear_cross_entropy``, which a backend may fuse and chunk; SDPA stays torch's). Both give
the same parameters and model state dicts.

Inference API (usable by a profiler: time to first token = :meth:`GptWorkload.prefill`, per-token
latency = :meth:`GptWorkload.decode_step`):

- ``prefill(tokens) -> (logits[b, vocab] of the last position, KVCache)``
- ``decode_step(token[b], cache) -> logits[b, vocab]`` (appends one position to ``cache``)
- ``generate(prompt, max_new_tokens, use_cache=True) -> ids[b, max_new_tokens]`` (greedy);
  ``use_cache=False`` recomputes the whole sequence every token (the reference the cache must equal).

Configs: ``tiny`` (default; a few seconds on 2 CPU cores) and ``gpt2-small`` (124M parameters).
Training data are synthetic arithmetic token sequences (``start + i*stride mod vocab``) so that
the loss falls measurably within a few steps.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from hal.models.workload import BaseConfig, Workload


@dataclasses.dataclass(frozen=True)
class GptConfig(BaseConfig):
    vocab_size: int = 256
    seq_len: int = 64            # training sequence length and maximum positions
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    norm: str = "layernorm"      # layernorm | rmsnorm
    mlp: str = "gelu"            # gelu | swiglu
    pos: str = "learned"         # learned | rope
    attention: str = "sdpa"      # sdpa | math
    dropout: float = 0.0
    bias: bool = True
    batch_size: int = 4
    prompt_len: int = 8
    gen_tokens: int = 8
    lr: float = 3e-3
    weight_decay: float = 0.1
    ops: str = "torch"           # torch | hal (see the module docstring)

    def __post_init__(self) -> None:
        for field, allowed in (("norm", ("layernorm", "rmsnorm")), ("mlp", ("gelu", "swiglu")),
                               ("pos", ("learned", "rope")), ("attention", ("sdpa", "math")),
                               ("ops", ("torch", "hal"))):
            if getattr(self, field) not in allowed:
                raise ValueError(f"gpt config {field}={getattr(self, field)!r}; one of {', '.join(allowed)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn_dim(self) -> int:
        # SwiGLU keeps the parameter count of a 4h GELU MLP (2/3 * 4h, rounded to 8)
        return 4 * self.n_embd if self.mlp == "gelu" else int(8 * ((8 * self.n_embd // 3 + 7) // 8))


GPT_CONFIGS = {
    "tiny": GptConfig(),
    "gpt2-small": GptConfig(vocab_size=50257, seq_len=1024, n_layer=12, n_head=12, n_embd=768,
                            batch_size=8, prompt_len=128, gen_tokens=32, lr=6e-4),
}


# ---- building blocks (shared with the moe workload) ---------------------------------------------
def make_norm(kind: str, dim: int, ops: str = "torch") -> nn.Module:
    """A ``layernorm``/``rmsnorm`` module over the last ``dim``; with ``ops="hal"`` its forward calls
    ``hal.ops`` (same parameters and state dict as torch's module)."""
    if kind == "layernorm":
        return HalLayerNorm(dim) if ops == "hal" else nn.LayerNorm(dim)
    if ops == "hal":
        return HalRMSNorm(dim, eps=1e-6)
    if hasattr(nn, "RMSNorm"):
        return nn.RMSNorm(dim, eps=1e-6)
    return _RMSNorm(dim)  # pragma: no cover - torch < 2.4


class HalLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` whose forward is ``hal.ops.layer_norm``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import hal.ops as H
        return H.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class HalRMSNorm(nn.Module):
    """RMSNorm (``weight`` parameter, like ``nn.RMSNorm``) whose forward is ``hal.ops.rms_norm``."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.normalized_shape, self.eps, self.weight = (dim,), eps, nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import hal.ops as H
        return H.rms_norm(x, self.normalized_shape, self.weight, self.eps)


class _RMSNorm(nn.Module):  # pragma: no cover - only for torch without nn.RMSNorm
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Rope(nn.Module):
    """Rotary position embedding tables (non-persistent buffers) for ``max_len`` positions."""

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0):
        super().__init__()
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        ang = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        """Rotate ``x[b, heads, s, head_dim]`` for positions ``pos .. pos+s-1``."""
        s = x.shape[-2]
        cos, sin = self.cos[pos:pos + s].to(x.dtype), self.sin[pos:pos + s].to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class KVCache:
    """Per-layer key/value tensors ``[b, heads, max_len, head_dim]`` and the filled ``length``.

    Size: 2 x layers x kv_heads x head_dim x max_len x batch x bytes (:func:`kv_cache_bytes`)."""

    def __init__(self, n_layer: int, batch: int, heads: int, max_len: int, head_dim: int,
                 device: torch.device, dtype: torch.dtype):
        shape = (batch, heads, max_len, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.length = 0
        self.max_len = max_len

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


def kv_cache_bytes(n_layer: int, kv_heads: int, head_dim: int, tokens: int, bytes_per: int) -> int:
    """2 x layers x kv_heads x head_dim x tokens x bytes (tokens = batch x positions)."""
    return 2 * n_layer * kv_heads * head_dim * tokens * bytes_per


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, impl: str, dropout_p: float,
              ops: str = "torch") -> torch.Tensor:
    """Causal attention of ``q[b,h,s,d]`` over ``k, v[b,h,L,d]`` (``L >= s``, queries at the end);
    the ``math`` path's softmax is ``hal.ops.softmax`` when ``ops="hal"``."""
    s, L = int(q.shape[-2]), int(k.shape[-2])
    if impl == "sdpa":
        if s == L:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=s > 1)
        mask = torch.ones(s, L, dtype=torch.bool, device=q.device).tril(L - s) if s > 1 else None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if s > 1:
        mask = torch.ones(s, L, dtype=torch.bool, device=q.device).tril(L - s)
        att = att.masked_fill(~mask, float("-inf"))
    if ops == "hal":
        import hal.ops as H
        att = H.softmax(att, -1)
    else:
        att = F.softmax(att, dim=-1)
    if dropout_p:
        att = F.dropout(att, dropout_p)
    return att @ v


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GptConfig):
        super().__init__()
        self.cfg = cfg
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, rope: Optional[Rope], cache: Optional[KVCache], layer: int) -> torch.Tensor:
        b, s, h = x.shape
        nh, hd = self.cfg.n_head, self.cfg.head_dim
        q, k, v = self.qkv(x).split(h, dim=2)
        q, k, v = (t.view(b, s, nh, hd).transpose(1, 2) for t in (q, k, v))
        pos = cache.length if cache is not None else 0
        if rope is not None:
            q, k = rope(q, pos), rope(k, pos)
        if cache is not None:
            cache.k[layer][:, :, pos:pos + s] = k
            cache.v[layer][:, :, pos:pos + s] = v
            k, v = cache.k[layer][:, :, :pos + s], cache.v[layer][:, :, :pos + s]
        y = attention(q, k, v, self.cfg.attention, self.cfg.dropout if self.training else 0.0,
                      self.cfg.ops)
        y = y.transpose(1, 2).reshape(b, s, h)
        return self.drop(self.proj(y))


class Mlp(nn.Module):
    def __init__(self, cfg: GptConfig):
        super().__init__()
        h, f = cfg.n_embd, cfg.ffn_dim
        self.kind, self.ops = cfg.mlp, cfg.ops
        self.fc = nn.Linear(h, f, bias=cfg.bias)
        self.gate = nn.Linear(h, f, bias=cfg.bias) if cfg.mlp == "swiglu" else None
        self.proj = nn.Linear(f, h, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ops == "hal":
            import hal.ops as H
            act_gelu, act_silu = H.gelu, H.silu
        else:
            act_gelu, act_silu = F.gelu, F.silu
        if self.gate is None:
            y = act_gelu(self.fc(x))
        else:
            y = act_silu(self.gate(x)) * self.fc(x)
        return self.drop(self.proj(y))


class Block(nn.Module):
    def __init__(self, cfg: GptConfig, mlp: Optional[nn.Module] = None):
        super().__init__()
        self.ln1 = make_norm(cfg.norm, cfg.n_embd, getattr(cfg, "ops", "torch"))
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = make_norm(cfg.norm, cfg.n_embd, getattr(cfg, "ops", "torch"))
        self.mlp = mlp if mlp is not None else Mlp(cfg)

    def forward(self, x: torch.Tensor, rope: Optional[Rope] = None, cache: Optional[KVCache] = None,
                layer: int = 0) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), rope, cache, layer)
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    """The language model: ``forward(tokens[b, s], cache=None) -> logits[b, s, vocab]``."""

    def __init__(self, cfg: GptConfig, blocks: Optional[list[nn.Module]] = None):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.seq_len, cfg.n_embd) if cfg.pos == "learned" else None
        self.rope = Rope(cfg.head_dim, cfg.seq_len) if cfg.pos == "rope" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(blocks if blocks is not None else [Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = make_norm(cfg.norm, cfg.n_embd, getattr(cfg, "ops", "torch"))
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.head.weight = self.wte.weight  # tied
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, tokens: torch.Tensor, cache: Optional[KVCache] = None, last_only: bool = False) -> torch.Tensor:
        """Logits ``[b, s, vocab]`` (``[b, 1, vocab]`` with ``last_only``, as a server's prefill does)."""
        return self.head(self.features(tokens, cache, last_only))

    def features(self, tokens: torch.Tensor, cache: Optional[KVCache] = None, last_only: bool = False) -> torch.Tensor:
        """The final-norm hidden states ``[b, s, n_embd]`` the head maps to logits."""
        b, s = tokens.shape
        pos = cache.length if cache is not None else 0
        if pos + s > self.cfg.seq_len:
            raise ValueError(f"sequence of {pos + s} positions exceeds seq_len={self.cfg.seq_len}")
        x = self.wte(tokens)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(pos, pos + s, device=tokens.device))
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x, self.rope, cache, i)
        if cache is not None:
            cache.length = pos + s
        if last_only:
            x = x[:, -1:]
        return self.ln_f(x)


class GptExport(nn.Module):
    """ONNX-exportable prefill: ``tokens -> logits`` (the inference path without the cache)."""

    def __init__(self, model: Gpt):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens)


def lm_batch(cfg: Any, batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Arithmetic sequences ``start + i*stride (mod vocab)``: inputs and next-token targets."""
    start = torch.randint(0, cfg.vocab_size, (batch_size, 1), generator=gen)
    stride = torch.randint(1, 4, (batch_size, 1), generator=gen)
    seq = (start + stride * torch.arange(cfg.seq_len + 1)) % cfg.vocab_size
    return {"tokens": seq[:, :-1].contiguous(), "targets": seq[:, 1:].contiguous()}


class GptWorkload(Workload):
    """See the module docstring. ``infer(batch)`` greedily generates ``gen_tokens`` ids after the
    first ``prompt_len`` tokens of ``batch["tokens"]`` with the KV cache."""

    name = "gpt"
    CONFIGS = GPT_CONFIGS

    def _make_model(self) -> nn.Module:
        return Gpt(self.config)

    def _make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=self.config.lr, betas=(0.9, 0.95),
                                 weight_decay=self.config.weight_decay)

    def _make_batch(self, batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return lm_batch(self.config, batch_size, gen)

    def _loss(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        if self.config.ops == "hal":  # the head + loss fused (never the full logits where the backend chunks)
            import hal.ops as H
            h = self.model.features(batch["tokens"])
            return H.linear_cross_entropy(h.reshape(-1, h.shape[-1]), self.model.head.weight,
                                          batch["targets"].reshape(-1), self.model.head.bias)
        logits = self.model(batch["tokens"])
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), batch["targets"].reshape(-1))

    # ---- inference ----------------------------------------------------------------------------
    def new_cache(self, batch: int, max_len: Optional[int] = None) -> KVCache:
        c = self.config
        return KVCache(c.n_layer, batch, c.n_head, max_len or c.seq_len, c.head_dim, self.device, self.dtype)

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, cache: Optional[KVCache] = None) -> tuple[torch.Tensor, KVCache]:
        """Run the prompt, fill a new (or the given empty) cache; logits of the last position."""
        self._require_built()
        self.model.eval()
        cache = cache if cache is not None else self.new_cache(tokens.shape[0])
        logits = self.model(tokens, cache, last_only=True)
        return logits[:, -1], cache

    @torch.no_grad()
    def decode_step(self, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Feed one token per sequence (``token[b]``); returns the next logits ``[b, vocab]``."""
        self.model.eval()
        return self.model(token.view(-1, 1), cache)[:, -1]

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, max_new_tokens: int, use_cache: bool = True) -> torch.Tensor:
        """Greedy decoding; returns the ``max_new_tokens`` new ids ``[b, max_new_tokens]``."""
        self._require_built()
        self.model.eval()
        out = []
        if use_cache:
            logits, cache = self.prefill(prompt)
            for i in range(max_new_tokens):
                nxt = logits.argmax(-1)
                out.append(nxt)
                if i + 1 < max_new_tokens:
                    logits = self.decode_step(nxt, cache)
        else:
            seq = prompt
            for _ in range(max_new_tokens):
                nxt = self.model(seq)[:, -1].argmax(-1)
                out.append(nxt)
                seq = torch.cat([seq, nxt[:, None]], dim=1)
        return torch.stack(out, dim=1)

    def infer(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.generate(batch["tokens"][:, :self.config.prompt_len], self.config.gen_tokens)

    def onnx_inputs(self, batch: Mapping[str, torch.Tensor]) -> tuple[nn.Module, tuple, list[str]]:
        return GptExport(self.model), (batch["tokens"][:, :self.config.prompt_len],), ["tokens"]

    # ---- estimates ----------------------------------------------------------------------------
    def estimates(self, batch_size: Optional[int] = None, seq_len: Optional[int] = None,
                  mode: str = "train") -> dict:
        from hal.models.estimate import gpt_estimates
        return gpt_estimates(self.config, self.dtype, batch_size or self.config.batch_size,
                             seq_len or self.config.seq_len, mode, foreach=self.optimizer_foreach())
