"""Mixture-of-experts SwiGLU block: softmax router, top-k, optional always-on shared expert.

Routing: p = softmax(router(x)); the k largest p_e are chosen and renormalized to sum 1. Experts have d_expert
hidden units (default d_ff // top_k, so the active MLP size stays close to the dense one); the shared expert has the
same size. Under `branch`, the router and each expert's gate/up get their own γ (their `Projection.s_in`).
Load balance (Switch Transformer): aux = E · Σ_e f_e · P_e, f_e = fraction of token-slots sent to e, P_e = mean
router probability of e; aux = 1 at perfectly uniform routing. The model adds aux_loss_coef · mean over layers.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from scalelab.config import ModelConfig
from scalelab.model.mlp import MLP
from scalelab.model.norm import Projection


class Routing(NamedTuple):
    probs: torch.Tensor  # [N, E] router probabilities (float32)
    weights: torch.Tensor  # [N, k] combine weights of the chosen experts, summing to 1
    experts: torch.Tensor  # [N, k] chosen expert ids


def load_balance_loss(probs: torch.Tensor, experts: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Switch aux loss E · Σ_e f_e · P_e from probabilities [N, E] and chosen experts [N, k]."""
    f = torch.bincount(experts.flatten(), minlength=n_experts).to(probs.dtype) / experts.numel()
    return n_experts * (f * probs.mean(0)).sum()


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig, out_std: float) -> None:
        super().__init__()
        if cfg.moe is None:
            raise ValueError("MoE needs ModelConfig.moe")
        m, s = cfg.moe, cfg.scale
        d_expert = m.d_expert or cfg.d_ff // m.top_k
        self.n_experts, self.top_k = m.n_experts, m.top_k
        # the router is read like an embedding (AdamW, no s_out) but its input γ is foldable like any other
        self.router = Projection(cfg.d_model, m.n_experts, std=cfg.init_std, cfg=s, reads_norm=True,
                                 kind="embedding")
        self.experts = nn.ModuleList(
            MLP(cfg.d_model, d_expert, std=cfg.init_std, out_std=out_std, cfg=s) for _ in range(m.n_experts))
        self.shared = MLP(cfg.d_model, d_expert, std=cfg.init_std, out_std=out_std, cfg=s) if m.shared_expert else None

    def input_projections(self) -> list[Projection]:
        """The maps that read the pre-MLP norm (where its γ folds): router, and every expert's gate and up."""
        mlps = [*self.experts, *([self.shared] if self.shared is not None else [])]
        return [self.router, *(p for mlp in mlps for p in mlp.input_projections())]

    def route(self, x: torch.Tensor) -> Routing:
        probs = F.softmax(self.router(x).float(), dim=-1)
        top, experts = probs.topk(self.top_k, dim=-1)
        return Routing(probs, top / top.sum(-1, keepdim=True), experts)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(output like x, load-balance aux loss) for x [..., d_model]."""
        shape, x = x.shape, x.reshape(-1, x.shape[-1])
        r = self.route(x)
        # group the N·k token-slots by expert: one host sync for the counts, then one call per expert (an expert
        # with no tokens still runs on an empty batch, so every parameter is in the graph, as DDP expects)
        slot_expert = r.experts.flatten()
        order = slot_expert.argsort(stable=True)
        counts = torch.bincount(slot_expert, minlength=self.n_experts).tolist()
        tokens, weights = (order // self.top_k).split(counts), r.weights.flatten()[order].split(counts)
        out = torch.zeros_like(x)
        for expert, tok, w in zip(self.experts, tokens, weights):
            out.index_add_(0, tok, (expert(x[tok]) * w[:, None]).to(out.dtype))
        if self.shared is not None:
            out = out + self.shared(x)
        return out.view(shape), load_balance_loss(r.probs, r.experts, self.n_experts)
