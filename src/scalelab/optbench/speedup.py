"""Speed-up in data from end-of-run losses only (Wen et al. 2025, arXiv 2509.02046).

A reference (the tuned baseline, or another of `optimizers.references`) is trained to completion at every data
budget of the benchmark, each run with its own full schedule and the LR chosen at that budget; on each held-out seed
its final losses are fitted with the saturating power law L(D) = E + A·D^−α
(scalelab.ledger.powerlaw: three parameters, dof = budgets − 3). An optimizer's speed-up on that seed is
D_base(L_opt) / D_opt: the tokens the fitted baseline needs to reach the optimizer's final loss over the tokens the
optimizer used.

A fit that is not identified (scalelab.ledger.powerlaw: dof ≤ 0, α or the asymptote E at a bound, no trend) gives
no curve to read: the speed-up then falls back to interpolation between the two measured budgets whose losses
bracket the optimizer's, linear in log D (log D = log D_i + (L_i − L)/(L_i − L_(i+1))·(log D_(i+1) − log D_i)),
labelled "interpolated" (kind INTERP) wherever it is shown; it needs the measured losses to fall with the budget.
When one held-out seed's fit is not identified, every seed of that comparison is interpolated (its seeds' values are
then read the same way, never a mix of fitted and interpolated).

Whether a loss is inside the range is decided on the baseline's measured losses on that seed, not on the fit: a loss
below the lowest the baseline reached over its budgets gives a bound "> D_max / D_opt", above the highest
"< D_min / D_opt", never an extrapolated or capped number. A bound is not a measurement of the speed-up (the claims
treat it as a failed premise: the reference curve had no room for that loss). Mid-run validation curves are never
used here (a secondary plot only).
"""

from __future__ import annotations

import math
import statistics

from scalelab.ledger.claims import t_interval
from scalelab.optbench.data import Bench, chosen, finals, ok
from scalelab.ledger.powerlaw import Fit, fit_power_law

INSIDE, ABOVE, BELOW = "=", ">", "<"  # a value; a lower bound (loss below the range); an upper bound (above it)
INTERP = "~"  # a value interpolated between measured budgets (the fit not identified)
READ = (INSIDE, INTERP)  # the kinds that are measurements of the speed-up, not bounds


class Reference:
    """The baseline's end-of-run losses over its data budgets on one seed, and their power-law fit."""

    def __init__(self, points: list[tuple[float, float]]) -> None:
        self.points = sorted(points)
        self.fit: Fit | None = (fit_power_law([t for t, _ in points], [v for _, v in points])
                                if len({t for t, _ in points}) >= 3 else None)

    @property
    def identified(self) -> bool:
        return self.fit is not None and self.fit.identified

    @property
    def falling(self) -> bool:
        """Whether the measured losses fall strictly with the budget (interpolation inverts them uniquely)."""
        return len(self.points) >= 2 and all(b[1] < a[1] and b[0] > a[0] for a, b in zip(self.points,
                                                                                         self.points[1:]))

    @property
    def fallback(self) -> str | None:
        """Why the speed-up is interpolated, not read off the fit (None: the fit is identified)."""
        if self.identified:
            return None
        return f"fit {self.fit.reason}" if self.fit else f"{len(self.points)} budgets, no fit"

    @property
    def why_not(self) -> str | None:
        """Why no speed-up can be read from this reference (None: it can, off the fit or interpolated)."""
        if self.identified or self.falling:
            return None
        if len(self.points) < 2:
            return f"baseline: {len(self.points)} budgets measured, fewer than 2"
        return f"baseline {self.fallback}, and its measured losses do not fall with the budget (no interpolation)"

    def _interpolate(self, loss: float) -> float:
        """D at `loss` between the bracketing measured budgets, linear in log D (module doc)."""
        for (d0, l0), (d1, l1) in zip(self.points, self.points[1:]):
            if l1 <= loss <= l0:
                return math.exp(math.log(d0) + (l0 - loss) / (l0 - l1) * (math.log(d1) - math.log(d0)))
        raise ValueError(f"loss {loss} outside the measured losses")

    def speedup(self, loss: float, tokens: float, interpolate: bool = False) -> tuple[float, str]:
        """(value, kind) of D_base(loss) / tokens (module doc): kind INSIDE (off the fit) or INTERP (interpolated:
        the fit not identified, or `interpolate`) when `loss` lies within the measured losses, ABOVE/BELOW a bound at
        the largest/smallest budget's tokens otherwise."""
        losses = [v for _, v in self.points]
        lo, hi = self.points[0][0], self.points[-1][0]
        if loss < min(losses):
            return hi / tokens, ABOVE
        if loss > max(losses):
            return lo / tokens, BELOW
        if interpolate or not self.identified:
            return self._interpolate(loss) / tokens, INTERP
        d = self.fit.law.inverse(loss)
        return (d / tokens, INSIDE) if math.isfinite(d) else (hi / tokens, ABOVE)

    def loss_at(self, tokens: float) -> float | None:
        """The reference's loss at `tokens`: the fit's, or interpolated linearly in log D between the measured
        budgets when the fit is not identified (None outside them)."""
        if self.identified:
            return float(self.fit.law(tokens))
        for (d0, l0), (d1, l1) in zip(self.points, self.points[1:]):
            if d0 <= tokens <= d1:
                return l0 + (l1 - l0) * (math.log(tokens) - math.log(d0)) / (math.log(d1) - math.log(d0))
        return None

    def loss_worth(self, tokens: float, factor: float) -> float | None:
        """The reference's loss drop from `tokens` to `factor` × `tokens`: what a speed-up of `factor` is worth in
        loss at the benchmark's budget (converts a smallest effect stated in data into nats); None where the
        interpolated curve does not reach both."""
        a, b = self.loss_at(tokens), self.loss_at(factor * tokens)
        return None if a is None or b is None else a - b


def reference(bench: Bench, cells: dict, runs: list[dict], size: str, seed: int, ref: str | None = None) -> Reference:
    """The reference curve of `ref` (default the baseline) at `size` on `seed`: its final loss at each data budget,
    at the configuration it chose for that budget."""
    ref = ref or bench.baseline
    pts = [(r["tokens"], r["val_loss"]) for b in bench.budgets
           for r in [finals(runs, ref, size, chosen(cells[ref, size], b), b).get(seed)] if ok(r)]
    return Reference(pts)


def per_seed(bench: Bench, cells: dict, runs: list[dict], opt: str, size: str, hp: dict | None = None,
             ref: str | None = None) -> dict[int, tuple[float | None, str]]:
    """{held-out seed: (value, kind) or (None, why)} of `opt`'s speed-up in data at `size` against reference `ref`
    (default the baseline), at its chosen hyperparameters (or `hp`: the baseline's default recipe for the tuning
    claim)."""
    hp = hp if hp is not None else cells[opt, size]["best_hp"]
    mine = finals(runs, opt, size, hp)
    curves = {seed: reference(bench, cells, runs, size, seed, ref) for seed in bench.rerun_seeds}
    # one seed's fit not identified: every seed is interpolated, so the seeds' values are read the same way
    every = any(not c.identified for c in curves.values())
    out: dict[int, tuple[float | None, str]] = {}
    for seed, curve in curves.items():
        r = mine.get(seed)
        if not ok(r):
            out[seed] = (None, f"seed {seed} diverged" if r else f"seed {seed}: no run")
        elif curve.why_not or (every and not curve.falling):
            out[seed] = (None, curve.why_not or "the measured losses do not fall with the budget (no interpolation, "
                         "and another seed's fit is not identified)")
        else:
            out[seed] = curve.speedup(r["val_loss"], r["tokens"], interpolate=every)
    return out


def fit_dof(bench: Bench, cells: dict, runs: list[dict], size: str, ref: str | None = None) -> int | None:
    """The residual degrees of freedom of the reference fits of `ref` (default the baseline) at `size` (None: no
    fit)."""
    fits = [reference(bench, cells, runs, size, s, ref).fit for s in bench.rerun_seeds]
    return next((f.dof for f in fits if f is not None), None)


def summarise(seeds: dict[int, tuple[float | None, str]], level: float = 0.95) -> dict:
    """The seeds' speed-ups as one leaderboard cell: mean and t interval when every seed is inside the range; the
    bound the seeds support when some are beyond it on one side only (the mean of values and bounds is then that
    bound); else why not."""
    vals = list(seeds.values())
    if not vals or any(v is None for v, _ in vals):
        why = next((k for v, k in vals if v is None), "no seeds")
        return {"speedup": None, "kind": why, "low": None, "high": None, "n": len(vals)}
    kinds = {k for _, k in vals}
    mean = statistics.fmean(v for v, _ in vals)
    if kinds <= set(READ):  # interpolated on any seed: the whole cell is labelled so
        ci = t_interval([v for v, _ in vals], level)
        return {"speedup": mean, "kind": INTERP if INTERP in kinds else INSIDE, "low": ci and ci[1],
                "high": ci and ci[2], "n": len(vals)}
    side = kinds - set(READ)
    if len(side) == 1:
        return {"speedup": mean, "kind": side.pop(), "low": None, "high": None, "n": len(vals)}
    return {"speedup": None, "kind": "outside the range on both sides", "low": None, "high": None, "n": len(vals)}


def speedup_text(s: dict) -> str:
    if s["speedup"] is None:
        return f"– ({s['kind']})"
    if s["kind"] in (ABOVE, BELOW):
        return f"{s['kind']} {s['speedup']:.2f}x"
    return (f"{s['speedup']:.2f}x" + ("" if s["low"] is None else f" [{s['low']:.2f}, {s['high']:.2f}]")
            + (" (interpolated)" if s["kind"] == INTERP else ""))
