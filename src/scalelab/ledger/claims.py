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
   `level` on the mean difference [low, high]; δ > 0 is the claim's smallest effect of interest (`Sesoi`, rule 4):
   high < δ → contradicted (an equivalence-style test: no effect of the size that matters, a wrong sign included,
   and so also a real effect too small to matter); else low > 0 → reproduced (its size is reported beside the
   paper's, `paper_effect`); otherwise → inconclusive. A claim of non-inferiority ("A is no worse than B", "within
   a margin") takes δ as its margin: low > −δ → reproduced, high < −δ → contradicted.
3. **No spread, no verdict.** One seed gives no spread: "inconclusive (1 seed)". Zero spread (every seed's difference
   identical) is "inconclusive (no seed variance)" for any n: the t interval needs a positive variance estimate, and
   identical differences say the seeds did not vary what they replicate (same batches and init), so they are not
   independent evidence. A statistic with no per-seed value (a fitted exponent, a speed-up bound) brings its own
   interval (`interval_claim`) and is decided the same way; a bound without an interval is never a verdict.
4. **A smallest effect of interest on every claim.** A claim without one (> 0, a `Sesoi` carrying its reason) is
   refused with an error naming it: with δ = 0 an exact null reads "inconclusive" forever. Each row carries δ
   (`smallest_effect`) and `sesoi`: the reason, whether it was declared before the study's cells ran or chosen after
   ("post hoc": the declaration names the committed studies whose cells had already run, `Sesoi.post_hoc_for`), and
   whether the bound rests on the results it judges (a value measured on the study itself). A post-hoc bound that
   rests on the judged study's results cannot contradict: such a row reads "inconclusive (...)" and says why, since a
   bound picked after seeing the interval could be picked to sit above it. The study being judged is set by
   `judging` (scalelab.ledger.studies.regenerate, scalelab.study.ledger.write_ledger); a pipeline run judges cells
   that run after the code that declares δ, so its rows read "declared before the cells ran".
5. **Solve-or-fail outcomes** (a seed solves the task or stays at chance) are counts, not means: `count_claim`
   decides them by Fisher's exact test on the 2×2 table of solved and failed seeds (scipy.stats.fisher_exact,
   one-sided in the claim's direction, at α = (1 − level)/2, the one side of the two-sided t interval the other
   claims use), and contradicts by exact Clopper–Pearson bounds on the difference of solve rates (each rate's at
   1 − α/2, Bonferroni, so the pair covers with ≥ `level`): high < δ.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

REPRODUCED, CONTRADICTED, INCONCLUSIVE, UNTESTED = "reproduced", "contradicted", "inconclusive", "untested"
NO_VARIANCE = "no seed variance"
FIELDS = ("id", "claim", "metric", "effect", "spread", "n_seeds", "verdict", "rule", "published", "paper_effect",
          "smallest_effect", "sesoi", "regime", "premises")
SESOI_FIELDS = ("reason", "declared", "depends_on_results")
BEFORE, POST_HOC = "before the cells ran", "post hoc"
POST_HOC_DEPENDENT = "post-hoc smallest effect measured on these results: it cannot contradict"


@dataclass(frozen=True)
class Sesoi:
    """A smallest effect of interest, declared in a paper's claim registry with its reason.

    `value` (> 0) in the claim's metric; `reason` why an effect below it does not matter at this scale, in words a
    reader can check (where it was measured, or the published number it is a fraction of); `declared_on`: when it
    was committed (ISO 8601); `post_hoc_for`: the committed studies whose cells had already run when it was declared
    (for them it is post hoc; tests/test_ledgers.py checks the list against the commits the cells ran at);
    `measured_on`: the studies whose results the value was measured from, "*" for every study it judges (a bound
    computed from the judged study's own cells): judging one of those, the bound rests on the results."""
    value: float
    reason: str
    declared_on: str = ""
    post_hoc_for: tuple[str, ...] = ()
    measured_on: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.value, int | float) or not math.isfinite(self.value) or self.value <= 0:
            raise ValueError(f"smallest effect of interest {self.value!r}: it must be a size > 0")
        if not self.reason.strip():
            raise ValueError("a smallest effect of interest needs its reason")

    def row(self, study: str | None) -> dict:
        """The row's `sesoi` field when judging `study` (None: a pipeline run, whose cells run after the code)."""
        post_hoc = study is not None and study in self.post_hoc_for
        return {"reason": self.reason, "declared": POST_HOC if post_hoc else BEFORE,
                "depends_on_results": study is not None and ("*" in self.measured_on or study in self.measured_on)}

    def with_value(self, value: float) -> "Sesoi":
        """The same declaration with its value computed where it is used (e.g. converted into the claim's metric)."""
        return Sesoi(value, self.reason, self.declared_on, self.post_hoc_for, self.measured_on)


_JUDGING: ContextVar[str | None] = ContextVar("judging", default=None)


@contextmanager
def judging(study: str | None) -> Iterator[None]:
    """Entries built inside are judged as the ledger of committed study `study` (its name, results/<study>): whether
    each smallest effect is post hoc for it, and whether it rests on its results."""
    token = _JUDGING.set(study)
    try:
        yield
    finally:
        _JUDGING.reset(token)


def _sesoi(id: str, smallest_effect) -> tuple[float, dict]:
    """(δ, the row's `sesoi` field) of claim `id`; a claim without a declared smallest effect is refused."""
    if not isinstance(smallest_effect, Sesoi):
        raise ValueError(f"claim {id!r}: no smallest effect of interest declared (got {smallest_effect!r}); every "
                         "claim needs a claims.Sesoi (> 0, with its reason) from its paper's claim registry")
    return float(smallest_effect.value), smallest_effect.row(_JUDGING.get())
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


def verdict(diffs: Sequence[float], level: float, smallest_effect: float, non_inferiority: bool = False) -> str:
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
    return decide(*interval[1:], smallest_effect, non_inferiority)


def decide(low: float, high: float, smallest_effect: float, non_inferiority: bool = False) -> str:
    """The decision on an interval of the effect (claim direction positive), δ = `smallest_effect` > 0; for a claim
    of non-inferiority δ is its margin (the interval is compared with −δ)."""
    if not smallest_effect > 0:
        raise ValueError(f"smallest effect of interest {smallest_effect}: it must be a size > 0")
    if non_inferiority:
        return CONTRADICTED if high < -smallest_effect else REPRODUCED if low > -smallest_effect else INCONCLUSIVE
    return CONTRADICTED if high < smallest_effect else REPRODUCED if low > 0 else INCONCLUSIVE


def _guard(decision: str, sesoi_row: dict) -> str:
    """A contradiction by a post-hoc bound measured on the judged results reads inconclusive, saying why (rule 4)."""
    if decision == CONTRADICTED and sesoi_row["declared"] == POST_HOC and sesoi_row["depends_on_results"]:
        return f"{INCONCLUSIVE} ({POST_HOC_DEPENDENT}; the interval lies below it)"
    return decision


def _delta_text(smallest_effect: float, non_inferiority: bool) -> str:
    if non_inferiority:
        return (f"non-inferiority at margin {smallest_effect:g}: wholly below −{smallest_effect:g} contradicted, else "
                f"above −{smallest_effect:g} reproduced")
    return f"wholly below the smallest effect of interest {smallest_effect:g} contradicted, else above 0 reproduced"


def rule_text(level: float, smallest_effect: float, non_inferiority: bool = False) -> str:
    return (f"premises first (a failed one: untested); paired by seed; {level:.0%} t interval of the mean difference "
            f"(claim direction positive): {_delta_text(smallest_effect, non_inferiority)}, else inconclusive; a "
            "post-hoc smallest effect measured on these results never contradicts; 1 seed inconclusive; identical "
            "differences over seeds (zero spread: a degenerate t interval) inconclusive")


def _entry(id, text, metric, effect, spread, n, decision, rule, published, paper_effect, smallest_effect, sesoi, reg,
           premises) -> dict:
    if reg is None or set(reg) != set(REGIME_FIELDS):
        raise ValueError(f"claim {id!r}: a regime (claims.regime) is required")
    for p in premises:
        if tuple(p) != PREMISE_FIELDS:
            raise ValueError(f"claim {id!r}: premise {p!r} is not a claims.premise")
    return {"id": id, "claim": text, "metric": metric, "effect": effect, "spread": spread, "n_seeds": n,
            "verdict": decision, "rule": rule, "published": published, "paper_effect": paper_effect,
            "smallest_effect": smallest_effect, "sesoi": sesoi, "regime": reg, "premises": list(premises)}


def claim(id: str, text: str, metric: str, diffs: Sequence[float], published: str, level: float = 0.95,
          unusable: str | None = None, *, regime: dict, premises: Sequence[dict] = (),
          paper_effect: float | str | None = None, smallest_effect: Sesoi | None = None,
          non_inferiority: bool = False) -> dict:
    """One ledger entry. `effect` is the mean paired difference, `spread` the half-width of its t interval (None for
    one seed: a single seed has no spread, it is never reported as 0). `premises` decide first (rule 1).
    `smallest_effect`: the claim's declared Sesoi (required, rule 4); `non_inferiority`: δ is the claim's margin.
    `unusable`: why the statistic itself cannot be read (e.g. no comparable cells): inconclusive, with that reason.
    `paper_effect`: the paper's stated effect in the same metric, where it states one, shown beside the measured."""
    delta, sesoi = _sesoi(id, smallest_effect)
    clean = _clean(diffs)
    interval = t_interval(clean, level)
    effect = statistics.fmean(clean) if clean else None
    spread = (interval[2] - interval[0]) if interval else None
    decision = (untested_reason(premises) or (f"{INCONCLUSIVE} ({unusable})" if unusable else None)
                or _guard(verdict(clean, level, delta, non_inferiority), sesoi))
    return _entry(id, text, metric, effect, spread, len(clean), decision, rule_text(level, delta, non_inferiority),
                  published, paper_effect, delta, sesoi, regime, premises)


def clopper_pearson(k: int, n: int, level: float) -> tuple[float, float]:
    """The exact (Clopper–Pearson) two-sided interval at `level` of a binomial rate from k successes in n trials."""
    from scipy.stats import beta

    a = 1 - level
    low = 0.0 if k == 0 else float(beta.ppf(a / 2, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - a / 2, k + 1, n - k))
    return low, high


def fisher_greater(treated: tuple[int, int], control: tuple[int, int]) -> float:
    """One-sided p of Fisher's exact test that the treated rate exceeds the control's; each side (solved, seeds)."""
    from scipy.stats import fisher_exact

    (a, n), (c, m) = treated, control
    return float(fisher_exact([[a, n - a], [c, m - c]], alternative="greater").pvalue)


def count_interval(treated: tuple[int, int], control: tuple[int, int], level: float,
                   factor: float = 1.0) -> tuple[float, float]:
    """An exact-based interval of rate(treated) − factor·rate(control), each side (solved, seeds): each rate's
    Clopper–Pearson interval at 1 − (1 − level)/2 (Bonferroni: the two cover together with ≥ `level`)."""
    (a, n), (c, m) = treated, control
    (lt, ht), (lc, hc) = clopper_pearson(a, n, 1 - (1 - level) / 2), clopper_pearson(c, m, 1 - (1 - level) / 2)
    return lt - factor * hc, ht - factor * lc


def count_claim(id: str, text: str, metric: str, treated: tuple[int, int], control: tuple[int, int], published: str,
                level: float = 0.95, *, regime: dict, premises: Sequence[dict] = (), smallest_effect: Sesoi | None = None,
                factor: float = 1.0, non_inferiority: bool = False, paper_effect: float | str | None = None) -> dict:
    """A ledger entry for a solve-or-fail outcome (rule 5): `treated` and `control` are (seeds solved, seeds run).
    `effect` is rate(treated) − factor·rate(control), `spread` the half-width of its interval (`count_interval`);
    contradicted when the interval's top < δ; else reproduced when Fisher's exact one-sided p < (1 − level)/2 (the
    treated rate exceeds the control's); else inconclusive. `non_inferiority` (e.g. "keeps ≥ `factor` of the
    control's rate", which Fisher's test does not state): δ is the margin, the interval's bottom > −δ reproduces and
    its top < −δ contradicts."""
    delta, sesoi = _sesoi(id, smallest_effect)
    (a, n), (c, m) = treated, control
    if not (0 <= a <= n and 0 <= c <= m):
        raise ValueError(f"claim {id!r}: counts {treated}, {control} are not (solved, seeds) with solved ≤ seeds")
    alpha = (1 - level) / 2
    effect = spread = p = None
    if n and m:
        low, high = count_interval(treated, control, level, factor)
        effect, spread = a / n - factor * c / m, (high - low) / 2
        p = None if non_inferiority else fisher_greater(treated, control)
    if not non_inferiority and factor != 1:
        raise ValueError(f"claim {id!r}: Fisher's test compares the two rates; a fraction is a non-inferiority claim")
    decision = untested_reason(premises)
    if decision is None:
        if not (n and m):
            decision = f"{INCONCLUSIVE} (no data)"
        elif non_inferiority:
            decision = _guard(decide(low, high, delta, non_inferiority=True), sesoi)
        else:
            decision = _guard(CONTRADICTED if high < delta else REPRODUCED if p < alpha else INCONCLUSIVE, sesoi)
            if p is not None and " (" not in decision:
                decision += f" (Fisher p = {p:.3g})"
    interval = f"the exact (Clopper–Pearson, Bonferroni) {level:.0%} interval of the difference of solve rates"
    rule = (f"premises first (a failed one: untested); solve-or-fail per seed: {a}/{n} seeds solved against {c}/{m}; "
            + (f"{interval} (non-inferiority at margin {delta:g}): wholly below −{delta:g} contradicted, else above "
               f"−{delta:g} reproduced" if non_inferiority else
               f"{interval} wholly below the smallest effect of interest {delta:g} contradicted, else Fisher's exact "
               f"test, one-sided, p < {alpha:g} reproduced")
            + "; a post-hoc smallest effect measured on these results never contradicts; else inconclusive")
    return _entry(id, text, metric, effect, spread, n, decision, rule, published, paper_effect, delta, sesoi, regime,
                  premises)


def interval_claim(id: str, text: str, metric: str, effect: float | None, interval: tuple[float, float] | None,
                   n_seeds: int, rule: str, published: str, unusable: str | None = None, *, regime: dict,
                   premises: Sequence[dict] = (), paper_effect: float | str | None = None,
                   smallest_effect: Sesoi | None = None) -> dict:
    """A ledger entry whose interval comes from elsewhere (`rule` says how), decided as `claim` decides: premises
    first, then high < δ contradicts, else low > 0 reproduces. No interval (one seed, a bound) or an `unusable` statistic
    (the reason, e.g. "fit not identified") is inconclusive, with the reason. `spread`: the interval's half-width."""
    delta, sesoi = _sesoi(id, smallest_effect)
    if (reason := untested_reason(premises)) is not None:
        decision = reason
    elif unusable:
        decision = f"{INCONCLUSIVE} ({unusable})"
    elif n_seeds < 2 or interval is None:
        decision = f"{INCONCLUSIVE} (1 seed)" if n_seeds < 2 else f"{INCONCLUSIVE} (no interval)"
    else:
        decision = _guard(decide(*interval, delta), sesoi)
    spread = None if interval is None or n_seeds < 2 else (interval[1] - interval[0]) / 2
    return _entry(id, text, metric, effect, spread, n_seeds, decision, f"premises first (a failed one: untested); {rule}"
                  f"; smallest effect of interest {delta:g}", published, paper_effect, delta, sesoi, regime, premises)


def observation(id: str, text: str, metric: str, effect: float | None, n_seeds: int, published: str, *,
                regime: dict, why: str) -> dict:
    """An entry the study measures but that no paper claims (e.g. a family outside the papers' statements): it is
    reported, never decided; `why` says why it is an observation."""
    return _entry(id, text, metric, effect, None, n_seeds, f"observation ({why})", "an observation: not decided",
                  published, None, None, None, regime, ())


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


def sesoi_text(e: dict) -> str:
    """The row's smallest effect of interest in one cell: δ, and "post hoc" (with "from these results" where the bound
    was measured on them) when it was chosen after the cells ran; "–" for an observation."""
    if e.get("sesoi") is None:
        return "–"
    s = e["sesoi"]
    when = "" if s["declared"] == BEFORE else " post hoc" + (", from these results" if s["depends_on_results"] else "")
    return f"{e['smallest_effect']:.3g}{when}"


def premises_text(premises: Sequence[dict]) -> str:
    return "; ".join(f"{'✓' if p['passed'] else '✗'} {p['name']} {_short(p['value'])} (need {p['need']})"
                     for p in premises) or "–"


def markdown(entries: Sequence[dict]) -> str:
    """The ledger as a markdown table: effect ± spread beside the paper's, seeds, verdict, regime, premises, and the
    paper's statement."""
    def num(x: float | None) -> str:
        return "–" if x is None else f"{x:+.4f}"

    rows = ["| claim | metric | effect ± spread | paper | smallest effect | seeds | verdict | regime | premises | "
            "published |", "|---|---|---|---|---|---|---|---|---|---|"]
    for e in entries:
        spread = "" if e["spread"] is None else f" ± {e['spread']:.4f}"
        paper = "–" if e["paper_effect"] is None else _short(e["paper_effect"])
        rows.append(f"| {e['claim']} | {e['metric']} | {num(e['effect'])}{spread} | {paper} | {sesoi_text(e)} | "
                    f"{e['n_seeds']} | "
                    f"**{e['verdict']}** | {regime_text(e['regime'])} | {premises_text(e['premises'])} | {e['published']} |")
    return "\n".join(rows)
