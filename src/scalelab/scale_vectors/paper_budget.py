"""The scale-vector claims near the paper's token budget (results/sv-paper-budget, run by `scalelab study
sv-paper-budget`; what it runs: configs/sv-paper-budget.yaml): every variant at xxs, xs and s trained to 20 tokens per
non-embedding parameter, the peak LR of the two tuned arms (standard, unified) chosen per size on a sweep seed, the
claims decided on held-out seeds by the rule of scalelab.ledger.claims.

The LR ladder: a rung is a recipe that is the base recipe with its AdamW's lr scaled (`rung_lr` refuses any other
difference, so a rung cannot carry a second treatment); rungs are a factor 2 apart. The choice (`choose`): on the
sweep seed, the rung with the lowest final validation loss among those run; where it is the lowest or highest rung
run and the ladder has a rung past it, the sweep is not finished and `extend` names that rung (the grid extended at
its edge, one rung at a time; the spec's next slice adds it). The held-out seeds run every variant at standard's rung
and unified at its own (`held_out`).

Premises, per claim and size, before any verdict (scalelab.ledger.claims rule 1):
- **budget**: ≥ NEAR_PAPER tokens per non-embedding parameter: near the paper's regime (half its plan's lower end);
  the value gives both counts (per non-embedding parameter and per parameter);
- **passes**: no compared cell past MAX_PASSES passes over the training split (a corpus seen more often is a
  memorisation regime the paper's runs never reach);
- **LR chosen** (per tuned arm the claim reads): the sweep finished (not at an extendable edge), and the chosen rung
  interior by the shared rule with its noise tolerance (scalelab.ledger.interior.edge: an edge that beats its
  neighbour by less than the held-out seeds' standard deviation at the chosen rung is interior);
- **held out at the chosen LR**: the compared variants have held-out cells at their arm's chosen rung;
- **γ moved** (decay claims): the decayed kind's mean γ (the blocks' input γ, or the output γ; the final norm's apart
  in its own premise, scalelab.scale_vectors.premises) shrank, paired by seed against standard, by more than the
  threshold the spec fixes (params scaling.gamma_moves); **γ left init** (the other structure claims).

Smallest effects of interest (SESOI below) are the scale-vector registry's (scalelab.scale_vectors.claims), declared
before any cell of this study ran and measured on no study: their rows read "declared before the cells ran".
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from scalelab.config import Params
from scalelab.ledger import claims, studies
from scalelab.ledger.interior import edge
from scalelab.scale_vectors import claims as claims_a, premises as premises_a, scaling
from scalelab.scale_vectors.dose import varied_optimizer
from scalelab.scale_vectors.premises import Cells

STUDY = "sv-paper-budget"
SWEEP_SEED = 0  # the seed the LR is chosen on; every claim reads the other seeds only
ARMS = ("standard", "unified")  # the tuned arms; every other variant runs at standard's rung
TUNED = "tuned"  # the recipe label of the held-out cells read by the claims (each at its arm's chosen rung)
TOKENS_PER_PARAM = 20.0  # the budget (per non-embedding parameter): the paper's plan's lower end (premises.PAPER)
NEAR_PAPER = 10.0  # the budget premise: half the plan's lower end still reads as near the paper's regime
MAX_PASSES = 4.0  # the passes premise: at most this many passes over the training split
# The smallest effects of interest, per claim kind: the registry's conventions (0.01 nats of final validation loss, 1%
# in perplexity; 0.01 in α), declared at claims_a.DECLARED, before this study's first cell (the reasons rest on no
# study's results, so they may contradict)
SESOI = {"loss": claims_a.LOSS_SESOI, "alpha": claims_a.ALPHA_SESOI}


def rung_lr(params: Params, recipe: str) -> float:
    """The peak lr of a rung. ValueError where the recipe differs from the base recipe in more than its optimizer, or
    its optimizer from the base recipe's in more than lr: a rung varies the LR and nothing else."""
    opt = varied_optimizer(params, recipe, "lr", "rung of the base recipe's LR ladder")
    return opt.lr


def ladder(params: Params) -> list[tuple[str, float]]:
    """The grid's rungs (recipe, lr), by lr; each checked by `rung_lr`, two apart by a factor of 2."""
    rungs = sorted(((r, rung_lr(params, r)) for r in params.pretrain.grid.recipes), key=lambda x: x[1])
    for (a, la), (b, lb) in zip(rungs, rungs[1:]):
        if not math.isclose(lb / la, 2.0, rel_tol=1e-6):
            raise ValueError(f"rungs {a} ({la:g}) and {b} ({lb:g}): not a factor 2 apart (a ladder of ratio 2)")
    return rungs


@dataclass(frozen=True)
class Choice:
    """The LR choice of one arm at one size, from its sweep-seed cells."""

    size: str
    arm: str
    scores: dict[str, float]  # rung -> final val loss on the sweep seed (nan: diverged)
    lrs: dict[str, float]  # rung -> lr, every rung of the ladder
    best: str | None  # the rung with the lowest loss (None: nothing run)
    extend: str | None  # the next rung out where best sits at an edge of the rungs run with a rung past it

    def edge(self, tolerance: float) -> str | None:
        """Why the choice is not interior (scalelab.ledger.interior.edge on the lrs run), None where it is."""
        return edge({self.lrs[r]: s for r, s in self.scores.items()}, tolerance)

    def text(self) -> str:
        run = ", ".join(f"{self.lrs[r]:g}: {s:.4f}" for r, s in sorted(self.scores.items(), key=lambda x: self.lrs[x[0]]))
        return f"{self.arm} at {self.best} ({self.lrs[self.best]:g}) of {{{run}}}" if self.best else f"{self.arm}: none run"


def choose(cells: pl.DataFrame, params: Params, size: str, arm: str) -> Choice:
    rungs = ladder(params)
    lrs = dict(rungs)
    rows = cells.filter((pl.col("variant") == arm) & (pl.col("size") == size) & (pl.col("seed") == SWEEP_SEED)
                        & pl.col("recipe").is_in(list(lrs)))
    scores = {r["recipe"]: (r["val_loss"] if r["val_loss"] is not None else math.nan) for r in rows.iter_rows(named=True)}
    finite = {r: s for r, s in scores.items() if math.isfinite(s)}
    if not finite:
        return Choice(size, arm, scores, lrs, None, None)
    best = min(finite, key=finite.get)
    order = [r for r, _ in rungs]
    run = sorted(scores, key=order.index)
    extend = None
    if best == run[0] and order.index(best) > 0:
        extend = order[order.index(best) - 1]
    elif best == run[-1] and order.index(best) < len(order) - 1:
        extend = order[order.index(best) + 1]
    return Choice(size, arm, scores, lrs, best, extend)


def held_out(cells: pl.DataFrame, choices: dict[tuple[str, str], Choice]) -> pl.DataFrame:
    """The cells the claims read, relabelled recipe TUNED: the held-out seeds of every variant at standard's chosen
    rung of its size, unified's at unified's (sizes whose sweep is not finished have none)."""
    parts = []
    for (size, arm), choice in choices.items():
        if choice.best is None or choice.extend is not None:
            continue
        which = pl.col("variant") == "unified" if arm == "unified" else pl.col("variant") != "unified"
        parts.append(cells.filter(which & (pl.col("size") == size) & (pl.col("recipe") == choice.best)
                                  & (pl.col("seed") != SWEEP_SEED)))
    return (pl.concat(parts) if parts else cells.clear()).with_columns(pl.lit(TUNED).alias("recipe"))


# ---------------------------------------------------------------- premises
def budget_premise(rows: list[dict]) -> dict:
    """≥ NEAR_PAPER tokens per non-embedding parameter in every compared cell; the value by both counts."""
    if not rows or any(r.get("tokens") is None for r in rows):
        return claims.premise("budget", "no cells", False, f"≥ {NEAR_PAPER:g} tokens per non-embedding parameter")
    per_ne = min(r["tokens"] / r["non_embedding_params"] for r in rows)
    per_all = min(r["tokens"] / r["params"] for r in rows)
    return claims.premise("budget", f"{per_ne:.3g} tokens per non-embedding parameter, {per_all:.3g} per parameter",
                          per_ne >= NEAR_PAPER, f"≥ {NEAR_PAPER:g} tokens per non-embedding parameter: near the "
                          f"paper's regime (its plan's lower end {TOKENS_PER_PARAM:g})")


def passes_premise(rows: list[dict]) -> dict:
    """No compared cell past MAX_PASSES passes over its training split."""
    need = f"at most {MAX_PASSES:g} passes over the training split"
    if not rows or any(not r.get("train_tokens") or r.get("tokens") is None for r in rows):
        return claims.premise("passes", "not recorded", False, need)
    worst = max(rows, key=lambda r: r["tokens"] / r["train_tokens"])
    passes = worst["tokens"] / worst["train_tokens"]
    return claims.premise("passes", f"{passes:.3g} over {worst['train_tokens']:,} training tokens",
                          passes <= MAX_PASSES, need)


def lr_premise(choice: Choice, tuned: Cells) -> dict:
    """The arm's LR chosen: the sweep finished and its choice interior within the held-out seeds' spread."""
    name = f"LR chosen ({choice.arm}, {choice.size})"
    need = ("the sweep finished (best not at an edge of the rungs run that the ladder extends) and the best rung "
            "interior, an edge within the held-out seeds' std of its neighbour counting as interior")
    if choice.best is None:
        return claims.premise(name, "no sweep cell", False, need)
    if choice.extend is not None:
        return claims.premise(name, f"{choice.text()}: extend to {choice.extend}", False, need)
    held = [v for (r, var, s, _), v in tuned.loss.items() if var == choice.arm and s == choice.size]
    spread = statistics.stdev(held) if len(held) >= 2 else 0.0
    why = choice.edge(spread)
    return claims.premise(name, f"{choice.text()}; held-out std {spread:.4f}" + (f"; {why}" if why else ""),
                          why is None, need)


def held_out_premise(tuned: Cells, size: str, variants: tuple[str, ...], choices: dict) -> dict:
    """Each compared variant has ≥ 2 held-out seeds at its arm's chosen rung."""
    have = {v: sorted(seed for (_, var, s, seed) in tuned.loss if var == v and s == size) for v in variants}
    value = "; ".join(f"{v} at {choices[size, 'unified' if v == 'unified' else 'standard'].best}: "
                      f"seeds {','.join(map(str, seeds)) or 'none'}" for v, seeds in have.items())
    return claims.premise("held out at the chosen LR", value, all(len(s) >= 2 for s in have.values()),
                          "≥ 2 held-out seeds of each compared variant at its arm's chosen rung")


# ---------------------------------------------------------------- the ledger
def _rows(tuned: pl.DataFrame, size: str | None, variants: tuple[str, ...]) -> list[dict]:
    keep = tuned.filter(pl.col("variant").is_in(list(variants)))
    return (keep if size is None else keep.filter(pl.col("size") == size)).to_dicts()


def _regime(rows: list[dict]) -> dict:
    """The largest compared model and its cells' own budget (the budget differs by size: the params give none)."""
    top = max(rows, key=lambda r: (r["non_embedding_params"], r["params"])) if rows else None
    return claims.regime(premises_a.PAPER, params=top and top["params"],
                         non_embedding_params=top and top["non_embedding_params"], tokens=top and top["tokens"],
                         steps=top and top["steps"], paper_tokens_per_param=premises_a.PAPER_TOKENS_PER_PARAM,
                         scope=premises_a.SCOPE)


def _arms(variants: tuple[str, ...]) -> list[str]:
    return ["standard"] + (["unified"] if "unified" in variants else [])


def ordering_claims(tuned: pl.DataFrame, params: Params, choices: dict, sizes: list[str], level: float,
                    gamma_moves: float) -> list[dict]:
    """Each ordering of the registry (claims_a.ORDERINGS) and unified_best, at each size, on the held-out seeds."""
    index, variants = Cells(tuned), list(params.pretrain.grid.recipe_variants)
    out_gammas = claims_a.output_gammas(params, "base")
    specs = [(key, text.format(out=out_gammas), worse, better, published, treated)
             for key, text, worse, better, published, treated in claims_a.ORDERINGS
             if worse in variants and better in variants]
    others = tuple(v for v in variants if v != "unified")
    entries = []
    for size in sizes:
        for key, text, worse, better, published, treated in [*specs, ("unified_best", None, None, None, None, None)]:
            compared = (worse, better) if key != "unified_best" else (*others, "unified")
            rows = _rows(tuned, size, compared)
            premises = [budget_premise(rows), passes_premise(rows),
                        *(lr_premise(choices[size, arm], index) for arm in _arms(compared)),
                        held_out_premise(index, size, compared, choices)]
            if key in claims_a.DECAY_CLAIMS:
                apart = premises_a.cells_moved_apart(index, params, TUNED, treated, [size], level, gamma_moves)
                moved, final = apart or (claims.premise("γ moved", "kinds' means not recorded apart", False,
                                                        f"the decayed kind's mean γ apart, shrunk by > {gamma_moves}"),
                                         None)
                premises += [moved] + ([premises_a.final_norm_premise(params.model.variants[treated], "the cells",
                                                                       final, level)]
                                       if params.model.variants[treated].wd_input_scales else [])
            else:
                premises.append(index.left_init(TUNED, treated or "unified", [size]))
            if key == "unified_best":
                def margin(sz: str, seed: int) -> float | None:
                    u = index.loss.get((TUNED, "unified", sz, seed))
                    rest = [index.loss.get((TUNED, v, sz, seed)) for v in others]
                    return None if u is None or None in rest else min(rest) - u
                diffs, text = index.per_seed(TUNED, margin, [size]), f"unified is the best variant ({', '.join(others)})"
                metric, published = "best other variant's final val loss − unified's (nats), paired by seed", \
                    claims_a.PUB_UNION
            else:
                diffs = index.per_seed(TUNED, index.gap(TUNED, worse, better), [size])
                metric = "final val loss difference (nats), paired by seed"
            entries.append(claims.claim(f"{TUNED}.{key}@{size}", f"{text} at size {size} (tuned LR, 20 tokens per "
                                        "non-embedding parameter)", f"{metric}, size {size}, held-out seeds", diffs,
                                        published, level, regime=_regime(rows), premises=premises,
                                        smallest_effect=SESOI["loss"]))
    return entries


def scaling_claim(tuned: pl.DataFrame, params: Params, choices: dict, sizes: list[str]) -> list[dict]:
    """unified against standard in the exponent of L(N) over the sizes (claims_a.scaling_claim, on the held-out
    cells), with this study's premises at every size; a row even where no fit could be made, saying why."""
    rows = _rows(tuned, None, ARMS)
    index = Cells(tuned)
    premises = [budget_premise(rows), passes_premise(rows),
                *(lr_premise(choices[size, arm], index) for size in sizes for arm in ARMS)]
    fits = scaling.fit_all(tuned, params.scaling, recipe=TUNED) if tuned.height else {}
    out = claims_a.scaling_claim(tuned, fits, params, TUNED, regime=_regime(rows), premises=premises,
                                 smallest_effect=SESOI["alpha"]) if tuned.height else []
    if out:
        return out
    return [claims.interval_claim(f"{TUNED}.alpha_unified", f"{TUNED}: unified scales better than standard (larger α)",
                                  "α of L(N) = E + A·N^-α (non-embedding N)", None, None, 0,
                                  "α fitted per seed over the sizes, paired by seed", claims_a.PUB_SCALING,
                                  f"no fit: fewer than {params.scaling.min_sizes} sizes of held-out cells of both arms",
                                  regime=_regime(rows), premises=premises, smallest_effect=SESOI["alpha"])]


def sizes_of(params: Params) -> list[str]:
    """The grid's sizes, smallest model first."""
    grid = params.pretrain.grid
    n = {s: premises_a.dense_counts(params.resolve_model(s, "standard", vocab_size=2))[1] for s in grid.recipe_sizes}
    return sorted(grid.recipe_sizes, key=n.get)


def read(folder: Path) -> tuple[Params, pl.DataFrame, dict[tuple[str, str], Choice]]:
    """The study's params, every committed cell, and the LR choice of each (size, arm)."""
    folder = Path(folder)
    params = premises_a.study_params(folder)
    cells = scaling.collect(studies.cell_files(folder, "metrics/pretrain", ".json"))
    for recipe in cells["recipe"].unique().to_list():
        rung_lr(params, recipe)  # every cell is a rung of the ladder
    choices = {(s, a): choose(cells, params, s, a) for s in sizes_of(params) for a in ARMS}
    return params, cells, choices


def paper_budget(folder: Path) -> list[dict]:
    """The ledger of results/sv-paper-budget: every ordering at each size, unified against standard in α."""
    params, cells, choices = read(folder)
    tuned, sizes = held_out(cells, choices), sizes_of(params)
    return (ordering_claims(tuned, params, choices, sizes, params.scaling.level, params.scaling.gamma_moves)
            + scaling_claim(tuned, params, choices, sizes))


# ---------------------------------------------------------------- the next slice
def next_slice(folder: Path) -> list[str]:
    """What the sweep says to run next, in lines: per size and arm the choice or the rung to extend to, and the grid
    entries (configs/studies/<study>.yaml) that add it."""
    params, cells, choices = read(folder)
    variants = list(params.pretrain.grid.recipe_variants)
    seeds = "[" + "".join(str(s) for s in params.pretrain.grid.seeds if s != SWEEP_SEED) + "]"
    lines = []
    for size in sizes_of(params):
        pending = []
        for arm in ARMS:
            c = choices[size, arm]
            if c.best is None:
                lines.append(f"{size} {arm}: no sweep cell yet")
                pending.append(arm)
            elif c.extend is not None:
                lines.append(f"{size} {arm}: best {c.best} at an edge of {c.text()}; extend: add "
                             f"\"{c.extend}-{arm}-{size}-{SWEEP_SEED}\" to the sweep entry")
                pending.append(arm)
            else:
                lines.append(f"{size} {arm}: chosen {c.text()}")
        if not pending:
            std, uni = choices[size, "standard"].best, choices[size, "unified"].best
            cells_ = [f"{std}-{v}-{size}-{seeds}" for v in variants if v != "unified"] + [f"{uni}-unified-{size}-{seeds}"]
            lines.append(f"{size} held out: add  - stage: pretrain_recipe\n    cells: [{', '.join(repr(c) for c in cells_)}]"
                         f"\n  and seeds: {list(params.pretrain.grid.seeds)} (the spec's seeds filter every entry)")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    name = args[0] if args else STUDY
    folder = Path("results") / name
    if not (folder / "params.yaml").is_file():
        print(f"{folder}: no committed cell yet (run the sweep slice first)", file=sys.stderr)
        return 2
    print("\n".join(next_slice(folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
