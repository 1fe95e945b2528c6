"""``moe``: a decoder LM whose transformer blocks use a top-2 mixture-of-experts MLP.

Router: a linear layer, softmax (float32), ``topk`` (k = 2), the k weights renormalised to sum 1.
Dispatch: assignments sorted by expert (stable), token rows gathered, every expert (a GELU MLP)
applied to its contiguous slice; combine: ``scatter_add`` of the weighted expert outputs back to
their tokens. Dropless (no capacity factor), so expert-parallel and single-process results match.
Load balancing: the Switch-Transformer auxiliary loss ``E * sum_e f_e * P_e`` (``f_e`` the
fraction of assignments routed to ``e``, ``P_e`` its mean router probability), weighted by
``aux_loss_coef`` and added to the cross-entropy.

Expert parallel (``build(..., communicator=comm)``): the E experts are split evenly over the
communicator's ranks (rank r keeps experts ``r*E/W .. (r+1)*E/W - 1``; the others are deleted);
each rank routes its own tokens, exchanges per-expert counts with ``Communicator.all_to_all``, sends
token rows to the experts' owners with ``all_to_all`` and input/output splits, and gets the
results back the same way. The exchange is differentiable (backward is the reverse all_to_all).
Replicated parameters (attention, router, embeddings) are *not* synchronised by this module: a
trainer all-reduces their gradients (see :mod:`hal.models.dp`). ``python -m hal.models.ep`` checks
expert parallel against a single process.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from hal.models.gpt import Block, Gpt, GptConfig, GptWorkload


@dataclasses.dataclass(frozen=True)
class MoeConfig(GptConfig):
    n_experts: int = 4
    top_k: int = 2
    expert_ffn: int = 128
    aux_loss_coef: float = 0.01


MOE_CONFIGS = {
    "tiny": MoeConfig(),
    "small": MoeConfig(vocab_size=32000, seq_len=512, n_layer=4, n_head=8, n_embd=512, n_experts=8,
                       expert_ffn=1408, batch_size=8, prompt_len=64, gen_tokens=16, lr=6e-4),
}


def _stable_argsort(keys: torch.Tensor) -> torch.Tensor:
    """Stable ascending argsort of small non-negative integer ``keys`` (unique composite keys, so
    any sort is stable; exportable to ONNX, unlike ``argsort(stable=True)``)."""
    n = keys.shape[0]
    return torch.argsort(keys * n + torch.arange(n, device=keys.device))


class _AllToAll(torch.autograd.Function):
    """Differentiable ``Communicator.all_to_all`` with splits; backward sends gradients back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Any, out_splits: list, in_splits: list) -> torch.Tensor:
        ctx.comm, ctx.splits = comm, (out_splits, in_splits)
        return comm.all_to_all(x, out_splits, in_splits)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        out_splits, in_splits = ctx.splits
        return ctx.comm.all_to_all(grad.contiguous(), in_splits, out_splits), None, None, None


class Expert(nn.Module):
    def __init__(self, h: int, f: int):
        super().__init__()
        self.fc = nn.Linear(h, f)
        self.proj = nn.Linear(f, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class MoeMlp(nn.Module):
    """Top-k MoE MLP. ``aux_loss`` holds the last forward's load-balancing loss."""

    def __init__(self, cfg: MoeConfig):
        super().__init__()
        self.n_experts, self.top_k = cfg.n_experts, cfg.top_k
        self.router = nn.Linear(cfg.n_embd, cfg.n_experts, bias=False)
        self.experts = nn.ModuleDict({str(e): Expert(cfg.n_embd, cfg.expert_ffn) for e in range(cfg.n_experts)})
        self.comm: Optional[Any] = None
        self.aux_loss = torch.zeros(())

    def shard(self, comm: Any) -> None:
        """Keep only this rank's experts and route through ``comm`` (ValueError if E % W != 0)."""
        w, r = comm.world_size, comm.rank
        if self.n_experts % w:
            raise ValueError(f"{self.n_experts} experts cannot be split over {w} ranks")
        per = self.n_experts // w
        for e in range(self.n_experts):
            if not r * per <= e < (r + 1) * per:
                del self.experts[str(e)]
        self.comm = comm

    def _run_local(self, xs: torch.Tensor, expert_ids: list[int], counts: list[int]) -> torch.Tensor:
        outs = [self.experts[str(e)](chunk) for e, chunk in zip(expert_ids, xs.split(counts)) if chunk.shape[0]]
        return torch.cat(outs) if outs else xs[:0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, h, E, k = x.shape, x.shape[-1], self.n_experts, self.top_k
        xt = x.reshape(-1, h)
        T = xt.shape[0]
        probs = F.softmax(self.router(xt).float(), dim=-1)
        top_w, top_i = probs.topk(k, dim=-1)
        top_w = top_w / top_w.sum(-1, keepdim=True)
        flat_e = top_i.reshape(-1)
        counts = (flat_e[:, None] == torch.arange(E, device=x.device)).sum(0)
        frac = counts.to(probs.dtype) / (T * k)
        self.aux_loss = E * (frac.detach() * probs.mean(0)).sum()
        order = _stable_argsort(flat_e)
        token_of = (torch.arange(T * k, device=x.device) // k)[order]
        xs = xt.index_select(0, token_of)
        if self.comm is None:
            ys = self._run_local(xs, list(range(E)), counts.tolist())
        else:
            ys = self._expert_parallel(xs, counts)
        weights = top_w.reshape(-1)[order].to(ys.dtype).unsqueeze(1)
        # under autocast the experts' outputs are in the autocast dtype: combine in that dtype
        out = torch.zeros_like(xt, dtype=ys.dtype).scatter_add(0, token_of.unsqueeze(1).expand(-1, h), ys * weights)
        return out.view(shape)

    def _expert_parallel(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        comm, E = self.comm, self.n_experts
        W, r = comm.world_size, comm.rank
        per = E // W
        recv_counts = comm.all_to_all(counts.to(torch.int64).contiguous())   # [W * per]: from j, my experts
        in_splits = counts.view(W, per).sum(1).tolist()
        recv_matrix = recv_counts.view(W, per)
        out_splits = recv_matrix.sum(1).tolist()
        recv = _AllToAll.apply(xs, comm, out_splits, in_splits)
        # rows arrive grouped by source rank, then by expert: regroup by expert
        local_ids = torch.arange(per, device=xs.device).repeat(W)
        row_expert = torch.repeat_interleave(local_ids, recv_matrix.reshape(-1))
        regroup = _stable_argsort(row_expert)
        ys_sorted = self._run_local(recv.index_select(0, regroup), [r * per + e for e in range(per)],
                                    recv_matrix.sum(0).tolist())
        ys = torch.empty_like(ys_sorted).index_copy(0, regroup, ys_sorted)
        return _AllToAll.apply(ys, comm, in_splits, out_splits)


class MoeGpt(Gpt):
    def __init__(self, cfg: MoeConfig):
        super().__init__(cfg, blocks=[Block(cfg, MoeMlp(cfg)) for _ in range(cfg.n_layer)])

    def moe_layers(self) -> list[MoeMlp]:
        return [b.mlp for b in self.blocks]

    def aux_loss(self) -> torch.Tensor:
        return sum(m.aux_loss for m in self.moe_layers())


class MoeWorkload(GptWorkload):
    """The gpt workload with MoE blocks (same inference API). See the module docstring."""

    name = "moe"
    CONFIGS = MOE_CONFIGS

    def _make_model(self) -> nn.Module:
        return MoeGpt(self.config)

    def build(self, device: Any = None, dtype: Any = torch.float32, seed: int = 0,
              communicator: Optional[Any] = None) -> "MoeWorkload":
        """As :meth:`Workload.build`; with ``communicator``, experts are split over its ranks."""
        super().build(device, dtype, seed)
        if communicator is not None:
            for layer in self.model.moe_layers():
                layer.shard(communicator)
            self.optimizer = self._make_optimizer(self.model.parameters())
        return self

    def _loss(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        ce = super()._loss(batch)
        return ce + self.config.aux_loss_coef * self.model.aux_loss().to(ce.dtype)

    def estimates(self, batch_size: Optional[int] = None, seq_len: Optional[int] = None,
                  mode: str = "train") -> dict:
        from hal.models.estimate import moe_estimates
        return moe_estimates(self.config, self.dtype, batch_size or self.config.batch_size,
                             seq_len or self.config.seq_len, mode, foreach=self.optimizer_foreach())
