"""The optimizer benchmark's claims ledger: one entry per claim of the registry (scalelab.optbench.papers),
subject, reference and size, on the held-out rerun seeds only, and an observation for every optimizer no claim
speaks of. A claim built against every reference has one entry per reference arm: the tuned baseline (ids as the
registry writes them), then each of `optimizers.references` (ids ending `-vs-<reference>`).

Its premises, each measured from the committed cells: scalelab.optbench.premises.
"""

from __future__ import annotations

import statistics

from scalelab.ledger import claims
from scalelab.optbench.papers import (CLAIMS, CONTROL, EVERY_REFERENCE, SMALLEST_SPEEDUP, UNCLAIMED, WEN_REGIME,
                                      WEN_TOKENS_PER_PARAM, PaperClaim, claims_about)
from scalelab.optbench import premises as prem
from scalelab.optbench.data import Bench, finals, ok, read_study, size_regime
from scalelab.optbench.speedup import READ, per_seed, reference
from scalelab.optim import spec

SPEEDUP = ("speed-up in data − 1: tokens the baseline's fitted end-of-run curve needs to reach the optimizer's final "
           "loss, over the optimizer's tokens (held-out seeds)")
EQUAL = "final val loss difference at equal tokens (baseline − optimizer), held-out seeds"


def regime(bench: Bench, runs: list[dict], size: str, pc: PaperClaim | None) -> dict:
    """The entry's regime at `size`, beside the claim's paper (an observation: the benchmark protocol's, Wen et
    al.'s, stated as small-scale)."""
    paper, tpp, scope = (pc.paper, pc.paper_tokens_per_param, pc.scope) if pc else (WEN_REGIME, WEN_TOKENS_PER_PARAM,
                                                                                    "small-scale")
    return claims.regime(paper, **size_regime(bench, runs, size), paper_tokens_per_param=tpp, scope=scope)


def _unusable(seeds: dict[int, tuple]) -> str | None:
    return next((k for v, k in seeds.values() if v is None), None)


# ---------------------------------------------------------------- the claims, by kind
# Each builder: (claim, settings, cells, runs, subject, size, reference) -> one entry.
def beats(pc, bench, cells, runs, opt, size, ref) -> dict:
    seeds = per_seed(bench, cells, runs, opt, size, ref=ref)
    premises = [*prem.common(bench, cells, runs, opt, [size], ref), prem.curve_premise(bench, cells, runs, size, ref),
                prem.range_premise(seeds)]
    if pc.scope == "paper":
        premises.append(prem.budget_premise(bench, runs, size, pc))
    return claims.claim(_id(pc, bench, opt, size, ref), _text(pc, bench, opt, size, ref), _vs(SPEEDUP, bench, ref),
                        [v - 1 for v, k in seeds.values() if k in READ], pc.published,
                        unusable=_unusable(seeds), regime=regime(bench, runs, size, pc), premises=premises,
                        paper_effect=pc.paper_effect, smallest_effect=pc.sesoi)


def shrinks(pc, bench, cells, runs, opt, size, ref) -> dict:
    # the regime of the larger size: the claim is about the lead there, against the smallest
    small, large = bench.sizes[0], bench.sizes[-1]
    a, b = (per_seed(bench, cells, runs, opt, s, ref=ref) for s in (small, large))
    premises = [*prem.common(bench, cells, runs, opt, [small, large], ref),
                *(prem.curve_premise(bench, cells, runs, s, ref) for s in (small, large)),
                prem.range_premise(a, f"{small}: "), prem.range_premise(b, f"{large}: ")]
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
    premises = [*prem.common(bench, cells, runs, opt, [size]), prem.curve_premise(bench, cells, runs, size)]
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
    premises = [*prem.common(bench, cells, runs, opt, [size]), rerun, prem.curve_premise(bench, cells, runs, size),
                prem.range_premise(a, "LR alone: "), prem.range_premise(d, "default: ")]
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
    premises = [prem.seeds_premise(cells, arms), prem.interior_premise(bench, cells, runs, arms),
                prem.tuning_premise(cells, arms), prem.curve_premise(bench, cells, runs, size), prem.range_premise(t, f"{opt}: "),
                *([prem.range_premise(c, f"{ref}: ")] if c else [])]
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
