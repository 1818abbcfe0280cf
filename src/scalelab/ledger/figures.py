"""The report's own plots (PNG, matplotlib Agg), each drawn from a polars table the report also prints."""

from __future__ import annotations

from pathlib import Path

import polars as pl


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


DPI = 110


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=DPI)
    tmp.replace(path)  # atomic: a crash never leaves half a PNG
    _plt().close(fig)
    return path


def loss_curves(curves: pl.DataFrame, size: str, path: Path) -> Path:
    """Validation loss against tokens, one line per variant of one size (mean over seeds; band = min..max)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    rows = curves.filter(pl.col("size") == size)
    for (variant,), g in rows.group_by("variant", maintain_order=True):
        s = g.group_by("tokens").agg(pl.col("val_loss").mean().alias("mean"), pl.col("val_loss").min().alias("lo"),
                                     pl.col("val_loss").max().alias("hi")).sort("tokens")
        line, = ax.plot(s["tokens"], s["mean"], marker=".", label=variant)
        if g["seed"].n_unique() > 1:
            ax.fill_between(s["tokens"], s["lo"], s["hi"], color=line.get_color(), alpha=0.15)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title(f"size {size}: validation loss by scale-vector variant")
    ax.legend(fontsize=8, ncol=2)
    return _save(fig, path)


def ablation(table: pl.DataFrame, path: Path) -> Path:
    """Final validation loss minus `standard`'s at the same size, per variant (bars grouped by size)."""
    plt = _plt()
    sizes = table["size"].unique(maintain_order=True).to_list()
    variants = table["variant"].unique(maintain_order=True).to_list()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.8 / max(len(sizes), 1)
    for i, size in enumerate(sizes):
        g = table.filter(pl.col("size") == size)
        delta = {r["variant"]: r["delta_vs_standard"] for r in g.iter_rows(named=True)}
        xs = [j + i * width for j in range(len(variants))]
        ax.bar(xs, [delta.get(v) or 0.0 for v in variants], width, label=f"size {size}")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks([j + width * (len(sizes) - 1) / 2 for j in range(len(variants))], variants, rotation=30)
    ax.set_ylabel("Δ val loss vs standard (lower is better)")
    ax.set_title("scale-vector ablation")
    ax.legend(fontsize=8)
    return _save(fig, path)


def evaluation(table: pl.DataFrame, path: Path) -> Path:
    """Per model: validation loss, and zero-shot accuracy against the chance rate."""
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 0.45 * table.height + 2))
    names = table["model"].to_list()
    a.barh(names, table["val_loss"].to_list())
    a.set_xlabel("validation loss (nats/token)")
    a.invert_yaxis()
    for k, (col, label) in enumerate((("continuation_acc", "continuation"), ("cloze_acc", "cloze"))):
        b.barh([y + 0.4 * k for y in range(len(names))], table[col].to_list(), 0.4, label=label)
    b.axvline(float(table["chance"][0]), color="black", ls="--", lw=1, label="chance")
    b.set_yticks(range(len(names)), names)
    b.invert_yaxis()
    b.set_xlabel("zero-shot accuracy")
    b.legend(fontsize=8)
    return _save(fig, path)


def gain_vs_n(table: pl.DataFrame, x: str, y: str, path: Path) -> Path:
    """Hidden Decoding: validation-loss gain against the number of streams n."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(table[x].to_list(), table[y].to_list(), marker="o")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title("Hidden Decoding: gain against n")
    return _save(fig, path)


def effects(entries: list[dict], path: Path, width_px: int = 528) -> Path:
    """Ledger entries drawn: each effect with its spread (the interval the verdict read) against zero, the paper's
    effect beside it where it is a number, coloured by verdict, each row numbered as the card lists it; `width_px`
    wide (a report card's width), its text at a reading size there."""
    from scalelab.ledger.cards import COLORS
    from scalelab.ledger.claims import verdict_of

    plt = _plt()
    fig, ax = plt.subplots(figsize=(width_px / DPI, 0.45 * len(entries) + 1.0))
    ys = range(len(entries))
    for y, e in zip(ys, entries):
        if e["effect"] is not None:
            ax.errorbar(e["effect"], y, xerr=e["spread"] or 0, fmt="o", ms=5, capsize=3,
                        color=COLORS.get(verdict_of(e), "#57606a"))
        if isinstance(e["paper_effect"], (int, float)):
            ax.plot(e["paper_effect"], y, marker="x", color="black", ms=6, ls="none")
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(list(ys), [str(y + 1) for y in ys], fontsize=9)  # the card's numbered rows say what each is
    ax.invert_yaxis()
    ax.tick_params(axis="x", labelsize=9)
    ax.set_xlabel("effect ± spread (x: the paper's)", fontsize=9)
    return _save(fig, path)
