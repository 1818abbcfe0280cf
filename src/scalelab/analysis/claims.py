"""The claims ledger: each paper claim, its measured effect, spread over seeds, verdict,
the regime it ran in and the premises that make it testable.

Every method's summary builds its entries with `claim()` (or `interval_claim()`) and writes them with
`write_claims()`; the report only gathers those files. No verdict is ever typed in: it follows from the premises and
the effects by the rule below, stated in each entry, and no module rewrites a verdict after the fact.

Rule:
1. **Premises first.** Each claim declares the measured checks that make it testable (`premise()`): room to show the
   effect (a gap to a computed floor, or a positive control that succeeds), the treatment acted (γ moved, stream tables
   diverged, SigmaScale converged), every tuned hyperparameter interior, a budget within a stated factor of the
   paper's regime (or the claim stated as a small-scale one). Any failed premise makes the entry
   "untested (<premise>: <value>)", whatever its numbers; the numbers are still reported.
2. **The interval.** `diffs` are per-seed differences oriented so that a positive value is the claim's direction (e.g.
   loss(standard) − loss(unified) for "unified is better"). With n ≥ 2 seeds, a two-sided Student-t interval at
   `level` on the mean difference [low, high]; δ ≥ 0 is the claim's smallest effect of interest:
   high < δ → contradicted (an equivalence-style test: no effect of the size that matters, a wrong sign included,
   and so also a real effect too small to matter); else low > 0 → reproduced (its size is reported beside the
   paper's, `paper_effect`); otherwise → inconclusive. With δ = 0 this is the sign of the interval.
3. **No spread, no verdict.** One seed gives no spread: "inconclusive (1 seed)". Zero spread (every seed's difference
   identical) is "inconclusive (no seed variance)" for any n: the t interval needs a positive variance estimate, and
   identical differences say the seeds did not vary what they replicate (same batches and init), so they are not
   independent evidence. A statistic with no per-seed value (a fitted exponent, a speed-up bound) brings its own
   interval (`interval_claim`) and is decided the same way; a bound without an interval is never a verdict.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path

REPRODUCED, CONTRADICTED, INCONCLUSIVE, UNTESTED = "reproduced", "contradicted", "inconclusive", "untested"
NO_VARIANCE = "no seed variance"
FIELDS = ("id", "claim", "metric", "effect", "spread", "n_seeds", "verdict", "rule", "published", "paper_effect",
          "smallest_effect", "regime", "premises")
PREMISE_FIELDS = ("name", "value", "need", "passed")
REGIME_FIELDS = ("params", "non_embedding_params", "tokens", "tokens_per_param", "steps", "scope", "paper",
                 "paper_tokens_per_param", "ratio")


def premise(name: str, value, passed: bool, need: str) -> dict:
    """One measured premise: `value` what was measured (a number or a short string), `need` the condition it must
    meet (in words, with its threshold), `passed` whether it did."""
    if isinstance(value, float) and not math.isfinite(value):
        value = None
    return {"name": name, "value": value, "need": need, "passed": bool(passed)}


def regime(paper: str, *, params: int | None = None, non_embedding_params: int | None = None,
           tokens: int | None = None, steps: int | None = None, paper_tokens_per_param: float | None = None,
           scope: str = "small-scale") -> dict:
    """Where an entry ran, beside the paper's regime for the same claim (each method page's "Published claims and their regime"). `ratio` is this run's
    tokens per parameter over the paper's; `scope` says what the claim is about: "small-scale" (a sign at this scale,
    stated as such) or "paper" (the paper's own regime, which `budget_premise` then checks)."""
    tpp = tokens / params if tokens and params else None
    ratio = tpp / paper_tokens_per_param if tpp and paper_tokens_per_param else None
    return {"params": params, "non_embedding_params": non_embedding_params, "tokens": tokens, "tokens_per_param": tpp,
            "steps": steps, "scope": scope, "paper": paper, "paper_tokens_per_param": paper_tokens_per_param,
            "ratio": ratio}


def budget_premise(reg: dict, factor: float) -> dict:
    """The budget premise of a claim about the paper's regime: tokens per parameter within `factor` of the paper's."""
    ratio = reg.get("ratio")
    value = None if ratio is None else f"{reg['tokens_per_param']:.3g} tokens/param, {ratio:.2g}x the paper's"
    return premise("budget", value, ratio is not None and ratio >= 1 / factor,
                   f"tokens/param within {factor:g}x of the paper's {reg.get('paper_tokens_per_param') or 0:g}")


def failed(premises: Sequence[dict]) -> list[dict]:
    return [p for p in premises if not p["passed"]]


def untested_reason(premises: Sequence[dict]) -> str | None:
    """'untested (<premise>: <value>; ...)' for the failed premises, None when every premise holds."""
    bad = failed(premises)
    if not bad:
        return None
    return f"{UNTESTED} ({'; '.join(p['name'] + ': ' + _short(p['value']) for p in bad)})"


def _short(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


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


def _clean(diffs: Sequence[float | None]) -> list[float]:
    return [float(d) for d in diffs if d is not None and math.isfinite(d)]


def verdict(diffs: Sequence[float], level: float = 0.95, smallest_effect: float = 0.0) -> str:
    """reproduced / contradicted / inconclusive from the interval alone (rule 2 and 3; premises come first in
    `claim`)."""
    diffs = _clean(diffs)
    if not diffs:
        return f"{INCONCLUSIVE} (no data)"
    interval = t_interval(diffs, level)
    if interval is None:
        return f"{INCONCLUSIVE} (1 seed)"
    if no_seed_variance(diffs):
        return f"{INCONCLUSIVE} ({NO_VARIANCE})"
    return decide(*interval[1:], smallest_effect)


def decide(low: float, high: float, smallest_effect: float = 0.0) -> str:
    """The decision on an interval of the effect (claim direction positive), δ = `smallest_effect` ≥ 0."""
    if smallest_effect < 0:
        raise ValueError(f"smallest effect of interest {smallest_effect} < 0: it is a size, not a direction")
    return CONTRADICTED if high < smallest_effect else REPRODUCED if low > 0 else INCONCLUSIVE


def rule_text(level: float = 0.95, smallest_effect: float = 0.0) -> str:
    delta = f"{smallest_effect:g}" if smallest_effect else "0"
    return (f"premises first (a failed one: untested); paired by seed; {level:.0%} t interval of the mean difference "
            f"(claim direction positive): wholly below the smallest effect of interest {delta} contradicted, else "
            "above 0 reproduced, else inconclusive; 1 seed inconclusive; identical differences over seeds (zero spread: a "
            "degenerate t interval) inconclusive")


def _entry(id, text, metric, effect, spread, n, decision, rule, published, paper_effect, smallest_effect, reg,
           premises) -> dict:
    if reg is None or set(reg) != set(REGIME_FIELDS):
        raise ValueError(f"claim {id!r}: a regime (claims.regime) is required")
    for p in premises:
        if tuple(p) != PREMISE_FIELDS:
            raise ValueError(f"claim {id!r}: premise {p!r} is not a claims.premise")
    return {"id": id, "claim": text, "metric": metric, "effect": effect, "spread": spread, "n_seeds": n,
            "verdict": decision, "rule": rule, "published": published, "paper_effect": paper_effect,
            "smallest_effect": smallest_effect, "regime": reg, "premises": list(premises)}


def claim(id: str, text: str, metric: str, diffs: Sequence[float], published: str, level: float = 0.95,
          unusable: str | None = None, *, regime: dict, premises: Sequence[dict] = (),
          paper_effect: float | str | None = None, smallest_effect: float = 0.0) -> dict:
    """One ledger entry. `effect` is the mean paired difference, `spread` the half-width of its t interval (None for
    one seed: a single seed has no spread, it is never reported as 0). `premises` decide first (rule 1).
    `unusable`: why the statistic itself cannot be read (e.g. no comparable cells): inconclusive, with that reason.
    `paper_effect`: the paper's stated effect in the same metric, where it states one, shown beside the measured."""
    clean = _clean(diffs)
    interval = t_interval(clean, level)
    effect = statistics.fmean(clean) if clean else None
    spread = (interval[2] - interval[0]) if interval else None
    decision = (untested_reason(premises) or (f"{INCONCLUSIVE} ({unusable})" if unusable else None)
                or verdict(clean, level, smallest_effect))
    return _entry(id, text, metric, effect, spread, len(clean), decision, rule_text(level, smallest_effect),
                  published, paper_effect, smallest_effect, regime, premises)


def interval_claim(id: str, text: str, metric: str, effect: float | None, interval: tuple[float, float] | None,
                   n_seeds: int, rule: str, published: str, unusable: str | None = None, *, regime: dict,
                   premises: Sequence[dict] = (), paper_effect: float | str | None = None,
                   smallest_effect: float = 0.0) -> dict:
    """A ledger entry whose interval comes from elsewhere (`rule` says how), decided as `claim` decides: premises
    first, then high < δ contradicts, else low > 0 reproduces. No interval (one seed, a bound) or an `unusable` statistic
    (the reason, e.g. "fit not identified") is inconclusive, with the reason. `spread`: the interval's half-width."""
    if (reason := untested_reason(premises)) is not None:
        decision = reason
    elif unusable:
        decision = f"{INCONCLUSIVE} ({unusable})"
    elif n_seeds < 2 or interval is None:
        decision = f"{INCONCLUSIVE} (1 seed)" if n_seeds < 2 else f"{INCONCLUSIVE} (no interval)"
    else:
        decision = decide(*interval, smallest_effect)
    spread = None if interval is None or n_seeds < 2 else (interval[1] - interval[0]) / 2
    return _entry(id, text, metric, effect, spread, n_seeds, decision, f"premises first (a failed one: untested); {rule}",
                  published, paper_effect, smallest_effect, regime, premises)


def observation(id: str, text: str, metric: str, effect: float | None, n_seeds: int, published: str, *,
                regime: dict, why: str) -> dict:
    """An entry the study measures but that no paper claims (e.g. a family outside the papers' statements): it is
    reported, never decided; `why` says why it is an observation."""
    return _entry(id, text, metric, effect, None, n_seeds, f"observation ({why})", "an observation: not decided",
                  published, None, 0.0, regime, ())


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


def verdict_of(e: dict) -> str:
    """The verdict without its reason: 'untested (budget: ...)' -> 'untested'."""
    return e["verdict"].split(" (")[0]


def regime_text(reg: dict) -> str:
    """'135M params, 1.02e+04 tokens (7.6e-05 tokens/param, 1e-06x the paper's); paper: ...' in one cell."""
    parts = []
    if reg.get("params"):
        parts.append(f"{reg['params'] / 1e6:.3g}M params")
    if reg.get("tokens"):
        tpp = f"{reg['tokens_per_param']:.2g} tokens/param" if reg.get("tokens_per_param") else ""
        ratio = f", {reg['ratio']:.2g}x the paper's" if reg.get("ratio") else ""
        parts.append(f"{reg['tokens']:.3g} tokens" + (f" ({tpp}{ratio})" if tpp else ""))
    if reg.get("steps"):
        parts.append(f"{reg['steps']} steps")
    return "; ".join(parts + [f"{reg['scope']}; paper: {reg['paper']}"])


def premises_text(premises: Sequence[dict]) -> str:
    return "; ".join(f"{'✓' if p['passed'] else '✗'} {p['name']} {_short(p['value'])} (need {p['need']})"
                     for p in premises) or "–"


def markdown(entries: Sequence[dict]) -> str:
    """The ledger as a markdown table: effect ± spread beside the paper's, seeds, verdict, regime, premises, and the
    paper's statement."""
    def num(x: float | None) -> str:
        return "–" if x is None else f"{x:+.4f}"

    rows = ["| claim | metric | effect ± spread | paper | seeds | verdict | regime | premises | published |",
            "|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        spread = "" if e["spread"] is None else f" ± {e['spread']:.4f}"
        paper = "–" if e["paper_effect"] is None else _short(e["paper_effect"])
        rows.append(f"| {e['claim']} | {e['metric']} | {num(e['effect'])}{spread} | {paper} | {e['n_seeds']} | "
                    f"**{e['verdict']}** | {regime_text(e['regime'])} | {premises_text(e['premises'])} | {e['published']} |")
    return "\n".join(rows)
