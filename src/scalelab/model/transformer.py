"""Llama-style Pre-Norm decoder with composable scale vectors (docs/scale-vectors.md).

    x = embed(idx)
    for each block:  x = x + post?(attn(norm(x)))      post? = Peri-LN output norm (cfg.post_norm)
                     x = x + post?(mlp(norm(x)))       mlp = SwiGLU or MoE
    logits = lm_head(norm(x))

Where the γ live (ScaleConfig flags, composable):
    standard   one γ per norm: block.attn_scale, block.mlp_scale, final_scale (input scales),
               attn.q_scale/k_scale (QK-norm) and block.*_post_scale (post-branch norm) (output scales)
    branch     the pre-attention/pre-MLP norms lose their shared γ; each map reading x̂ has its own (Projection.s_in)
    placement  s_out on the outputs of q, k, v, o, gate, up, down and of every expert's (Projection.s_out)
    magdir     every Scale, s_out included (our choice: one parameterization for all), is g·sqrt(d)·v/‖v‖₂
    none       scales: false, no Scale module at all
Weight decay flags only change optimizer groups (scalelab.optim, by `param_kind`).
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from scalelab.config import ModelConfig
from scalelab.model.attention import Attention, Rotary
from scalelab.model.mlp import MLP
from scalelab.model.moe import MoE
from scalelab.model.norm import INPUT_SCALE, OUTPUT_SCALE, Projection, RMSNorm, Scale, make_scale


class ModelOutput(NamedTuple):
    logits: torch.Tensor  # [B, T, V]
    loss: torch.Tensor | None  # CE mean (+ aux_loss_coef · aux for MoE); None without targets
    aux_loss: torch.Tensor  # mean MoE load-balance loss over layers; 0 for dense models


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, s = cfg.d_model, cfg.scale
        out_std = cfg.init_std / math.sqrt(2 * cfg.n_layer)  # residual projections, GPT-2 style
        shared = not s.branch  # under `branch` the consumers hold the input γ instead
        self.attn_norm = RMSNorm(d, cfg.norm_eps)
        self.attn_scale = make_scale(d, INPUT_SCALE, s) if shared else None
        self.attn = Attention(cfg, out_std)
        self.mlp_norm = RMSNorm(d, cfg.norm_eps)
        self.mlp_scale = make_scale(d, INPUT_SCALE, s) if shared else None
        if cfg.moe is None:
            self.mlp = MLP(d, cfg.d_ff, std=cfg.init_std, out_std=out_std, cfg=s)
        else:
            self.mlp = MoE(cfg, out_std)
        self.post_norm = RMSNorm(d, cfg.norm_eps) if cfg.post_norm else None
        self.attn_post_scale = make_scale(d, OUTPUT_SCALE, s) if cfg.post_norm else None
        self.mlp_post_scale = make_scale(d, OUTPUT_SCALE, s) if cfg.post_norm else None

    def _post(self, h: torch.Tensor, scale: Scale | None) -> torch.Tensor:
        return h if self.post_norm is None else self.post_norm(h, scale)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attn_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(new residual stream, MoE aux loss or None)."""
        x = x + self._post(self.attn(self.attn_norm(x, self.attn_scale), cos, sin, attn_mask), self.attn_post_scale)
        h = self.mlp(self.mlp_norm(x, self.mlp_scale))
        h, aux = h if isinstance(self.mlp, MoE) else (h, None)
        return x + self._post(h, self.mlp_post_scale), aux


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        nn.init.normal_(self.embed.weight, mean=0.0, std=cfg.init_std)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.final_scale = make_scale(cfg.d_model, INPUT_SCALE, cfg.scale)  # the LM head's input γ
        self.lm_head = Projection(cfg.d_model, cfg.vocab_size, std=cfg.init_std, cfg=cfg.scale, reads_norm=False,
                                  kind="embedding")
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self._kinds = self._collect_kinds()

    # ---------------------------------------------------------------- forward
    def hidden_states(self, x: torch.Tensor, positions: torch.Tensor | None = None,
                      attn_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the blocks on embeddings x [B, T, d] at RoPE `positions` ([T] or [B, T]; default 0..T-1), causal
        or under a boolean `attn_mask`; returns (residual stream before the final norm, mean MoE aux loss)."""
        if positions is None:
            positions = torch.arange(x.shape[1], device=x.device)
        cos, sin = self.rotary(positions)
        aux = []
        for block in self.blocks:
            x, a = block(x, cos, sin, attn_mask)
            if a is not None:
                aux.append(a)
        return x, torch.stack(aux).mean() if aux else x.new_zeros((), dtype=torch.float32)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h, self.final_scale))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> ModelOutput:
        """idx [B, T] int64; targets [B, T] (-100 = ignored) gives the loss."""
        h, aux = self.hidden_states(self.embed(idx))
        logits = self.logits(h)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
            if self.cfg.moe is not None:
                loss = loss + self.cfg.moe.aux_loss_coef * aux
        return ModelOutput(logits, loss, aux)

    # ---------------------------------------------------------------- accounting
    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters, tied ones once; non_embedding leaves out the token embedding and the LM head."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.embed.weight.numel() + (0 if self.cfg.tie_embeddings else self.lm_head.weight.numel())
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward), PaLM-style: 6·N_active + 12·n_layer·d_model·seq_len.

        N_active counts the weights of every matmul a token goes through: q, k, v, o; gate, up, down (MoE: router,
        top_k experts and the shared expert); and the LM head. The embedding lookup and the elementwise scale
        vectors are left out. The second term is QKᵀ and AV (2·2·seq_len·d forward, ×3 with backward), counted
        without the causal halving, as PaLM and nanoGPT do."""
        c = self.cfg
        hd = c.head_dim
        attn = c.d_model * hd * (2 * c.n_head + 2 * c.kv_heads)
        if c.moe is None:
            mlp = 3 * c.d_model * c.d_ff
        else:
            d_expert = c.moe.d_expert or c.d_ff // c.moe.top_k
            mlp = c.d_model * c.moe.n_experts + 3 * c.d_model * d_expert * (c.moe.top_k + int(c.moe.shared_expert))
        n_active = c.n_layer * (attn + mlp) + c.d_model * c.vocab_size
        return 6.0 * n_active + 12.0 * c.n_layer * c.d_model * seq_len

    # ---------------------------------------------------------------- scales, for the optimizer and diagnostics
    def _collect_kinds(self) -> dict[str, str]:
        kinds = {}
        for mod_name, module in self.named_modules():
            if isinstance(module, (Scale, Projection)):
                kind = module.kind
            elif isinstance(module, nn.Embedding):
                kind = "embedding"
            else:
                kind = None
            for p_name, _ in module.named_parameters(recurse=False):
                if kind is None:
                    raise TypeError(f"no optimizer kind for parameter {p_name!r} of {type(module).__name__}")
                kinds[f"{mod_name}.{p_name}" if mod_name else p_name] = kind
        return kinds

    def param_kind(self, name: str) -> str:
        """"matrix", "embedding", "input_scale" or "output_scale" for a name of `named_parameters()`."""
        try:
            return self._kinds[name]
        except KeyError:
            raise KeyError(f"{name!r} is not a parameter of this model") from None

    @torch.no_grad()
    def gamma_stats(self) -> dict[str, float]:
        """mean, std, max, min of every effective scale vector, keyed `gamma/<where>/<stat>` with <where> like
        `layer0.attn_scale`, `layer0.attn.q.s_in`, `layer1.mlp.down.s_out`, `layer0.attn.q_scale`, `final_scale`."""
        names, rows = [], []
        for name, module in self.named_modules():
            if isinstance(module, Scale):
                g = module().float()
                names.append(re.sub(r"^blocks\.(\d+)\.", r"layer\1.", name))
                rows.append(torch.stack([g.mean(), g.std(correction=0), g.max(), g.min()]))
        if not rows:
            return {}
        values = torch.stack(rows).tolist()  # one host sync for all of them
        return {f"gamma/{n}/{stat}": v for n, row in zip(names, values)
                for stat, v in zip(("mean", "std", "max", "min"), row)}
