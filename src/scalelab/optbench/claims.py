"""The optimizer benchmark's claims ledger: one entry per claim of the registry (scalelab.optbench.papers),
subject, reference and size, on the held-out rerun seeds only, and an observation for every optimizer no claim
speaks of. A claim built against every reference has one entry per reference arm: the tuned baseline (ids as the
registry writes them), then each of `optimizers.references` (ids ending `-vs-<reference>`).

Premises (each measured from the committed cells; any failed one makes the entry untested, its numbers still shown):
- choice on the seed mean: every arm's configuration was chosen on the mean of ≥ 2 sweep seeds;
- hyperparameters interior: no tuned hyperparameter of either arm (the LR after the grid's extension, each second
  hyperparameter after its one pass) sits at an edge of the values tried (scalelab.optbench.protocol.at_edge, the
  shared rule of scalelab.ledger.interior: an end that beats its neighbour by less than the arm's held-out seed
  spread at that setting is interior, and no decay or no warmup is a natural bound);
- equal tuning: both arms tuned the same of the hyperparameters every family has (weight decay and warmup,
  config.optbench.SHARED_HPS), so neither lead is the other's untuned recipe;
- embeddings trained like the baseline's: where the optimizer sends the embeddings and LM head to its AdamW side group
  (the matrix families), that group's LR is within half an LR grid step of the LR the reference trained its
  embeddings at (its tuned LR × its embedding LR multiplier), so the claim compares the treatment of the matrices
  and not an embedding LR the reference never had (a pinned arm's side group is at the baseline's tuned LR);
- reference curve: the reference measured at ≥ 4 data budgets on every held-out seed (three parameters and one dof);
  where its power-law fit is not identified (an asymptote or exponent at its bound) the speed-up is interpolated
  between the measured budgets, and the premise's value says so;
- in the measured range: every held-out seed's final loss lies within the reference's measured losses (a speed-up
  beyond them is a bound, never a measurement: the curve had no room for it);
- budget (claims about the paper's own regime): tokens per parameter within the stated factor of the paper's.
"""

from __future__ import annotations

import math
import statistics

from scalelab.ledger import claims
from scalelab.optbench.papers import (CLAIMS, CONTROL, EVERY_REFERENCE, SMALLEST_SPEEDUP, UNCLAIMED, WEN_REGIME,
                                      WEN_TOKENS_PER_PARAM, PaperClaim, claims_about)
from scalelab.config.optbench import SHARED_HPS
from scalelab.optbench.data import Bench, chosen, finals, ok, read_study, size_regime, sweep_seed_count
from scalelab.optbench.speedup import READ, per_seed, reference
from scalelab.optim import spec
from scalelab.optbench.protocol import at_edge

SPEEDUP = ("speed-up in data − 1: tokens the baseline's fitted end-of-run curve needs to reach the optimizer's final "
           "loss, over the optimizer's tokens (held-out seeds)")
EQUAL = "final val loss difference at equal tokens (baseline − optimizer), held-out seeds"
MIN_BUDGETS = 4


def regime(bench: Bench, runs: list[dict], size: str, pc: PaperClaim | None) -> dict:
    """The entry's regime at `size`, beside the claim's paper (an observation: the benchmark protocol's, Wen et
    al.'s, stated as small-scale)."""
    paper, tpp, scope = (pc.paper, pc.paper_tokens_per_param, pc.scope) if pc else (WEN_REGIME, WEN_TOKENS_PER_PARAM,
                                                                                    "small-scale")
    return claims.regime(paper, **size_regime(bench, runs, size), paper_tokens_per_param=tpp, scope=scope)


# ---------------------------------------------------------------- premises
def seeds_premise(cells: dict, arms: list[tuple[str, str]]) -> dict:
    n = min(sweep_seed_count(cells[a]) for a in arms)
    return claims.premise("choice on the seed mean", n, n >= 2, "every arm chosen on the mean of ≥ 2 sweep seeds")


def seed_spread(bench: Bench, cells: dict, runs: list[dict], opt: str, size: str):
    """budget -> the standard deviation of `opt`'s final loss over the held-out seeds at its choice for that budget
    (0 with fewer than two finished seeds): the interior rule's tolerance."""
    def spread(budget: float) -> float:
        losses = [r["val_loss"] for r in finals(runs, opt, size, chosen(cells[opt, size], budget), budget).values()
                  if r["seed"] in bench.rerun_seeds and ok(r)]
        return statistics.stdev(losses) if len(losses) > 1 else 0.0
    return spread


def tolerance(bench: Bench, cells: dict, runs: list[dict], opt: str, size: str, ref: str | None = None):
    """budget -> the interior rule's tolerance for `opt` at `size`: the smaller of its held-out seed spread at that
    budget's choice and the loss a SMALLEST_SPEEDUP speed-up in data is worth on reference `ref`'s curve at that
    budget's tokens (mean over the held-out seeds). The spread includes the seed effect the sweep's paired
    comparisons cancel; an end that loses less than the smallest effect of interest to its neighbour moves no
    verdict."""
    spread, ref = seed_spread(bench, cells, runs, opt, size), ref or bench.baseline
    tokens = size_regime(bench, runs, size)["tokens"]
    curves = [reference(bench, cells, runs, size, s, ref) for s in bench.rerun_seeds]

    def tol(budget: float) -> float:
        worth = [w for c in curves if tokens and not c.why_not
                 and (w := c.loss_worth(tokens * budget, SMALLEST_SPEEDUP)) is not None]
        return min(spread(budget), statistics.fmean(worth)) if worth else spread(budget)
    return tol


def interior_premise(bench: Bench, cells: dict, runs: list[dict], arms: list[tuple[str, str]],
                     ref: str | None = None) -> dict:
    edges = [f"{o}-{s} {', '.join(e)}" for o, s in arms
             if (e := at_edge(cells[o, s], tolerance(bench, cells, runs, o, s, ref)))]
    return claims.premise("hyperparameters interior", "; ".join(edges) + " at edge" if edges else "none at an edge",
                          not edges, "every tuned hyperparameter of each arm inside the values tried, or at an end "
                          "within the smaller of the held-out seed spread and the loss 1.1x in data is worth, of its "
                          "neighbour, or at a natural bound")


def tuning_premise(cells: dict, arms: list[tuple[str, str]]) -> dict:
    """Which of the shared hyperparameters (SHARED_HPS) each arm tuned, from its sweep's record: equal for all."""
    tuned = {f"{o}-{s}": sorted(set(cells[o, s].get("second") or {}) & set(SHARED_HPS)) for o, s in arms}
    same = len({tuple(v) for v in tuned.values()}) == 1
    value = (f"{', '.join(next(iter(tuned.values()))) or 'none'} by every arm" if same
             else "; ".join(f"{a} {', '.join(v) or 'none'}" for a, v in tuned.items()))
    return claims.premise("equal tuning", value, same,
                          f"every arm tuned the same of {', '.join(SHARED_HPS)} (besides the LR)")


def embedding_premise(bench: Bench, cells: dict, opt: str, size: str, ref: str | None = None) -> dict:
    """The side group's LR (embeddings and LM head) over the LR the reference `ref` (default the baseline) trained
    its embeddings at, within half a grid step."""
    ref = ref or bench.baseline
    tol = math.sqrt(bench.lr_ratio)
    whose = "the baseline's tuned LR" if ref == bench.baseline else f"{ref}'s tuned embedding LR"
    need = f"side-group LR within {tol:.3g}x of {whose} (half an LR grid step)"
    hp, base = cells[opt, size]["best_hp"], cells[ref, size]["best_hp"]
    if hp is None or base is None:
        return claims.premise("embeddings trained like the baseline's", "nothing chosen", False, need)
    side = bench.embedding_lr(opt, hp, cells[opt, size])
    theirs = bench.embedding_lr(ref, base, cells[ref, size])
    ratio = side / theirs
    return claims.premise("embeddings trained like the baseline's",
                          f"{ratio:.3g}x ({opt}-{size} side LR {side:.3g}, {ref} {theirs:.3g})",
                          1 / tol <= ratio <= tol, need)


def curve_premise(bench: Bench, cells: dict, runs: list[dict], size: str, ref: str | None = None) -> dict:
    """The reference's budgets on every held-out seed, and where its fit is not identified, that the speed-up was
    interpolated between the measured budgets (and why)."""
    ref = ref or bench.baseline
    curves = {s: reference(bench, cells, runs, size, s, ref) for s in bench.rerun_seeds}
    n = min(len(c.points) for c in curves.values())
    who = "the baseline" if ref == bench.baseline else ref
    fallback = {}
    for s, c in curves.items():
        if c.fallback:
            fallback.setdefault(c.fallback, []).append(str(s))
    how = "".join(f"; seed {', '.join(seeds)} {why}: interpolated between measured budgets"
                  for why, seeds in fallback.items()) + ("; so every seed interpolated" if fallback else "")
    # a fit identified but looser than the seeds differ at its own budget: flagged (read off it all the same)
    spread = seed_spread(bench, cells, runs, ref, size)(1.0)
    loose = [f"seed {s} rmse {c.fit.rmse:.2g}" for s, c in curves.items() if c.identified and c.fit.rmse > spread > 0]
    how += f"; {', '.join(loose)} above the seeds' spread {spread:.2g}" if loose else ""
    return claims.premise("reference curve", f"{size}: {n} budgets{how}", n >= MIN_BUDGETS,
                          f"{who} measured at ≥ {MIN_BUDGETS} data budgets on every held-out seed")


def range_premise(seeds: dict[int, tuple], where: str = "") -> dict:
    """Seeds whose speed-up is a bound fail it; seeds with no speed-up at all (no reference fit, a diverged run) are
    not counted here: the reference curve's premise or the statistic's own reason says why."""
    out = [f"seed {s} {k}" for s, (v, k) in sorted(seeds.items()) if v is not None and k not in READ]
    read = any(v is not None for v, _ in seeds.values())
    value = f"{where}{', '.join(out)} (a bound)" if out else f"{where}{'every seed inside' if read else 'none read'}"
    return claims.premise("in the measured range", value, not out,
                          "each held-out seed's final loss within the baseline's measured losses over its budgets")


def budget_premise(bench: Bench, runs: list[dict], size: str, pc: PaperClaim) -> dict:
    """A claim about the paper's regime: the run's tokens per non-embedding parameter (Chinchilla's count, as Wen et
    al. state their budgets) at least the paper's over the claim's factor."""
    reg = size_regime(bench, runs, size)
    rest, tokens = reg["non_embedding_params"], reg["tokens"]
    tpp = tokens / rest if rest and tokens else None
    need = pc.paper_tokens_per_param / pc.budget_factor
    return claims.premise("budget", None if tpp is None else f"{tpp:.3g} tokens per non-embedding parameter",
                          tpp is not None and tpp >= need, f"≥ {need:.3g} tokens per non-embedding parameter (the "
                          f"paper's {pc.paper_tokens_per_param:g} within {pc.budget_factor:g}x)")


def common(bench: Bench, cells: dict, runs: list[dict], opt: str, sizes: list[str],
           ref: str | None = None) -> list[dict]:
    """The premises every comparison with a tuned reference (default the baseline) has: the seed mean, interior
    hyperparameters and equal tuning of both arms at every size it uses, and the embeddings' LR where the optimizer
    hands them to its side group."""
    ref = ref or bench.baseline
    arms = [(o, s) for s in sizes for o in dict.fromkeys((opt, ref))]
    out = [seeds_premise(cells, arms), interior_premise(bench, cells, runs, arms, ref), tuning_premise(cells, arms)]
    if bench.embeddings_on_side(opt):
        out += [embedding_premise(bench, cells, opt, s, ref) for s in sizes]
    return out


def _unusable(seeds: dict[int, tuple]) -> str | None:
    return next((k for v, k in seeds.values() if v is None), None)


# ---------------------------------------------------------------- the claims, by kind
# Each builder: (claim, settings, cells, runs, subject, size, reference) -> one entry.
def beats(pc, bench, cells, runs, opt, size, ref) -> dict:
    seeds = per_seed(bench, cells, runs, opt, size, ref=ref)
    premises = [*common(bench, cells, runs, opt, [size], ref), curve_premise(bench, cells, runs, size, ref),
                range_premise(seeds)]
    if pc.scope == "paper":
        premises.append(budget_premise(bench, runs, size, pc))
    return claims.claim(_id(pc, bench, opt, size, ref), _text(pc, bench, opt, size, ref), _vs(SPEEDUP, bench, ref),
                        [v - 1 for v, k in seeds.values() if k in READ], pc.published,
                        unusable=_unusable(seeds), regime=regime(bench, runs, size, pc), premises=premises,
                        paper_effect=pc.paper_effect, smallest_effect=pc.sesoi)


def shrinks(pc, bench, cells, runs, opt, size, ref) -> dict:
    # the regime of the larger size: the claim is about the lead there, against the smallest
    small, large = bench.sizes[0], bench.sizes[-1]
    a, b = (per_seed(bench, cells, runs, opt, s, ref=ref) for s in (small, large))
    premises = [*common(bench, cells, runs, opt, [small, large], ref),
                *(curve_premise(bench, cells, runs, s, ref) for s in (small, large)),
                range_premise(a, f"{small}: "), range_premise(b, f"{large}: ")]
    diffs = [a[s][0] - b[s][0] for s in bench.rerun_seeds if a[s][1] in READ and b[s][1] in READ]
    return claims.claim(_id(pc, bench, opt, large, ref), _text(pc, bench, opt, large, ref),
                        _vs(f"speed-up({small}) − speed-up({large}), held-out seeds", bench, ref), diffs,
                        pc.published, unusable=_unusable(a) or _unusable(b), regime=regime(bench, runs, large, pc),
                        premises=premises, paper_effect=pc.paper_effect, smallest_effect=pc.sesoi)


def gaps(bench: Bench, cells: dict, runs: list[dict], opt: str, size: str, batch: int = 1,
         ref: str | None = None) -> dict[int, float]:
    """{held-out seed: reference's loss − `opt`'s loss} at equal tokens and batch factor `batch` (reference: default
    the baseline)."""
    ref = ref or bench.baseline
    b = finals(runs, ref, size, cells[ref, size]["best_hp"], batch=batch)
    m = finals(runs, opt, size, cells[opt, size]["best_hp"], batch=batch)
    return {s: b[s]["val_loss"] - m[s]["val_loss"] for s in bench.rerun_seeds if ok(b.get(s)) and ok(m.get(s))}


def batch(pc, bench, cells, runs, opt, size, ref) -> dict:
    """The gap at `batch_factor` × the batch minus at 1x (same tokens); δ: what the smallest speed-up is worth in loss
    on the baseline's reference curve at the benchmark's tokens (mean over held-out seeds)."""
    one, big = gaps(bench, cells, runs, opt, size), gaps(bench, cells, runs, opt, size, bench.batch_factor)
    diffs = [big[s] - one[s] for s in bench.rerun_seeds if s in one and s in big]
    refs = [reference(bench, cells, runs, size, s) for s in bench.rerun_seeds]
    tokens = size_regime(bench, runs, size)["tokens"]
    worth = [w for r in refs if not r.why_not and tokens
             and (w := r.loss_worth(tokens, pc.smallest_speedup)) is not None]
    premises = [*common(bench, cells, runs, opt, [size]), curve_premise(bench, cells, runs, size)]
    return claims.claim(_id(pc, bench, opt, size, ref), _text(pc, bench, opt, size, ref),
                        f"(baseline − {opt}) final loss at {bench.batch_factor}x batch minus at 1x, same tokens, LR "
                        "chosen at 1x (held-out seeds)", diffs, pc.published,
                        unusable=None if worth else "no reference fit for the smallest effect",
                        regime=regime(bench, runs, size, pc), premises=premises,
                        smallest_effect=pc.sesoi.with_value(statistics.fmean(worth)) if worth else pc.sesoi)


def unstable(pc, bench, cells, runs, opt, size, ref) -> dict:
    """Per sweep seed: the fraction of `opt`'s sweep runs that diverged minus the baseline's."""
    def frac(o: str, seed: int) -> float | None:
        mine = [r for r in cells[o, size]["runs"].values() if r["seed"] == seed]
        return sum(bool(r["diverged"]) for r in mine) / len(mine) if mine else None

    diffs = [frac(opt, s) - frac(bench.baseline, s) for s in bench.sweep_seeds
             if frac(opt, s) is not None and frac(bench.baseline, s) is not None]
    reg = regime(bench, runs, size, pc)
    return claims.claim(_id(pc, bench, opt, size, ref), _text(pc, bench, opt, size, ref),
                        f"fraction of sweep runs diverged: {opt} − {bench.baseline} (sweep seeds)", diffs,
                        pc.published, regime=reg, premises=[claims.budget_premise(reg, pc.budget_factor)],
                        paper_effect=pc.paper_effect, smallest_effect=pc.sesoi)


def lr_alone(cell: dict) -> dict | None:
    """The LR alone tuned, every other hyperparameter at its default: the first LR pass's choice (`lr_first`; the
    sweep's LR where it ran no second pass), as its held-out reruns name it."""
    first = cell.get("lr_first", cell["best_lr"])
    return None if first is None else {"lr": first}


def tuned(pc, bench, cells, runs, opt, size, ref) -> dict:
    """The data gain of tuning the LR alone: the speed-up of the LR-alone runs over the default recipe's, both read
    on the tuned baseline's curve (the tokens that curve needs to reach each one's final loss), minus 1."""
    default, alone = {"lr": bench.optim[opt].lr}, lr_alone(cells[opt, size])
    d = per_seed(bench, cells, runs, opt, size, hp=default)
    a = per_seed(bench, cells, runs, opt, size, hp=alone)
    held = sorted(set(finals(runs, opt, size, alone)) & set(bench.rerun_seeds))
    rerun = claims.premise("LR alone rerun", f"{len(held)} of {len(bench.rerun_seeds)} held-out seeds",
                           len(held) == len(bench.rerun_seeds), "the LR alone tuned rerun on every held-out seed (a "
                           "study run before the protocol reran it has none)")
    premises = [*common(bench, cells, runs, opt, [size]), rerun, curve_premise(bench, cells, runs, size),
                range_premise(a, "LR alone: "), range_premise(d, "default: ")]
    diffs = [a[s][0] / d[s][0] - 1 for s in bench.rerun_seeds if a[s][1] in READ and d[s][1] in READ]
    return claims.claim(_id(pc, bench, opt, size, ref), _text(pc, bench, opt, size, ref),
                        "data gain of tuning the LR alone − 1: the tokens the tuned baseline's fitted curve needs to "
                        "reach the LR-alone run's final loss over those it needs to reach the default recipe's "
                        "(held-out seeds)", diffs, pc.published,
                        unusable=_unusable(a) or _unusable(d), regime=regime(bench, runs, size, pc),
                        premises=premises, paper_effect=pc.paper_effect, smallest_effect=pc.sesoi)


def tuned_recipe(bench, cells, runs, size) -> dict:
    """The whole recipe's gain (LR, decay, warmup, LR again) over the default recipe on the tuned baseline's curve:
    measured, never decided (the paper's claim is about the LR alone)."""
    opt = bench.baseline
    seeds = per_seed(bench, cells, runs, opt, size, hp={"lr": bench.optim[opt].lr})
    d = [1 / v - 1 for v, k in seeds.values() if k in READ]
    why = "the paper's claim is about the LR alone (b-tuned-*); this is the whole recipe's gain"
    text = f"tuned {opt} (its whole recipe) beats its default recipe in data at {size}"
    metric = ("data gain of tuning − 1: the default recipe's tokens over those the tuned baseline's curve needs to "
              "reach the default's final loss (held-out seeds)")
    return claims.observation(f"b-obs-tuned-recipe-{opt}-{size}", text, metric, statistics.fmean(d) if d else None,
                              len(d), why, regime=regime(bench, runs, size, None), why=why)


def embedding_pairs(bench: Bench, cells: dict, size: str) -> list[tuple[str, str]]:
    """(treated, control) pairs of the embedding-LR control at `size`: each reference beyond the baseline against the
    baseline; each pinned arm pinned to such a reference against its twin of the same family pinned to the
    baseline."""
    pairs = [(r, bench.baseline) for r in bench.references]
    pinned = {o: to for o in bench.optimizers if (to := cells[o, size].get("pinned_to"))}
    for o, to in pinned.items():
        twin = next((t for t, tt in pinned.items() if tt == bench.baseline and bench.name(t) == bench.name(o)), None)
        if to != bench.baseline and twin:
            pairs.append((o, twin))
    return pairs


def embedding(pc, bench, cells, runs, opt, size, ref) -> dict:
    """`opt` (its embeddings at their own tuned LR) over `ref` (the same family, its embeddings at the baseline's
    tuned LR): the ratio of their speed-ups on the baseline's curve (the baseline's own is 1), minus 1."""
    t = per_seed(bench, cells, runs, opt, size)
    c = None if ref == bench.baseline else per_seed(bench, cells, runs, ref, size)
    arms = [(opt, size), (ref, size)]
    premises = [seeds_premise(cells, arms), interior_premise(bench, cells, runs, arms), tuning_premise(cells, arms),
                curve_premise(bench, cells, runs, size), range_premise(t, f"{opt}: "),
                *([range_premise(c, f"{ref}: ")] if c else [])]
    diffs = [t[s][0] / (c[s][0] if c else 1.0) - 1 for s in bench.rerun_seeds
             if t[s][1] in READ and (c is None or c[s][1] in READ)]
    return claims.claim(_id(pc, bench, opt, size, ref), _text(pc, bench, opt, size, ref),
                        f"speed-up in data of {opt} over {ref} − 1, both read on the baseline's fitted end-of-run "
                        "curve (held-out seeds)", diffs, pc.published,
                        unusable=_unusable(t) or (_unusable(c) if c else None), regime=regime(bench, runs, size, pc),
                        premises=premises, paper_effect=pc.paper_effect, smallest_effect=pc.sesoi)


BUILDERS = {"beats": beats, "shrinks": shrinks, "batch": batch, "unstable": unstable, "tuned": tuned,
            "embedding": embedding}


def _fmt(s: str, bench: Bench, opt: str, size: str, ref: str | None = None) -> str:
    return s.format(opt=opt, size=size, base=ref or bench.baseline, small=bench.sizes[0], large=bench.sizes[-1],
                    factor=bench.batch_factor)


def _suffix(bench: Bench, ref: str | None) -> str:
    return "" if ref in (None, bench.baseline) else f"-vs-{ref}"


def _vs(metric: str, bench: Bench, ref: str | None) -> str:
    """A metric's words against reference `ref`: as written for the baseline, or naming `ref` in its place."""
    return metric if ref in (None, bench.baseline) else metric.replace("the baseline's", f"{ref}'s").replace(
        "(baseline − optimizer)", f"({ref} − optimizer)") + ("" if "baseline" in metric else f", against {ref}")


def _id(pc: PaperClaim, bench: Bench, opt: str, size: str, ref: str | None = None) -> str:
    return _fmt(pc.id, bench, opt, size, ref) + _suffix(bench, ref)


def _text(pc: PaperClaim, bench: Bench, opt: str, size: str, ref: str | None = None) -> str:
    return _fmt(pc.text, bench, opt, size, ref)


def _subjects(pc: PaperClaim, bench: Bench) -> list[str]:
    """The optimizer keys a claim is built for: the baseline itself for the tuning claim, the large-batch reruns
    for the batch claim, else every arm other than the references whose registry name the claim speaks of."""
    if pc.kind == "tuned":
        return [bench.baseline] if bench.name(bench.baseline) in pc.subjects else []
    pool = bench.batch_optimizers if pc.kind == "batch" else bench.optimizers
    return [o for o in pool if o not in bench.reference_arms and bench.name(o) in pc.subjects]


def _against(pc: PaperClaim, bench: Bench) -> tuple[str, ...]:
    return bench.reference_arms if pc.against == EVERY_REFERENCE else (bench.baseline,)


def observation(bench, cells, runs, opt, size, kind: str, ref: str | None = None) -> dict:
    name, ref = bench.name(opt), ref or bench.baseline
    other = claims_about(name)  # a claim about this family, but of another comparison
    why = (CONTROL if opt in bench.references
           else f"the papers' claim about {name} is another comparison ({other[0].published})" if other
           else UNCLAIMED.format(name=name, family=spec(name).family))
    reg = regime(bench, runs, size, None)
    if kind == "batch":
        one, big = gaps(bench, cells, runs, opt, size), gaps(bench, cells, runs, opt, size, bench.batch_factor)
        d = [big[s] - one[s] for s in bench.rerun_seeds if s in one and s in big]
        return claims.observation(f"b-obs-{opt}-batch-{size}", _fmt("{opt}'s gap to tuned {base} closes at {factor}x "
                                  "the batch at {size}", bench, opt, size), "(baseline − optimizer) loss at "
                                  f"{bench.batch_factor}x batch minus at 1x", statistics.fmean(d) if d else None,
                                  len(d), why, regime=reg, why=why)
    d = list(gaps(bench, cells, runs, opt, size, ref=ref).values())
    return claims.observation(f"b-obs-{opt}-{size}{_suffix(bench, ref)}", f"{opt} beats tuned {ref} at {size}",
                              _vs(EQUAL, bench, ref), statistics.fmean(d) if d else None, len(d), why, regime=reg,
                              why=why)


def ledger(bench: Bench, cells: dict, runs: list[dict]) -> list[dict]:
    """Every claim of the registry for every subject in the benchmark, against each reference it is built against
    (per size, or once for a trend over sizes), then the observations: each other arm's gap at equal tokens to each
    reference, and each large-batch rerun no claim covers."""
    entries = []
    for pc in CLAIMS:
        if pc.kind == "shrinks" and len(bench.sizes) < 2:  # a trend over sizes needs two of them
            continue
        if pc.kind == "embedding":  # its pairs come from the arms, not from a registry name
            entries += [embedding(pc, bench, cells, runs, t, size, c) for size in bench.sizes
                        for t, c in embedding_pairs(bench, cells, size)]
            continue
        for opt in _subjects(pc, bench):
            for ref in _against(pc, bench):
                for size in bench.sizes[-1:] if pc.kind == "shrinks" else bench.sizes:
                    entries.append(BUILDERS[pc.kind](pc, bench, cells, runs, opt, size, ref))
    for opt in bench.optimizers:
        if opt == bench.baseline:
            continue
        for size in bench.sizes:
            if not claims_about(bench.name(opt), "beats"):
                entries += [observation(bench, cells, runs, opt, size, "beats", ref) for ref in bench.reference_arms
                            if ref != opt]
            if opt in bench.batch_optimizers and not claims_about(bench.name(opt), "batch"):
                entries.append(observation(bench, cells, runs, opt, size, "batch"))
    entries += [tuned_recipe(bench, cells, runs, size) for size in bench.sizes]
    return entries


def study(folder) -> list[dict]:
    """The ledger of a study run by `scalelab study` (configs/studies/<name>.yaml names this its generator): its
    params.yaml and committed stage cells, by today's code."""
    return ledger(*read_study(folder))
