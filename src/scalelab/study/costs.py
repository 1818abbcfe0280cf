"""What a cell will cost, and when the cells left will be done.

A cell's cost is measured wherever the study has measured one like it, from the wall times its committed cells
recorded (the cells of this run included, as they finish), in this order:
1. the same cell, committed before (stale, or under other params);
2. the cells of its stage that differ from it only in the seed (its other seeds);
3. the cells of its stage: their median;
then 4. the spec's `estimate_s` for the stage; else it is unknown.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from scalelab.study.grid import Cell


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

    def __init__(self, estimate_s: dict[str, float] | None = None):
        self.estimate_s = dict(estimate_s or {})
        self.measured: dict[str, tuple[str, dict, float]] = {}

    @classmethod
    def of(cls, estimate_s: dict[str, float], records) -> Estimator:
        """From the wall times of committed cells (scalelab.study.cells.Record)."""
        est = cls(estimate_s)
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
