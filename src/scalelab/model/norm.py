"""Normalization and scale vectors, kept apart so every scale variant is a composition (docs/scale-vectors.md).

`RMSNorm` computes x̂ = x / sqrt(mean(x²) + eps) and owns no parameters. A `Scale` is one scale vector γ (or s_out),
plain (γ, init 1) or magnitude-direction (γ = g·sqrt(d)·v/‖v‖₂, g = 1 and v = 1 at init, so γ = 1 exactly).
A `Projection` is a linear map with the scales its consumer role gives it (branch: s_in, placement: s_out).
Under `magdir` every Scale is magnitude-direction, s_out included: our choice, so that `unified` has one
parameterization for all its vectors. Which scales exist and where is decided by the consumers (transformer.py,
attention.py, mlp.py, moe.py) from the `ScaleConfig` flags; `make_scale` returns None wherever the `none` variant
(scales: false) wants no parameter at all.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from scalelab.config import ScaleConfig

# Input-norm γ, branch γ and s_out can be folded into the adjacent linear map; output-norm γ
# (QK-norm, post-branch norm) cannot: they are capacity. The optimizer groups parameters by these kinds.
INPUT_SCALE = "input_scale"
OUTPUT_SCALE = "output_scale"
ScaleKind = Literal["input_scale", "output_scale"]


class Scale(nn.Module):
    """One scale vector of length `dim`; `forward()` returns its effective value γ."""

    def __init__(self, dim: int, kind: ScaleKind, magdir: bool = False) -> None:
        super().__init__()
        self.dim, self.kind, self.magdir = dim, kind, magdir
        if magdir:
            self.g = nn.Parameter(torch.ones(1))  # shape (1,), not (): FSDP shards along dim 0
            self.v = nn.Parameter(torch.ones(dim))
        else:
            self.weight = nn.Parameter(torch.ones(dim))

    def forward(self) -> torch.Tensor:
        if self.magdir:
            # g·sqrt(d)·v/‖v‖₂ = g·v/rms(v): one fused kernel, and exactly 1 at init (rms(1) = 1)
            return F.rms_norm(self.v, (self.dim,), eps=0.0) * self.g
        return self.weight

    def extra_repr(self) -> str:
        return f"{self.dim}, kind={self.kind}, magdir={self.magdir}"


def make_scale(dim: int, kind: ScaleKind, cfg: ScaleConfig) -> Scale | None:
    """A scale vector under the variant `cfg`, or None for the `none` variant (no γ anywhere)."""
    return Scale(dim, kind, cfg.magdir) if cfg.scales else None


class RMSNorm(nn.Module):
    """x̂ = x / sqrt(mean(x²) + eps) over the last `dim` features; an optional γ is applied in the same kernel."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x: torch.Tensor, scale: Scale | None = None) -> torch.Tensor:
        gamma = None if scale is None else scale().to(x.dtype)  # same dtype keeps torch's fused kernel
        return F.rms_norm(x, (self.dim,), gamma, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


class Projection(nn.Linear):
    """A bias-free linear map with the scales placed around it: y = diag(s_out) · W · diag(s_in) · x.

    `s_in` is the consumer's own input-norm γ (variant `branch`: only maps that read a norm's x̂ get one); `s_out`
    scales the outputs (variant `placement`: hidden matrices only, never the router or LM head). Both are applied
    to W on the fly: the same function and the same gradients for W and the scales as scaling the activations,
    but its cost grows with the weight (d_out·d_in) rather than with the tokens (B·T·d), which keeps the per-step
    overhead of the scale variants small. `kind` is the optimizer group of the weight ("matrix" or "embedding").
    """

    def __init__(self, d_in: int, d_out: int, *, std: float, cfg: ScaleConfig, reads_norm: bool,
                 kind: Literal["matrix", "embedding"] = "matrix") -> None:
        super().__init__(d_in, d_out, bias=False)
        nn.init.normal_(self.weight, mean=0.0, std=std)
        self.kind = kind
        self.s_in = make_scale(d_in, INPUT_SCALE, cfg) if cfg.branch and reads_norm else None
        self.s_out = make_scale(d_out, INPUT_SCALE, cfg) if cfg.placement and kind == "matrix" else None

    def effective_weight(self) -> torch.Tensor:
        """diag(s_out) · W · diag(s_in): the weight a plain model holds once these scales are folded."""
        w = self.weight
        if self.s_in is not None:
            w = w * self.s_in()
        if self.s_out is not None:
            w = w * self.s_out()[:, None]
        return w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.effective_weight())
