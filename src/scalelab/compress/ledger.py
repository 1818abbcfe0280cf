"""The compression study's claims ledger, decided by scalelab.ledger.claims' rule (premises first).

Claims: per-seed differences oriented so that positive is the claim's direction, paired by calibration seed. An id's
`@ρ` names the kept fraction: the paper states its ordering at one kept fraction, so those claims are per ρ and have
no pooled twin; the spectrum claims pool every ρ and carry no `@`.
    d.order.<better>.<worse>@ρ   the published ordering, in validation loss (nats; ppl = exp):
                                 SVD-LLM ≤ SigmaScale, SigmaScale < ASVD, SigmaScale < FWSVD, ASVD < SVD, FWSVD < SVD
    d.alloc.<sens>.<uniform>@ρ   the sensitivity allocation beats uniform ranks (a method and its uniform twin)
    d.headline.<s>.svd_llm@ρ     the paper's headline: SigmaScale with its sensitivity allocation (<s>) is competitive
                                 with or better than SVD-LLM as published (uniform ranks): non-inferiority, the paired
                                 difference plus HEADLINE_MARGIN must be positive
    d.order.svd_llm_sens.<s>@ρ   the ordering at equal allocation (both sensitivity): SVD-LLM ≤ SigmaScale
    d.beyond.<m>.svd_llm@ρ       beyond the paper: a warm-started SigmaScale, a refined method or SVD-LLM with ranks
                                 allocated by its whitened truncation loss beats SVD-LLM as published
    d.refine.<refined>.<base>@ρ  beyond the paper: end-to-end refinement beats its own unrefined factors at the same
                                 ranks (the method without `refine`, same allocation), REFINE_DELTA
    d.erank_loss[.sigmascale]    per seed, Spearman correlation over (method, ρ, layer) between erank_after/erank_before
                                 and the layer loss relative to plain SVD's (same layer, rank and seed): positive is
                                 lower erank, lower loss. Only methods that are a scaling of their own (`distinct`): a
                                 refined variant repeats its base method's layers and would count them twice.
Premises, each measured from the cells and their maps (a failed one makes the claim untested, its numbers kept):
    optimisation settled         each seed's SigmaScale cell reads the same at the paper's fixed PAPER_STEPS steps
                                 and at the plateau rule's per-map answers, within half the claim's smallest effect:
                                 more (or less) optimisation could not move the verdict. Both answers come from the
                                 study's store (a `stop: fixed` run keeps the plateau rule's answer of every map beside
                                 its own; steps.py evaluates them without optimising); a cell whose other answer the
                                 store lacks reads untested, naming what is missing
    same budget                  both sides keep at most ρ of the decoder linear weights, within BUDGET_TOL
    compression acted            the worse side loses ≥ ROOM nats to the uncompressed model: room for an ordering
    allocation differs from uniform   ≥ ALLOC_MIN of the sensitivity side's maps off uniform's rank
    scaling moved the spectrum   ≥ MOVED_MIN of the correlated layers' effective rank moved by the scaling
    same ranks                   a refined method and its base share every map's rank on every seed (ranks_digest)
    refinement acted             the calibration objective fell by ≥ REFINE_MOVED on every seed; the objective on
                                 the held-out evaluation windows, before and after, reported beside it
A SigmaScale whose step cap leaves the plateau rule no room to fire (CompressConfig.smoke: at most 2·patience steps)
is not the method as published by construction: a smoke run of the code path, in no claim (the default profile's).
Regime: the model's parameters, its decoder linear weights, the calibration tokens per seed and SigmaScale's longest
map, beside the paper's. Every claim is small-scale: what a real 135M-class model says of the ordering and of the
allocation's effect is a sign at its own scale, not SigmaScale's 8B results nor SVD-LLM's LLaMA-7B numbers.
Published: each claim quotes the paper that measured it (PUB_SIGMA: SigmaScale on Llama 3.1 8B Instruct and Qwen3-8B;
PUB_SVDLLM: SVD-LLM's own LLaMA-7B table, the baselines' numbers).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

import polars as pl

from scalelab.ledger import claims
from scalelab.compress.keys import normal_part
from scalelab.compress.rank import rank_for
from scalelab.compress.summary import (
    PLATEAU, cells_table, distinct, layers_table, load, maps_table, paired, rows_of, spearman,
)
from scalelab.config.compress import CompressConfig

# Who measured what (checked against the official SigmaScale code, ernlavr/SigmaScale at 8e34871, and the SigmaScale
# abstract; the four LLaMA-7B numbers are SVD-LLM's own table as this project has quoted them since its plan, not
# re-read from that paper's table here). SigmaScale's experiments are on Llama 3.1 8B Instruct and Qwen3-8B, none on
# LLaMA-7B: no number this ledger uses is SigmaScale's.
PUB_SVDLLM = ("LLaMA-7B, WikiText-2 ppl at 20% of the weights removed: SVD-LLM 7.94, ASVD 11.14, FWSVD 1727, SVD 20061 "
              "(SVD-LLM's own table, arXiv 2403.07378, uniform ranks)")
PUB_SIGMA = ("SigmaScale competitive with closely related SVD-based methods in perplexity and zero-shot accuracy, on "
             "Llama 3.1 8B Instruct and Qwen3-8B (arXiv 2606.07098; no number quoted here)")
PUBLISHED = f"{PUB_SIGMA}; the baselines: {PUB_SVDLLM}"  # an ordering with SigmaScale on one side
PAPER_PPL = {"svd_llm": 7.94, "asvd": 11.14, "fwsvd": 1727.0, "svd": 20061.0}  # PUB_SVDLLM's table, as quoted
PAPER_REGIME = ("SigmaScale (arXiv 2606.07098): Llama 3.1 8B Instruct and Qwen3-8B; its official code calibrates on "
                "32 × 2048 WikiText-2 train tokens, probes sensitivity over kept ratios 0.2-0.9 on the WikiText-2 test "
                "split, runs 1000 SigmaScale steps a map, then fine-tunes the compressed model (distillation on Alpaca, "
                "one epoch). The baselines' LLaMA-7B numbers: SVD-LLM's own table (arXiv 2403.07378)")
PUB_ALLOC = ("the paper's allocation is sensitivity-based (ASVD style, what its code always uses); uniform ranks are "
             "the ablation (no number quoted)")
PUB_BEYOND = "none (beyond the paper; SVD-LLM is the layer-wise optimum)"
PUB_ERANK = "SigmaScale: scaling concentrates the spectrum (lower erank), lowering truncation loss (qualitative)"
# Smallest effects of interest (δ, claims.py rule 4), declared 2026-12-03 (commit c4830ff): after the cells of
# compression-smollm2 ran (post hoc for it), before sigmascale-allocation's. No reason rests on either study's results.
DECLARED = "2026-12-03T08:02:43+00:00"  # commit c4830ff
POST_HOC = ("compression-smollm2",)
# Orderings, in nats of validation loss: 0.02 (a 2% perplexity ratio): a sixteenth of the closest published pair in
# SVD-LLM's LLaMA-7B table (ASVD 11.14 against SVD-LLM 7.94, 0.34 nats), and a gap under 2% in perplexity would not
# change which method one picks.
ORDER_DELTA = claims.Sesoi(
    0.02, "0.02 nats, 2% in perplexity: a sixteenth of the closest published pair (SVD-LLM's LLaMA-7B table, arXiv "
    "2403.07378: ASVD 11.14 against SVD-LLM 7.94 ppl, 0.34 nats); a smaller gap would not change which method one "
    "picks",
    declared_on=DECLARED, post_hoc_for=POST_HOC)
# "SVD-LLM ≤ SigmaScale" admits equality: a claim of non-inferiority (claims.decide), at the same 2% as its margin, so
# only SigmaScale ahead by more than 2% contradicts it (it was δ = 0: ahead by any amount).
# Spectrum claims, in Spearman ρ: 0.1 (ranks that share under 1% of their variance are no relation worth stating).
ERANK_DELTA = claims.Sesoi(
    0.1, "Spearman ρ 0.1: ranks that share under 1% of their variance are no relation worth stating",
    declared_on=DECLARED, post_hoc_for=POST_HOC)
# Refined against its own unrefined factors at the same ranks (beyond the papers), declared 2026-12-06 with the study
# that decides it (configs/studies/compression-refined.yaml) before any of its cells ran. 0.02 nats, the orderings' 2%:
# the refinement costs core-minutes a cell beyond SVD-LLM's closed form, and a gain under 2% in perplexity would not
# change which factors one ships; the pair shares ranks, calibration and evaluation windows, so its seed-to-seed
# spread is the refinement's own, and 2% stays resolvable on three seeds.
REFINE_DELTA = claims.Sesoi(
    0.02, "0.02 nats, 2% in perplexity: the refinement costs core-minutes a cell beyond SVD-LLM's closed form, and a "
    "gain under 2% would not change which factors one ships (the orderings' bound, ORDER_DELTA)",
    declared_on="2026-12-06T07:55:34+00:00")
# A refinement whose calibration objective fell by under 1% left the factors where SVD-LLM put them: the comparison
# would measure nothing the refinement did.
REFINE_MOVED = 0.01
# (better, worse, claim text, non-inferiority): the published ordering, by method name in the grid
ORDERING = [
    ("svd_llm", "sigmascale", "SVD-LLM ≤ SigmaScale in perplexity", True),
    ("sigmascale", "asvd", "SigmaScale < ASVD in perplexity", False),
    ("sigmascale", "fwsvd", "SigmaScale < FWSVD in perplexity", False),
    ("asvd", "svd", "ASVD < plain SVD in perplexity", False),
    ("fwsvd", "svd", "FWSVD < plain SVD in perplexity", False),
]
# The paper's optimisation: a fixed 1000 AdamW steps a map (the official code's early stop is commented out). Whether
# its verdicts could change with more or less optimisation is read off the two answers the store keeps per map: the
# 1000-step scalings and the plateau rule's (the best up to where the rule fires on the same trajectory; the best of
# the 1000 steps where it never fires). An earlier premise counted the maps whose loss had flattened by the plateau
# rule: a slope, not a distance from the optimum, which says nothing of the perplexity a verdict reads.
PAPER_STEPS = 1000
RULES = ("fixed", "plateau")
# The two answers may differ by less than half the claim's smallest effect of interest: then the claim's interval,
# read at either answer, moves by less than half the effect that would matter (and a non-inferiority margin by less
# than half itself), so no verdict it decides could flip on which answer the method is taken at.
SETTLED_SHARE = 0.5
# "Competitive with" as a margin: SigmaScale may lose up to one effect of interest (2% in perplexity) to SVD-LLM and
# still be competitive; only a loss clearly beyond it contradicts the headline (a claim of non-inferiority).
HEADLINE_MARGIN = ORDER_DELTA.value
# The kept fractions 0.9 and 0.75 (it read "20% and 10% removed"): the official scripts' example model is saved at
# 0.75, and a summary of the paper names 0.90x and 0.75x retention; not read from the paper's own tables here.
PUB_HEADLINE = ("SigmaScale (its sensitivity allocation) is competitive with or better than SVD-LLM at kept fractions "
                "0.9 and 0.75 (arXiv 2606.07098, on Llama 3.1 8B Instruct and Qwen3-8B; SVD-LLM with uniform ranks, "
                "as SVD-LLM publishes it)")
BUDGET_TOL = 0.01  # kept fractions of the two sides within 1% of the dense weights: the same budget
ROOM = ORDER_DELTA.value  # the worse side must lose at least an effect of interest to the dense model
ALLOC_MIN = 0.1  # an allocation moving under a tenth of the maps off uniform cannot carry an effect of interest
# a correlation over layers most of which the scaling left as they were measures those ties, not the scalings
MOVED_MIN, MOVED_BY = 0.5, 0.01


# ---------------------------------------------------------------- premises (each measured, claims.premise)
def rule_answers(store: str | Path | None, table: pl.DataFrame,
                 layers: Mapping[tuple[str, float, int], Sequence[Mapping]], cfg: CompressConfig,
                 ) -> dict[tuple[str, float, int], dict]:
    """Each SigmaScale cell's answers under both stopping rules: {(method, ρ, seed): {"own": the cell's rule,
    "stored": whether the store holds the cell's own part, rule: {"val_nll", "max_steps", "maps"}, ...}}.

    The cell's own rule (the study's compress.sigmascale.stop) is the cell itself. Its other answer is the store's
    part whose key is the cell's own part's with `sigmascale.stop` swapped (both read through today's schema,
    keys.normal_part): the same model, windows, ranks and settings but for the rule (what steps.py writes from the
    stored scalings). The cell's own part is the stored part
    with its method, ρ, seed and validation NLL (the cell wrote it: the same float). A study whose cells ran before it
    kept a store has no part to key the other answer by."""
    from scalelab.compress.store import parts

    held = parts(store) if store is not None and Path(store).is_dir() else []
    own_rule, steps = cfg.sigmascale.stop, cfg.sigmascale.max_steps
    out: dict[tuple[str, float, int], dict] = {}
    sigma = table.filter(pl.col("method").is_in([m for m, spec in cfg.methods.items() if spec.kind == "sigmascale"]))
    for method, keep, seed, nll in sigma.select("method", "keep", "seed", "val_nll").iter_rows():
        at = (method, float(keep), int(seed))
        mine = [(k, m, maps) for k, m, maps in held
                if (m.get("method"), m.get("keep"), m.get("seed")) == (method, keep, seed) and k.get("sigmascale")]
        own = next((k for k, m, _ in mine if m.get("val_nll") == nll and k["sigmascale"]["stop"] == own_rule), None)
        answers: dict = {"own": own_rule, "stored": own is not None,
                         own_rule: {"val_nll": nll, "max_steps": steps, "maps": list(layers.get(at, []))}}
        for rule in set(RULES) - {own_rule} if own is not None else ():
            # read through today's schema: a cell's part written before a setting existed keys it at its default
            want = normal_part({**own, "sigmascale": {**own["sigmascale"], "stop": rule}})
            hit = next(((k, m, maps) for k, m, maps in mine if normal_part(k) == want), None)
            if hit is not None:
                answers[rule] = {"val_nll": hit[1]["val_nll"], "max_steps": hit[0]["sigmascale"]["max_steps"],
                                 "maps": hit[2]}
        out[at] = answers
    return out


def _missing(answers: Mapping) -> str:
    """What a cell's premise lacks, in words: which answer, why the store does not hold it, what would supply it."""
    if "plateau" not in answers:  # a fixed run: every map's plateau answer is in the store, not yet evaluated
        return ("the plateau rule's answer of each map is stored beside the 1000-step one but the cell was not "
                "evaluated at it (python -m scalelab.compress.steps: no optimisation)")
    maps = [r for r in answers["plateau"]["maps"] if r.get("stop") is not None]
    early = sum(r["stop"] in PLATEAU and r["steps"] < PAPER_STEPS for r in maps)
    where = "" if answers["stored"] else " and the study keeps no store"
    return (f"the {PAPER_STEPS}-step answer was never computed: the cell ran stop: plateau, which ended {early} of "
            f"{len(maps)} maps before step {PAPER_STEPS}{where} (supplied only by optimising every map for "
            f"{PAPER_STEPS} steps at stop: fixed, which keeps both answers)")


def _judged(what: str, per_seed: Sequence[tuple[int, str | None, float | None, float | None]], delta: float,
            unit: str, statistic: str) -> dict:
    """The premise "optimisation settled" from each seed's (seed, what is missing or None, the statistic at the
    paper's fixed steps, at the plateau answers): every seed present and within SETTLED_SHARE of `delta`."""
    bound = SETTLED_SHARE * delta
    need = (f"on every seed, |the {statistic} at the paper's {PAPER_STEPS} fixed steps − at the plateau rule's "
            f"per-map answers| < {bound:g} {unit} (half the claim's smallest effect)")
    texts: dict[str, list[int]] = {}  # what each seed read, seeds that read the same said once
    ok = bool(per_seed)
    for seed, missing, fixed, plateau in per_seed:
        if missing is None and (fixed is None or plateau is None):
            missing = f"the {statistic} is undefined at one of the answers"
        if missing is not None:
            texts.setdefault(missing, []).append(seed)
            ok = False
            continue
        gap = fixed - plateau
        ok = ok and abs(gap) < bound
        texts.setdefault(f"{fixed:.4f} at {PAPER_STEPS} steps, {plateau:.4f} at the plateau (Δ {gap:+.4f})",
                         []).append(seed)
    said = "; ".join(f"seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))}: {t}" for t, s in texts.items())
    return claims.premise("optimisation settled", f"{what}: {said}", ok, need)


def _lacking(answer: Mapping) -> str | None:
    """Why one cell's two answers cannot be compared (None: both are there, the fixed one at the paper's steps)."""
    if not all(r in answer for r in RULES):
        return _missing(answer)
    if answer["fixed"]["max_steps"] != PAPER_STEPS:
        return f"the fixed run took {answer['fixed']['max_steps']} steps, not the paper's {PAPER_STEPS}"
    return None


def settled(answers: Mapping[tuple[str, float, int], dict], method: str, keep: float, seeds: Sequence[int]) -> dict:
    """Whether more (or less) optimisation could move an ordering's verdict: each seed's SigmaScale cell, its
    validation NLL at the paper's fixed PAPER_STEPS steps and at the plateau rule's per-map answers, within
    SETTLED_SHARE of the claim's smallest effect (ORDER_DELTA, the headline's margin too)."""
    per_seed = []
    for seed in seeds:
        a = answers[(method, float(keep), int(seed))]
        lack = _lacking(a)
        per_seed.append((seed, lack, *((None, None) if lack else (a["fixed"]["val_nll"], a["plateau"]["val_nll"]))))
    return _judged(f"{method} at ρ {keep:g}", per_seed, ORDER_DELTA.value, "nats", "cell's val NLL")


def settled_spectrum(answers: Mapping[tuple[str, float, int], dict], layers: Mapping[tuple[str, float, int],
                     Sequence[Mapping]], method: str, keeps: Sequence[float], seeds: Sequence[int]) -> dict:
    """The same premise for the spectrum claim within SigmaScale: each seed's Spearman correlation (over its layers at
    every ρ, against plain SVD's layer loss, as erank_claims computes it) with SigmaScale's maps at either answer."""
    per_seed = []
    for seed in seeds:
        cells = [answers[(method, float(k), int(seed))] for k in keeps]
        lack = next((f"ρ {k:g}: {why}" for k, a in zip(keeps, cells) if (why := _lacking(a))), None)
        if lack:
            per_seed.append((seed, lack, None, None))
            continue
        stat = {}
        for rule in RULES:
            pooled = {(method, float(k), int(seed)): a[rule]["maps"] for k, a in zip(keeps, cells)}
            pooled |= {("svd", float(k), int(seed)): layers.get(("svd", float(k), int(seed)), []) for k in keeps}
            rows = layers_table(pooled)
            rows = rows.filter((pl.col("method") == method) & pl.col("loss_rel_svd").is_not_null()) \
                if "loss_rel_svd" in rows.columns else rows.clear()
            stat[rule] = spearman(rows["erank_ratio"].to_list(), rows["loss_rel_svd"].to_list())
        per_seed.append((seed, None, stat["fixed"], stat["plateau"]))
    return _judged(f"{method} at ρ {', '.join(f'{k:g}' for k in keeps)}", per_seed, ERANK_DELTA.value,
                   "in Spearman ρ", "seed's Spearman ρ")


def allocation_differs(maps: pl.DataFrame, method: str, keep: float) -> dict:
    """The allocation acted: the share of `method`'s maps at `keep` whose rank is not uniform's (dense counts)."""
    rows = rows_of(maps, method, keep)
    off = sum(r != rank_for(m, n, keep) for m, n, r in rows.select("m", "n", "rank").iter_rows())
    return claims.premise("allocation differs from uniform",
                          f"{off} of {rows.height} maps off the uniform rank ({method} at ρ {keep:g})",
                          rows.height > 0 and off >= ALLOC_MIN * rows.height,
                          f"≥ {ALLOC_MIN:.0%} of the maps at a rank other than uniform's ⌊ρ·m·n/(m+n)⌋")


def same_budget(table: pl.DataFrame, methods: Sequence[str], keep: float) -> dict:
    """The ordering is at one budget: every cell of both sides keeps at most ρ of the decoder linear weights (an
    allocation never overspends), and the sides' kept fractions agree within BUDGET_TOL."""
    need = (f"each side keeps at most ρ = {keep:g} of the decoder linear weights, the two within {BUDGET_TOL:g} of "
            "each other")
    kept = {m: rows_of(table, m, keep)["linear_weights_kept"].drop_nulls().to_list() for m in methods}
    if not all(kept.values()):
        return claims.premise("same budget", None, False, need)
    mean = {m: statistics.fmean(v) for m, v in kept.items()}
    return claims.premise("same budget", ", ".join(f"{m} keeps {v:.4f}" for m, v in mean.items()),
                          max(map(max, kept.values())) <= keep + 1e-9 and max(mean.values()) - min(mean.values())
                          <= BUDGET_TOL, need)


def compression_acted(table: pl.DataFrame, worse: str, keep: float) -> dict:
    """Room for an ordering: the worse side's loss over the uncompressed model (seed mean). A model that loses
    nothing to any factorization (a briefly trained toy) cannot rank the methods."""
    rows = rows_of(table, worse, keep).filter(pl.col("val_nll").is_not_null() & pl.col("val_nll_dense").is_not_null())
    loss = statistics.fmean(a - b for a, b in zip(rows["val_nll"], rows["val_nll_dense"])) if rows.height else None
    value = None if loss is None else f"{worse} {loss:+.4g} nats over the dense model"
    return claims.premise("compression acted", value, loss is not None and loss >= ROOM,
                          f"the worse side ≥ {ROOM:g} nats above the uncompressed model")


def scaling_moved(rows: pl.DataFrame) -> dict:
    """The spectrum claims correlate the scalings' effect: the share of the layers whose erank the scaling moved."""
    ratios = rows["erank_ratio"].drop_nulls().to_list()
    moved = sum(abs(r - 1) > MOVED_BY for r in ratios)
    return claims.premise("scaling moved the spectrum",
                          f"{moved} of {len(ratios)} layers' effective rank moved by more than {MOVED_BY:.0%}",
                          bool(ratios) and moved >= MOVED_MIN * len(ratios),
                          f"≥ {MOVED_MIN:.0%} of the correlated layers")


def regime(table: pl.DataFrame, maps: pl.DataFrame, sigma: set[str]) -> dict:
    """This grid beside the paper's: the model's parameters and its decoder linear weights, the calibration tokens a
    seed, and the longest SigmaScale map (steps) of the claim's SigmaScale methods."""
    params, tokens = table["params_dense"].drop_nulls(), table["calib_tokens"].drop_nulls()
    # every cell factors the same maps: one cell's Σ m·n is every non-embedding parameter but the norms' gains, which
    # the maps do not record (0.03% of SmolLM2-135M's)
    linear = None
    if maps.height:
        key = dict(zip(("method", "keep", "seed"), maps.row(0)))
        one = maps.filter(pl.all_horizontal(pl.col(c) == v for c, v in key.items()))
        linear = int((one["m"] * one["n"]).sum())
    steps = maps.filter(pl.col("method").is_in(sorted(sigma)))["steps"].max() if sigma else None
    # no paper_tokens_per_param: calibration is not a training budget, and tokens per parameter says nothing of it
    # (the paper's 32 × 2048 tokens are in its regime's words)
    return claims.regime(PAPER_REGIME, params=int(params[0]) if len(params) else None, non_embedding_params=linear,
                         tokens=int(tokens[0]) if len(tokens) else None, steps=steps, scope="small-scale")


# ---------------------------------------------------------------- the ledger
def paper_effect(better: str, worse: str) -> float | str:
    """The published gap in the claim's metric, ln ppl(worse)/ppl(better), where the paper's table has both."""
    if better in PAPER_PPL and worse in PAPER_PPL:
        return math.log(PAPER_PPL[worse] / PAPER_PPL[better])
    if better == "svd_llm":
        return "≥ 0: SVD-LLM competitive with or better (ordering only, no SigmaScale number quoted)"
    return "> 0 (ordering only, no SigmaScale number quoted)"


def refine_pairs(present: set[str], cfg: CompressConfig) -> list[tuple[str, str]]:
    """(refined, base) method pairs of the grid: the same method but for `refine` (base: none)."""
    def base_of(a: str, b: str) -> bool:
        return cfg.methods[a].refine != "none" and cfg.methods[b].refine == "none" and \
            cfg.methods[a].model_dump(exclude={"refine"}) == cfg.methods[b].model_dump(exclude={"refine"})

    return sorted((a, b) for a in present for b in present if base_of(a, b))


def same_ranks(table: pl.DataFrame, refined: str, base: str, keep: float) -> dict:
    """Refined and base compare factors, not allocations: every seed's two cells have the same ranks on every map
    (the cells' ranks_digest)."""
    def digests(method: str) -> dict[int, str]:
        rows = rows_of(table, method, keep)
        return dict(zip(rows["seed"].to_list(), rows["ranks_digest"].to_list()))

    a, b = digests(refined), digests(base)
    same = [s for s in sorted(set(a) & set(b)) if a[s] is not None and a[s] == b[s]]
    return claims.premise("same ranks", f"{len(same)} of {len(set(a) | set(b))} seeds with equal ranks "
                          f"({refined}, {base} at ρ {keep:g})", bool(a) and len(same) == len(set(a) | set(b)),
                          "every seed's refined and unrefined cells at the same rank on every map")


def refinement_acted(table: pl.DataFrame, refined: str, keep: float) -> dict:
    """The refinement moved its factors: its calibration objective fell by at least REFINE_MOVED on every seed. The
    objective on the held-out evaluation windows (read, never fitted) is reported beside it: a fit that memorised its
    calibration windows falls there and not here."""
    rows = rows_of(table, refined, keep).sort("seed")
    said, ok = [], rows.height > 0
    for seed, b, a, bh, ah in rows.select("seed", "objective_before", "objective_after", "objective_before_held",
                                          "objective_after_held").iter_rows():
        if b is None or a is None:
            said.append(f"seed {seed}: no objective recorded")
            ok = False
            continue
        ok = ok and a <= (1 - REFINE_MOVED) * b
        said.append(f"seed {seed}: calibration {b:.4g} → {a:.4g}"
                    + (f", held out {bh:.4g} → {ah:.4g}" if bh is not None and ah is not None else ""))
    return claims.premise("refinement acted", f"{refined} at ρ {keep:g}: " + "; ".join(said), ok,
                          f"the calibration objective after ≤ {1 - REFINE_MOVED:g} × before on every seed")


def allocation_pairs(table: pl.DataFrame, cfg: CompressConfig) -> list[tuple[str, str]]:
    """(sensitivity, uniform) method pairs of the grid that differ in their cells' allocation and nothing else."""
    alloc = {m: a for m, a in table.group_by("method").agg(pl.col("allocation").first()).iter_rows() if a}

    def twins(a: str, b: str) -> bool:
        return cfg.methods[a].model_dump(exclude={"allocation"}) == cfg.methods[b].model_dump(exclude={"allocation"})

    return sorted((a, b) for a in alloc for b in alloc
                  if alloc[a] == "sensitivity" and alloc[b] == "uniform" and twins(a, b))


def ledger(cells: Sequence[Mapping], layers: Mapping[tuple[str, float, int], Sequence[Mapping]],
           cfg: CompressConfig, store: str | Path | None = None) -> list[dict]:
    """Every claim the grid can speak to, decided by scalelab.ledger.claims (premises first, then the interval).
    `store`: the study's store (store.py), where each SigmaScale cell's answer under the other stopping rule is read
    (its premise "optimisation settled"; without it that premise fails, saying what is missing)."""
    table, maps = cells_table(cells), maps_table(layers)
    smoke = cfg.smoke()  # a SigmaScale that cannot reach its plateau by construction decides nothing: left out
    layer_table = layers_table({k: v for k, v in layers.items() if k[0] in distinct(cfg) - smoke})
    present = set(table["method"].to_list()) - smoke
    sigma = {m for m in present if cfg.methods[m].kind == "sigmascale"}
    keeps = sorted(set(table["keep"].to_list()), reverse=True)
    seeds = sorted(set(table["seed"].to_list()))
    answers = rule_answers(store, table, layers, cfg)

    def compare(id: str, text: str, better: str, worse: str, keep: float, published: str,
                paper: float | str | None, non_inferiority: bool = False, extra: Sequence[dict] = (),
                delta: claims.Sesoi = ORDER_DELTA) -> dict:
        sides = (better, worse)
        premises = [*extra, *(settled(answers, m, keep, seeds) for m in sides if m in sigma),
                    same_budget(table, sides, keep),
                    compression_acted(table, worse, keep)]
        metric = f"val NLL({worse}) − val NLL({better})" + (
            f" (non-inferiority: margin {ORDER_DELTA.value:g})" if non_inferiority else "")
        return claims.claim(id, f"{text} at kept fraction {keep:g}", f"{metric}, nats",
                            paired(table, worse, better, keep), published, cfg.claims_level,
                            regime=regime(table, maps, sigma & set(sides)), premises=premises, paper_effect=paper,
                            smallest_effect=delta, non_inferiority=non_inferiority)

    entries = []
    for keep in keeps:
        entries += [compare(f"d.order.{better}.{worse}@{keep:g}", text, better, worse, keep,
                            PUBLISHED if "sigmascale" in (better, worse) else PUB_SVDLLM,
                            paper_effect(better, worse), non_inf)
                    for better, worse, text, non_inf in ORDERING if better in present and worse in present]
        entries += [compare(f"d.alloc.{sens}.{uniform}@{keep:g}", f"the sensitivity allocation ({sens}) beats uniform "
                            f"ranks ({uniform}) in perplexity", sens, uniform, keep, PUB_ALLOC, None, False,
                            [allocation_differs(maps, sens, keep)]) for sens, uniform in allocation_pairs(table, cfg)]
        for sens in sorted(m for m in sigma if cfg.methods[m].allocation == "sensitivity"):
            if "svd_llm" in present:
                entries.append(compare(
                    f"d.headline.{sens}.svd_llm@{keep:g}", f"SigmaScale with its sensitivity allocation ({sens}) is "
                    f"competitive with (within {HEADLINE_MARGIN:g} nats) or better than SVD-LLM with uniform ranks",
                    sens, "svd_llm", keep, PUB_HEADLINE, "≥ 0: competitive or better (no gap quoted)", True,
                    [allocation_differs(maps, sens, keep)]))
            twin = next((u for u in sorted(present) if cfg.methods[u].kind == "svd_llm"
                         and cfg.methods[u].allocation == "sensitivity" and cfg.methods[u].refine == "none"), None)
            if twin is not None:
                entries.append(compare(f"d.order.{twin}.{sens}@{keep:g}", "SVD-LLM ≤ SigmaScale in perplexity at "
                                       f"equal (sensitivity) allocation ({twin}, {sens})", twin, sens, keep,
                                       PUBLISHED, paper_effect("svd_llm", "sigmascale"), True,
                                       [allocation_differs(maps, sens, keep)]))
        entries += [compare(f"d.beyond.{name}.svd_llm@{keep:g}", f"{name} (beyond the paper) beats SVD-LLM", name,
                            "svd_llm", keep, PUB_BEYOND, None)
                    for name in sorted(present) if name != "svd_llm" and "svd_llm" in present
                    and (cfg.methods[name].init != "random" or cfg.methods[name].refine != "none"
                         or cfg.methods[name].allocation == "whitened")]
        entries += [compare(f"d.refine.{refined}.{base}@{keep:g}", f"end-to-end refinement ({refined}) beats its "
                            f"unrefined factors ({base}) at the same ranks", refined, base, keep, PUB_BEYOND, None,
                            False, [same_ranks(table, refined, base, keep), refinement_acted(table, refined, keep)],
                            REFINE_DELTA)
                    for refined, base in refine_pairs(present, cfg)]
    return entries + erank_claims(table, layer_table, maps, sigma, keeps, cfg.claims_level, answers, layers)


def erank_claims(table: pl.DataFrame, layer_table: pl.DataFrame, maps: pl.DataFrame, sigma: set[str],
                 keeps: Sequence[float], level: float, answers: Mapping[tuple[str, float, int], dict],
                 layers: Mapping[tuple[str, float, int], Sequence[Mapping]]) -> list[dict]:
    """Lower erank after scaling goes with lower layer loss: pooled over every method that scales, and within
    SigmaScale's own learned scalings (the paper's claim, decided only where its optimisation is settled: the
    correlation at the paper's 1000 steps and at the plateau answers within half its smallest effect, per seed)."""
    if "loss_rel_svd" not in layer_table.columns:
        return []  # no plain SVD cells: no reference layer loss
    entries = []
    seeds = sorted(set(layer_table["seed"].to_list()))
    for suffix, method, over in (("", None, "layers, methods and kept fractions"),
                                 (".sigmascale", "sigmascale", "SigmaScale's layers and kept fractions")):
        rows = layer_table.filter(pl.col("loss_rel_svd").is_not_null())
        if method is not None:
            if method not in set(rows["method"].to_list()):
                continue
            rows = rows.filter(pl.col("method") == method)
        diffs = [spearman(r["erank_ratio"].to_list(), r["loss_rel_svd"].to_list())
                 for s in sorted(set(rows["seed"].to_list())) for r in [rows.filter(pl.col("seed") == s)]]
        on = {method} if method else set(rows["method"].to_list())
        premises = [scaling_moved(rows)]
        if method is not None:
            premises = [settled_spectrum(answers, layers, method, keeps, seeds), *premises]
        entries.append(claims.claim(
            f"d.erank_loss{suffix}", "lower effective rank after scaling goes with lower layer loss"
            + (" (SigmaScale's learned scalings)" if method else ""),
            f"Spearman ρ(erank_after/erank_before, layer loss / plain SVD's) over {over}",
            [d for d in diffs if d is not None], PUB_ERANK, level, regime=regime(table, maps, sigma & on),
            premises=premises, smallest_effect=ERANK_DELTA))
    return entries


def regenerate(folder: Path) -> list[dict]:
    """A committed study's ledger rebuilt from its raw per-cell metrics (study.json's `generator`): the compress
    section of its params.yaml, its metrics/compress and plots/compress files (flat, or in its cells/), its store
    (`store/`, where it keeps one), today's rule."""
    from pydantic import ValidationError

    from scalelab.config import ParamsError
    from scalelab.config.params import read_yaml

    path = Path(folder) / "params.yaml"
    raw = read_yaml(path)
    if not isinstance(raw.get("compress"), dict):
        raise ParamsError(f"{path}: no compress section")
    try:
        cfg = CompressConfig.model_validate(raw["compress"])
    except ValidationError as err:
        e = err.errors()[0]
        raise ParamsError(f"{path}: compress.{'.'.join(map(str, e['loc']))}: {e['msg']}") from None
    if (Path(folder) / "cells").is_dir():  # a study run by `scalelab study`: its committed stage cells
        from scalelab.ledger.studies import cell_files

        return ledger(*load(Path(folder), cfg, cell_files(folder, "metrics/compress"),
                            cell_files(folder, "plots/compress")), cfg, Path(folder) / "store")
    return ledger(*load(Path(folder), cfg), cfg, Path(folder) / "store")
