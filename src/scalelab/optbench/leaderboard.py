"""The optimizer leaderboard: per optimizer and size, from the sweep and rerun cells (scalelab.optbench.sweep).

Per row: the model's parameters (all, and without the token embedding and LM head) and the run's tokens per
parameter; the configuration the protocol chose (mean over the sweep seeds) and every tuned hyperparameter it left at
an edge of the values tried (scalelab.optbench.protocol.at_edge); the final loss over the held-out seeds; the speed-up
in data (scalelab.optbench.speedup: end-of-run losses against the fitted baseline, a bound outside its measured
range), and against each further reference arm (`optimizers.references`: the embedding-LR control) where there is
one; the LR its embeddings and LM head trained at over the baseline's tuned LR where they go to an AdamW side group
(the matrix families) or train at a multiple of an AdamW arm's LR; step-time ratio; optimizer-state bytes per
parameter and the optimizer step's own peak memory (hooks.step_peak_bytes); diverged runs of the sweep; what the
papers claim about it (scalelab.optbench.papers). The claims themselves are scalelab.optbench.claims's.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import polars as pl

from scalelab.optbench.premises import seed_spread
from scalelab.optbench.papers import CONTROL, published
from scalelab.optbench.data import Bench, finals, ok, read_study, run_size
from scalelab.optbench.speedup import fit_dof, per_seed, speedup_text, summarise
from scalelab.optim import spec
from scalelab.optbench.protocol import at_edge, run_name


def _embedding_ratio(bench: Bench, cells: dict, opt: str, size: str, ref: str) -> float | None:
    """The LR `opt`'s embeddings trained at over the LR `ref`'s did, where the two are comparable: a matrix family's
    AdamW side group, or another AdamW arm (the embedding-LR control); None otherwise."""
    best, base = cells[opt, size]["best_hp"], cells[ref, size]["best_hp"]
    comparable = bench.embeddings_on_side(opt) or (opt != ref and bench.name(opt) == bench.name(ref))
    if not (comparable and best and base):
        return None
    return bench.embedding_lr(opt, best, cells[opt, size]) / bench.embedding_lr(ref, base, cells[ref, size])


def table(bench: Bench, cells: dict, runs: list[dict]) -> pl.DataFrame:
    rows = []
    for (opt, size), c in cells.items():
        best = c["best_hp"]
        losses = [r["val_loss"] for r in finals(runs, opt, size, best).values() if r["seed"] in bench.rerun_seeds
                  and ok(r)]
        s = summarise(per_seed(bench, cells, runs, opt, size))
        vs = {}
        for ref in bench.references:
            t = summarise(per_seed(bench, cells, runs, opt, size, ref=ref)) if opt != ref else None
            vs |= {f"speedup_vs_{ref}": t and t["speedup"], f"speedup_kind_vs_{ref}": t and t["kind"],
                   f"speedup_text_vs_{ref}": speedup_text(t) if t else "–",
                   f"embedding_lr_ratio_vs_{ref}": _embedding_ratio(bench, cells, opt, size, ref)}
        n = run_size(bench, runs, opt, size)
        rows.append({
            "optimizer": opt, "size": size, "family": spec(bench.name(opt)).family, "library": c.get("library"),
            "params": next((r["params"] for r in c["runs"].values() if r.get("params")), None),
            "non_embedding_params": n["non_embedding_params"], "tokens": n["tokens"],
            "tokens_per_param": n["tokens_per_param"],
            "best_lr": c["best_lr"], "best_hp": json.dumps(best),
            "at_edge": ", ".join(at_edge(c, seed_spread(bench, cells, runs, opt, size))),
            "extra_points": c.get("extra_points"), "diverged": f"{c['diverged']}/{c['n_runs']}",
            "n_seeds": len(losses), "val_loss": statistics.fmean(losses) if losses else None,
            "val_loss_sd": statistics.stdev(losses) if len(losses) > 1 else None,
            "speedup": s["speedup"], "speedup_kind": s["kind"], "speedup_low": s["low"], "speedup_high": s["high"],
            "speedup_text": speedup_text(s), "fit_dof": fit_dof(bench, cells, runs, size),
            "embedding_lr_ratio": _embedding_ratio(bench, cells, opt, size, bench.baseline), **vs,
            "step_time_ratio": c.get("step_time_ratio"),
            "state_bytes_per_param": c.get("state_bytes_per_param"), "step_peak_mb": c.get("step_peak_mb"),
            "step_peak_bytes_per_param": c.get("step_peak_bytes_per_param"),
            "published": "baseline (the fitted reference curve)" if opt == bench.baseline
            else f"reference: {CONTROL}" if opt in bench.references
            else published(bench.name(opt), spec(bench.name(opt)).family),
        })
    return pl.DataFrame(rows, infer_schema_length=None).sort(["size", "val_loss"], nulls_last=True)


def markdown(df: pl.DataFrame) -> str:
    """The table as markdown; a column pair per further reference arm (speed-up against its curve, the embeddings'
    LR over its) where the benchmark has one."""
    def f(x, fmt):
        return "–" if x is None else format(x, fmt)

    refs = [c.removeprefix("speedup_text_vs_") for c in df.columns if c.startswith("speedup_text_vs_")]
    extra = "".join(f" speed-up vs {ref} | embeddings' LR / {ref}'s |" for ref in refs)
    lines = ["| size | optimizer | family | params (without embeddings) | tokens/param | chosen (sweep-seed mean) | "
             "final val loss (held out) | speed-up in data (end-of-run, fitted baseline) | embeddings' LR / "
             f"baseline's |{extra} step time | state B/param | step peak B/param | diverged | published |",
             "|" + "---|" * (14 + 2 * len(refs))]
    for r in df.iter_rows(named=True):
        loss = f(r["val_loss"], ".4f") + ("" if r["val_loss_sd"] is None else f" ± {r['val_loss_sd']:.4f}")
        hp = ", ".join(f"{k} {v:.3g}" for k, v in (json.loads(r["best_hp"]) or {}).items() if v is not None)
        hp = (hp or "–") + (f" (edge: {r['at_edge']})" if r["at_edge"] else "")
        size = f"{f(r['params'], ',')} ({f(r['non_embedding_params'], ',')})"
        more = "".join(f" {r[f'speedup_text_vs_{ref}']} | {f(r[f'embedding_lr_ratio_vs_{ref}'], '.3g')} |"
                       for ref in refs)
        lines.append(f"| {r['size']} | {r['optimizer']} | {r['family']} | {size} | {f(r['tokens_per_param'], '.3g')}"
                     f" | {hp} | {loss} (n={r['n_seeds']}) | {r['speedup_text']} | "
                     f"{f(r['embedding_lr_ratio'], '.3g')} |{more} {f(r['step_time_ratio'], '.2f')}x"
                     f" | {f(r['state_bytes_per_param'], '.2f')} | {f(r['step_peak_bytes_per_param'], '.2f')} | "
                     f"{r['diverged']} | {r['published']} |")
    return "\n".join(lines)


def lr_sensitivity(cells: dict) -> pl.DataFrame:
    """optimizer, size, lr, seed, val_loss (None: diverged) of the LR trials (second hyperparameters at their
    defaults): the LR-sensitivity plot's data."""
    return pl.DataFrame([{"optimizer": o, "size": s, "lr": r["lr"], "seed": r["seed"],
                          "val_loss": r["val_loss"] if ok(r) else None}
                         for (o, s), c in cells.items() for r in c["runs"].values() if list(r["hp"]) == ["lr"]],
                        schema={"optimizer": pl.String, "size": pl.String, "lr": pl.Float64, "seed": pl.Int64,
                                "val_loss": pl.Float64})


def plot(cells: dict, curves: dict, bench: Bench, curves_png: Path, lr_png: Path) -> None:
    """Secondary: mid-run validation curves of each optimizer's chosen configuration (first sweep seed; not a
    claim: mid-schedule losses mislead), and the sweep-seed mean final loss against LR (× = diverged)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sens = lr_sensitivity(cells)
    n = len(bench.sizes)
    for path, kind in ((curves_png, "curves"), (lr_png, "lr")):
        fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4), squeeze=False)
        for ax, size in zip(axes[0], bench.sizes):
            for opt in bench.optimizers:
                c = cells[opt, size]
                if kind == "curves" and c["best_hp"] is not None:
                    seed = bench.sweep_seeds[0]
                    pts = curves.get((opt, size, seed, run_name(c["best_hp"], seed)), [])
                    ax.plot([t for t, _ in pts], [v for _, v in pts], label=f"{opt} (lr {c['best_lr']:.3g})")
                elif kind == "lr":
                    df = sens.filter((pl.col("optimizer") == opt) & (pl.col("size") == size)).group_by("lr").agg(
                        pl.col("val_loss").mean(), pl.col("val_loss").null_count().alias("bad")).sort("lr")
                    good = df.filter(pl.col("bad") == 0)
                    line, = ax.plot(good["lr"].to_list(), good["val_loss"].to_list(), marker="o", label=opt)
                    bad = df.filter(pl.col("bad") > 0)["lr"].to_list()
                    top = max(good["val_loss"].to_list(), default=1.0)
                    ax.plot(bad, [top] * len(bad), "x", color=line.get_color(), markersize=9)
            ax.set_title(f"size {size}")
            ax.set_xlabel("tokens" if kind == "curves" else "learning rate")
            ax.set_ylabel("validation loss")
            if kind == "lr":
                ax.set_xscale("log")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def study_table(cells_dir: Path) -> str:
    """The leaderboard of a study run by `scalelab study`, from its committed cells (`cells_dir`: the study's
    cells/ folder, as a README's generated block names it)."""
    return markdown(table(*read_study(Path(cells_dir).parent)))
