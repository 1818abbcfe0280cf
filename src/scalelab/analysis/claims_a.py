"""The claims ledger of METHODS §A (scale vectors), built from the pretrain cells by the rules of evaluate/claims.py.

Every ordering claim compares two variants of one recipe, paired by seed (cells of one seed see the same batches):
for each seed, the loss difference at every size of the recipe that both variants have, averaged over those sizes,
oriented so that positive is the claim's direction; then the t rule of `claims.claim` on those per-seed values. The
headline orderings of the base recipe are also given per size ("at every size", METHODS §A). The scaling claim
compares fitted exponents: a bootstrap over seeds, the same resampled seeds for both variants, and only when both
pooled fits are identified (scalelab.analysis.powerlaw). Sharpness compares log top eigenvalues of the
cross-entropy Hessian taken in the folded plain-weight parameterization (train/callbacks.py `Sharpness`), so values
are comparable across variants.

The paper's numbers are not in METHODS §A, so `published` quotes its stated ordering ("ordering only").
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import polars as pl

from scalelab.config import Params
from scalelab.analysis.claims import NO_VARIANCE, claim, interval_claim, no_seed_variance, t_interval
from scalelab.analysis.powerlaw import Fit, fit_power_law
from scalelab.analysis.scaling import seed_matrix

SOURCE = "arXiv 2605.26895 as quoted in METHODS §A; no number there"
PUB_NONE = f'ordering only: "removing scale vectors hurts pre-training" ({SOURCE})'
PUB_WD = f'ordering only: "weight decay helps Input-Norm scales and hurts Output-Norm scales" ({SOURCE})'
PUB_IMPROVE = f'ordering only: "three improvements each help" ({SOURCE})'
PUB_UNION = (f'ordering only: "their union helps most, on dense and MoE models, across optimizers and schedules" '
             f'({SOURCE})')
PUB_SCALING = f'ordering only: union "with better scaling" ({SOURCE})'
PUB_SHARP = ('none: METHODS §A names the top Hessian eigenvalue "the sharpness the WD claim speaks of"; that decay '
             'on input scales lowers it is our reading')

# (key, claim, worse variant, better variant, published); `{out}` names the recipe's output-norm γ
ORDERINGS = (
    ("none_hurts", "no scale vectors (none) is worse than standard", "none", "standard", PUB_NONE),
    ("unified_helps", "unified is better than standard", "standard", "unified", PUB_UNION),
    ("wd_in_helps", "weight decay on input-norm γ (wd_in) is better than standard", "standard", "wd_in", PUB_WD),
    ("branch_helps", "per-branch γ (branch) is better than standard", "standard", "branch", PUB_IMPROVE),
    ("placement_helps", "two-sided placement is better than standard", "standard", "placement", PUB_IMPROVE),
    ("magdir_helps", "magnitude-direction γ (magdir) is better than standard", "standard", "magdir", PUB_IMPROVE),
    ("wd_out_hurts", "weight decay on output-norm γ ({out}) (wd_out) is worse than standard", "wd_out", "standard",
     PUB_WD),
)
PER_SIZE = ("none_hurts", "unified_helps")  # the headline orderings, also checked at every size of the base recipe


class Losses:
    """Final validation loss (and sharpness) of every cell, indexed for paired lookups."""

    def __init__(self, cells: pl.DataFrame) -> None:
        self.cells = cells
        self.loss = {(r["recipe"], r["variant"], r["size"], r["seed"]): r["val_loss"]
                     for r in cells.iter_rows(named=True)}
        # a power iteration that did not reach its tolerance gives no value (cells written before the flag: kept)
        self.sharp = {(r["recipe"], r["variant"], r["size"], r["seed"]): r["sharpness"]
                      for r in cells.iter_rows(named=True) if r.get("sharpness_converged") is not False}

    def axes(self, recipe: str) -> tuple[list[str], list[str], list[int]]:
        """Variants, sizes (by N) and seeds of a recipe."""
        g = self.cells.filter(pl.col("recipe") == recipe)
        sizes = g.group_by("size").agg(pl.col("non_embedding_params").min()).sort("non_embedding_params")
        return (g["variant"].unique(maintain_order=True).to_list(), sizes["size"].to_list(),
                sorted(g["seed"].unique().to_list()))

    def per_seed(self, recipe: str, diff, sizes: list[str] | None = None) -> list[float]:
        """For each seed of `recipe`, the mean over sizes of `diff(size, seed)`; a seed counts only where every
        size gives a value (the same sizes for every seed: differences are paired)."""
        _, all_sizes, seeds = self.axes(recipe)
        sizes = sizes or all_sizes
        out = []
        for seed in seeds:
            values = [diff(size, seed) for size in sizes]
            if all(v is not None and math.isfinite(v) for v in values):
                out.append(statistics.fmean(values))
        return out

    def gap(self, recipe: str, worse: str, better: str):
        def diff(size: str, seed: int) -> float | None:
            w, b = self.loss.get((recipe, worse, size, seed)), self.loss.get((recipe, better, size, seed))
            return None if w is None or b is None else w - b
        return diff


def _sizes_text(sizes: list[str]) -> str:
    return f"size {sizes[0]}" if len(sizes) == 1 else f"mean over sizes {','.join(sizes)}"


def ordering_claims(losses: Losses, recipe: str, out_gammas: str, level: float) -> list[dict]:
    variants, sizes, _ = losses.axes(recipe)
    entries = []
    for key, text, worse, better, published in ORDERINGS:
        if worse not in variants or better not in variants:
            continue
        metric = f"final val loss difference (nats), paired by seed, {_sizes_text(sizes)}"
        entries.append(claim(f"{recipe}.{key}", f"{recipe}: {text.format(out=out_gammas)}", metric,
                             losses.per_seed(recipe, losses.gap(recipe, worse, better)), published, level))
        if recipe == "base" and key in PER_SIZE and len(sizes) > 1:
            for size in sizes:
                entries.append(claim(f"{recipe}.{key}@{size}",
                                     f"{recipe}: {text.format(out=out_gammas)} at size {size}",
                                     f"final val loss difference (nats), paired by seed, size {size}",
                                     losses.per_seed(recipe, losses.gap(recipe, worse, better), [size]),
                                     published, level))
    if "unified" in variants and len(variants) > 1:
        others = [v for v in variants if v != "unified"]

        def margin(size: str, seed: int) -> float | None:
            u = losses.loss.get((recipe, "unified", size, seed))
            rest = [losses.loss.get((recipe, v, size, seed)) for v in others]
            return None if u is None or None in rest else min(rest) - u

        entries.append(claim(f"{recipe}.unified_best", f"{recipe}: unified is the best variant ({', '.join(others)})",
                             f"best other variant's final val loss − unified's (nats), paired by seed, "
                             f"{_sizes_text(sizes)}", losses.per_seed(recipe, margin), PUB_UNION, level))
    return entries


def sharpness_claim(losses: Losses, recipe: str, level: float) -> list[dict]:
    variants, sizes, _ = losses.axes(recipe)
    if "wd_in" not in variants or "standard" not in variants:
        return []

    def log_ratio(size: str, seed: int) -> float | None:
        s, w = losses.sharp.get((recipe, "standard", size, seed)), losses.sharp.get((recipe, "wd_in", size, seed))
        return None if not s or not w or s <= 0 or w <= 0 else math.log(s) - math.log(w)

    diffs = losses.per_seed(recipe, log_ratio)
    if not diffs:
        return []
    return [claim(f"{recipe}.sharpness_wd_in", f"{recipe}: weight decay on input-norm γ lowers sharpness",
                  "log λ_max(standard) − log λ_max(wd_in), top Hessian eigenvalue of the CE on a fixed batch in the "
                  f"folded plain-weight parameterization (comparable across variants), {_sizes_text(sizes)}",
                  diffs, PUB_SHARP, level)]


def scaling_claim(cells: pl.DataFrame, fits: dict[str, Fit], params: Params) -> list[dict]:
    """unified scales better than standard: α(unified) − α(standard) of each seed's own fits, paired by seed and
    decided by the t rule of every other claim. Each seed's curve has all the sizes, so its fit has the mean fit's
    dof; one seed whose fit is not identified blocks the claim (its α is wherever the search stopped). A percentile
    bootstrap of the mean curve's α was used first: with 3 seeds it has 10 distinct resamples, its interval spans
    the single seeds' extremes asymmetrically and it took α from resamples at a bound."""
    if "unified" not in fits or "standard" not in fits:
        return []
    cfg = params.scaling
    fu, fs = fits["unified"], fits["standard"]
    seeds = sorted(set(seed_matrix(cells, "base", "standard")[2]) & set(seed_matrix(cells, "base", "unified")[2]))
    n_s, loss_s, _ = seed_matrix(cells, "base", "standard", seeds)  # the seeds both have, in one order
    n_u, loss_u, _ = seed_matrix(cells, "base", "unified", seeds)
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
            "α(unified) − α(standard): above 0 reproduced, below 0 contradicted, else inconclusive; only when every "
            "fit is identified (dof > 0, α inside its bounds, A > 0); 1 seed inconclusive; identical differences over "
            "seeds (zero spread: a degenerate t interval) inconclusive")
    effect = float(np.mean(diffs)) if interval else fu.law.alpha - fs.law.alpha
    return [interval_claim("base.alpha_unified", "base: unified scales better than standard (larger α)",
                           f"α of L(N) = E + A·N^-α (non-embedding N), fits over {fu.n_sizes} sizes",
                           effect, interval, len(seeds), rule, PUB_SCALING, "; ".join(problems) or None)]


def output_gammas(params: Params, recipe: str) -> str:
    """Which output-norm γ a recipe's models have (what wd_out decays)."""
    size = next(iter(params.model.sizes))
    cfg = params.resolve_model(size, "standard", vocab_size=2, recipe=recipe)
    parts = [name for name, on in (("QK-norm", cfg.qk_norm), ("post-branch", cfg.post_norm)) if on]
    return " and ".join(parts) + " γ" if parts else "no output-norm γ"


def ledger(cells: pl.DataFrame, fits: dict[str, Fit], params: Params) -> list[dict]:
    """Every §A claim that the grid has cells for: per recipe the orderings, then sharpness and scaling."""
    losses, level = Losses(cells), params.scaling.level
    recipes = ["base", *[r for r in params.pretrain.grid.recipes if r != "base"]]
    entries = []
    for recipe in recipes:
        if recipe in set(cells["recipe"].to_list()):
            entries += ordering_claims(losses, recipe, output_gammas(params, recipe), level)
    entries += sharpness_claim(losses, "base", level)
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
    the effect ± spread and verdict of that recipe's entry (per-size entries are in the full table)."""
    recipes = list(dict.fromkeys(e["id"].split(".")[0] for e in entries))
    by_id = {e["id"]: e for e in entries if "@" not in e["id"]}
    keys = [k for k in LABELS if any(f"{r}.{k}" in by_id for r in recipes)]

    def cell(e: dict | None) -> str:
        if e is None:
            return ""
        if e["effect"] is None:  # no usable seed (e.g. no converged sharpness)
            return e["verdict"]
        spread = "" if e["spread"] is None else f" ± {e['spread']:.4f}"
        verdict = e["verdict"].split(" (")[0]
        return f"{e['effect']:+.4f}{spread} {'**' + verdict + '**' if verdict != 'inconclusive' else verdict}"

    rows = [f"| claim | {' | '.join(recipes)} |", "|---" * (len(recipes) + 1) + "|"]
    rows += [f"| {LABELS[k]} | {' | '.join(cell(by_id.get(f'{r}.{k}')) for r in recipes)} |" for k in keys]
    return "\n".join(rows)


# METHODS §A's weight-decay claims at a dose (issue 19): at the matrices' rate, decay on γ over a short run moves it
# little (λ·η·T ≈ 0.05), so the claims are decided at the lowest dose of a dose-response that moves γ.
DOSE_KINDS = {"wd_in": ("input", "gamma_in"), "wd_out": ("output", "gamma_out")}


def dose_table(rows: list[dict], level: float = 0.95) -> list[dict]:
    """Per decayed kind (`arm` wd_in / wd_out) and dose (decay on those γ as a multiple of the matrices'), paired by
    seed against dose 0 (arm "standard": no decay on γ): the shrinkage of that kind's mean γ (γ̄₀ − γ̄_d), the loss
    gain (loss₀ − loss_d, positive: the decay helps) and the sharpness drop (log λ₀ − log λ_d); each the mean over
    seeds with its t-interval half-width (`*_spread`, None for one seed). `rows`: one dict per run with arm, dose,
    seed, val_loss, gamma_in, gamma_out, sharpness (None: not converged)."""
    zero = {r["seed"]: r for r in rows if r["arm"] == "standard"}
    out = []
    for arm, (kind, col) in DOSE_KINDS.items():
        for dose in sorted({r["dose"] for r in rows if r["arm"] == arm}):
            mine = [(zero[r["seed"]], r) for r in rows if r["arm"] == arm and r["dose"] == dose and r["seed"] in zero]
            entry = {"arm": arm, "kind": kind, "dose": dose, "n_seeds": len(mine)}
            for name, diff in (("shrinkage", lambda a, b: a[col] - b[col]),
                               ("loss_gain", lambda a, b: a["val_loss"] - b["val_loss"]),
                               ("sharpness_drop", lambda a, b: math.log(a["sharpness"]) - math.log(b["sharpness"])
                                if a["sharpness"] and b["sharpness"] and a["sharpness"] > 0 and b["sharpness"] > 0
                                else None)):
                vals = [v for a, b in mine if (v := diff(a, b)) is not None]
                ci = t_interval(vals, level)
                entry[name] = statistics.fmean(vals) if vals else None
                entry[f"{name}_spread"] = None if ci is None else ci[2] - ci[0]
            out.append(entry)
    return out


def dose_claims(rows: list[dict], moves: float = 0.05, level: float = 0.95) -> list[dict]:
    """The wd_in / wd_out claims decided at the lowest dose whose paired shrinkage of mean γ has its t interval above
    `moves` (the decay measurably moved γ); no such dose: inconclusive (γ did not move). wd_in helps: loss₀ − loss_d
    > 0; wd_out hurts: loss_d − loss₀ > 0; both paired by seed (claims.claim's rule)."""
    table = dose_table(rows, level)
    entries = []
    for arm, key, sign, published in (("wd_in", "wd_in_helps", 1, PUB_WD), ("wd_out", "wd_out_hurts", -1, PUB_WD)):
        moved = [e for e in table if e["arm"] == arm and e["n_seeds"] >= 2 and e["shrinkage"] is not None
                 and e["shrinkage"] - e["shrinkage_spread"] > moves]
        text = LABELS[key].replace("standard", "no decay on γ")
        if not moved:
            entries.append(claim(f"dose.{key}", text, f"no dose moved mean γ by > {moves}", [], published, level))
            entries[-1]["verdict"] = "inconclusive (γ did not move)"
            continue
        dose = min(e["dose"] for e in moved)
        zero = {r["seed"]: r["val_loss"] for r in rows if r["arm"] == "standard"}
        diffs = [sign * (zero[r["seed"]] - r["val_loss"]) for r in rows
                 if r["arm"] == arm and r["dose"] == dose and r["seed"] in zero]
        entries.append(claim(f"dose.{key}", f"{text}, at {dose:g}x the matrices' decay (the lowest dose that moves γ)",
                             f"final val loss, paired by seed, decay on γ at {dose:g}x vs none", diffs, published,
                             level))
    return entries
