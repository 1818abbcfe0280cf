"""Causal self-attention: RoPE, grouped-query attention, optional QK-norm, no biases (the scale-vector paper's model).

RoPE follows Hugging Face Llama's non-interleaved `rotate_half` convention, so exported q/k weights need no
permutation. QK-norm is RMS over head_dim with one γ per head_dim shared across heads, applied before RoPE (Qwen3).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from scalelab.config import ModelConfig
from scalelab.model.norm import OUTPUT_SCALE, Projection, RMSNorm, make_scale


class Rotary(nn.Module):
    """cos/sin tables of rotary position embeddings for arbitrary integer positions ([T] or [B, T])."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim, self.theta = head_dim, theta

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Frequencies made here in fp32, not kept as a buffer: `bf16-true` casts buffers, and bf16 phases drift by
        # ~0.2 rad at position 1024 (and would no longer match the fp32 HF export). As HF Llama.
        exponent = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=positions.device) / self.head_dim
        freqs = positions[..., None].float() / (self.theta**exponent)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, T, H, head_dim] by the tables cos/sin [T, head_dim] or [B, T, head_dim]."""
    cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, out_std: float) -> None:
        super().__init__()
        d, hd, s = cfg.d_model, cfg.head_dim, cfg.scale
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.kv_heads, hd
        # q, k, v read the pre-attention norm's x̂ (each gets its own γ under `branch`); o reads the heads
        self.q = Projection(d, cfg.n_head * hd, std=cfg.init_std, cfg=s, reads_norm=True)
        self.k = Projection(d, cfg.kv_heads * hd, std=cfg.init_std, cfg=s, reads_norm=True)
        self.v = Projection(d, cfg.kv_heads * hd, std=cfg.init_std, cfg=s, reads_norm=True)
        self.o = Projection(cfg.n_head * hd, d, std=out_std, cfg=s, reads_norm=False)
        self.qk_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None
        # output-norm γ: they set the attention temperature, real capacity
        self.q_scale = make_scale(hd, OUTPUT_SCALE, s) if cfg.qk_norm else None
        self.k_scale = make_scale(hd, OUTPUT_SCALE, s) if cfg.qk_norm else None

    def input_projections(self) -> list[Projection]:
        """The maps that read the pre-attention norm (where its γ folds)."""
        return [self.q, self.k, self.v]

    def qkv(self, x: torch.Tensor, cos: torch.Tensor,
            sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values [B, heads, T, head_dim], normalized and rotated."""
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.n_head, self.head_dim)
        k = self.k(x).view(B, T, self.n_kv_head, self.head_dim)
        v = self.v(x).view(B, T, self.n_kv_head, self.head_dim)
        if self.qk_norm is not None:
            q, k = self.qk_norm(q, self.q_scale), self.qk_norm(k, self.k_scale)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Causal attention, or attention under `attn_mask` (boolean, True = may attend) when given."""
        B, T, _ = x.shape
        q, k, v = self.qkv(x, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None,
                                           enable_gqa=self.n_kv_head != self.n_head)
        return self.o(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))
