"""Scaling curves and the scale-vector claims (METHODS §A reproduction target).

Collects the final validation loss of every pretraining cell into a polars table, fits `L(N) = E + A·N^(−α)` per
variant (N = non-embedding parameters, as in Kaplan et al.; embeddings dominate tiny models and would hide the trend),
and checks the paper's orderings at each size.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import polars as pl

CELL_KEYS = ("variant", "size", "recipe", "seed")
IMPROVEMENTS = ("wd_in", "branch", "placement", "magdir")


def collect(metrics_dir: Path, cells: list[str] | None = None) -> pl.DataFrame:
    """One row per cell from metrics/pretrain/<cell>.json (each written by the pretrain stage).

    `cells` names the cells of the current grid: files left behind by cells since removed from params are ignored,
    and a missing one is an error. None reads every file."""
    paths = sorted(Path(metrics_dir).glob("*.json")) if cells is None else [Path(metrics_dir) / f"{c}.json" for c in cells]
    rows = []
    for path in paths:
        if not path.is_file():
            raise ValueError(f"{path}: missing; run the pretrain stage of this cell first")
        m = json.loads(path.read_text())
        missing = [k for k in (*CELL_KEYS, "val_loss", "non_embedding_params", "flops") if k not in m]
        if missing:
            raise ValueError(f"{path}: missing keys {missing}; was it written by stages/pretrain.py?")
        rows.append({k: m[k] for k in (*CELL_KEYS, "val_loss", "params", "non_embedding_params", "flops")})
    if not rows:
        raise ValueError(f"no pretraining metrics found in {metrics_dir}")
    return pl.DataFrame(rows)


def grid_cells(grid) -> list[str]:
    """The cell names of the pretrain matrices (params `pretrain.grid`): <variant>-<size>-<recipe>-<seed>."""
    main = [f"{v}-{s}-base-{seed}" for v in grid.variants for s in grid.sizes for seed in grid.seeds]
    extra = [f"{v}-{grid.recipe_size}-{r}-{seed}" for r in grid.recipes for v in grid.recipe_variants
             for seed in grid.seeds]
    return main + extra


def summarize(cells: pl.DataFrame) -> pl.DataFrame:
    """Mean and spread of the final validation loss over seeds, per (recipe, variant, size)."""
    return (
        cells.group_by("recipe", "variant", "size")
        .agg(
            pl.col("val_loss").mean().alias("val_loss"),
            pl.col("val_loss").std(ddof=1).fill_null(0.0).alias("val_loss_std"),
            pl.len().alias("seeds"),
            pl.col("non_embedding_params").first(),
            pl.col("params").first(),
            pl.col("flops").mean(),
        )
        .sort("recipe", "variant", "non_embedding_params")
    )


@dataclass(frozen=True)
class PowerLaw:
    E: float
    A: float
    alpha: float
    rmse: float

    def __call__(self, n: np.ndarray) -> np.ndarray:
        return self.E + self.A * np.power(n, -self.alpha)


def fit_power_law(n: np.ndarray, loss: np.ndarray, alphas: np.ndarray | None = None) -> PowerLaw:
    """Least-squares fit of L = E + A·N^-α with E, A ≥ 0.

    For a fixed α the model is linear in (E, A), so we scan α on a fine grid and solve each linear problem exactly:
    robust with three points, where a nonlinear solver from a poor start often diverges.
    """
    n, loss = np.asarray(n, float), np.asarray(loss, float)
    if len(n) < 3 or len(np.unique(n)) < 3:
        raise ValueError(f"a three-parameter fit needs ≥ 3 distinct sizes, got {len(np.unique(n))}")
    scale = n.min()  # condition N^-α: work in units of the smallest model
    best: PowerLaw | None = None
    for alpha in alphas if alphas is not None else np.linspace(0.01, 3.0, 600):
        x = np.power(n / scale, -alpha)
        design = np.stack([np.ones_like(x), x], axis=1)
        (e, a), *_ = np.linalg.lstsq(design, loss, rcond=None)
        if a < 0:  # loss must fall with size: clamp to the flat fit
            e, a = loss.mean(), 0.0
        if e < 0:  # E ≥ 0: refit A alone through the origin
            e, a = 0.0, float(x @ loss / (x @ x))
        rmse = float(np.sqrt(np.mean((e + a * x - loss) ** 2)))
        if best is None or rmse < best.rmse:
            best = PowerLaw(E=float(e), A=float(a) * scale**alpha, alpha=float(alpha), rmse=rmse)
    assert best is not None
    return best


def fit_all(summary: pl.DataFrame, min_sizes: int = 3) -> dict[str, PowerLaw]:
    """A fit per variant of the base recipe, where it has enough sizes."""
    fits = {}
    base = summary.filter(pl.col("recipe") == "base")
    for (variant,), group in base.group_by("variant", maintain_order=True):
        if group.height >= min_sizes:
            fits[variant] = fit_power_law(group["non_embedding_params"].to_numpy(), group["val_loss"].to_numpy())
    return fits


def claims(summary: pl.DataFrame) -> dict[str, float | None]:
    """The orderings of METHODS §A, as the fraction of (recipe, size) comparisons where each holds.

    None where the comparison has no data (e.g. a variant left out of the grid).
    """
    loss = {(r["recipe"], r["variant"], r["size"]): r["val_loss"] for r in summary.iter_rows(named=True)}
    settings = sorted({(r, s) for r, _, s in loss})

    def frac(worse: str, better: str) -> float | None:
        pairs = [(loss[(r, worse, s)], loss[(r, better, s)]) for r, s in settings
                 if (r, worse, s) in loss and (r, better, s) in loss]
        return sum(w > b for w, b in pairs) / len(pairs) if pairs else None

    out = {"none_worse_than_standard": frac("none", "standard"),
           "standard_worse_than_unified": frac("standard", "unified"),
           "wd_out_worse_than_standard": frac("wd_out", "standard")}
    out.update({f"{v}_better_than_standard": frac("standard", v) for v in IMPROVEMENTS})
    return out


def plot(summary: pl.DataFrame, fits: dict[str, PowerLaw], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    base = summary.filter(pl.col("recipe") == "base")
    for (variant,), g in base.group_by("variant", maintain_order=True):
        n = g["non_embedding_params"].to_numpy()
        line = ax.errorbar(n, g["val_loss"].to_numpy(), yerr=g["val_loss_std"].to_numpy(), fmt="o", label=variant)
        if variant in fits:
            grid = np.geomspace(n.min(), n.max(), 50)
            f = fits[variant]
            ax.plot(grid, f(grid), "-", color=line[0].get_color(), alpha=0.7)
    ax.set_xscale("log")
    ax.set_xlabel("non-embedding parameters N")
    ax.set_ylabel("final validation loss (nats/token)")
    ax.set_title("L(N) = E + A·N^-α per scale-vector variant")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fits_table(fits: dict[str, PowerLaw]) -> pl.DataFrame:
    return pl.DataFrame([{"variant": v, **asdict(f)} for v, f in fits.items()])
