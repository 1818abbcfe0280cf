"""Scaling curves of the scale-vector study: the cells' final validation losses
as a polars table, their seed means and spreads, a power-law fit per variant (scalelab.ledger.powerlaw) and the
plot. N is the non-embedding parameter count (Kaplan et al.; embeddings dominate tiny models and would hide the
trend). The claims built on these tables live in scalelab.scale_vectors.claims.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from scalelab.config import GridConfig, ScalingConfig
from scalelab.ledger.powerlaw import Fit, fit_seeds

CELL_KEYS = ("variant", "size", "recipe", "seed")
# each kind's mean γ apart (train/callbacks.py kind_means): null in cells written before they were recorded
KIND_MEANS = ("gamma_input_mean", "gamma_output_mean", "gamma_final_mean")
# tokens, steps and train_tokens (the training split's size, null in cells written before it was recorded): a cell's
# own budget, for studies whose budget differs by size (scalelab.scale_vectors.paper_budget)
VALUES = ("val_loss", "params", "non_embedding_params", "flops", "sharpness", "sharpness_iters", "sharpness_converged",
          "gamma_mean", "gamma_std", *KIND_MEANS, "tokens", "steps", "train_tokens")


def collect(metrics_dir: Path | dict[str, Path], cells: list[str] | None = None) -> pl.DataFrame:
    """One row per cell from metrics/pretrain/<cell>.json (each written by the pretrain stage): a folder of them, or
    a study's committed cells' files by name (scalelab.ledger.studies.cell_files).

    `cells` names the cells of the current grid: files left behind by cells since removed from params are ignored,
    and a missing one is an error. None reads every file. `sharpness` is null where it was not measured, `gamma_mean`
    and `gamma_std` (over every γ vector of the model: the decay premises) where the model has no γ, each kind's mean
    (KIND_MEANS) where the cell did not record it."""
    if isinstance(metrics_dir, dict):
        files = metrics_dir
    else:
        metrics_dir = Path(metrics_dir)
        files = {p.name: p for p in sorted(metrics_dir.glob("*.json"))}
    paths = (list(files.values()) if cells is None
             else [files.get(f"{c}.json", Path(str(metrics_dir)) / f"{c}.json") for c in cells])
    rows = []
    for path in paths:
        if not path.is_file():
            raise ValueError(f"{path}: missing; run the pretrain stage of this cell first")
        m = json.loads(path.read_text())
        missing = [k for k in (*CELL_KEYS, "val_loss", "non_embedding_params", "flops") if k not in m]
        if missing:
            raise ValueError(f"{path}: missing keys {missing}; was it written by stages/pretrain.py?")
        rows.append({k: m.get(k) for k in (*CELL_KEYS, *VALUES)})
    if not rows:
        raise ValueError(f"no pretraining metrics found in {metrics_dir}")
    schema = {"variant": pl.String, "size": pl.String, "recipe": pl.String, "seed": pl.Int64,
              "val_loss": pl.Float64, "params": pl.Int64, "non_embedding_params": pl.Int64, "flops": pl.Float64,
              "sharpness": pl.Float64, "sharpness_iters": pl.Int64, "sharpness_converged": pl.Boolean,
              "gamma_mean": pl.Float64, "gamma_std": pl.Float64, **dict.fromkeys(KIND_MEANS, pl.Float64),
              "tokens": pl.Int64, "steps": pl.Int64, "train_tokens": pl.Int64}
    return pl.DataFrame(rows, schema=schema)


def grid_cells(grid: GridConfig) -> list[str]:
    """The cell names of the pretrain matrices (params `pretrain.grid`): <variant>-<size>-<recipe>-<seed>."""
    main = [f"{v}-{s}-base-{seed}" for v in grid.variants for s in grid.sizes for seed in grid.seeds]
    extra = [f"{v}-{s}-{r}-{seed}" for r in grid.recipes for v in grid.recipe_variants for s in grid.recipe_sizes
             for seed in grid.seeds]
    return main + extra


def summarize(cells: pl.DataFrame) -> pl.DataFrame:
    """Mean and spread of the final validation loss over seeds, per (recipe, variant, size). The spread (sample
    std, ddof 1) is null for a single seed: one seed has no spread, which is not a spread of 0."""
    return (
        cells.group_by("recipe", "variant", "size")
        .agg(
            pl.col("val_loss").mean().alias("val_loss"),
            pl.col("val_loss").std(ddof=1).alias("val_loss_std"),
            pl.len().alias("seeds"),
            pl.col("non_embedding_params").first(),
            pl.col("params").first(),
            pl.col("flops").mean(),
            pl.col("sharpness").mean(),
        )
        .sort("recipe", "variant", "non_embedding_params")
    )


def seed_matrix(cells: pl.DataFrame, recipe: str, variant: str,
                seeds: list[int] | None = None) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(N per size ascending, val_loss [seeds × sizes], seeds) of one variant: only the seeds (of `seeds`, if given)
    that have every size of the variant, so each row is one seed's whole curve."""
    g = cells.filter((pl.col("recipe") == recipe) & (pl.col("variant") == variant))
    sizes = g.group_by("size").agg(pl.col("non_embedding_params").first()).sort("non_embedding_params")
    wide = g.pivot(on="size", index="seed", values="val_loss").drop_nulls()
    if seeds is not None:
        wide = wide.filter(pl.col("seed").is_in(seeds))
    wide = wide.sort("seed")
    if wide.height == 0:
        return sizes["non_embedding_params"].to_numpy().astype(float), np.empty((0, sizes.height)), []
    loss = wide.select(sizes["size"].to_list()).to_numpy()
    return sizes["non_embedding_params"].to_numpy().astype(float), loss, wide["seed"].to_list()


def fit_all(cells: pl.DataFrame, cfg: ScalingConfig, recipe: str = "base") -> dict[str, Fit]:
    """A fit with a seed-bootstrap interval per variant of `recipe` that has at least `cfg.min_sizes` sizes."""
    fits = {}
    for variant in cells.filter(pl.col("recipe") == recipe)["variant"].unique(maintain_order=True).to_list():
        n, loss, seeds = seed_matrix(cells, recipe, variant)
        if seeds and len(n) >= cfg.min_sizes:
            fits[variant] = fit_seeds(n, loss, tuple(cfg.alpha_bounds), cfg.bootstrap, cfg.level)
    return fits


def fits_table(fits: dict[str, Fit]) -> pl.DataFrame:
    return pl.DataFrame([{"variant": v, **f.row()} for v, f in fits.items()])


def plot(summary: pl.DataFrame, fits: dict[str, Fit], path: Path, recipe: str = "base") -> None:
    """Seed means with ±1 std error bars (none for one seed), the fitted curves (solid: identified; dashed: not,
    with the reason in the legend) and α with its bootstrap interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    base = summary.filter(pl.col("recipe") == recipe)
    for (variant,), g in base.group_by("variant", maintain_order=True):
        n = g["non_embedding_params"].to_numpy()
        std = g["val_loss_std"].fill_null(np.nan).to_numpy()
        label = variant
        f = fits.get(variant)
        if f is not None:
            ci = f" [{f.alpha_ci[0]:.2f}, {f.alpha_ci[1]:.2f}]" if f.alpha_ci else ""
            label += (f": α={f.law.alpha:.2f}{ci}, dof {f.dof}" if f.identified
                      else f": not identified ({f.reason})")
        yerr = None if np.isnan(std).all() else np.nan_to_num(std)
        line = ax.errorbar(n, g["val_loss"].to_numpy(), yerr=yerr, fmt="o", capsize=3, label=label)
        if f is not None:
            grid = np.geomspace(n.min(), n.max(), 50)
            ax.plot(grid, f.law(grid), "-" if f.identified else "--", color=line[0].get_color(), alpha=0.7)
    seeds = int(base["seeds"].max()) if base.height else 0
    ax.set_xscale("log")
    ax.set_xlabel("non-embedding parameters N")
    ax.set_ylabel("final validation loss (nats/token)")
    ax.set_title(f"L(N) = E + A·N^-α per variant ({recipe} recipe; {seeds} seed(s); bars ±1 std over seeds)\n"
                 "solid: identified fit, dashed: not identified", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
