"""The claims ledger (DESIGN "Claims ledger"): each paper claim, its measured effect, spread over seeds, verdict.

Every method's summary stage builds its entries with `claim()` and writes `metrics/claims_<a|b|c|d>.json` with
`write_claims()`; the report only gathers those files. No verdict is ever typed in: it follows from the effects by
the rule below, stated in each entry.

Rule (paired by seed): `diffs` are per-seed differences oriented so that a positive value is the claim's direction
(e.g. loss(standard) − loss(unified) for "unified is better"). With n ≥ 2 seeds, a two-sided Student-t interval at
`level` on the mean difference: above 0 → reproduced, below 0 → contradicted, straddling 0 → inconclusive. One seed
gives no spread, so it is "inconclusive (1 seed)" whatever its sign. Zero spread (every seed's difference identical)
is "inconclusive (no seed variance)" for any n: the t interval needs a positive variance estimate (with sd 0 it
collapses to a point and t = mean/0), and identical differences say the seeds did not vary what they replicate
(same batches and init), not that the effect is exact, so the seeds are not independent evidence.

A statistic with no per-seed value (e.g. a fitted scaling exponent) brings its own interval, such as a bootstrap over
seeds paired between the compared cells (`interval_claim`); the same decision applies to that interval, and an
entry whose statistic is unusable (a fit that is not identified) is "inconclusive (<why>)".
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path

REPRODUCED, CONTRADICTED, INCONCLUSIVE = "reproduced", "contradicted", "inconclusive"
NO_VARIANCE = "no seed variance"
FIELDS = ("id", "claim", "metric", "effect", "spread", "n_seeds", "verdict", "rule", "published")


def t_interval(diffs: Sequence[float], level: float = 0.95) -> tuple[float, float, float] | None:
    """(mean, low, high) of the two-sided Student-t interval of the mean; None with fewer than 2 values."""
    n = len(diffs)
    if n < 2:
        return None
    from scipy.stats import t

    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    half = t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def no_seed_variance(diffs: Sequence[float]) -> bool:
    """Two or more seeds whose values are all identical: a degenerate t interval (zero spread, the module's rule)."""
    return len(diffs) >= 2 and len(set(diffs)) == 1


def verdict(diffs: Sequence[float], level: float = 0.95) -> str:
    """reproduced / contradicted / inconclusive by the module's rule (positive diffs = the claim's direction)."""
    diffs = [float(d) for d in diffs if d is not None and math.isfinite(d)]
    if not diffs:
        return f"{INCONCLUSIVE} (no data)"
    interval = t_interval(diffs, level)
    if interval is None:
        return f"{INCONCLUSIVE} (1 seed)"
    if no_seed_variance(diffs):
        return f"{INCONCLUSIVE} ({NO_VARIANCE})"
    return decide(*interval[1:])


def decide(low: float, high: float) -> str:
    """The decision on an interval of the effect (claim direction positive)."""
    return REPRODUCED if low > 0 else CONTRADICTED if high < 0 else INCONCLUSIVE


def rule_text(level: float = 0.95) -> str:
    return (f"paired by seed; {level:.0%} t interval of the mean difference (claim direction positive): "
            "above 0 reproduced, below 0 contradicted, else inconclusive; 1 seed inconclusive; identical differences "
            "over seeds (zero spread: a degenerate t interval) inconclusive")


def claim(id: str, text: str, metric: str, diffs: Sequence[float], published: str, level: float = 0.95,
          unusable: str | None = None) -> dict:
    """One ledger entry. `effect` is the mean paired difference, `spread` the half-width of its t interval
    (None for one seed: a single seed has no spread, it is never reported as 0). `unusable`: why the experiment
    could not show the claim whatever its numbers (e.g. a method stopped before it converged): then inconclusive,
    with that reason, and the numbers still reported."""
    clean = [float(d) for d in diffs if d is not None and math.isfinite(d)]
    interval = t_interval(clean, level)
    effect = statistics.fmean(clean) if clean else None
    spread = (interval[2] - interval[0]) if interval else None
    decision = f"{INCONCLUSIVE} ({unusable})" if unusable else verdict(clean, level)
    return {"id": id, "claim": text, "metric": metric, "effect": effect, "spread": spread, "n_seeds": len(clean),
            "verdict": decision, "rule": rule_text(level), "published": published}


def interval_claim(id: str, text: str, metric: str, effect: float | None, interval: tuple[float, float] | None,
                   n_seeds: int, rule: str, published: str, unusable: str | None = None) -> dict:
    """A ledger entry whose interval comes from elsewhere (`rule` says how), decided as `verdict` decides: an
    interval above 0 reproduces, below 0 contradicts. No interval (one seed) or an `unusable` statistic (the reason,
    e.g. "fit not identified") is inconclusive, with the reason in the verdict. `spread`: the interval's half-width."""
    if unusable:
        decision = f"{INCONCLUSIVE} ({unusable})"
    elif n_seeds < 2 or interval is None:
        decision = f"{INCONCLUSIVE} (1 seed)" if n_seeds < 2 else f"{INCONCLUSIVE} (no interval)"
    else:
        decision = decide(*interval)
    spread = None if interval is None or n_seeds < 2 else (interval[1] - interval[0]) / 2
    return {"id": id, "claim": text, "metric": metric, "effect": effect, "spread": spread, "n_seeds": n_seeds,
            "verdict": decision, "rule": rule, "published": published}


def write_claims(path: str | os.PathLike, entries: Sequence[dict]) -> None:
    """Write a claims file atomically after checking every entry has exactly the ledger's fields."""
    for e in entries:
        if tuple(e) != FIELDS:
            raise ValueError(f"claim {e.get('id')!r}: fields {tuple(e)} differ from the ledger's {FIELDS}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(list(entries), indent=2) + "\n")
    os.replace(tmp, path)


def read_claims(path: str | os.PathLike) -> list[dict]:
    entries = json.loads(Path(path).read_text())
    for e in entries:
        if set(e) != set(FIELDS):
            raise ValueError(f"{path}: claim {e.get('id')!r} has fields {sorted(e)}, expected {list(FIELDS)}")
    return entries


def markdown(entries: Sequence[dict]) -> str:
    """The ledger as a markdown table (effect ± spread, seeds, verdict, the published number)."""
    def num(x: float | None) -> str:
        return "–" if x is None else f"{x:+.4f}"

    rows = ["| claim | metric | effect ± spread | seeds | verdict | published |", "|---|---|---|---|---|---|"]
    for e in entries:
        spread = "" if e["spread"] is None else f" ± {e['spread']:.4f}"
        rows.append(f"| {e['claim']} | {e['metric']} | {num(e['effect'])}{spread} | {e['n_seeds']} | "
                    f"**{e['verdict']}** | {e['published']} |")
    return "\n".join(rows)
