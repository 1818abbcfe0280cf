"""What the scale-vector claims (scalelab.scale_vectors.claims, and the dose-response's, scalelab.scale_vectors.dose) rest on
besides their loss differences: the cells indexed for paired lookups (loss, sharpness, γ), each entry's regime beside
the paper's, and the measured premises that make a claim testable (`claims.premise`; a failed one makes the entry
"untested").

Premises of the scale-vector claims:
- **γ moved** (weight-decay claims): the decay moved the γ it acts on, as the paired shrinkage of mean γ against the
  arm without decay on γ (its t interval above `GAMMA_MOVES`). A decay that leaves γ where it was tests nothing.
- **per-step pull** (weight-decay claims): λ·η, the fraction of γ that decoupled decay removes per step at peak lr,
  within `PULL_FACTOR` of the paper's. The pull sets the balance between the decay and the gradient that restores γ;
  a run that reaches a shrinkage in few steps at a pull many times the paper's is a different treatment.
- **final norm** (decay on input-norm γ): the decayed input-norm γ include the final norm's, the LM head's input,
  whose decay scales the logits directly; the paper's claim speaks of γ that precondition the next matrix. Where the
  cells record the final γ's mean apart (`gamma_final_mean`, train/callbacks.py `kind_means`), γ moved is read on the
  other input-norm γ and the final γ's own shrinkage is stated beside it; where they record one mean of every input
  γ, a run that decays the final γ cannot separate the two.
- **γ left init** (claims about γ's structure): the treated model's γ moved away from its init (every variant computes
  the standard model's function at init, so an untrained γ is no treatment), as the mean within-vector spread of γ.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import polars as pl

from scalelab.ledger import claims
from scalelab.runtime import yamlio
from scalelab.config import ModelConfig, Params, ScaleConfig, machine, parse_params

# The paper's regime (its reproduction plan) for every scale-vector claim, in words and in tokens per parameter: the
# plan's lower end (20 of 20-80), the comparison most favourable to a small run.
PAPER = ("dense and MoE models of 0.12B-2B params; reproduction plan: a 0.12B Llama on 2.5-10B tokens (20-80 "
         "tokens/param), AdamW weight decay 0.1 on γ at the matrices' rate over ~10^4 steps")
PAPER_TOKENS_PER_PARAM = 20.0
# λ·η of the plan: weight decay 0.1 at AdamW's lr 3e-3 (the 0.12B preset, configs/gpu-0.12b.yaml; a test holds them
# equal), so ~10^4 steps pull γ by λ·η·T ≈ 3.
PAPER_PULL = 0.1 * 3.0e-3
# Half a decade: a pull 10x the paper's reaches in T steps what the paper's reaches in 10T, against a gradient that
# has had a tenth of the steps to respond; within 3x the two runs are the same treatment to within their schedules.
PULL_FACTOR = 3.0
# γ starts at 1: its mean shrinking by more than 5% of that init is a decay that acted (a λ·η·T of a few hundredths,
# the matrices' rate over a short run, moves it by about that much or less: barely).
GAMMA_MOVES = 0.05
# γ's within-vector spread is exactly 0 at init for every variant; 1% of its init value is a γ that was trained.
LEFT_INIT = 0.01
SCOPE = "small-scale"  # every scale-vector claim is stated as a sign at this run's scale, beside the paper's regime
# The sections of a study's params.yaml that the scale-vector ledger reads: a committed study ran under its commit's
# schema, whose other sections (other methods, inline machine settings) may no longer parse.
LEDGER_SECTIONS = ("seed", "tracking", "prepare", "tokenizer", "tokenize", "model", "optim", "pretrain", "scaling")


def study_params(folder: Path) -> Params:
    """The params a committed study ran under (its params.yaml), the ledger's sections only."""
    path = Path(folder) / "params.yaml"
    raw = yamlio.safe_load(path.read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a params mapping")
    return parse_params(machine.split({k: v for k, v in raw.items() if k in LEDGER_SECTIONS})[0], str(path))


class Cells:
    """Final validation loss, sharpness, γ statistics and parameter counts of every cell, keyed (recipe, variant,
    size, seed) for paired lookups."""

    def __init__(self, cells: pl.DataFrame) -> None:
        self.cells = cells
        rows = {(r["recipe"], r["variant"], r["size"], r["seed"]): r for r in cells.iter_rows(named=True)}
        self.loss = {k: r["val_loss"] for k, r in rows.items()}
        # a power iteration that did not reach its tolerance gives no value (cells written before the flag: kept)
        self.sharp = {k: r["sharpness"] for k, r in rows.items() if r.get("sharpness_converged") is not False}
        self.gamma_mean = {k: r.get("gamma_mean") for k, r in rows.items()}
        self.gamma_std = {k: r.get("gamma_std") for k, r in rows.items()}
        self.kind_mean = {kind: {k: r.get(f"gamma_{kind}_mean") for k, r in rows.items()}
                          for kind in ("input", "output", "final")}
        self.counts = {k: (r["params"], r["non_embedding_params"]) for k, r in rows.items()}

    def axes(self, recipe: str) -> tuple[list[str], list[str], list[int]]:
        """Variants, sizes (by N) and seeds of a recipe."""
        g = self.cells.filter(pl.col("recipe") == recipe)
        sizes = g.group_by("size").agg(pl.col("non_embedding_params").min()).sort("non_embedding_params")
        return (g["variant"].unique(maintain_order=True).to_list(), sizes["size"].to_list(),
                sorted(g["seed"].unique().to_list()))

    def per_seed(self, recipe: str, diff, sizes: list[str] | None = None) -> list[float]:
        """For each seed of `recipe`, the mean over sizes of `diff(size, seed)`; a seed counts only where every
        size gives a value (the same sizes for every seed: differences are paired)."""
        _, all_sizes, seeds = self.axes(recipe)
        sizes = sizes or all_sizes
        out = []
        for seed in seeds:
            values = [diff(size, seed) for size in sizes]
            if all(v is not None and math.isfinite(v) for v in values):
                out.append(statistics.fmean(values))
        return out

    def paired(self, table: dict, recipe: str, first: str, second: str):
        """diff(size, seed) = table[first] − table[second] of one recipe, None where either is missing."""
        def diff(size: str, seed: int) -> float | None:
            a, b = table.get((recipe, first, size, seed)), table.get((recipe, second, size, seed))
            return None if a is None or b is None else a - b
        return diff

    def gap(self, recipe: str, worse: str, better: str):
        return self.paired(self.loss, recipe, worse, better)

    def regime(self, params: Params, recipe: str, variants: tuple[str, ...], sizes: list[str]) -> dict:
        """The regime of a claim over `sizes` of `recipe`: the largest compared model (the claim holds at most at its
        scale), the tokens and steps of the params' pretrain budget."""
        counts = [c for (r, v, s, _), c in self.counts.items() if r == recipe and v in variants and s == sizes[-1]]
        total, non_emb = max(counts) if counts else (None, None)
        return budget_regime(params, total, non_emb)

    def left_init(self, recipe: str, variant: str, sizes: list[str]) -> dict:
        """γ left init: the mean over the variant's cells (these sizes, every seed) of γ's within-vector spread."""
        stds = [v for (r, var, s, _), v in self.gamma_std.items() if r == recipe and var == variant and s in sizes]
        value = statistics.fmean(stds) if stds and None not in stds else None
        return claims.premise("γ left init", f"{variant}: {value:.3g}" if value is not None else f"{variant}: not "
                              "recorded", value is not None and value > LEFT_INIT,
                              f"mean within-vector std of {variant}'s γ above {LEFT_INIT} (0 at init)")


def budget_regime(params: Params, total: int | None, non_emb: int | None) -> dict:
    pre = params.pretrain
    steps = pre.total_steps()
    return claims.regime(PAPER, params=None if total is None else int(total),
                         non_embedding_params=None if non_emb is None else int(non_emb),
                         tokens=steps * pre.batch_size * pre.seq_len, steps=steps,
                         paper_tokens_per_param=PAPER_TOKENS_PER_PARAM, scope=SCOPE)


def _one_gamma_per_norm(cfg: ModelConfig) -> None:
    if cfg.scale.branch or cfg.scale.placement or cfg.scale.magdir:
        raise ValueError("counted for one γ per norm only (variants without branch, placement, magdir)")


def dense_counts(cfg: ModelConfig) -> tuple[int, int]:
    """(total, non-embedding) parameters of a dense model with one γ per norm (variants standard, wd_in, wd_out), from
    its config: per layer q, k, v, o and the SwiGLU gate, up, down; the pre-attention and pre-MLP γ, QK-norm's two
    head-dim γ, Peri-LN's two post-branch γ; the final γ; embedding and (untied) LM head V·d each. What
    `Transformer.num_params` counts (a test holds them equal)."""
    _one_gamma_per_norm(cfg)
    if cfg.moe is not None:
        raise ValueError("dense_counts: a dense MLP only")
    d, hd = cfg.d_model, cfg.head_dim
    per_layer = d * hd * (2 * cfg.n_head + 2 * cfg.kv_heads) + 3 * d * cfg.d_ff
    if cfg.scale.scales:
        per_layer += 2 * d + (2 * hd if cfg.qk_norm else 0) + (2 * d if cfg.post_norm else 0)
    non_emb = cfg.n_layer * per_layer + (d if cfg.scale.scales else 0)
    return non_emb + cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2), non_emb


def gamma_vectors(cfg: ModelConfig) -> dict[str, int]:
    """γ vectors of each kind in a model with one γ per norm (dense or MoE): per layer the pre-attention and pre-MLP
    γ (input), QK-norm's q and k γ and Peri-LN's two post-branch γ (output); the final γ (input). The cells' mean γ
    weighs every vector once (train/callbacks.py `GammaStats`); a test holds these counts to the model's."""
    _one_gamma_per_norm(cfg)
    if not cfg.scale.scales:
        return {"input_scale": 0, "output_scale": 0}
    return {"input_scale": 2 * cfg.n_layer + 1,
            "output_scale": 2 * cfg.n_layer * (int(cfg.qk_norm) + int(cfg.post_norm))}


def scale_pull(params: Params, recipe: str, mult: float | None = None) -> float:
    """λ·η on the scale vectors at peak lr: the recipe optimizer's decay × `mult` (None: its scale_wd_mult) × the lr
    the scales train at (AdamW's own, or the AdamW side's under a matrix optimizer: scalelab.optim.registry)."""
    cfg = params.optim[params.pretrain.recipes[recipe].optimizer]
    lr = cfg.lr if cfg.name == "adamw" else (cfg.adamw_lr or cfg.lr)
    return lr * cfg.weight_decay * (cfg.scale_wd_mult if mult is None else mult)


def pull_premise(pull: float, steps: int) -> dict:
    ratio = pull / PAPER_PULL
    return claims.premise("per-step pull", f"λ·η {pull:.2g}, {ratio:.3g}x the paper's; λ·η·T {pull * steps:.2g} over "
                          f"{steps} steps", 1 / PULL_FACTOR <= ratio <= PULL_FACTOR,
                          f"λ·η at peak lr within {PULL_FACTOR:g}x of the paper's {PAPER_PULL:.2g} (AdamW lr 3e-3, "
                          "weight decay 0.1)")


def moved_premise(diffs: list[float], level: float, what: str, note: str = "",
                  threshold: float = GAMMA_MOVES) -> dict:
    """γ moved: the per-seed shrinkage of `what` (no decay on γ − decayed) has its t interval above `threshold`
    (GAMMA_MOVES, or the one a study's spec fixes: params scaling.gamma_moves)."""
    ci = claims.t_interval(diffs, level) if diffs else None
    if not diffs:
        value = "not recorded"
    elif ci is None:
        value = f"{diffs[0]:.4f} (1 seed)"
    else:
        value = f"{ci[0]:.4f} [{ci[1]:.4f}, {ci[2]:.4f}]"
    return claims.premise("γ moved", value + note, ci is not None and ci[1] > threshold,
                          f"paired shrinkage of {what} against no decay on γ, its {level:.0%} t interval above "
                          f"{threshold}")


def final_norm_premise(scale: ScaleConfig, source: str, apart: list[float] | None = None,
                       level: float = 0.95) -> dict:
    """Passes where the treatment leaves the final γ undecayed, or where `source` records its mean apart (`apart`: the
    per-seed shrinkage of the final γ's mean against no decay on γ), so that γ moved reads the other input-norm γ
    and this premise states the final γ's own shrinkage; fails where it is decayed and no mean of it is apart."""
    decayed = scale.scales and scale.wd_input_scales
    need = "the LM head's input γ not decayed (its decay scales the logits directly, which the claim does not speak of)"
    if not decayed or apart is None:
        return claims.premise("final norm", f"decayed, no mean of it apart in {source}" if decayed else "not decayed",
                              not decayed, need)
    ci = claims.t_interval(apart, level) if apart else None
    shrunk = (f"{ci[0]:.4f} [{ci[1]:.4f}, {ci[2]:.4f}]" if ci else f"{apart[0]:.4f} (1 seed)" if apart
              else "not recorded")
    return claims.premise("final norm", f"decayed, measured apart in {source}: its mean shrank {shrunk}", bool(apart),
                          need[:-1] + "), or its mean recorded apart, γ moved then read on the other input-norm γ")


def cells_moved_apart(cells: Cells, params: Params, recipe: str, treated: str, sizes: list[str],
                      level: float, threshold: float = GAMMA_MOVES) -> tuple[dict, list[float] | None] | None:
    """γ moved read on the decayed kinds' own means (the blocks' input γ, the output γ; their mean where both are
    decayed), and the final γ's per-seed shrinkage where it is decayed: for cells that record each kind's mean apart
    (train/callbacks.py kind_means). None where a paired cell lacks them (cells_moved then reads the mean of every γ)."""
    scale = params.model.variants[treated]
    kinds = [k for k, on in (("input", scale.wd_input_scales), ("output", scale.wd_output_scales)) if on]
    keys = [(recipe, v, size, seed) for v in ("standard", treated) for size in sizes
            for seed in cells.axes(recipe)[2]]
    needed = [*kinds, "final"] if "input" in kinds else kinds
    if not kinds or any(cells.kind_mean[k].get(key) is None for k in needed for key in keys if key in cells.loss):
        return None
    shrink = [cells.paired(cells.kind_mean[k], recipe, "standard", treated) for k in kinds]

    def decayed(size: str, seed: int) -> float | None:
        d = [f(size, seed) for f in shrink]
        return None if None in d else statistics.fmean(d)

    what = " and ".join(f"the {k}-norm γ" for k in kinds)
    moved = moved_premise(cells.per_seed(recipe, decayed, sizes), level, f"the mean of {what}"
                          + (" of the blocks (the final norm's apart)" if "input" in kinds else ""),
                          threshold=threshold)
    final = (cells.per_seed(recipe, cells.paired(cells.kind_mean["final"], recipe, "standard", treated), sizes)
             if "input" in kinds else None)
    return moved, final


def cells_moved(cells: Cells, params: Params, recipe: str, treated: str, sizes: list[str], level: float) -> dict:
    """γ moved, from the cells. They record one mean over every γ vector, decayed or not; the decayed γ's shrinkage
    is that mean's over the decayed share of the vectors, the undecayed γ taken as unchanged (where the kinds are
    recorded apart, the dose runs, decay on one kind moves the other's mean by < 0.005)."""
    scale = params.model.variants[treated]
    kinds = [k for k, on in (("input_scale", scale.wd_input_scales), ("output_scale", scale.wd_output_scales)) if on]
    shares = {}
    for size in sizes:
        n = gamma_vectors(params.resolve_model(size, treated, vocab_size=2, recipe=recipe))
        shares[size] = (sum(n[k] for k in kinds), sum(n.values()))
    raw = cells.paired(cells.gamma_mean, recipe, "standard", treated)

    def decayed(size: str, seed: int) -> float | None:
        d, (k, n) = raw(size, seed), shares[size]
        return None if d is None or not k else d * n / k

    every = cells.per_seed(recipe, raw, sizes)
    note = (f" (the mean of every γ {statistics.fmean(every):.4f}; decayed vectors "
            f"{', '.join(sorted({f'{k}/{n}' for k, n in shares.values()}))})" if every else "")
    return moved_premise(cells.per_seed(recipe, decayed, sizes), level, "the decayed γ's mean (the cells' mean of "
                         "every γ vector over the decayed share, the undecayed taken as unchanged)", note)
