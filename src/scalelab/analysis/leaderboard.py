"""The optimizer leaderboard and claims of METHODS §B, from the sweep and rerun cells (scalelab.train.optbench).

Speed-up in data (Wen et al. 2025, arXiv 2509.02046), from end-of-run losses only: the baseline (tuned) is trained
to completion at every `budgets` fraction of the benchmark's tokens, each run with its own full schedule; on each
held-out seed its final losses are fitted with the saturating power law L(D) = E + A·D^−α (scalelab.analysis.powerlaw:
three parameters, dof = budgets − 3). An optimizer's speed-up on that seed is D_base(L_opt) / D_opt: the tokens the
fitted baseline needs to reach the optimizer's final loss over the tokens the optimizer used. A loss below the fit's
value at the largest budget is outside the fitted range and gives a bound, "> D_max / D_opt" (above the smallest
budget's: "< D_min / D_opt"), never an extrapolated or capped number. Over seeds: the mean and its t interval when every
seed is inside the range; else the bound the seeds support. Mid-run validation curves stay a secondary plot.

Per optimizer and size, also: the configuration the protocol chose (mean over the sweep seeds) and whether its LR is
still at a grid edge after extension; final loss over the held-out seeds; step-time ratio; optimizer-state bytes per
parameter and the optimizer step's own peak memory (hooks.step_peak_bytes); diverged runs of the sweep.

Claims: one row per published claim, with its source; rows with no published claim behind them are observations
(effect and interval, no verdict). Claims use the held-out rerun seeds only, and an LR still at an edge (either
arm) makes the claim "inconclusive (edge)".
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import polars as pl

from scalelab.config import OptBenchConfig, Params
from scalelab.analysis.claims import claim, interval_claim, t_interval
from scalelab.analysis.powerlaw import fit_power_law

WEN = "Wen et al. 2025 (arXiv 2509.02046)"
SEMENOV = "Semenov et al. 2025 (arXiv 2509.01440)"
# What METHODS §B quotes of the benchmark papers (no other numbers are ever typed in here).
MATRIX_LEAD = f"{WEN}: matrix-based optimizers (Muon, SOAP) lead, ~1.3-1.4x in data over well-tuned AdamW at ~0.1B"
MATRIX_SHRINKS = f"{WEN}: the matrix-based lead shrinks with scale (~1.1x at 1.2B)"
STRONG = f"{SEMENOV}: AdEMAMix and MARS strong"
BATCH = f"{SEMENOV}: Lion/Signum need large batches"
TUNED = f"{WEN}: tuning AdamW's LR alone gives ~2x over a default recipe"
OBSERVATION = "observation: no published claim in METHODS §B"
MATRIX, STRONG_NAMES = ("muon", "soap"), ("ademamix", "mars")
PUBLISHED = {"muon": MATRIX_LEAD, "soap": MATRIX_LEAD, "ademamix": STRONG, "mars": STRONG,
             "sophia": f"{SEMENOV}: Sophia unstable on long runs", "lion": BATCH, "signum": BATCH}


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
    """{(optimizer, size, seed, lr): [(tokens, val loss), ...]} of the budget-1 runs, from the cells' curve CSVs."""
    curves: dict[tuple, list] = {}
    for kind in ("sweep", "seeds"):
        for opt in ob.optimizers:
            for size in ob.sizes:
                df = pl.read_csv(plots_dir / kind / f"{opt}-{size}.csv")
                one = df.filter((pl.col("budget") == 1.0) & (pl.col("batch") == 1))
                for row in one.sort("tokens").iter_rows(named=True):
                    key = (row["optimizer"], row["size"], row["seed"], row["run"])
                    curves.setdefault(key, []).append((row["tokens"], row["val_loss"]))
    return curves


def _ok(r: dict) -> bool:
    return not r["diverged"] and r["val_loss"] is not None and math.isfinite(r["val_loss"])


def finals(runs: list[dict], opt: str, size: str, hp: dict | None, budget: float = 1.0,
           batch: int = 1) -> dict[int, dict]:
    """{seed: run} of `opt` at `size` with hyperparameters `hp`, data budget `budget` and batch factor `batch`."""
    return {r["seed"]: r for r in runs if r["optimizer"] == opt and r["size"] == size and hp is not None
            and r["hp"] == hp and r["budget"] == budget and r["batch"] == batch}


def baseline_fit(runs: list[dict], ob: OptBenchConfig, size: str, hp: dict | None, seed: int):
    """The power-law fit of the baseline's final loss against tokens over the budgets on `seed` (None without ≥ 3
    finite budgets), with its fitted token range."""
    pts = [(r["tokens"], r["val_loss"]) for b in ob.budgets
           for r in [finals(runs, ob.baseline, size, hp, b).get(seed)] if r is not None and _ok(r)]
    if len({t for t, _ in pts}) < 3:
        return None, None
    return fit_power_law([t for t, _ in pts], [v for _, v in pts]), (min(t for t, _ in pts), max(t for t, _ in pts))


def data_speedup(law, span: tuple[float, float], loss: float, tokens: float) -> tuple[float, str]:
    """(value, kind) of D_base(loss) / tokens on the fitted law: kind "=" inside the fitted range, ">" a lower bound
    (the loss is below what the largest budget reached), "<" an upper bound (above the smallest budget's)."""
    lo, hi = span
    if loss < float(law(hi)):
        return hi / tokens, ">"
    if loss > float(law(lo)):
        return lo / tokens, "<"
    return law.inverse(loss) / tokens, "="


def speedups(cells: dict, runs: list[dict], ob: OptBenchConfig, opt: str, size: str) -> dict:
    """Per held-out seed {seed: (value, kind) or (None, why)}, and the fits' dof, of `opt`'s speed-up in data."""
    base_hp, hp = cells[ob.baseline, size]["best_hp"], cells[opt, size]["best_hp"]
    mine = finals(runs, opt, size, hp)
    out, dof = {}, None
    for seed in ob.rerun_seeds:
        fit, span = baseline_fit(runs, ob, size, base_hp, seed)
        r = mine.get(seed)
        if r is None or not _ok(r):
            out[seed] = (None, "diverged" if r else "no run")
        elif fit is None or not fit.identified:
            out[seed] = (None, f"baseline fit: {fit.reason if fit else 'fewer than 3 budgets'}")
        else:
            out[seed], dof = data_speedup(fit.law, span, r["val_loss"], r["tokens"]), fit.dof
    return {"seeds": out, "dof": dof}


def summarise(per_seed: dict, level: float = 0.95) -> dict:
    """The seeds' speed-ups as one entry: mean and t interval when all are inside the range; a bound when some are
    beyond it on one side only (the mean of values and bounds is then itself that bound); else why not."""
    vals = list(per_seed.values())
    if not vals or any(v is None for v, _ in vals):
        why = next((k for v, k in vals if v is None), "no seeds")
        return {"speedup": None, "kind": why, "low": None, "high": None, "n": len(vals)}
    kinds = {k for _, k in vals}
    mean = statistics.fmean(v for v, _ in vals)
    if kinds == {"="}:
        ci = t_interval([v for v, _ in vals], level)
        return {"speedup": mean, "kind": "=", "low": ci and ci[1], "high": ci and ci[2], "n": len(vals)}
    side = kinds - {"="}
    kind = side.pop() if len(side) == 1 else "outside the range on both sides"
    return {"speedup": mean if kind in "<>" else None, "kind": kind, "low": None, "high": None, "n": len(vals)}


def speedup_text(s: dict) -> str:
    if s["speedup"] is None:
        return f"– ({s['kind']})"
    if s["kind"] in "<>":
        return f"{s['kind']} {s['speedup']:.2f}x"
    return f"{s['speedup']:.2f}x" + ("" if s["low"] is None else f" [{s['low']:.2f}, {s['high']:.2f}]")


def table(params: Params, cells: dict, runs: list[dict]) -> pl.DataFrame:
    ob = params.optimizers
    rows = []
    for (opt, size), c in cells.items():
        ok = [r["val_loss"] for r in finals(runs, opt, size, c["best_hp"]).values()
              if r["seed"] in ob.rerun_seeds and _ok(r)]
        sp = speedups(cells, runs, ob, opt, size)
        s = summarise(sp["seeds"])
        rows.append({
            "optimizer": opt, "size": size, "family": c["family"], "library": c["library"],
            "params": next((r["params"] for r in c["runs"].values() if r.get("params")), None),
            "best_lr": c["best_lr"], "best_hp": json.dumps(c["best_hp"]), "lr_at_edge": c["lr_at_edge"],
            "extra_points": c["extra_points"], "diverged": f"{c['diverged']}/{c['n_runs']}", "n_seeds": len(ok),
            "val_loss": statistics.fmean(ok) if ok else None,
            "val_loss_sd": statistics.stdev(ok) if len(ok) > 1 else None,
            "speedup": s["speedup"], "speedup_kind": s["kind"], "speedup_low": s["low"], "speedup_high": s["high"],
            "speedup_text": speedup_text(s), "fit_dof": sp["dof"],
            "step_time_ratio": c["step_time_ratio"], "state_bytes_per_param": c["state_bytes_per_param"],
            "step_peak_mb": c["step_peak_mb"], "step_peak_bytes_per_param": c["step_peak_bytes_per_param"],
            "published": "baseline (the fitted reference curve)" if opt == ob.baseline
            else PUBLISHED.get(params.optim[opt].name, OBSERVATION),
        })
    return pl.DataFrame(rows).sort(["size", "val_loss"], nulls_last=True)


def markdown(df: pl.DataFrame) -> str:
    def f(x, fmt):
        return "–" if x is None else format(x, fmt)

    lines = ["| size | optimizer | family | chosen (sweep-seed mean) | final val loss (held out) | speed-up in data "
             "(end-of-run, fitted baseline) | step time | state B/param | step peak B/param | diverged | published |",
             "|" + "---|" * 11]
    for r in df.iter_rows(named=True):
        loss = f(r["val_loss"], ".4f") + ("" if r["val_loss_sd"] is None else f" ± {r['val_loss_sd']:.4f}")
        hp = ", ".join(f"{k} {v:.3g}" for k, v in (json.loads(r["best_hp"]) or {}).items() if v is not None)
        hp = (hp or "–") + (" (edge)" if r["lr_at_edge"] else "")
        lines.append(f"| {r['size']} | {r['optimizer']} | {r['family']} | {hp} | {loss} (n={r['n_seeds']}) | "
                     f"{r['speedup_text']} | {f(r['step_time_ratio'], '.2f')}x | "
                     f"{f(r['state_bytes_per_param'], '.2f')} | {f(r['step_peak_bytes_per_param'], '.2f')} | "
                     f"{r['diverged']} | {r['published']} |")
    return "\n".join(lines)


def _edge(cells: dict, *keys) -> bool:
    return any(cells[k]["lr_at_edge"] or cells[k]["best_hp"] is None for k in keys)


def _speedup_claim(id: str, text: str, s: dict, edge: bool, published: str) -> dict:
    """speed-up − 1 > 0 decided on its t interval, or on a bound (a lower bound above 1 reproduces, an upper bound
    below 1 contradicts, any other bound is inconclusive)."""
    metric = "speed-up in data − 1: baseline tokens to reach the optimizer's final loss (fitted end-of-run curve) / its tokens"
    rule = "95% t interval over held-out seeds of speed-up − 1 (or a bound outside the fitted range); edge LR inconclusive"
    effect = None if s["speedup"] is None else s["speedup"] - 1
    unusable = "edge" if edge else None if s["speedup"] is not None else s["kind"]
    interval = (s["low"] - 1, s["high"] - 1) if s["low"] is not None else None
    if not unusable and s["kind"] in "<>":
        bound = s["speedup"] - 1
        interval = (bound, math.inf) if s["kind"] == ">" else (-math.inf, bound)
    e = interval_claim(id, text, metric, effect, interval, s["n"], rule, published, unusable)
    if interval and math.isinf(interval[0] + interval[1]):  # a bound has no half-width
        e["spread"] = None
    return e


def claims(params: Params, cells: dict, runs: list[dict]) -> list[dict]:
    """One entry per published claim (module doc), then observations for the optimizers no paper speaks of."""
    ob, entries, base = params.optimizers, [], params.optimizers.baseline
    held = list(ob.rerun_seeds)
    names = {o: params.optim[o].name for o in ob.optimizers}
    equal = "final val loss difference at equal tokens (baseline − optimizer), held-out seeds"

    def gaps(opt: str, size: str, batch: int = 1) -> dict[int, float]:
        b = finals(runs, base, size, cells[base, size]["best_hp"], batch=batch)
        m = finals(runs, opt, size, cells[opt, size]["best_hp"], batch=batch)
        return {s: b[s]["val_loss"] - m[s]["val_loss"] for s in held if s in b and s in m and _ok(b[s]) and _ok(m[s])}

    def loss_diffs(opt: str, size: str) -> list[float]:
        return list(gaps(opt, size).values())

    per_seed = {(o, size): speedups(cells, runs, ob, o, size)["seeds"] for o in ob.optimizers for size in ob.sizes}
    for opt in [o for o in ob.optimizers if names[o] in MATRIX]:
        for size in ob.sizes:
            entries.append(_speedup_claim(f"b-wen-{opt}-leads-{size}", f"{opt} beats tuned {base} in data at {size}",
                                          summarise(per_seed[opt, size]), _edge(cells, (opt, size), (base, size)),
                                          MATRIX_LEAD))
        small, large = ob.sizes[0], ob.sizes[-1]
        a, b = per_seed[opt, small], per_seed[opt, large]
        diffs = [a[s][0] - b[s][0] for s in held if a[s][1] == "=" and b[s][1] == "="]
        e = claim(f"b-wen-{opt}-lead-shrinks", f"{opt}'s speed-up shrinks from {small} to {large}",
                  f"speed-up({small}) − speed-up({large}), seeds inside both fitted ranges", diffs, MATRIX_SHRINKS)
        if _edge(cells, *[(o, s) for o in (opt, base) for s in (small, large)]):
            e["verdict"] = "inconclusive (edge)"
        entries.append(e)
    for opt in ob.batch_optimizers:
        for size in ob.sizes:
            small, large = gaps(opt, size), gaps(opt, size, ob.batch_factor)
            e = claim(f"b-semenov-{opt}-batch-{size}", f"{opt}'s gap to tuned {base} closes at {ob.batch_factor}x the "
                      f"batch at {size}", f"(baseline − {opt}) final loss at {ob.batch_factor}x batch minus at 1x, same "
                      "tokens, LR chosen at 1x (held-out seeds)", [large[s] - small[s] for s in held
                                                                   if s in small and s in large],
                      BATCH if names[opt] in ("lion", "signum") else OBSERVATION)
            if names[opt] not in ("lion", "signum"):
                e["verdict"] = f"observation ({e['verdict']})"
            elif _edge(cells, (opt, size), (base, size)):
                e["verdict"] = "inconclusive (edge)"
            entries.append(e)
    for opt in ob.optimizers:
        if opt == base or names[opt] in MATRIX:
            continue
        for size in ob.sizes:
            strong = names[opt] in STRONG_NAMES
            e = claim(f"b-{'semenov' if strong else 'obs'}-{opt}-{size}", f"{opt} beats tuned {base} at {size}",
                      equal, loss_diffs(opt, size), STRONG if strong else PUBLISHED.get(names[opt], OBSERVATION))
            if not strong:  # no published claim of this direction: reported, not decided
                e["verdict"] = f"observation ({e['verdict']})"
            elif _edge(cells, (opt, size), (base, size)):
                e["verdict"] = "inconclusive (edge)"
            entries.append(e)
    for size in ob.sizes:
        default = finals(runs, base, size, {"lr": params.optim[base].lr})
        tuned = finals(runs, base, size, cells[base, size]["best_hp"])
        diffs = [default[s]["val_loss"] - tuned[s]["val_loss"] for s in held
                 if s in default and s in tuned and _ok(default[s]) and _ok(tuned[s])]
        entries.append(claim(f"b-tuned-{base}-{size}", f"tuned {base} beats its default recipe at {size}",
                             f"final val loss: {base} at its default recipe minus at the protocol's choice "
                             "(held-out seeds)", diffs, TUNED))
    return entries


def lr_sensitivity(cells: dict) -> pl.DataFrame:
    """optimizer, size, lr, seed, val_loss (None: diverged) of the LR trials (second hyperparameters at their
    defaults): the LR-sensitivity plot's data."""
    return pl.DataFrame([{"optimizer": o, "size": s, "lr": r["lr"], "seed": r["seed"],
                          "val_loss": r["val_loss"] if _ok(r) else None}
                         for (o, s), c in cells.items() for r in c["runs"].values() if list(r["hp"]) == ["lr"]],
                        schema={"optimizer": pl.String, "size": pl.String, "lr": pl.Float64, "seed": pl.Int64,
                                "val_loss": pl.Float64})


def plot(cells: dict, curves: dict, ob: OptBenchConfig, curves_png: Path, lr_png: Path) -> None:
    """Secondary: mid-run validation curves of each optimizer's chosen configuration (first sweep seed; not a
    claim: mid-schedule losses mislead), and the sweep-seed mean final loss against LR (× = diverged)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from scalelab.optim.protocol import run_name

    sens = lr_sensitivity(cells)
    n = len(ob.sizes)
    for path, kind in ((curves_png, "curves"), (lr_png, "lr")):
        fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4), squeeze=False)
        for ax, size in zip(axes[0], ob.sizes):
            for opt in ob.optimizers:
                c = cells[opt, size]
                if kind == "curves" and c["best_hp"] is not None:
                    seed = ob.sweep_seeds[0]
                    pts = curves.get((opt, size, seed, run_name(c["best_hp"], seed)), [])
                    ax.plot([t for t, _ in pts], [v for _, v in pts], label=f"{opt} (lr {c['best_lr']:.3g})")
                elif kind == "lr":
                    df = sens.filter((pl.col("optimizer") == opt) & (pl.col("size") == size)).group_by("lr").agg(
                        pl.col("val_loss").mean(), pl.col("val_loss").null_count().alias("bad")).sort("lr")
                    ok = df.filter(pl.col("bad") == 0)
                    line, = ax.plot(ok["lr"].to_list(), ok["val_loss"].to_list(), marker="o", label=opt)
                    bad = df.filter(pl.col("bad") > 0)["lr"].to_list()
                    top = max(ok["val_loss"].to_list(), default=1.0)
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
