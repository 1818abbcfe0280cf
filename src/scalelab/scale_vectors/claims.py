"""The claims ledger of the scale-vector study, built from the pretrain cells by the rule of scalelab.ledger.claims;
each entry's regime and premises come from scalelab.scale_vectors.premises (the γ weight-decay dose-response's claims:
scalelab.scale_vectors.dose).

Every ordering claim compares two variants of one recipe, paired by seed (cells of one seed see the same batches):
for each seed, the loss difference at every size of the recipe that both variants have, averaged over those sizes,
oriented so that positive is the claim's direction; then the t rule of `claims.claim` on those per-seed values. The
headline orderings of the base recipe are also given per size ("at every size"). The scaling claim compares fitted
exponents per seed, only when every fit is identified (scalelab.ledger.powerlaw). Sharpness compares log top
eigenvalues of the cross-entropy Hessian taken in the folded plain-weight parameterization (train/callbacks.py
`Sharpness`), so values are comparable across variants. Premises come first: a weight-decay claim is testable only
where the decay moved γ under a per-step pull near the paper's (and, on input-norm γ, without the final norm's);
a claim about γ's structure only where the treated γ left its init.

Smallest effects of interest (claims.py rule 4): declared below (LOSS_SESOI, SHARPNESS_SESOI, ALPHA_SESOI), each with
its reason. The paper states orderings, not sizes, so no bound is a fraction of a published effect: each is a stated
convention about what matters, measured on no study. They were declared on 2026-12-06, after the cells of cpu-study
and gamma-wd-dose ran: post hoc for both (their rows say so); since no reason rests on either study's results, such
a row may read contradicted ("an effect, if any, below what matters at this scale"). Until then δ was 0 and a null
could only read inconclusive.

The paper's numbers are not quoted, so `published` quotes its stated ordering ("ordering only").
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl

from scalelab.config import Params
from scalelab.ledger import claims, studies
from scalelab.scale_vectors import premises as premises_a, scaling
from scalelab.ledger.claims import NO_VARIANCE, claim, interval_claim, no_seed_variance, t_interval
from scalelab.ledger.powerlaw import Fit, fit_power_law
from scalelab.scale_vectors.premises import Cells
from scalelab.scale_vectors.scaling import seed_matrix

SOURCE = "arXiv 2605.26895; the paper states orderings, no effect sizes"
PUB_NONE = f'ordering only: "removing scale vectors hurts pre-training" ({SOURCE})'
PUB_WD = f'ordering only: "weight decay helps Input-Norm scales and hurts Output-Norm scales" ({SOURCE})'
PUB_IMPROVE = f'ordering only: "three improvements each help" ({SOURCE})'
PUB_UNION = (f'ordering only: "their union helps most, on dense and MoE models, across optimizers and schedules" '
             f'({SOURCE})')
PUB_SCALING = f'ordering only: union "with better scaling" ({SOURCE})'
PUB_SHARP = ("none: the paper ties decay on γ to sharpness (the top Hessian eigenvalue); that decay on input scales "
             "lowers it is our reading")

# When the smallest effects below were declared (commit b9bf6f9), and the scale-vector studies whose cells ran before
DECLARED = "2026-12-06T05:18:17+00:00"
POST_HOC = ("cpu-study", "gamma-wd-dose")
LOSS_SESOI = claims.Sesoi(
    0.01, "0.01 nats of final validation loss, 1% in perplexity (e^0.01 = 1.010): a convention of what a "
    "normalization variant must gain to matter, measured on no study (the paper states orderings, no sizes)",
    declared_on=DECLARED, post_hoc_for=POST_HOC)
SHARPNESS_SESOI = claims.Sesoi(
    0.1, "0.1 in log λ_max, a 10.5% change of the top Hessian eigenvalue: a convention (power iteration on one "
    "batch is not read finer), measured on no study; the paper gives no size",
    declared_on=DECLARED, post_hoc_for=POST_HOC)
ALPHA_SESOI = claims.Sesoi(
    0.01, "0.01 in the exponent α: over a 10x range of N it moves the reducible loss A·N^-α by under 2.3% "
    "(ln 10 · 0.01), the order of the loss convention; measured on no study, the paper gives no size",
    declared_on=DECLARED, post_hoc_for=POST_HOC)

# (key, claim, worse variant, better variant, published, treated variant); `{out}` names the recipe's output-norm γ.
# The treated variant's γ carry the premises: its decay moved them (wd_*), or they left init (the others).
ORDERINGS = (
    ("none_hurts", "no scale vectors (none) is worse than standard", "none", "standard", PUB_NONE, "standard"),
    ("unified_helps", "unified is better than standard", "standard", "unified", PUB_UNION, "unified"),
    ("wd_in_helps", "weight decay on input-norm γ (wd_in) is better than standard", "standard", "wd_in", PUB_WD,
     "wd_in"),
    ("branch_helps", "per-branch γ (branch) is better than standard", "standard", "branch", PUB_IMPROVE, "branch"),
    ("placement_helps", "two-sided placement is better than standard", "standard", "placement", PUB_IMPROVE,
     "placement"),
    ("magdir_helps", "magnitude-direction γ (magdir) is better than standard", "standard", "magdir", PUB_IMPROVE,
     "magdir"),
    ("wd_out_hurts", "weight decay on output-norm γ ({out}) (wd_out) is worse than standard", "wd_out", "standard",
     PUB_WD, "wd_out"),
)
DECAY_CLAIMS = ("wd_in_helps", "wd_out_hurts")  # the claims about decay on γ: decided only where it moved γ
PER_SIZE = ("none_hurts", "unified_helps")  # the headline orderings, also checked at every size of the base recipe


def _sizes_text(sizes: list[str]) -> str:
    return f"size {sizes[0]}" if len(sizes) == 1 else f"mean over sizes {','.join(sizes)}"


def decay_premises(cells: Cells, params: Params, recipe: str, variant: str, sizes: list[str],
                   level: float) -> list[dict]:
    """A decay claim's premises from the cells: γ moved, the per-step pull, and (decay on input-norm γ) the final
    norm's."""
    scale = params.model.variants[variant]
    apart = premises_a.cells_moved_apart(cells, params, recipe, variant, sizes, level)
    moved, final = apart or (premises_a.cells_moved(cells, params, recipe, variant, sizes, level), None)
    out = [moved, premises_a.pull_premise(premises_a.scale_pull(params, recipe), params.pretrain.total_steps())]
    return out + ([premises_a.final_norm_premise(scale, "the cells", final, level)] if scale.wd_input_scales else [])


def _premises(cells: Cells, params: Params, recipe: str, key: str, treated: str, sizes: list[str],
              level: float) -> list[dict]:
    if key in DECAY_CLAIMS:
        return decay_premises(cells, params, recipe, treated, sizes, level)
    return [cells.left_init(recipe, treated, sizes)]


def ordering_claims(cells: Cells, params: Params, recipe: str, level: float) -> list[dict]:
    variants, sizes, _ = cells.axes(recipe)
    out_gammas = output_gammas(params, recipe)
    entries = []
    for key, text, worse, better, published, treated in ORDERINGS:
        if worse not in variants or better not in variants:
            continue
        per_size = recipe == "base" and key in PER_SIZE and len(sizes) > 1
        for at, where in [("", sizes)] + ([(s, [s]) for s in sizes] if per_size else []):
            entries.append(claim(f"{recipe}.{key}" + (f"@{at}" if at else ""),
                                 f"{recipe}: {text.format(out=out_gammas)}" + (f" at size {at}" if at else ""),
                                 f"final val loss difference (nats), paired by seed, {_sizes_text(where)}",
                                 cells.per_seed(recipe, cells.gap(recipe, worse, better), where), published, level,
                                 regime=cells.regime(params, recipe, (worse, better), where),
                                 premises=_premises(cells, params, recipe, key, treated, where, level),
                                 smallest_effect=LOSS_SESOI))
    if "unified" in variants and len(variants) > 1:
        others = [v for v in variants if v != "unified"]

        def margin(size: str, seed: int) -> float | None:
            u = cells.loss.get((recipe, "unified", size, seed))
            rest = [cells.loss.get((recipe, v, size, seed)) for v in others]
            return None if u is None or None in rest else min(rest) - u

        entries.append(claim(f"{recipe}.unified_best", f"{recipe}: unified is the best variant ({', '.join(others)})",
                             f"best other variant's final val loss − unified's (nats), paired by seed, "
                             f"{_sizes_text(sizes)}", cells.per_seed(recipe, margin), PUB_UNION, level,
                             regime=cells.regime(params, recipe, tuple(variants), sizes),
                             premises=[cells.left_init(recipe, "unified", sizes)], smallest_effect=LOSS_SESOI))
    return entries


def sharpness_claim(cells: Cells, params: Params, recipe: str, level: float) -> list[dict]:
    variants, sizes, _ = cells.axes(recipe)
    if "wd_in" not in variants or "standard" not in variants:
        return []

    def log_ratio(size: str, seed: int) -> float | None:
        s, w = cells.sharp.get((recipe, "standard", size, seed)), cells.sharp.get((recipe, "wd_in", size, seed))
        return None if not s or not w or s <= 0 or w <= 0 else math.log(s) - math.log(w)

    diffs = cells.per_seed(recipe, log_ratio)
    if not diffs:
        return []
    return [claim(f"{recipe}.sharpness_wd_in", f"{recipe}: weight decay on input-norm γ lowers sharpness",
                  "log λ_max(standard) − log λ_max(wd_in), top Hessian eigenvalue of the CE on a fixed batch in the "
                  f"folded plain-weight parameterization (comparable across variants), {_sizes_text(sizes)}",
                  diffs, PUB_SHARP, level, regime=cells.regime(params, recipe, ("standard", "wd_in"), sizes),
                  premises=decay_premises(cells, params, recipe, "wd_in", sizes, level),
                  smallest_effect=SHARPNESS_SESOI)]


def scaling_claim(cells: pl.DataFrame, fits: dict[str, Fit], params: Params, recipe: str = "base", *,
                  regime: dict | None = None, premises: list[dict] | None = None,
                  smallest_effect: claims.Sesoi = ALPHA_SESOI) -> list[dict]:
    """unified scales better than standard: α(unified) − α(standard) of each seed's own fits, paired by seed and
    decided by the t rule of every other claim. Each seed's curve has all the sizes, so its fit has the mean fit's
    dof; one seed whose fit is not identified blocks the claim (its α is wherever the search stopped). A percentile
    bootstrap of the mean curve's α was used first: with 3 seeds it has 10 distinct resamples, its interval spans
    the single seeds' extremes asymmetrically and it took α from resamples at a bound. `recipe`: whose cells; a study
    whose budget the params do not give as one (a budget per size) passes its `regime` and its `premises`."""
    if "unified" not in fits or "standard" not in fits:
        return []
    cfg = params.scaling
    fu, fs = fits["unified"], fits["standard"]
    seeds = sorted(set(seed_matrix(cells, recipe, "standard")[2]) & set(seed_matrix(cells, recipe, "unified")[2]))
    n_s, loss_s, _ = seed_matrix(cells, recipe, "standard", seeds)  # the seeds both have, in one order
    n_u, loss_u, _ = seed_matrix(cells, recipe, "unified", seeds)
    problems = [f"{v} fit not identified: {f.reason}" for v, f in (("standard", fs), ("unified", fu))
                if not f.identified]
    diffs = []
    if len(seeds) >= 2 and not problems:
        bounds = tuple(cfg.alpha_bounds)
        per_seed = {v: [fit_power_law(n, row, bounds) for row in loss] for v, n, loss in
                    (("standard", n_s, loss_s), ("unified", n_u, loss_u))}
        problems = [f"{v} fit of seed {seed} not identified: {f.reason}" for v, fs_ in per_seed.items()
                    for seed, f in zip(seeds, fs_) if not f.identified]
        diffs = [u.law.alpha - s.law.alpha for u, s in zip(per_seed["unified"], per_seed["standard"])]
        if not problems and no_seed_variance(diffs):  # claims.py's rule: zero spread is a degenerate interval
            problems = [NO_VARIANCE]
    interval = None if problems or len(diffs) < 2 else t_interval(diffs, cfg.level)[1:]
    rule = (f"α fitted per seed over the sizes, paired by seed; {cfg.level:.0%} t interval of the mean "
            "α(unified) − α(standard): wholly below the smallest effect of interest contradicted, else above 0 "
            "reproduced, else inconclusive; only when every "
            "fit is identified (dof > 0, α inside its bounds, A > 0); 1 seed inconclusive; identical differences over "
            "seeds (zero spread: a degenerate t interval) inconclusive")
    effect = float(np.mean(diffs)) if interval else fu.law.alpha - fs.law.alpha
    index = Cells(cells)
    sizes = index.axes(recipe)[1]
    return [interval_claim(f"{recipe}.alpha_unified", f"{recipe}: unified scales better than standard (larger α)",
                           f"α of L(N) = E + A·N^-α (non-embedding N), fits over {fu.n_sizes} sizes",
                           effect, interval, len(seeds), rule, PUB_SCALING, "; ".join(problems) or None,
                           regime=regime or index.regime(params, recipe, ("standard", "unified"), sizes),
                           premises=[index.left_init(recipe, "unified", sizes), *(premises or [])],
                           smallest_effect=smallest_effect)]


def output_gammas(params: Params, recipe: str) -> str:
    """Which output-norm γ a recipe's models have (what wd_out decays)."""
    size = next(iter(params.model.sizes))
    cfg = params.resolve_model(size, "standard", vocab_size=2, recipe=recipe)
    parts = [name for name, on in (("QK-norm", cfg.qk_norm), ("post-branch", cfg.post_norm)) if on]
    return " and ".join(parts) + " γ" if parts else "no output-norm γ"


def ledger(cells: pl.DataFrame, fits: dict[str, Fit], params: Params) -> list[dict]:
    """Every scale-vector claim that the grid has cells for: per recipe the orderings, then sharpness and scaling."""
    index, level = Cells(cells), params.scaling.level
    recipes = ["base", *[r for r in params.pretrain.grid.recipes if r != "base"]]
    entries = []
    for recipe in recipes:
        if recipe in set(cells["recipe"].to_list()):
            entries += ordering_claims(index, params, recipe, level)
    entries += sharpness_claim(index, params, "base", level)
    entries += scaling_claim(cells, fits, params)
    return entries


def paired_table(cells: pl.DataFrame) -> pl.DataFrame:
    """Every paired difference behind the ledger: loss(variant) − loss(standard) per recipe, size and seed."""
    std = cells.filter(pl.col("variant") == "standard").select("recipe", "size", "seed",
                                                                pl.col("val_loss").alias("standard_loss"))
    return (cells.join(std, on=["recipe", "size", "seed"])
            .with_columns((pl.col("val_loss") - pl.col("standard_loss")).alias("minus_standard"))
            .select("recipe", "variant", "size", "seed", "val_loss", "standard_loss", "minus_standard")
            .sort("recipe", "variant", "size", "seed"))


LABELS = {key: text.replace(" ({out})", "") for key, text, *_ in ORDERINGS} | {
    "unified_best": "unified is the best variant of its recipe",
    "sharpness_wd_in": "weight decay on input-norm γ lowers sharpness (log λ_max)",
    "alpha_unified": "unified scales better than standard (larger α)"}


def recipe_table(entries: list[dict]) -> str:
    """The ledger at a glance (README, `claims_a_by_recipe.md`): one row per claim, one column per recipe, each cell
    the effect ± spread and verdict of that recipe's entry, an untested one with the premises that failed (per-size
    entries are in the full table)."""
    recipes = list(dict.fromkeys(e["id"].split(".")[0] for e in entries))
    by_id = {e["id"]: e for e in entries if "@" not in e["id"]}
    keys = [k for k in LABELS if any(f"{r}.{k}" in by_id for r in recipes)]

    def cell(e: dict | None) -> str:
        if e is None:
            return ""
        if e["effect"] is None:  # no usable seed (e.g. no converged sharpness)
            return e["verdict"]
        spread = "" if e["spread"] is None else f" ± {e['spread']:.4f}"
        verdict = claims.verdict_of(e)
        why = ", ".join(p["name"] for p in claims.failed(e["premises"]))
        return (f"{e['effect']:+.4f}{spread} {'**' + verdict + '**' if verdict != 'inconclusive' else verdict}"
                + (f" ({why})" if why else ""))

    rows = [f"| claim | {' | '.join(recipes)} |", "|---" * (len(recipes) + 1) + "|"]
    rows += [f"| {LABELS[k]} | {' | '.join(cell(by_id.get(f'{r}.{k}')) for r in recipes)} |" for k in keys]
    return "\n".join(rows)


# ---------------------------------------------------------------- the committed studies' ledgers, re-derived
def cpu_study(folder: Path) -> list[dict]:
    """The ledger of a committed grid study (results/cpu-study): its committed cells' metrics (metrics/pretrain/<cell>
    .json in results/<study>/cells/) under its own params.yaml, by today's code."""
    folder = Path(folder)
    params = premises_a.study_params(folder)
    metrics = studies.cell_files(folder, "metrics/pretrain", ".json")
    cells = scaling.collect(metrics, scaling.grid_cells(params.pretrain.grid))
    return ledger(cells, scaling.fit_all(cells, params.scaling), params)
