"""params section `optimizers`: the optimizer benchmark (stages/optimizers.py, stages/leaderboard.py).

The protocol (Wen et al. 2025, arXiv 2509.02046; Semenov et al. 2025, arXiv 2509.01440), the same for
every optimizer of `optimizers` (keys of params `optim`) at every size of `sizes`, on the `variant` model:

1. LR grid: `lr_points` (odd) log-spaced values `lr · lr_ratio^(i − (lr_points − 1)/2)` centred on `optim.<name>.lr`
   (the centre is a grid point; ratio ≤ 2), each trained with every seed of `sweep_seeds` (≥ 2); the LR is chosen by
   the mean final loss over those seeds. A best LR at an edge extends the grid by one point on that side, at most
   `max_extra` points per optimizer, until it is interior or the new point diverges on every sweep seed (then the
   optimum is bracketed by divergence); still at an edge after that, the claims using it are untested.
2. Second hyperparameters: at the chosen LR, each of `second[<name>]` in turn (coordinate descent) at its value
   × hp_ratio^±1 (betas and momenta move 1 − β by that factor), chosen by the same sweep-seed mean, and extended past
   an edge by the LR's rule, at most `max_extra_second` points each. AdamW gets weight decay and warmup (Wen et al.:
   its recipe beyond the LR matters), every other optimizer the one its paper names most sensitive. `max_runs`: the
   stated budget of runs per optimizer and size; the schema checks every optimizer's worst case fits it.
   With `lr_last`, every arm's LR is searched again at its chosen second hyperparameters (`retune_points` LRs
   centred on the first choice, extended by the LR's rule): the budget-1 point of a reference's curve is then tuned
   as fully as the points at the other budgets, and every arm is tuned the same way. Every arm should tune the same
   shared hyperparameters (SHARED_HPS: weight decay and warmup, besides the LR); the claims ledger makes a comparison
   of arms that did not untested (its equal-tuning premise).
3. The chosen configuration is rerun with `rerun_seeds` (held out from every choice). The references (the baseline
   and each of `references`) are also trained at every `budgets` fraction of the steps, each with its own full
   schedule and its LR retuned there on the sweep seeds (`retune_points` LRs centred on the one chosen at budget 1,
   extended by the same rule): each reference's curve of the speed-up in data. The baseline also at its default
   recipe (tuned vs default). Each of `batch_optimizers` and the baseline also run at `batch_factor` × the batch for
   the same tokens (Semenov et al.: Lion/Signum need large batches), at the LR chosen at the small batch.

The embedding-LR control. Under a matrix family the embeddings and LM head (most of a small model's parameters)
train on its AdamW side group, whose LR moves with the family's own; AdamW has one LR for everything. Two arms take
that confound apart: a reference that is AdamW with `embedding_lr_mult` among its second hyperparameters (the
embeddings' LR tuned as a multiple of its LR), and the `pinned` arms, matrix families whose side group trains at the
baseline's LR tuned at that size (their sweep reads the baseline's: they run after it).
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
SECOND_HPS = ("weight_decay", "warmup", "momentum", "beta1", "beta2", "embedding_lr_mult")
BOUNDED = ("momentum", "beta1", "beta2")  # in (0, 1): moved on 1 − β
# The hyperparameters every family has besides the LR (the decay of its weights, the schedule's warmup): every arm
# of a comparison tunes the same of them (the claims' equal-tuning premise), so neither is tuned more than the other
SHARED_HPS = ("weight_decay", "warmup")


class PinnedCell(Strict):
    """One stage cell of a pinned arm, as dvc.yaml's `foreach` reads it: the arm, the size and its reference."""

    optimizer: Name
    size: Name
    ref: Name  # the reference arm whose sweep it reads (and depends on, and is keyed by): pin_to's, or the baseline


class OptBenchConfig(Strict):
    optimizers: list[Name]  # keys of params `optim`: the matrix axis of the sweep
    # matrix-family keys of `optim` whose AdamW side group trains at the baseline's tuned LR (run after its sweep)
    pinned: list[Name] = []
    # pinned arm -> the AdamW arm (the baseline or one of `references`) whose tuned LR, decay, betas and embedding LR
    # multiplier its side group takes; a pinned arm not named here is pinned to the baseline
    pin_to: dict[Name, Name] = {}
    # The pinned arms' stage cells, `{arm}-{size}` -> {optimizer, size, ref}: dvc.yaml iterates over it (`foreach`), so
    # each cell depends on its own reference's sweep and its key holds that reference's params, which a matrix of
    # pinned x sizes cannot say (DVC interpolates no lookup). Written out in the profile, checked equal to pinned x
    # sizes with pin_to (`expected_pinned_cells`), as compress.source_dep is checked against its source. None: params
    # written before it (a committed study's record, read again); DVC itself refuses such a profile with pinned arms.
    pinned_cells: dict[str, PinnedCell] | None = None
    references: list[Name] = []  # more arms treated as the baseline (budgets, retuned LRs); claims built against each
    sizes: Annotated[list[Name], Field(min_length=1)]  # keys of model.sizes (≥ 2 for the claims' scale dependence)
    variant: Name = "standard"  # the paper's Pre-Norm model with one γ per norm
    baseline: Name = "adamw"  # speed-up in data and step-time ratio are against this optimizer (Wen et al. 2025)
    schedule: ScheduleConfig = ScheduleConfig()
    lr_points: Annotated[int, Field(ge=3)] = 3  # odd: the centre is a grid point
    lr_ratio: Annotated[float, Field(gt=1, le=2)] = 2.0  # between neighbouring grid points
    max_extra: NonNegInt = 2  # grid points an edge optimum may add, the same for every optimizer
    max_extra_second: NonNegInt = 0  # points an edge choice of each second hyperparameter may add (the LR's rule)
    retune_points: Annotated[int, Field(ge=3)] = 3  # odd: a reference's LR grid at each other data budget
    second: dict[Name, list[str]] = {}  # optimizer key -> its second hyperparameters, tuned in order
    hp_ratio: Annotated[float, Field(gt=1)] = 3.0
    lr_last: bool = False  # every arm's LR searched again at its chosen second hyperparameters (step 2, last)
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
        for key, n in (("lr_points", self.lr_points), ("retune_points", self.retune_points)):
            if n % 2 == 0:
                raise ValueError(f"optimizers.{key} {n} must be odd (the centre is a grid point)")
        if shared := sorted(set(self.sweep_seeds) & set(self.rerun_seeds)):
            raise ValueError(f"optimizers.rerun_seeds {self.rerun_seeds} share {shared} with sweep_seeds "
                             f"{self.sweep_seeds} (they are held out from the choices)")
        if 1.0 not in self.budgets:
            raise ValueError(f"optimizers.budgets {self.budgets} must contain 1.0 (the benchmark's own budget)")
        for axis in ("optimizers", "pinned", "references", "sizes", "sweep_seeds", "rerun_seeds", "budgets"):
            values = getattr(self, axis)
            if len(set(values)) != len(values):
                raise ValueError(f"optimizers.{axis} has duplicates: {values}")
        if both := sorted(set(self.pinned) & set(self.optimizers)):
            raise ValueError(f"optimizers.pinned: {both} also in optimizers.optimizers (a pinned arm runs after the "
                             "baseline's sweep, in a stage of its own)")
        if bad := sorted(set(self.references) - set(self.optimizers) | {self.baseline} & set(self.references)):
            raise ValueError(f"optimizers.references: {bad} must be keys of optimizers.optimizers other than the "
                             f"baseline {self.baseline!r}")
        if bad := sorted(set(self.batch_optimizers) - set(self.arms)):
            raise ValueError(f"optimizers.batch_optimizers: {bad} not in optimizers.optimizers {self.arms}")
        if bad := sorted(set(self.pin_to) - set(self.pinned)):
            raise ValueError(f"optimizers.pin_to: {bad} not in optimizers.pinned {self.pinned}")
        if bad := sorted(set(self.pin_to.values()) - set(self.reference_arms)):
            raise ValueError(f"optimizers.pin_to: {bad} not a reference arm {self.reference_arms} (a pinned arm "
                             "takes a reference's tuned side-group hyperparameters)")
        have = None if self.pinned_cells is None else {k: c.model_dump() for k, c in self.pinned_cells.items()}
        if have is not None and have != (want := self.expected_pinned_cells()):
            raise ValueError(f"optimizers.pinned_cells {have} must be {want} (one per pinned arm and size, each with "
                             "the reference pin_to gives it)")
        for opt, hps in self.second.items():
            if opt not in self.arms:
                raise ValueError(f"optimizers.second: {opt!r} is not in optimizers.optimizers {self.arms}")
            for hp in hps:
                if hp not in SECOND_HPS and not hp.startswith("kwargs."):
                    raise ValueError(f"optimizers.second.{opt}: unknown hyperparameter {hp!r}; known: "
                                     f"{list(SECOND_HPS)} or kwargs.<key>")
        if (worst := max(self.planned_runs(o) for o in self.arms)) > self.max_runs:
            raise ValueError(f"optimizers.max_runs {self.max_runs}: the protocol may need {worst} sweep runs for "
                             f"one optimizer and size")
        return self

    @property
    def arms(self) -> list[str]:
        """Every optimizer key the benchmark trains: `optimizers`, then the `pinned` arms."""
        return [*self.optimizers, *self.pinned]

    @property
    def reference_arms(self) -> list[str]:
        """The arms with a reference curve over the data budgets: the baseline, then each of `references`."""
        return [self.baseline, *self.references]

    def planned_runs(self, optimizer: str) -> int:
        """The most sweep runs the protocol takes for `optimizer` at one size (grid, extension, second HPs with
        theirs)."""
        points = self.lr_points + self.max_extra + len(self.second.get(optimizer, [])) * (2 + self.max_extra_second)
        if self.lr_last:  # the last LR pass: its centre is measured already
            points += self.retune_points - 1 + self.max_extra
        return points * len(self.sweep_seeds)

    def pinned_to(self, optimizer: str) -> str | None:
        """The reference arm whose tuned side-group hyperparameters pinned arm `optimizer` takes (None: not
        pinned)."""
        return self.pin_to.get(optimizer, self.baseline) if optimizer in self.pinned else None

    def expected_pinned_cells(self) -> dict[str, dict[str, str]]:
        """What `pinned_cells` must hold: every pinned arm at every size, with the reference it is pinned to."""
        return {f"{o}-{s}": {"optimizer": o, "size": s, "ref": self.pinned_to(o)}
                for o in self.pinned for s in self.sizes}

    def lr_grid(self, centre: PosFloat, points: int | None = None) -> list[float]:
        """The log-spaced grid of `points` (default lr_points) centred (geometrically) on `centre`, its middle
        point."""
        n = points or self.lr_points
        mid = (n - 1) // 2
        return [centre * self.lr_ratio ** (i - mid) for i in range(n)]

    def check_cell(self, optimizer: str, size: str) -> None:
        """A stage cell's names (they come from the command line), checked before any import of the trainer."""
        if optimizer not in self.arms:
            raise ParamsError(f"--optimizer {optimizer!r}: not in optimizers.optimizers {self.optimizers} or "
                              f"optimizers.pinned {self.pinned}")
        if size not in self.sizes:
            raise ParamsError(f"--size {size!r}: not in optimizers.sizes {self.sizes}")
