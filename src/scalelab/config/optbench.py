"""params section `optimizers`: the optimizer benchmark of METHODS §B (stages/optimizers.py, stages/leaderboard.py).

The protocol (issue 19; Wen et al. 2025, arXiv 2509.02046; Semenov et al. 2025, arXiv 2509.01440), the same for
every optimizer of `optimizers` (keys of params `optim`) at every size of `sizes`, on the `variant` model:

1. LR grid: `lr_points` (odd) log-spaced values `lr · lr_ratio^(i − (lr_points − 1)/2)` centred on `optim.<name>.lr`
   (the centre is a grid point; ratio ≤ 2), each trained with every seed of `sweep_seeds` (≥ 2); the LR is chosen by
   the mean final loss over those seeds. A best LR at an edge extends the grid by one point on that side, at most
   `max_extra` points per optimizer, until it is interior or the new point diverges on every sweep seed (then the
   optimum is bracketed by divergence); still at an edge after that: "inconclusive (edge)" in the claims.
2. Second hyperparameters: at the chosen LR, each of `second[<name>]` in turn (coordinate descent) at its value
   × hp_ratio^±1 (betas and momenta move 1 − β by that factor), chosen by the same sweep-seed mean. AdamW gets weight
   decay and warmup (Wen et al.: its recipe beyond the LR matters), every other optimizer the one its paper names most
   sensitive. `max_runs`: the stated budget of runs per optimizer and size; the schema checks every optimizer's
   worst case fits it.
3. The chosen configuration is rerun with `rerun_seeds` (held out from every choice); the baseline also at every
   `budgets` fraction of the steps, each with its own full schedule (the speed-up's reference curve), and at its
   default recipe (tuned vs default). Each of `batch_optimizers` and the baseline also run at `batch_factor` × the
   batch for the same tokens (Semenov et al.: Lion/Signum need large batches), at the LR chosen at the small batch.
Everything else of a run comes from `pretrain` (batch, sequence, precision, trainer), with the overrides below;
Schedule-Free optimizers keep only the schedule's warmup (their iterate averaging replaces the decay).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from scalelab.config.base import Name, NonNegInt, ParamsError, PosFloat, PosInt, Strict
from scalelab.config.optim import ScheduleConfig

# The second hyperparameters the protocol can tune: fields of `optim.<name>`, the schedule's warmup, or a library
# argument `kwargs.<key>` (which must be set in optim.<name>.kwargs: its value is the centre).
SECOND_HPS = ("weight_decay", "warmup", "momentum", "beta1", "beta2")
BOUNDED = ("momentum", "beta1", "beta2")  # in (0, 1): moved on 1 − β


class OptBenchConfig(Strict):
    optimizers: list[Name]  # keys of params `optim`: the matrix axis of the sweep
    sizes: Annotated[list[Name], Field(min_length=2)]  # keys of model.sizes (METHODS §B: scale dependence)
    variant: Name = "standard"  # the paper's Pre-Norm model with one γ per norm
    baseline: Name = "adamw"  # speed-up in data and step-time ratio are against this optimizer (Wen et al. 2025)
    schedule: ScheduleConfig = ScheduleConfig()
    lr_points: Annotated[int, Field(ge=3)] = 3  # odd: the centre is a grid point
    lr_ratio: Annotated[float, Field(gt=1, le=2)] = 2.0  # between neighbouring grid points
    max_extra: NonNegInt = 2  # grid points an edge optimum may add, the same for every optimizer
    second: dict[Name, list[str]] = {}  # optimizer key -> its second hyperparameters, tuned in order
    hp_ratio: Annotated[float, Field(gt=1)] = 3.0
    max_runs: PosInt = 40  # the stated budget of sweep runs per optimizer and size (all seeds)
    sweep_seeds: Annotated[list[NonNegInt], Field(min_length=2)] = [0, 1]  # choose LR and second HPs (mean)
    rerun_seeds: Annotated[list[NonNegInt], Field(min_length=2)] = [2, 3]  # held out from every choice
    budgets: Annotated[list[PosFloat], Field(min_length=4)] = [0.25, 0.5, 1.0, 2.0]  # baseline's data budgets
    batch_optimizers: list[Name] = []  # also rerun at batch_factor × the batch (same tokens), with the baseline
    batch_factor: Annotated[int, Field(ge=2)] = 4
    max_steps: PosInt | None = None  # None: pretrain's budget
    val_every: PosInt = 10  # validation points (the secondary mid-run curves plot)
    val_tokens: PosInt | None = None  # None: pretrain.val_tokens
    timing_steps: PosInt = 12  # step pairs (baseline, optimizer) timed interleaved in each sweep cell's process

    @model_validator(mode="after")
    def _check(self) -> "OptBenchConfig":
        if self.baseline not in self.optimizers:
            raise ValueError(f"optimizers.baseline {self.baseline!r} must be one of optimizers.optimizers "
                             f"{self.optimizers}")
        if self.lr_points % 2 == 0:
            raise ValueError(f"optimizers.lr_points {self.lr_points} must be odd (the centre is a grid point)")
        if shared := sorted(set(self.sweep_seeds) & set(self.rerun_seeds)):
            raise ValueError(f"optimizers.rerun_seeds {self.rerun_seeds} share {shared} with sweep_seeds "
                             f"{self.sweep_seeds} (they are held out from the choices)")
        if 1.0 not in self.budgets:
            raise ValueError(f"optimizers.budgets {self.budgets} must contain 1.0 (the benchmark's own budget)")
        for axis in ("optimizers", "sizes", "sweep_seeds", "rerun_seeds", "budgets"):
            values = getattr(self, axis)
            if len(set(values)) != len(values):
                raise ValueError(f"optimizers.{axis} has duplicates: {values}")
        if bad := sorted(set(self.batch_optimizers) - set(self.optimizers)):
            raise ValueError(f"optimizers.batch_optimizers: {bad} not in optimizers.optimizers {self.optimizers}")
        for opt, hps in self.second.items():
            if opt not in self.optimizers:
                raise ValueError(f"optimizers.second: {opt!r} is not in optimizers.optimizers {self.optimizers}")
            for hp in hps:
                if hp not in SECOND_HPS and not hp.startswith("kwargs."):
                    raise ValueError(f"optimizers.second.{opt}: unknown hyperparameter {hp!r}; known: "
                                     f"{list(SECOND_HPS)} or kwargs.<key>")
        if (worst := max(self.planned_runs(o) for o in self.optimizers)) > self.max_runs:
            raise ValueError(f"optimizers.max_runs {self.max_runs}: the protocol may need {worst} sweep runs for "
                             f"one optimizer and size")
        return self

    def planned_runs(self, optimizer: str) -> int:
        """The most sweep runs the protocol takes for `optimizer` at one size (grid, extension, second HPs)."""
        points = self.lr_points + self.max_extra + 2 * len(self.second.get(optimizer, []))
        return points * len(self.sweep_seeds)

    def lr_grid(self, centre: PosFloat) -> list[float]:
        """The log-spaced grid centred (geometrically) on `centre`, which is its middle point."""
        mid = (self.lr_points - 1) // 2
        return [centre * self.lr_ratio ** (i - mid) for i in range(self.lr_points)]

    def check_cell(self, optimizer: str, size: str) -> None:
        """A stage cell's names (they come from the command line), checked before any import of the trainer."""
        if optimizer not in self.optimizers:
            raise ParamsError(f"--optimizer {optimizer!r}: not in optimizers.optimizers {self.optimizers}")
        if size not in self.sizes:
            raise ParamsError(f"--size {size!r}: not in optimizers.sizes {self.sizes}")
