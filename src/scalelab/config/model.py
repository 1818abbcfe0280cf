"""params section `model`: the architecture, its sizes and scale-vector variants (docs/scale-vectors.md)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from scalelab.config.base import Name, NonNegFloat, PosFloat, PosInt, Strict


def check_heads(d_model: int, n_head: int, n_kv_head: int | None) -> None:
    """Attention shapes: heads split d_model evenly, query heads group evenly over KV heads, RoPE rotates pairs."""
    if d_model % n_head:
        raise ValueError(f"d_model ({d_model}) must be divisible by n_head ({n_head})")
    if n_head % (n_kv_head or n_head):
        raise ValueError(f"n_head ({n_head}) must be divisible by n_kv_head ({n_kv_head})")
    if (d_model // n_head) % 2:
        raise ValueError(f"head_dim = d_model / n_head ({d_model // n_head}) must be even for RoPE")


class ScaleConfig(Strict):
    """Scale-vector variant. Flags compose; `scales: false` is the `none` variant."""

    scales: bool = True
    branch: bool = False  # one γ per consuming branch of a shared x̂
    placement: bool = False  # s_out on every projection's outputs: diag(s_out)·W·diag(γ)
    magdir: bool = False  # γ = g·sqrt(d)·v/‖v‖
    wd_input_scales: bool = False  # decay on foldable scales (input-norm γ and s_out)
    wd_output_scales: bool = False  # decay on capacity scales (QK-norm and post-branch norm γ)

    @model_validator(mode="after")
    def _check(self) -> "ScaleConfig":
        if not self.scales and (self.branch or self.placement or self.magdir):
            raise ValueError("branch/placement/magdir need scales: true")
        return self


class SizeConfig(Strict):
    n_layer: PosInt
    d_model: PosInt
    n_head: PosInt
    n_kv_head: PosInt | None = None  # None: as many as n_head (no GQA)
    d_ff: PosInt

    @model_validator(mode="after")
    def _check(self) -> "SizeConfig":
        check_heads(self.d_model, self.n_head, self.n_kv_head)  # at load time, under the size's key path
        return self


class MoEConfig(Strict):
    n_experts: Annotated[int, Field(ge=2)] = 4
    top_k: PosInt = 2
    d_expert: PosInt | None = None  # None: d_ff // top_k (active size close to the dense MLP)
    shared_expert: bool = False
    aux_loss_coef: NonNegFloat = 0.01

    @model_validator(mode="after")
    def _check(self) -> "MoEConfig":
        if self.top_k > self.n_experts:
            raise ValueError(f"moe.top_k ({self.top_k}) exceeds moe.n_experts ({self.n_experts})")
        return self


class ModelConfig(Strict):
    """A resolved model: architecture + size + scale variant (+ optional MoE)."""

    vocab_size: PosInt
    n_layer: PosInt
    d_model: PosInt
    n_head: PosInt
    n_kv_head: PosInt | None = None
    d_ff: PosInt
    max_seq_len: PosInt = 1024
    rope_theta: PosFloat = 10000.0
    norm_eps: PosFloat = 1e-6
    qk_norm: bool = True
    post_norm: bool = False  # Peri-LN output norm on each branch before the residual add
    tie_embeddings: bool = False
    init_std: PosFloat = 0.02
    scale: ScaleConfig = ScaleConfig()
    moe: MoEConfig | None = None

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        check_heads(self.d_model, self.n_head, self.n_kv_head)
        return self


class ArchConfig(Strict):
    """Architecture shared by every size and variant of a study (params.yaml `model`)."""

    qk_norm: bool = True
    post_norm: bool = False
    tie_embeddings: bool = False
    rope_theta: PosFloat = 10000.0
    norm_eps: PosFloat = 1e-6
    init_std: PosFloat = 0.02
    sizes: dict[Name, SizeConfig]
    variants: dict[Name, ScaleConfig]
    moe: MoEConfig = MoEConfig()
