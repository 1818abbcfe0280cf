"""params section `optimizers`: the optimizer benchmark of METHODS §B (stages/optimizers.py, stages/leaderboard.py).

Each optimizer of `optimizers` (keys of params `optim`) is trained on the `variant` model at every size of `sizes`
over a log-spaced LR grid of `lr_points` values centred on its `optim.<name>.lr` (the documented default the entry
names): `lr · lr_ratio^(i − (lr_points − 1)/2)`, i = 0..lr_points−1, the same number of points for every optimizer
(METHODS §B fairness). The best LR of each optimizer and size (sweep seed `seed`) is rerun with `rerun_seeds`.
Everything else of the training run comes from `pretrain` (batch, sequence, precision, trainer), with the overrides
below; the schedule is `schedule` for every optimizer, except that Schedule-Free ones keep only its warmup (their
iterate averaging replaces the decay).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from scalelab.config.base import Name, NonNegInt, ParamsError, PosFloat, PosInt, Strict
from scalelab.config.optim import ScheduleConfig


class OptBenchConfig(Strict):
    optimizers: list[Name]  # keys of params `optim`: the matrix axis of the sweep
    sizes: Annotated[list[Name], Field(min_length=2)]  # keys of model.sizes (METHODS §B: scale dependence)
    variant: Name = "standard"  # the paper's Pre-Norm model with one γ per norm
    baseline: Name = "adamw"  # speed-up in data and step-time ratio are against this optimizer (Wen et al. 2025)
    schedule: ScheduleConfig = ScheduleConfig()
    lr_points: Annotated[int, Field(ge=4)] = 4  # the same for every optimizer (METHODS §B: at least 4)
    lr_ratio: Annotated[float, Field(gt=1)] = 3.0  # between neighbouring grid points
    seed: NonNegInt = 0  # the sweep's seed (it chooses the best LR)
    rerun_seeds: Annotated[list[NonNegInt], Field(min_length=2)] = [1, 2]  # held out from the LR choice
    max_steps: PosInt | None = None  # None: pretrain's budget
    val_every: PosInt = 10  # dense validation: the tokens at which a run reaches the baseline's loss
    val_tokens: PosInt | None = None  # None: pretrain.val_tokens
    timing_steps: PosInt = 12  # step pairs (baseline, optimizer) timed interleaved in each sweep cell's process

    @model_validator(mode="after")
    def _check(self) -> "OptBenchConfig":
        if self.baseline not in self.optimizers:
            raise ValueError(f"optimizers.baseline {self.baseline!r} must be one of optimizers.optimizers "
                             f"{self.optimizers}")
        if self.seed in self.rerun_seeds:
            raise ValueError(f"optimizers.rerun_seeds {self.rerun_seeds} must not contain the sweep seed {self.seed}"
                             " (they are held out from the LR choice)")
        for axis in ("optimizers", "sizes", "rerun_seeds"):
            values = getattr(self, axis)
            if len(set(values)) != len(values):
                raise ValueError(f"optimizers.{axis} has duplicates: {values}")
        return self

    def lr_grid(self, centre: PosFloat) -> list[float]:
        """The log-spaced grid centred (geometrically) on `centre`."""
        mid = (self.lr_points - 1) / 2
        return [centre * self.lr_ratio ** (i - mid) for i in range(self.lr_points)]

    def check_cell(self, optimizer: str, size: str) -> None:
        """A stage cell's names (they come from the command line), checked before any import of the trainer."""
        if optimizer not in self.optimizers:
            raise ParamsError(f"--optimizer {optimizer!r}: not in optimizers.optimizers {self.optimizers}")
        if size not in self.sizes:
            raise ParamsError(f"--size {size!r}: not in optimizers.sizes {self.sizes}")
