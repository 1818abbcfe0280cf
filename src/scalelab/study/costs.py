"""What a cell will cost, and when the cells left will be done.

A cell's cost is measured wherever the study has measured one like it, from the wall times its committed cells
recorded (the cells of this run included, as they finish), in this order:
1. the same cell, committed before (stale, or under other params);
2. the cells of its stage that differ from it only in the seed (its other seeds);
then, for a pretrain cell (its size and recipe named, its tokens in its params), 3. its tokens at the training rate
measured for its size and recipe (`Rates`: benchmarks/rates.json, written by benchmarks/pretrain_step.py --rates);
4. the cells of its stage: their median;
then 5. the spec's `estimate_s` for the stage; else it is unknown.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from scalelab.study.grid import Cell

RATES = Path("benchmarks/rates.json")
TRAINING_STAGES = ("pretrain", "pretrain_recipe")  # cells whose work is pretrain.* tokens of one model size


@dataclass(frozen=True)
class Rates:
    """Tokens/s of a pretrain cell's training loop by size and recipe, as a study runs its cells (Lightning, one
    thread, a second cell training beside it), and a fit's fixed cost in seconds (its wall less its training loop;
    the stage process's own start, ~2.5 s, is benchmarks/cell_overhead.py's and not counted)."""

    tokens_per_s: dict[str, dict[str, float]]  # size -> recipe -> tokens/s
    setup_s: float
    source: str  # where and when they were measured

    @classmethod
    def load(cls, root: Path) -> Rates | None:
        path = Path(root) / RATES
        if not path.is_file():
            return None
        raw = json.loads(path.read_text())
        return cls(raw["tokens_per_s"], raw["setup_s"], f"{RATES} of {raw['measured']}")

    def seconds(self, cell: Cell) -> float | None:
        """The cell's training tokens and its validation forwards (a third of a training token's compute each) at
        its size's rate for its recipe (base's when its recipe was not measured), plus the fixed cost; None when the
        cell names no measured size or its params give no token budget."""
        size, recipe = cell.item.get("size"), cell.item.get("recipe", "base")
        rates = self.tokens_per_s.get(size) if cell.stage in TRAINING_STAGES else None
        pre = {k.removeprefix("pretrain."): v for file in cell.params.values() for k, v in file.items()
               if k.startswith("pretrain.")}
        if not rates or not {"seq_len", "batch_size", "val_every", "val_tokens"} <= pre.keys():
            return None
        step_tokens = pre["batch_size"] * pre["seq_len"]
        budget = pre.get("max_tokens") or 0
        if isinstance(budget, dict):  # a budget per size (config/pretrain.py)
            budget = budget.get(size) or 0
        steps = pre.get("max_steps") or budget // step_tokens
        if not steps:
            return None
        val_tokens = (steps // pre["val_every"] + (steps % pre["val_every"] > 0)) * pre["val_tokens"]
        return (steps * step_tokens + val_tokens / 3) / rates.get(recipe, rates["base"]) + self.setup_s


@dataclass(frozen=True)
class Cost:
    seconds: float | None
    source: str

    def __str__(self) -> str:
        return "unknown" if self.seconds is None else f"~{duration(self.seconds)} ({self.source})"


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Estimator:
    """Costs from measured cells: `measured` is (address, stage, item, wall_s) of each, added to as cells finish."""

    def __init__(self, estimate_s: dict[str, float] | None = None, rates: Rates | None = None):
        self.estimate_s = dict(estimate_s or {})
        self.rates = rates
        self.measured: dict[str, tuple[str, dict, float]] = {}

    @classmethod
    def of(cls, estimate_s: dict[str, float], records, rates: Rates | None = None) -> Estimator:
        """From the wall times of committed cells (scalelab.study.cells.Record) and the measured training rates."""
        est = cls(estimate_s, rates)
        for r in records:
            est.add(r.address, r.meta.get("stage", ""), r.meta.get("item") or {}, r.wall_s)
        return est

    def add(self, address: str, stage: str, item: dict, wall_s: float | None) -> None:
        if wall_s is not None and wall_s > 0:
            self.measured[address] = (stage, item, float(wall_s))

    def cost(self, cell: Cell) -> Cost:
        if cell.address in self.measured:
            return Cost(self.measured[cell.address][2], "measured: this cell before")
        unseeded = {k: v for k, v in cell.item.items() if k != "seed"}
        same_stage = [(item, w) for stage, item, w in self.measured.values() if stage == cell.stage]
        alike = [w for item, w in same_stage if {k: v for k, v in item.items() if k != "seed"} == unseeded]
        if alike and "seed" in cell.item:
            return Cost(statistics.fmean(alike), f"measured: {len(alike)} other seed{'s' * (len(alike) > 1)}")
        if self.rates is not None and (seconds := self.rates.seconds(cell)) is not None:
            return Cost(seconds, f"estimated: its tokens at the rate of {self.rates.source}")
        if same_stage:
            n = len(same_stage)
            what = f"median of {n} {cell.stage} cells" if n > 1 else f"1 {cell.stage} cell"
            return Cost(statistics.median(w for _, w in same_stage), f"measured: {what}")
        if cell.stage in self.estimate_s:
            return Cost(self.estimate_s[cell.stage], "estimated: the spec's estimate_s")
        return Cost(None, "unknown")


def total(costs: list[Cost]) -> tuple[float, int]:
    """The summed known costs and how many are unknown."""
    return sum(c.seconds for c in costs if c.seconds is not None), sum(c.seconds is None for c in costs)


def eta(left: list[Cost], running: list[tuple[Cost, float]], workers: int) -> float | None:
    """Seconds until the cells left are done, `workers` at a time: the known work left (each running cell's cost
    less its elapsed time, at least nothing) spread over the workers, but never less than the longest single cell
    left; None when nothing left is known."""
    work = [c.seconds for c in left if c.seconds is not None]
    work += [max(0.0, c.seconds - elapsed) for c, elapsed in running if c.seconds is not None]
    if not work:
        return None
    return max(sum(work) / max(1, workers), max(work))


def within(costs: list[tuple[str, Cost]], budget_s: float, workers: int) -> list[str]:
    """The cells (in order) that a run of `budget_s` seconds, `workers` at a time, would start: each starts on the
    first free worker and only if its cost (when known) ends within the budget, as the flow's gate decides."""
    free = [0.0] * max(1, workers)
    chosen = []
    for address, cost in costs:
        i = min(range(len(free)), key=free.__getitem__)
        start = free[i]
        if start >= budget_s or (cost.seconds is not None and start + cost.seconds > budget_s):
            continue
        free[i] = start + (cost.seconds or 0.0)
        chosen.append(address)
    return chosen
