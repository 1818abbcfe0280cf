"""The optimizer benchmark's premises: what each ledger entry (scalelab.optbench.claims) checks of its arms and its
reference before it may be decided, each measured from the committed cells; any failed one makes the entry
untested, its numbers still shown:
- choice on the seed mean: every arm's configuration was chosen on the mean of ≥ 2 sweep seeds;
- hyperparameters interior: no tuned hyperparameter of either arm (the LR after the grid's extension, each second
  hyperparameter after its one pass) sits at an edge of the values tried (scalelab.optbench.protocol.at_edge, the
  shared rule of scalelab.ledger.interior: an end that beats its neighbour by less than `tolerance` is interior,
  and no decay or no warmup is a natural bound);
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
- budget (claims about the paper's own regime): tokens per non-embedding parameter within the stated factor of the
  paper's.
"""

from __future__ import annotations

import math
import statistics

from scalelab.config.optbench import SHARED_HPS
from scalelab.ledger import claims
from scalelab.optbench.data import Bench, chosen, finals, ok, size_regime, sweep_seed_count
from scalelab.optbench.papers import SMALLEST_SPEEDUP, PaperClaim
from scalelab.optbench.protocol import at_edge
from scalelab.optbench.speedup import READ, reference

MIN_BUDGETS = 4


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
