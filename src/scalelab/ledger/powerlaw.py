"""Scaling-law fits L(N) = E + A·N^(−α) that say when they are not identified (the scale-vector study's fits).

The fit: for a fixed α the model is linear in (E, A), so E, A ≥ 0 come from non-negative least squares (scipy's
nnls) at every α of a log grid over `bounds`; the best grid point is then refined by a bounded scalar minimisation
of the residual sum of squares over α (scipy's minimize_scalar). Sizes are in units of the smallest N, which keeps
the design well conditioned.

Identification: three parameters, so `n_sizes − 3` residual degrees of freedom. With dof ≤ 0 the curve passes
through its points whatever the truth, and α is whatever the search reached; an α at a bound of its search interval
means the data would have taken it further; E at its bound 0 (nnls keeps the asymptote non-negative) means the same of
the asymptote: the least-squares curve wanted an E below 0, so E, A and α trade off along a ridge the bound cuts and
none is measured; A = 0 means no trend, so α means nothing. Each of these flags the fit "not identified", and no claim
uses its parameters (a reader that needs the curve falls back to the measured points: scalelab.optbench.speedup).

Uncertainty: a bootstrap over seeds. Cells of one seed share their batches, so a seed is the unit of replication:
resample the seeds with replacement, refit the mean curve, and take the percentile interval of α (None with 1 seed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize_scalar, nnls

DEFAULT_BOUNDS = (0.02, 2.0)


@dataclass(frozen=True)
class PowerLaw:
    E: float
    A: float
    alpha: float

    def __call__(self, n: np.ndarray) -> np.ndarray:
        return self.E + self.A * np.power(np.asarray(n, float), -self.alpha)

    def inverse(self, loss: float) -> float:
        """The N at which the law reaches `loss`: (A / (L − E))^(1/α); inf at or below the asymptote E."""
        return math.inf if loss <= self.E or self.A <= 0 else float((self.A / (loss - self.E)) ** (1 / self.alpha))


@dataclass(frozen=True)
class Fit:
    law: PowerLaw
    n_sizes: int
    dof: int  # n_sizes − 3
    rss: float  # residual sum of squares on the fitted (mean) losses
    rmse: float
    identified: bool
    reason: str  # why not identified ("" when identified)
    alpha_ci: tuple[float, float] | None = None  # bootstrap percentile interval over seeds
    n_seeds: int = 1

    def row(self) -> dict:
        """A flat record (fits table, metrics json)."""
        low, high = self.alpha_ci or (None, None)
        return {"E": self.law.E, "A": self.law.A, "alpha": self.law.alpha, "alpha_low": low, "alpha_high": high,
                "n_sizes": self.n_sizes, "n_seeds": self.n_seeds, "dof": self.dof, "rss": self.rss,
                "rmse": self.rmse, "identified": self.identified, "reason": self.reason}


def _solve(x: np.ndarray, loss: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """(E, A in units of the smallest N, RSS) at fixed α; nnls keeps E, A ≥ 0."""
    design = np.stack([np.ones_like(x), np.power(x, -alpha)], axis=1)
    (e, a), norm = nnls(design, loss)
    return float(e), float(a), float(norm**2)


def fit_power_law(n, loss, bounds: tuple[float, float] = DEFAULT_BOUNDS) -> Fit:
    """Least-squares L = E + A·N^-α with E, A ≥ 0 and α in `bounds`, flagged when not identified (module doc)."""
    n, loss = np.asarray(n, float), np.asarray(loss, float)
    if n.shape != loss.shape or n.ndim != 1:
        raise ValueError(f"sizes {n.shape} and losses {loss.shape} must be two vectors of one length")
    if len(np.unique(n)) < 3:
        raise ValueError(f"a three-parameter fit needs ≥ 3 distinct sizes, got {len(np.unique(n))}")
    lo, hi = bounds
    x = n / n.min()
    grid = np.geomspace(lo, hi, 64)
    rss = [_solve(x, loss, a)[2] for a in grid]
    i = int(np.argmin(rss))
    bracket = (grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)])
    res = minimize_scalar(lambda a: _solve(x, loss, a)[2], bounds=bracket, method="bounded",
                          options={"xatol": 1e-6 * hi})
    alpha = float(res.x) if res.fun <= rss[i] else float(grid[i])
    e, a, r = _solve(x, loss, alpha)
    law = PowerLaw(E=e, A=float(a * n.min() ** alpha), alpha=alpha)
    dof = len(n) - 3
    nearest = lo if alpha - lo < hi - alpha else hi
    if dof <= 0:
        reason = f"dof {dof}: {len(n)} sizes for 3 parameters"
    elif abs(alpha - nearest) <= 1e-3 * (hi - lo):
        reason = f"alpha at its bound {nearest:g}"
    elif e <= 0 and a > 0:  # nnls stopped the asymptote at E ≥ 0: the bound, not the data, set it
        reason = "E at its bound 0"
    elif a <= 0:
        reason = "no trend (A = 0)"
    else:
        reason = ""
    return Fit(law=law, n_sizes=len(n), dof=dof, rss=r, rmse=float(np.sqrt(r / len(n))), identified=not reason,
               reason=reason)


def fit_seeds(n, losses, bounds: tuple[float, float] = DEFAULT_BOUNDS, n_boot: int = 400, level: float = 0.95,
              seed: int = 0) -> Fit:
    """Fit the seed-mean curve of `losses` [seeds × sizes] and attach a bootstrap interval of α over seeds."""
    losses = np.atleast_2d(np.asarray(losses, float))
    fit = fit_power_law(n, losses.mean(axis=0), bounds)
    n_seeds = losses.shape[0]
    if n_seeds < 2:
        return Fit(**{**fit.__dict__, "n_seeds": n_seeds})
    alphas = bootstrap_alphas(n, losses, bounds, n_boot, seed)
    q = (1 - level) / 2
    ci = (float(np.quantile(alphas, q)), float(np.quantile(alphas, 1 - q)))
    return Fit(**{**fit.__dict__, "alpha_ci": ci, "n_seeds": n_seeds})


def bootstrap_alphas(n, losses, bounds: tuple[float, float] = DEFAULT_BOUNDS, n_boot: int = 400,
                     seed: int = 0) -> np.ndarray:
    """α of the mean curve for each of `n_boot` resamples of the seeds (rows of `losses`)."""
    losses = np.atleast_2d(np.asarray(losses, float))
    rows = np.random.default_rng(seed).integers(0, losses.shape[0], size=(n_boot, losses.shape[0]))
    memo: dict[tuple[int, ...], float] = {}  # few seeds give few distinct resamples (3 seeds: 10)
    out = []
    for r in rows:
        key = tuple(sorted(int(i) for i in r))
        if key not in memo:
            memo[key] = fit_power_law(n, losses[list(key)].mean(axis=0), bounds).law.alpha
        out.append(memo[key])
    return np.array(out)
