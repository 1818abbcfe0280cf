"""The compression study's summary (METHODS §D reproduction target): tables, plots and the differences behind each
claim. The ledger entries themselves are built by the summary stage with scalelab.analysis.claims.

Claims (differences oriented so that positive is the claim's direction, paired by calibration seed):
    published ordering at each kept fraction, in validation loss (nats; ppl = exp):
        SVD-LLM ≤ SigmaScale,  SigmaScale < ASVD,  SigmaScale < FWSVD,  ASVD < SVD,  FWSVD < SVD
    beyond the paper: each warm-started SigmaScale or end-to-end refined method < SVD-LLM
    spectrum: per seed, Spearman correlation over (method, kept fraction, layer) between erank_after/erank_before
        and the layer loss relative to plain SVD's (same layer, rank and seed): positive = lower erank, lower loss.
        Only methods that are a scaling of their own count (`distinct`): a refined variant repeats its base method's
        layers and would count them twice. A layer is compared with plain SVD's at the same rank (same allocation).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import polars as pl

from scalelab.config.compress import CompressConfig

PUBLISHED = ("LLaMA-7B WikiText-2 ppl at 20% of weights removed: SVD-LLM 7.94, ASVD 11.14, FWSVD 1727, SVD 20061 "
             "(SigmaScale, arXiv 2606.07098)")
# (better, worse, claim text): the published ordering, by method name in the grid
ORDERING = [
    ("svd_llm", "sigmascale", "SVD-LLM ≤ SigmaScale in perplexity"),
    ("sigmascale", "asvd", "SigmaScale < ASVD in perplexity"),
    ("sigmascale", "fwsvd", "SigmaScale < FWSVD in perplexity"),
    ("asvd", "svd", "ASVD < plain SVD in perplexity"),
    ("fwsvd", "svd", "FWSVD < plain SVD in perplexity"),
]
UNCONVERGED_MAX = 0.1  # the share of a SigmaScale cell set's maps that may stop by the cap before it cannot decide


def distinct(cfg: CompressConfig) -> set[str]:
    """Methods whose per-layer factors are their own (the paper's kinds as specified, or a warm-started SigmaScale;
    not a refined copy of another method's layers)."""
    return {name for name, m in cfg.methods.items() if m.refine == "none"}


def cells_table(cells: Sequence[Mapping]) -> pl.DataFrame:
    """One row per compressed cell (its metrics file)."""
    cols = ["method", "kind", "allocation", "keep", "seed", "val_nll", "ppl", "ppl_dense", "calib_nll", "params",
            "params_dense", "linear_weights_kept", "loss_rel_svd_llm", "seconds", "tokens_per_s", "tokens_per_s_dense",
            "weight_bytes", "weight_bytes_dense", "peak_memory_bytes"]
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
             "steps": r.get("steps"), "stop": r.get("stop"), "best_over_init": r.get("best_over_init")}
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


def _paired(table: pl.DataFrame, worse: str, better: str, keep: float) -> list[float]:
    """Per-seed val_nll(worse) − val_nll(better) at one kept fraction (seeds present in both)."""
    def of(method: str) -> dict[int, float]:
        rows = table.filter((pl.col("method") == method) & (pl.col("keep") == keep))
        return dict(zip(rows["seed"].to_list(), rows["val_nll"].to_list()))

    a, b = of(worse), of(better)
    return [a[s] - b[s] for s in sorted(set(a) & set(b))]


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    from scipy.stats import spearmanr

    if len(x) < 3:
        return None
    value = spearmanr(x, y).statistic
    return None if value is None or math.isnan(value) else float(value)


def unconverged(layers: pl.DataFrame, method: str, keep: float) -> str | None:
    """Why `method`'s cells at `keep` cannot speak for SigmaScale: more than UNCONVERGED_MAX of its maps stopped by
    the step cap (the objective still falling: the method as published was not run); None if converged or no
    SigmaScale maps."""
    if "stop" not in layers.columns:
        return None
    rows = layers.filter((pl.col("method") == method) & (pl.col("keep") == keep) & pl.col("stop").is_not_null())
    capped = int((rows["stop"] == "cap").sum())
    if rows.is_empty() or capped <= UNCONVERGED_MAX * rows.height:
        return None
    return f"{method} unconverged: {capped} of {rows.height} maps stopped by the step cap"


def claim_specs(table: pl.DataFrame, layers: pl.DataFrame, cfg: CompressConfig) -> list[dict]:
    """Arguments of `scalelab.analysis.claims.claim` for every claim the grid can speak to; a claim on a SigmaScale
    that stopped by its cap carries the reason it cannot decide (`unusable`)."""
    present = set(table["method"].to_list())
    specs = []
    for keep in sorted(set(table["keep"].to_list()), reverse=True):
        for better, worse, text in ORDERING:
            if better in present and worse in present:
                reasons = [r for m in (better, worse) if (r := unconverged(layers, m, keep))]
                specs.append({"id": f"d.order.{better}.{worse}@{keep:g}", "text": f"{text} at kept fraction {keep:g}",
                              "metric": f"val NLL({worse}) − val NLL({better}), nats",
                              "diffs": _paired(table, worse, better, keep), "published": PUBLISHED,
                              "unusable": "; ".join(reasons) or None})
        for name in sorted(present):
            m = cfg.methods.get(name)
            if name != "svd_llm" and "svd_llm" in present and m is not None and (m.init != "random" or
                                                                                  m.refine != "none"):
                specs.append({"id": f"d.beyond.{name}.svd_llm@{keep:g}",
                              "text": f"{name} (beyond the paper) beats SVD-LLM at kept fraction {keep:g}",
                              "metric": f"val NLL(svd_llm) − val NLL({name}), nats",
                              "diffs": _paired(table, "svd_llm", name, keep),
                              "published": "none (beyond the paper; SVD-LLM is the layer-wise optimum)",
                              "unusable": unconverged(layers, name, keep)})
    if "loss_rel_svd" in layers.columns:
        # pooled over every method that scales, and within SigmaScale's own learned scalings (the paper's claim)
        for suffix, methods, over in (("", None, "layers, methods and kept fractions"),
                                      (".sigmascale", "sigmascale", "SigmaScale's layers and kept fractions")):
            if methods is not None and methods not in set(layers["method"].to_list()):
                continue
            diffs = []
            for seed in sorted(set(layers["seed"].to_list())):
                rows = layers.filter((pl.col("seed") == seed) & pl.col("loss_rel_svd").is_not_null())
                if methods is not None:
                    rows = rows.filter(pl.col("method") == methods)
                diffs.append(spearman(rows["erank_ratio"].to_list(), rows["loss_rel_svd"].to_list()))
            specs.append({"id": f"d.erank_loss{suffix}",
                          "text": "lower effective rank after scaling goes with lower layer loss"
                                  + (" (SigmaScale's learned scalings)" if methods else ""),
                          "metric": f"Spearman ρ(erank_after/erank_before, layer loss / plain SVD's) over {over}",
                          "diffs": [d for d in diffs if d is not None],
                          "published": "SigmaScale: scaling concentrates the spectrum (lower erank), lowering "
                                       "truncation loss (qualitative)",
                          "unusable": None if methods is None else "; ".join(
                              r for k in sorted(set(layers["keep"].to_list()))
                              if (r := unconverged(layers, methods, k))) or None})
    return specs


def convergence(layers: pl.DataFrame) -> dict:
    """SigmaScale's convergence over its maps (all cells): how many stopped by plateau (or a rising loss) rather
    than the step cap, the steps taken and the best objective over the initial one (median, max)."""
    if "stop" not in layers.columns:
        return {}
    rows = layers.filter(pl.col("stop").is_not_null())
    if rows.is_empty():
        return {}
    return {"maps": rows.height, "plateau": int(rows["stop"].is_in(["plateau", "rising"]).sum()),
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
    """Perplexity against kept fraction per method (seed means, ±1 std), the uncompressed model as a line."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in sorted(set(summary["method"].to_list())):
        rows = summary.filter(pl.col("method") == method).sort("keep")
        std = [s or 0.0 for s in rows["ppl_std"].to_list()]
        ax.errorbar(rows["keep"].to_list(), rows["ppl"].to_list(), yerr=std, marker="o", capsize=3, label=method)
    if dense_ppl is not None:
        ax.axhline(dense_ppl, color="k", ls=":", label=f"uncompressed ({dense_ppl:.2f})")
    values = [v for v in summary["ppl"].to_list() if v] + ([dense_ppl] if dense_ppl else [])
    wide = max(values) / min(values) > 3  # SVD's perplexity can be orders of magnitude off: log scale then
    ax.set(xlabel="kept fraction of decoder linear weights ρ", ylabel="validation perplexity",
           yscale="log" if wide else "linear", title="Perplexity against kept fraction")
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
