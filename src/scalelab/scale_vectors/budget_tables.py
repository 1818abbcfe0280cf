"""The README's generated tables of results/sv-paper-budget (scalelab.study.ledger.refresh_readme calls each with
the files its block names): the LR sweep per size and arm, the ledger as claims × sizes, and the loss of every
variant against non-embedding parameters with its power-law fit over the sizes."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from scalelab.ledger import claims
from scalelab.scale_vectors import claims as claims_a, scaling
from scalelab.scale_vectors.paper_budget import ARMS, TUNED, held_out, ladder, read, sizes_of


def tuning_table(cells_dir: Path) -> str:
    """The sweep at a glance: per size and arm each rung's loss on the sweep seed, the choice."""
    params, cells, choices = read(Path(cells_dir).parent)
    rungs = [r for r, _ in ladder(params)]
    rows = [f"| size | arm | {' | '.join(rungs)} | chosen |", "|---" * (len(rungs) + 3) + "|"]
    for (size, arm), c in choices.items():
        vals = [f"{c.scores[r]:.4f}" if r in c.scores else "" for r in rungs]
        state = c.best if c.extend is None else f"extend to {c.extend}"
        rows.append(f"| {size} | {arm} | {' | '.join(vals)} | {state or '–'} |")
    return "\n".join(rows)


def size_table(entries: list[dict]) -> str:
    """The ledger at a glance: one row per claim, one column per size, each cell the effect ± spread and verdict, an
    untested one with the premises that failed; the exponent's row last."""
    sizes = list(dict.fromkeys(e["id"].split("@")[1] for e in entries if "@" in e["id"]))
    by_id = {e["id"]: e for e in entries}
    keys = list(dict.fromkeys(e["id"].split("@")[0].split(".", 1)[1] for e in entries if "@" in e["id"]))

    def cell(e: dict | None) -> str:
        if e is None:
            return ""
        why = ", ".join(p["name"] for p in claims.failed(e["premises"]))
        num = "" if e["effect"] is None else f"{e['effect']:+.4f}" + ("" if e["spread"] is None else
                                                                       f" ± {e['spread']:.4f}") + " "
        return f"{num}**{claims.verdict_of(e)}**" + (f" ({why})" if why else "")

    rows = [f"| claim (δ) | {' | '.join(sizes)} |", "|---" * (len(sizes) + 1) + "|"]
    for key in keys:
        first = by_id[f"{TUNED}.{key}@{sizes[0]}"]
        label = claims_a.LABELS.get(key, key)
        rows.append(f"| {label} ({first['smallest_effect']:g}) | "
                    f"{' | '.join(cell(by_id.get(f'{TUNED}.{key}@{s}')) for s in sizes)} |")
    alpha = by_id.get(f"{TUNED}.alpha_unified")
    if alpha:
        rows.append(f"| {claims_a.LABELS['alpha_unified']} ({alpha['smallest_effect']:g}), over the sizes | "
                    f"{alpha['verdict']} |" + " |" * (len(sizes) - 1))
    return "\n".join(rows)


def loss_table(cells_dir: Path) -> str:
    """Loss against non-embedding parameters N, per variant: the held-out seeds' mean final validation loss ± their
    sample std (seeds) at each size, at its arm's chosen rung, and L(N) = E + A·N^-α fitted over the sizes on the
    seeds that have every size (scalelab.ledger.powerlaw: α with its seed-bootstrap interval where identified, why
    not where not). N is each variant's own (a variant with more γ has a few more parameters)."""
    params, cells, choices = read(Path(cells_dir).parent)
    tuned, sizes = held_out(cells, choices), sizes_of(params)
    fits = scaling.fit_all(tuned, params.scaling, recipe=TUNED) if tuned.height else {}
    rung = {s: ", ".join(f"{a} {choices[s, a].best}" for a in ARMS) for s in sizes}
    rows = [f"| variant | {' | '.join(f'{s} ({rung[s]})' for s in sizes)} | L(N) over the sizes |",
            "|---" * (len(sizes) + 2) + "|"]
    for variant in params.pretrain.grid.recipe_variants:
        mine = tuned.filter(pl.col("variant") == variant)
        vals = []
        for size in sizes:
            at = mine.filter(pl.col("size") == size)
            if at.height == 0:
                vals.append("")
                continue
            std = at["val_loss"].std(ddof=1) if at.height > 1 else None
            vals.append(f"{at['val_loss'].mean():.4f}" + ("" if std is None else f" ± {std:.4f}")
                        + f" ({at.height}; N {at['non_embedding_params'][0]:,})")
        f = fits.get(variant)
        if f is None:
            fit = f"no fit: fewer than {params.scaling.min_sizes} sizes with every seed"
        elif f.identified:
            lo, hi = f.alpha_ci or (float("nan"), float("nan"))
            fit = f"α {f.law.alpha:.3f} [{lo:.3f}, {hi:.3f}], E {f.law.E:.3f}, dof {f.dof}"
        else:
            fit = f"not identified ({f.reason})"
        rows.append(f"| {variant} | {' | '.join(vals)} | {fit} |")
    return "\n".join(rows)
