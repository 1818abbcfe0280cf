"""params sections `pretrain` (recipes, grid, trainer settings) and `scaling` (docs/scale-vectors.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from scalelab.config.base import Name, NonNegFloat, NonNegInt, PosFloat, PosInt, Strict
from scalelab.config.optim import ScheduleConfig

class RecipeConfig(Strict):
    optimizer: str = "adamw"  # key of params `optim`
    schedule: ScheduleConfig = ScheduleConfig()
    moe: bool = False
    # Peri-LN axis (an Output-Norm γ): a post-branch norm whose γ weighs each branch in the residual stream.
    # None keeps `model.post_norm` (the study's Pre-Norm default: false).
    post_norm: bool | None = None


class SharpnessConfig(Strict):
    """Top Hessian eigenvalue of the cross-entropy (the sharpness the decay claims speak of), in the folded plain-weight
    parameterization, on one fixed batch of training windows."""

    enabled: bool = True
    tokens: Annotated[int, Field(ge=4096)] = 4096  # the fixed batch: tokens // seq_len windows (≥ 4k)
    tol: PosFloat = 1e-2  # stop at residual ‖Hv − λv‖ ≤ tol·|λ|: an eigenvalue lies within tol·|λ| of λ
    max_iters: PosInt = 50  # power iterations per pass (a second pass runs past a negative dominant eigenvalue)
    every: PosInt | None = None  # steps between measurements; None: at the last step only


class GridConfig(Strict):
    """The matrix axes that dvc.yaml expands; short names whose details live elsewhere in params."""

    variants: list[Name]
    sizes: list[Name]
    seeds: list[NonNegInt]
    recipes: list[Name] = []  # extra recipes (Muon, WSD, MoE, Peri-LN) over the axes below
    recipe_variants: list[Name] = []
    recipe_sizes: list[Name] = []


class PretrainConfig(Strict):
    seq_len: PosInt = 128
    batch_size: PosInt = 16  # global batch in sequences (per step, across devices and accumulation)
    max_steps: PosInt | None = 200
    # alternative budget; steps = tokens // (batch_size·seq_len). A mapping gives each model size its own (a budget in
    # tokens per parameter differs by size): `for_size` resolves it for one cell
    max_tokens: PosInt | dict[Name, PosInt] | None = None
    val_every: PosInt = 100
    val_tokens: PosInt = 32768
    ckpt_every: PosInt = 100
    # Stale checkpoints (ckpt/stale-*: other params, or a completed run moved aside by a rerun) to keep, newest first.
    # Interrupted ones are resumable under their own params and never deleted. Not part of the training config hash.
    keep_stale: NonNegInt = 2
    # The tracker (MLflow) gets the training metrics every log_every steps, and every validation, γ and sharpness
    # step (curve.csv keeps every step); not part of the training config hash.
    log_every: PosInt = 10
    # No fp16: the manual-optimization loop clips and checks unscaled gradients, so it has no GradScaler.
    precision: Literal["32-true", "bf16-mixed", "bf16-true"] = "32-true"
    grad_clip: NonNegFloat = 1.0
    accumulate: PosInt = 1
    # Machine settings, from accelerator to peak_flops (config/machine.py): machine.yaml or the profile's machine:
    # section, never params.yaml's sections, so no stage depends on them.
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
    recipes: dict[Name, RecipeConfig]
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
        if self.val_tokens < self.seq_len:
            raise ValueError(f"val_tokens ({self.val_tokens}) is less than one validation window of seq_len "
                             f"({self.seq_len})")
        for r in self.grid.recipes:
            if r not in self.recipes:
                raise ValueError(f"pretrain.grid.recipes: unknown recipe {r!r}; known: {sorted(self.recipes)}")
        if self.grid.recipes and not (self.grid.recipe_variants and self.grid.recipe_sizes):
            raise ValueError("pretrain.grid.recipes needs recipe_variants and recipe_sizes")
        if self.sharpness.tokens < self.seq_len:
            raise ValueError(f"pretrain.sharpness.tokens ({self.sharpness.tokens}) is less than one window "
                             f"(seq_len {self.seq_len})")
        return self

    def for_size(self, size: str) -> "PretrainConfig":
        """This section as one cell of `size` trains it: a per-size `max_tokens` resolved to that size's budget."""
        if not isinstance(self.max_tokens, dict):
            return self
        if size not in self.max_tokens:
            raise ValueError(f"pretrain.max_tokens: no budget for size {size!r} (sizes: {sorted(self.max_tokens)})")
        return self.model_copy(update={"max_tokens": self.max_tokens[size]})

    def total_steps(self) -> int:
        if self.max_steps is not None:
            return self.max_steps
        if isinstance(self.max_tokens, dict):
            raise ValueError("pretrain.max_tokens is per size: take the steps of for_size(size)")
        return max(1, self.max_tokens // (self.batch_size * self.seq_len))


class ScalingConfig(Strict):
    """The scaling fits and the claims ledger of the scale-vector study (scalelab.ledger.powerlaw, claims_a)."""

    min_sizes: Annotated[int, Field(ge=3)] = 3  # below this no fit at all; a fit is identified only with dof > 0
    alpha_bounds: tuple[PosFloat, PosFloat] = (0.02, 2.0)  # α at either bound: "not identified"
    bootstrap: PosInt = 400  # resamples of the seeds for the fits' α intervals (fits.csv)
    level: Annotated[float, Field(gt=0, lt=1)] = 0.95  # of every interval (claims and fits)
    # γ moved (a decay claim's premise): the decayed γ's mean shrank by more than this from its init 1; a study's spec
    # fixes it before its cells run (scalelab.scale_vectors.premises.GAMMA_MOVES, the same 5%, for the older studies)
    gamma_moves: PosFloat = 0.05

    @model_validator(mode="after")
    def _check(self) -> "ScalingConfig":
        if not self.alpha_bounds[0] < self.alpha_bounds[1]:
            raise ValueError(f"scaling.alpha_bounds {self.alpha_bounds}: need low < high")
        return self
