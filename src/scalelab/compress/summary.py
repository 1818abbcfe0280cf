"""The compression study's summary: its cells and maps read back, the tables and plots over them (the claims ledger
built on these tables is compress/ledger.py).

Every cell's metrics (metrics/compress/seed-<s>.json) and every map of it (plots/compress/seed-<s>.json: rank, layer
loss, effective rank before and after scaling, SigmaScale's steps and stop) are keyed (method, kept fraction, seed).
A layer is compared with plain SVD's at the same rank (same allocation), seed and map.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import polars as pl

from scalelab.config.compress import CompressConfig
from scalelab.data import DataError

PLATEAU = ("plateau", "rising")  # SigmaScale's stops by the official plateau rule; the others: "cap", "nonfinite"
# A map that reached its plateau: stopped by the rule, or run for the fixed number of steps (`stop: fixed`) with the
# rule firing on the way (its `plateau_step`) and no non-finite step after
AT_PLATEAU = pl.col("stop").is_in(PLATEAU) | ((pl.col("stop") == "fixed") & pl.col("plateau_step").is_not_null())


def load(root: Path, cfg: CompressConfig, metrics: Mapping[str, Path] | None = None,
         plots: Mapping[str, Path] | None = None) -> tuple[list[dict], dict[tuple[str, float, int], list[dict]]]:
    """Every cell of the grid (metrics/compress/seed-<s>.json under `root`, or `metrics` by file name: a study's
    committed cells) and its maps (plots/compress/..., or `plots`), keyed (method, keep, seed)."""
    grid, root = cfg.grid, Path(root)
    metrics, plots = metrics or {}, plots or {}
    files = {s: metrics.get(f"seed-{s}.json", root / "metrics/compress" / f"seed-{s}.json") for s in grid.seeds}
    if missing := [str(f) for f in files.values() if not f.is_file()]:
        raise DataError(f"compress seeds not run yet: {missing} (run the compress stage)")
    by_name = {c["cell"]: c for f in files.values() for c in json.loads(f.read_text())["cells"]}
    names = {(m, float(k), s): cfg.cell(m, str(k), s) for m in grid.methods for k in grid.keep for s in grid.seeds
             if cfg.runs_at(m, s)}
    if missing := [n for n in names.values() if n not in by_name]:
        raise DataError(f"compress cells missing from their seed's metrics: {missing} (rerun the compress stage)")
    plots = {s: json.loads(Path(plots.get(f"seed-{s}.json", root / "plots/compress" / f"seed-{s}.json")).read_text())
             for s in grid.seeds}
    if missing := [n for (_, _, s), n in names.items() if n not in plots[s]]:
        raise DataError(f"compress cells missing from their seed's maps (plots/compress): {missing}")
    return [by_name[n] for n in names.values()], {key: plots[key[2]][n] for key, n in names.items()}


def distinct(cfg: CompressConfig) -> set[str]:
    """Methods whose per-layer factors are their own (the paper's kinds as specified, or a warm-started SigmaScale;
    not a refined copy of another method's layers)."""
    return {name for name, m in cfg.methods.items() if m.refine == "none"}


def cells_table(cells: Sequence[Mapping]) -> pl.DataFrame:
    """One row per compressed cell (its metrics file)."""
    cols = ["method", "kind", "allocation", "keep", "seed", "val_nll", "ppl", "val_nll_dense", "ppl_dense",
            "calib_nll", "calib_tokens", "params", "params_dense", "linear_weights_kept", "loss_rel_svd_llm",
            "seconds", "tokens_per_s", "tokens_per_s_dense", "weight_bytes", "weight_bytes_dense",
            "peak_memory_bytes", "ranks_digest", "objective_before", "objective_after", "objective_before_held",
            "objective_after_held"]
    return pl.DataFrame([{c: cell.get(c) for c in cols} for cell in cells], infer_schema_length=None).sort(
        "method", "keep", "seed")


def by_method(table: pl.DataFrame) -> pl.DataFrame:
    """Seed means (and std, None for one seed) per method and kept fraction."""
    return (table.group_by("method", "keep")
            .agg(pl.col("ppl").mean().alias("ppl"), pl.col("ppl").std().alias("ppl_std"),
                 pl.col("val_nll").mean().alias("val_nll"), pl.col("loss_rel_svd_llm").mean().alias("loss_rel_svd_llm"),
                 pl.col("seconds").mean().alias("seconds"), pl.col("tokens_per_s").mean().alias("tokens_per_s"),
                 pl.col("tokens_per_s_dense").mean().alias("tokens_per_s_dense"),
                 pl.col("weight_bytes").mean().alias("weight_bytes"), pl.len().alias("n_seeds"))
            .sort("method", "keep"))


def layers_table(layers: Mapping[tuple[str, float, int], Sequence[Mapping]]) -> pl.DataFrame:
    """Every compressed layer of every cell, keyed (method, keep, seed), with its loss relative to plain SVD's."""
    rows = [{"method": m, "keep": k, "seed": s, **{f: r[f] for f in ("name", "rank", "loss", "loss_rel_svd_llm",
                                                                       "erank_before", "erank_after", "seconds")},
             "steps": r.get("steps"), "stop": r.get("stop"), "plateau_step": r.get("plateau_step"),
             "best_over_init": r.get("best_over_init")}
            for (m, k, s), recs in layers.items() for r in recs if r["rank"] is not None]
    if not rows:
        return pl.DataFrame()
    df = pl.DataFrame(rows, infer_schema_length=None)  # SigmaScale-only fields are null in other rows
    if any(m == "svd" for m, _, _ in layers):
        ref = df.filter(pl.col("method") == "svd").select("keep", "seed", "name", "rank",
                                                           pl.col("loss").alias("loss_svd"))
        df = df.join(ref, on=["keep", "seed", "name", "rank"], how="left")
        df = df.with_columns((pl.col("loss") / pl.col("loss_svd")).alias("loss_rel_svd"))
    return df.with_columns((pl.col("erank_after") / pl.col("erank_before")).alias("erank_ratio"))


def maps_table(layers: Mapping[tuple[str, float, int], Sequence[Mapping]]) -> pl.DataFrame:
    """Every map of every cell as recorded, dense ones too (rank null): shape, rank and SigmaScale's stop."""
    schema = {"method": pl.String, "keep": pl.Float64, "seed": pl.Int64, "name": pl.String, "m": pl.Int64,
              "n": pl.Int64, "rank": pl.Int64, "steps": pl.Int64, "stop": pl.String, "plateau_step": pl.Int64}
    return pl.DataFrame([{"method": m, "keep": k, "seed": s, "name": r["name"], "m": r["m"], "n": r["n"],
                          "rank": r["rank"], "steps": r.get("steps"), "stop": r.get("stop"),
                          "plateau_step": r.get("plateau_step")}
                         for (m, k, s), recs in layers.items() for r in recs], schema=schema)


def rows_of(frame: pl.DataFrame, method: str, keep: float) -> pl.DataFrame:
    return frame.filter((pl.col("method") == method) & (pl.col("keep") == keep))


def paired(table: pl.DataFrame, worse: str, better: str, keep: float) -> list[float]:
    """Per-seed val_nll(worse) − val_nll(better) at one kept fraction (seeds present in both)."""
    def of(method: str) -> dict[int, float]:
        rows = rows_of(table, method, keep)
        return dict(zip(rows["seed"].to_list(), rows["val_nll"].to_list()))

    a, b = of(worse), of(better)
    return [a[s] - b[s] for s in sorted(set(a) & set(b))]


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    from scipy.stats import spearmanr

    if len(x) < 3:
        return None
    value = spearmanr(x, y).statistic
    return None if value is None or math.isnan(value) else float(value)


def convergence(layers: pl.DataFrame) -> dict:
    """SigmaScale's convergence over its maps (all cells): how many reached the plateau rule (AT_PLATEAU) rather
    than the step cap, the steps taken and the best objective over the initial one (median, max)."""
    if "stop" not in layers.columns:
        return {}
    rows = layers.filter(pl.col("stop").is_not_null())
    if rows.is_empty():
        return {}
    return {"maps": rows.height, "plateau": rows.filter(AT_PLATEAU).height,
            "cap": int((rows["stop"] == "cap").sum()), "nonfinite": int((rows["stop"] == "nonfinite").sum()),
            "steps_median": float(rows["steps"].median()), "steps_max": int(rows["steps"].max()),
            "best_over_init_median": float(rows["best_over_init"].median()),
            "best_over_init_max": float(rows["best_over_init"].max())}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_ppl(summary: pl.DataFrame, dense_ppl: float | None, path: Path) -> None:
    """Perplexity against kept fraction per method (seed means, ±1 std), the uncompressed model as a line; at a
    single kept fraction, one point per method (no axis for one value)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    keeps = sorted(set(summary["keep"].to_list()))
    for method in sorted(set(summary["method"].to_list())):
        rows = summary.filter(pl.col("method") == method).sort("keep")
        std = [s or 0.0 for s in rows["ppl_std"].to_list()]
        x, label = ([method] * rows.height, None) if len(keeps) == 1 else (rows["keep"].to_list(), method)
        ax.errorbar(x, rows["ppl"].to_list(), yerr=std, marker="o", capsize=3, label=label)
    if dense_ppl is not None:
        ax.axhline(dense_ppl, color="k", ls=":", label=f"uncompressed ({dense_ppl:.2f})")
    values = [v for v in summary["ppl"].to_list() if v] + ([dense_ppl] if dense_ppl else [])
    wide = max(values) / min(values) > 3  # SVD's perplexity can be orders of magnitude off: log scale then
    ax.set(xlabel="kept fraction of decoder linear weights ρ", ylabel="validation perplexity",
           yscale="log" if wide else "linear", title="Perplexity against kept fraction")
    if len(keeps) == 1:
        ax.set(xlabel="method", title=f"Perplexity at kept fraction ρ = {keeps[0]:g} of decoder linear weights")
    else:
        ax.invert_xaxis()
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_erank(layers: pl.DataFrame, path: Path) -> float | None:
    """Per layer: erank after/before scaling against layer loss relative to plain SVD, all seeds; returns the
    Spearman correlation shown in the title."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rho = None
    if "loss_rel_svd" in layers.columns:
        rows = layers.filter(pl.col("loss_rel_svd").is_not_null())
        rho = spearman(rows["erank_ratio"].to_list(), rows["loss_rel_svd"].to_list())
        for method in sorted(set(rows["method"].to_list())):
            r = rows.filter(pl.col("method") == method)
            ax.scatter(r["erank_ratio"].to_list(), r["loss_rel_svd"].to_list(), s=12, alpha=0.7, label=method)
        ax.set(yscale="log")
        ax.legend(fontsize=8)
    ax.set(xlabel="effective rank after / before scaling", ylabel="layer loss / plain SVD's",
           title=f"Spectrum concentration against layer loss (Spearman ρ = {rho:.2f})" if rho is not None
           else "Spectrum concentration against layer loss (needs plain SVD cells)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return rho
