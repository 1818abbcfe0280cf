"""SwiGLU feed-forward block without biases: down(silu(gate(x)) ⊙ up(x))."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from scalelab.config import ScaleConfig
from scalelab.model.norm import Projection


class MLP(nn.Module):
    def __init__(self, d_model: int, d_hidden: int, *, std: float, out_std: float, cfg: ScaleConfig) -> None:
        super().__init__()
        self.gate = Projection(d_model, d_hidden, std=std, cfg=cfg, reads_norm=True)
        self.up = Projection(d_model, d_hidden, std=std, cfg=cfg, reads_norm=True)
        self.down = Projection(d_hidden, d_model, std=out_std, cfg=cfg, reads_norm=False)

    def input_projections(self) -> list[Projection]:
        """The maps that read the pre-MLP norm (where its γ folds)."""
        return [self.gate, self.up]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))
