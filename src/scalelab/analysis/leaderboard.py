"""The optimizer leaderboard of METHODS §B, from the sweep and seed cells (scalelab.train.optbench).

Per optimizer and size: the best LR of the sweep (sweep seed) and whether it sits at an edge of the grid (then the
grid did not bracket the optimum); final validation loss at that LR, mean ± standard deviation over every seed; the
speed-up in data against the baseline (Wen et al. 2025): on each seed, the tokens the baseline (at its own best LR)
takes to reach its final loss over the tokens the optimizer takes to reach that same loss, read off the validation
curves by linear interpolation ("never" when it does not get there); the step-time ratio to the baseline measured in
the sweep cell's process; optimizer-state bytes per parameter; peak memory; diverged runs of the grid.

Claims (scalelab.analysis.claims, paired by seed) use the rerun seeds only: the sweep seed chose the LR, so its
difference is biased toward whichever arm it favoured.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import polars as pl

from scalelab.config import OptBenchConfig, Params
from scalelab.analysis.claims import claim

# What METHODS §B quotes of the benchmark papers, per registry name (no other numbers are ever typed in here).
WEN = "Wen et al. 2025: vs well-tuned AdamW the best speed-up is ~1.3-1.4x in data at ~0.1B, ~1.1x at 1.2B"
PUBLISHED = {
    "muon": f"{WEN}; Muon, SOAP and Kron lead",
    "soap": f"{WEN}; Muon, SOAP and Kron lead",
    "ademamix": "Semenov et al. 2025: AdEMAMix strong",
    "mars": "Semenov et al. 2025: MARS strong",
    "sophia": "Semenov et al. 2025: Sophia unstable on long runs",
    "lion": "Semenov et al. 2025: Lion/Signum need large batches",
    "signum": "Semenov et al. 2025: Lion/Signum need large batches",
}
TUNED = "Wen et al. 2025: tuning AdamW's LR alone gives ~2x over a default recipe"


def load_cells(metrics_dir: Path, ob: OptBenchConfig) -> tuple[dict, list[dict]]:
    """({(optimizer, size): sweep summary}, every run of the grid's sweep and seed cells)."""
    cells, runs = {}, []
    for opt in ob.optimizers:
        for size in ob.sizes:
            sweep = json.loads((metrics_dir / "sweep" / f"{opt}-{size}.json").read_text())
            seeds = json.loads((metrics_dir / "seeds" / f"{opt}-{size}.json").read_text())
            cells[opt, size] = sweep
            runs += [*sweep["runs"].values(), *seeds["runs"].values()]
    return cells, runs


def load_curves(plots_dir: Path, ob: OptBenchConfig) -> dict[tuple, list[tuple[float, float]]]:
    """{(optimizer, size, seed, lr): [(tokens, val loss), ...]} from the cells' curve CSVs."""
    curves: dict[tuple, list] = {}
    for kind in ("sweep", "seeds"):
        for opt in ob.optimizers:
            for size in ob.sizes:
                df = pl.read_csv(plots_dir / kind / f"{opt}-{size}.csv")
                for row in df.sort("tokens").iter_rows(named=True):
                    key = (row["optimizer"], row["size"], row["seed"], row["lr"])
                    curves.setdefault(key, []).append((row["tokens"], row["val_loss"]))
    return curves


def tokens_to_reach(curve: list[tuple[float, float]], target: float) -> float | None:
    """The first token count at which the curve is at or below `target`, linear between validation points (the
    first point itself when it is already there); None when it never gets there."""
    prev = None
    for tokens, loss in curve:
        if math.isfinite(loss) and loss <= target:
            if prev is None or not math.isfinite(prev[1]):
                return float(tokens)
            t0, l0 = prev
            return t0 + (tokens - t0) * (l0 - target) / (l0 - loss)
        prev = (tokens, loss)
    return None


def _final(runs: list[dict], opt: str, size: str, lr: float | None) -> dict[int, float]:
    """{seed: final val loss} of the runs at `lr` (non-finite: a diverged run counts as inf)."""
    return {r["seed"]: (r["val_loss"] if r["val_loss"] is not None and not r["diverged"] else math.inf)
            for r in runs if r["optimizer"] == opt and r["size"] == size and lr is not None and r["lr"] == lr}


def speedups(cells: dict, runs: list[dict], curves: dict, ob: OptBenchConfig, opt: str, size: str) -> dict:
    """{seed: AdamW tokens / optimizer tokens to reach AdamW's final loss, or None for never} (Wen et al. 2025)."""
    base_lr, lr = cells[ob.baseline, size]["best_lr"], cells[opt, size]["best_lr"]
    out = {}
    for seed, target in _final(runs, ob.baseline, size, base_lr).items():
        if not math.isfinite(target):
            continue
        t_base = tokens_to_reach(curves.get((ob.baseline, size, seed, base_lr), []), target)
        t_opt = tokens_to_reach(curves.get((opt, size, seed, lr), []), target)
        out[seed] = t_base / t_opt if t_base and t_opt else None
    return out


def table(params: Params, cells: dict, runs: list[dict], curves: dict) -> pl.DataFrame:
    ob = params.optimizers
    rows = []
    for (opt, size), c in cells.items():
        finals = [v for v in _final(runs, opt, size, c["best_lr"]).values()]
        ok = [v for v in finals if math.isfinite(v)]
        sp = speedups(cells, runs, curves, ob, opt, size)
        reached = [v for v in sp.values() if v is not None]
        grid = c["lr_grid"]
        rows.append({
            "optimizer": opt, "size": size, "family": c["family"], "library": c["library"],
            "params": next((r["params"] for r in c["runs"].values() if r.get("params")), None),
            "best_lr": c["best_lr"], "lr_at_edge": c["best_lr"] in (grid[0], grid[-1]),
            "diverged": f"{c['diverged']}/{c['n_runs']}", "n_seeds": len(ok),
            "val_loss": statistics.fmean(ok) if ok else None,
            "val_loss_sd": statistics.stdev(ok) if len(ok) > 1 else None,
            "speedup": statistics.fmean(reached) if reached else None, "reached": f"{len(reached)}/{len(sp)}",
            "step_time_ratio": c["step_time_ratio"], "state_bytes_per_param": c["state_bytes_per_param"],
            "peak_mem_mb": c["peak_mem_mb"], "published": PUBLISHED.get(params.optim[opt].name, ""),
        })
    return pl.DataFrame(rows).sort(["size", "val_loss"], nulls_last=True)


def markdown(df: pl.DataFrame) -> str:
    def f(x, fmt):
        return "–" if x is None else format(x, fmt)

    lines = ["| size | optimizer | family | best LR | final val loss | speed-up in data | step time | "
             "state B/param | peak MB | diverged | published (METHODS §B) |", "|" + "---|" * 11]
    for r in df.iter_rows(named=True):
        loss = f(r["val_loss"], ".4f") + ("" if r["val_loss_sd"] is None else f" ± {r['val_loss_sd']:.4f}")
        speed = "never" if r["speedup"] is None else f"{r['speedup']:.2f}x"
        lr = f(r["best_lr"], ".3g") + (" (edge)" if r["lr_at_edge"] else "")
        lines.append(f"| {r['size']} | {r['optimizer']} | {r['family']} | {lr} | {loss} (n={r['n_seeds']}) | "
                     f"{speed} ({r['reached']}) | {f(r['step_time_ratio'], '.2f')}x | "
                     f"{f(r['state_bytes_per_param'], '.2f')} | {f(r['peak_mem_mb'], '.0f')} | {r['diverged']} | "
                     f"{r['published']} |")
    return "\n".join(lines)


def claims(params: Params, cells: dict, runs: list[dict]) -> list[dict]:
    """Each optimizer against the baseline at each size, and the tuned baseline against its default LR, as loss
    differences at equal tokens paired by the rerun seeds (positive: the claim's direction)."""
    ob, entries = params.optimizers, []
    held_out = set(ob.rerun_seeds)
    metric = "final val loss difference at equal tokens, each at its best LR (seeds held out from the LR choice)"
    for size in ob.sizes:
        base = _final(runs, ob.baseline, size, cells[ob.baseline, size]["best_lr"])
        for opt in ob.optimizers:
            if opt == ob.baseline:
                continue
            mine = _final(runs, opt, size, cells[opt, size]["best_lr"])
            diffs = [base[s] - mine[s] for s in sorted(held_out & set(base) & set(mine))]
            entries.append(claim(f"b-{opt}-beats-{ob.baseline}-{size}",
                                 f"{opt} beats {ob.baseline} in data at size {size}", metric, diffs,
                                 PUBLISHED.get(params.optim[opt].name, "–")))
        default = _final(runs, ob.baseline, size, params.optim[ob.baseline].lr)
        diffs = [default[s] - base[s] for s in sorted(held_out & set(base) & set(default))]
        entries.append(claim(f"b-tuned-{ob.baseline}-{size}",
                             f"tuned {ob.baseline} LR beats the default recipe's at size {size}",
                             f"final val loss: {ob.baseline} at lr {params.optim[ob.baseline].lr:g} minus at the "
                             "sweep's best LR (seeds held out from the LR choice)", diffs, TUNED))
    return entries


def lr_sensitivity(cells: dict) -> pl.DataFrame:
    """optimizer, size, lr, val_loss (None: diverged) of the sweep: the LR-sensitivity plot's data."""
    return pl.DataFrame([{"optimizer": o, "size": s, "lr": r["lr"],
                          "val_loss": None if r["diverged"] else r["val_loss"]}
                         for (o, s), c in cells.items() for r in c["runs"].values()])


def plot(cells: dict, curves: dict, ob: OptBenchConfig, curves_png: Path, lr_png: Path) -> None:
    """Validation curves at each optimizer's best LR (sweep seed), and final loss against LR (× = diverged)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(ob.sizes)
    for path, kind in ((curves_png, "curves"), (lr_png, "lr")):
        fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4), squeeze=False)
        for ax, size in zip(axes[0], ob.sizes):
            for opt in ob.optimizers:
                c = cells[opt, size]
                if kind == "curves" and c["best_lr"] is not None:
                    pts = curves.get((opt, size, ob.seed, c["best_lr"]), [])
                    ax.plot([t for t, _ in pts], [v for _, v in pts], label=f"{opt} (lr {c['best_lr']:.3g})")
                elif kind == "lr":
                    rs = sorted(c["runs"].values(), key=lambda r: r["lr"])
                    line, = ax.plot([r["lr"] for r in rs if not r["diverged"]],
                                    [r["val_loss"] for r in rs if not r["diverged"]], marker="o", label=opt)
                    bad = [r["lr"] for r in rs if r["diverged"]]
                    top = max((r["val_loss"] for r in rs if not r["diverged"]), default=1.0)
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
