"""Scaling-law fits that say when they are not identified, seed statistics, and the scale-vector claims ledger with
its regimes and premises."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from scalelab.config import ScaleConfig, ScalingConfig, SizeConfig
from scalelab.ledger import claims
from scalelab.scale_vectors import claims as claims_a, premises as premises_a, scaling
from scalelab.ledger.powerlaw import PowerLaw, fit_power_law, fit_seeds
from mutants import assert_caught, mutant, mutation_checks

N4 = np.array([5e4, 1e5, 3e5, 7.4e5])
TRUTH = PowerLaw(E=2.0, A=60.0, alpha=0.45)
ROOT = Path(__file__).resolve().parents[1]
REG = claims.regime("the paper's regime", params=1000, tokens=1000)


def test_fit_recovers_a_known_power_law_with_residual_dof():
    n = np.array([1e5, 3e5, 1e6, 3e6, 1e7])
    fit = fit_power_law(n, TRUTH(n))
    assert fit.identified and fit.dof == 2 and fit.rss < 1e-12
    assert fit.law.E == pytest.approx(2.0, abs=1e-4) and fit.law.alpha == pytest.approx(0.45, abs=1e-4)


def test_four_noisy_points_recover_alpha_inside_the_seed_bootstrap_interval():
    """5 seeds × 4 sizes of a known law plus per-cell noise: α's bootstrap interval over seeds covers the truth, and
    is narrow enough to mean something."""
    rng = np.random.default_rng(7)
    losses = TRUTH(N4) + rng.normal(0, 0.004, size=(5, 4))
    fit = fit_seeds(N4, losses, n_boot=200)
    assert fit.identified and fit.dof == 1 and fit.n_seeds == 5, fit
    low, high = fit.alpha_ci
    assert low < TRUTH.alpha < high and high - low < 0.2, fit.alpha_ci


def test_three_points_fit_exactly_and_are_flagged_not_identified():
    fit = fit_power_law(N4[:3], np.array([5.0, 4.6, 4.4]))
    assert fit.dof == 0 and not fit.identified and "dof 0" in fit.reason
    assert fit.law.E >= 0 and fit.law.A >= 0 and fit.rss < 1e-10  # passes through its points: no test of the law
    with pytest.raises(ValueError, match="≥ 3 distinct sizes"):
        fit_power_law(N4[:2], np.array([5.0, 4.6]))


def test_alpha_at_a_bound_or_no_trend_is_flagged():
    steep = PowerLaw(E=2.0, A=1e12, alpha=2.8)  # steeper than the search allows
    fit = fit_power_law(N4, steep(N4), bounds=(0.02, 2.0))
    assert not fit.identified and fit.law.alpha == pytest.approx(2.0) and "bound" in fit.reason
    flat = fit_power_law(N4, np.array([4.0, 4.1, 4.0, 4.1]))
    assert not flat.identified


def test_an_asymptote_at_its_bound_0_is_flagged_like_alpha():
    """Losses from a law whose asymptote lies below 0 (E = −1): the non-negative fit stops E at 0 and the fit reads
    "not identified" (E at its bound), as α at a bound does; the same law lifted above 0 is identified."""
    below = PowerLaw(E=-1.0, A=6.0, alpha=0.1)
    fit = fit_power_law(N4, below(N4))
    assert fit.law.E == 0.0 and not fit.identified and fit.reason == "E at its bound 0", fit
    lifted = fit_power_law(N4, below(N4) + 3.0)  # E = 2: interior, the same shape
    assert lifted.identified and lifted.law.E == pytest.approx(2.0, abs=1e-3), lifted


@pytest.fixture
def a_params(micro_params):
    """The micro params with the synthetic cells' sizes (a-d) and the variants they compare (wd_in, wd_out)."""
    sizes = {**micro_params.model.sizes, "d": SizeConfig(n_layer=2, d_model=64, n_head=2, n_kv_head=1, d_ff=128)}
    variants = {**micro_params.model.variants, "wd_in": ScaleConfig(wd_input_scales=True),
                "wd_out": ScaleConfig(wd_output_scales=True)}
    return micro_params.model_copy(update={"model": micro_params.model.model_copy(
        update={"sizes": sizes, "variants": variants})})


def _cells(losses: dict) -> pl.DataFrame:
    """Rows of cells from {(recipe, variant, size, seed): (loss, sharpness[, gamma_mean])}: γ at init's mean 1 unless
    given, with a trained spread (std 0.05), none for `none`."""
    n = {"a": 5e4, "b": 1e5, "c": 3e5, "d": 7.4e5}
    rows = [{"variant": v, "size": s, "recipe": r, "seed": seed, "val_loss": loss, "params": int(n[s] * 2),
             "non_embedding_params": int(n[s]), "flops": 6 * n[s] * 1e5, "sharpness": sharp, "sharpness_iters": 5,
             "sharpness_converged": True, "gamma_mean": None if v == "none" else (gamma[0] if gamma else 1.0),
             "gamma_std": None if v == "none" else 0.05}
            for (r, v, s, seed), (loss, sharp, *gamma) in losses.items()]
    return pl.DataFrame(rows)


def _study(seeds=(0, 1, 2), sizes="abcd", gap=0.05, noise=0.005, unified_sharp=1.0, shrink=0.1):
    """Losses on a known law: none worse and unified/wd_in better than standard by `gap`, wd_out worse, all paired
    by a per-seed offset (shared batches) plus small per-cell noise; the decayed variants' mean of every γ shrinks
    by `shrink` (± 0.002 by seed) against standard's."""
    rng = np.random.default_rng(0)
    n = {"a": 5e4, "b": 1e5, "c": 3e5, "d": 7.4e5}
    shift = {"none": gap, "standard": 0.0, "wd_in": -gap, "wd_out": gap / 2, "unified": -2 * gap}
    out = {}
    for seed in seeds:
        offset = rng.normal(0, 0.05)  # a seed's batches move every variant together
        for v, d in shift.items():
            for s in sizes:
                sharp = 10.0 * (0.8 if v == "wd_in" else 1.0) * np.exp(rng.normal(0, 0.02))
                gamma = 1.0 - (shrink + 0.002 * seed if v.startswith("wd_") else 0.0)
                out[("base", v, s, seed)] = (TRUTH(n[s]) + d + offset + rng.normal(0, noise), sharp, gamma)
    return _cells(out)


def test_summary_reports_no_spread_for_one_seed_never_zero():
    one = scaling.summarize(_study(seeds=(0,)))
    assert one["val_loss_std"].null_count() == one.height and set(one["seeds"]) == {1}
    three = scaling.summarize(_study())
    assert three["val_loss_std"].null_count() == 0 and (three["val_loss_std"] > 0).all()


def _by_id(entries):
    return {e["id"]: e for e in entries}


def test_ledger_pairs_by_seed_and_decides_by_the_stated_rule(a_params):
    cells = _study()
    fits = scaling.fit_all(cells, ScalingConfig(bootstrap=100))
    entries = claims_a.ledger(cells, fits, a_params)
    led = _by_id(entries)
    # paired by seed: the seed offsets (sd 0.05) cancel, so a 0.05 gap is resolved with 3 seeds
    for cid in ("base.none_hurts", "base.unified_helps", "base.wd_out_hurts", "base.unified_best",
                "base.none_hurts@a"):
        assert led[cid]["verdict"] == claims.REPRODUCED, led[cid]
        assert led[cid]["n_seeds"] == 3 and led[cid]["spread"] > 0
        assert all(p["passed"] for p in led[cid]["premises"]) and led[cid]["premises"], led[cid]
    assert led["base.unified_helps"]["effect"] == pytest.approx(0.1, abs=0.01)
    assert "QK-norm γ" in led["base.wd_out_hurts"]["claim"]
    assert all(e["published"].startswith(("ordering only", "none:")) for e in entries)
    assert "base.branch_helps" not in led  # no cells, no claim
    # decay on input-norm γ decays the final norm's too, which no cell records apart: untested, the numbers kept
    for cid in ("base.wd_in_helps", "base.sharpness_wd_in"):
        assert led[cid]["verdict"].startswith("untested (final norm: decayed"), led[cid]
        assert led[cid]["effect"] > 0 and led[cid]["spread"] > 0
    # a sharpness whose power iteration missed its tolerance is no value: that seed drops out of the claim
    unconverged = cells.with_columns(
        pl.when(pl.col("seed") == 0).then(False).otherwise(True).alias("sharpness_converged"))
    again = _by_id(claims_a.ledger(unconverged, fits, a_params))
    assert again["base.sharpness_wd_in"]["n_seeds"] == 2 and again["base.unified_helps"]["n_seeds"] == 3
    # identified fits on a common law: the α claim is decided by its per-seed paired t interval, not blocked
    assert fits["standard"].identified and fits["unified"].identified
    assert not led["base.alpha_unified"]["verdict"].startswith("inconclusive (")


def test_every_entry_states_its_regime_beside_the_papers(a_params):
    cells = _study()
    entries = claims_a.ledger(cells, scaling.fit_all(cells, ScalingConfig(bootstrap=20)), a_params)
    pre = a_params.pretrain
    for e in entries:
        reg = e["regime"]
        assert reg["scope"] == "small-scale" and "0.12B" in reg["paper"] and reg["paper_tokens_per_param"] == 20
        assert reg["tokens"] == pre.total_steps() * pre.batch_size * pre.seq_len and reg["steps"] == pre.total_steps()
        size = e["id"].split("@")[1] if "@" in e["id"] else "d"  # a pooled claim: its largest size
        assert reg["non_embedding_params"] == cells.filter(pl.col("size") == size)["non_embedding_params"][0], e["id"]
        assert e["paper_effect"] is None  # the paper states orderings, no sizes
        # each claim's smallest effect is the one its registry declares, by the metric it is in
        want = (claims_a.ALPHA_SESOI if "alpha" in e["id"] else claims_a.SHARPNESS_SESOI if "sharpness" in e["id"]
                else claims_a.LOSS_SESOI)
        assert e["smallest_effect"] == want.value > 0 and e["sesoi"]["reason"] == want.reason, e["id"]


def test_a_decay_claim_whose_gamma_did_not_move_is_untested(a_params):
    """The decay claims read the cells' mean of every γ: a shrinkage of 0.01 (over the decayed share of the vectors, 2
    of 5 at one layer for wd_out: 0.025, under 0.05) leaves them untested whatever their loss gaps; the other claims
    are decided as before, and a decay that moved γ (0.1) decides wd_out."""
    cells = _study(shrink=0.01)
    led = _by_id(claims_a.ledger(cells, scaling.fit_all(cells, ScalingConfig(bootstrap=20)), a_params))
    for cid in ("base.wd_in_helps", "base.wd_out_hurts", "base.sharpness_wd_in"):
        assert led[cid]["verdict"].startswith("untested (γ moved: "), led[cid]
        assert led[cid]["effect"] > 0 and led[cid]["n_seeds"] == 3
    moved = next(p for p in led["base.wd_out_hurts"]["premises"] if p["name"] == "γ moved")
    assert not moved["passed"] and "the mean of every γ 0.0120" in moved["value"]
    assert led["base.none_hurts"]["verdict"] == claims.REPRODUCED
    assert _by_id(claims_a.ledger(_study(shrink=0.1), {}, a_params))["base.wd_out_hurts"]["verdict"] == \
        claims.REPRODUCED
    # the pull: decay on γ 10x the matrices' rate is no longer the paper's treatment
    strong = a_params.optim["adamw"].model_copy(update={"scale_wd_mult": 10.0})
    led = _by_id(claims_a.ledger(_study(shrink=0.1), {}, a_params.model_copy(
        update={"optim": {**a_params.optim, "adamw": strong}})))
    assert led["base.wd_out_hurts"]["verdict"].startswith("untested (per-step pull: λ·η 0.003, 10x the paper's")


def _with_kind_means(cells: pl.DataFrame, input_shrink: float, final_shrink: float) -> pl.DataFrame:
    """The cells as today's pretrain cells write them, each kind's mean γ apart: wd_in shrinks the blocks' input γ by
    `input_shrink` and the final norm's by `final_shrink`, wd_out the output γ by 0.1; the other kinds stay at 1."""
    def kind(col: str, arm: str, by: float) -> pl.Expr:
        return pl.when(pl.col("variant") == arm).then(1.0 - by - 0.002 * pl.col("seed")).otherwise(1.0).alias(col)
    return cells.with_columns(kind("gamma_input_mean", "wd_in", input_shrink),
                              kind("gamma_final_mean", "wd_in", final_shrink),
                              kind("gamma_output_mean", "wd_out", 0.1))


def test_cells_with_each_kinds_mean_apart_decide_decay_on_input_gamma(a_params):
    """Where the cells record each kind's mean (train/callbacks.py kind_means), γ moved reads the decayed kind's own
    mean and the final norm's shrinkage is stated beside it: decay on input-norm γ is decided, no longer untested for
    the final norm; an input γ that did not move leaves it untested on γ moved, whatever the mean of every γ says."""
    led = _by_id(claims_a.ledger(_with_kind_means(_study(), 0.1, 0.12), {}, a_params))
    entry = led["base.wd_in_helps"]
    assert entry["verdict"] == claims.REPRODUCED, entry
    premise = {p["name"]: p for p in entry["premises"]}
    assert premise["final norm"]["passed"] and "measured apart in the cells: its mean shrank 0.1220" in \
        premise["final norm"]["value"]
    assert "the input-norm γ of the blocks" in premise["γ moved"]["need"] and \
        premise["γ moved"]["value"].startswith("0.1020")
    assert "the output-norm γ" in {p["name"]: p for p in led["base.wd_out_hurts"]["premises"]}["γ moved"]["need"]
    still = _by_id(claims_a.ledger(_with_kind_means(_study(), 0.01, 0.12), {}, a_params))["base.wd_in_helps"]
    assert still["verdict"].startswith("untested (γ moved: 0.0120"), still


@mutant("gamma-moved-off")  # the γ-moved premise always holds: a decay that moved nothing decides its claim
def _(monkeypatch):
    real = premises_a.moved_premise
    monkeypatch.setattr(premises_a, "moved_premise", lambda *a, **k: {**real(*a, **k), "passed": True})


@mutant("pull-off")  # the per-step pull premise always holds
def _(monkeypatch):
    real = premises_a.pull_premise
    monkeypatch.setattr(premises_a, "pull_premise", lambda *a, **k: {**real(*a, **k), "passed": True})


test_the_decay_premises_are_caught = mutation_checks([
    ("gamma-moved-off", "tests/test_scaling.py::test_a_decay_claim_whose_gamma_did_not_move_is_untested"),
    ("pull-off", "tests/test_scaling.py::test_a_decay_claim_whose_gamma_did_not_move_is_untested")])


def test_ledger_contradicts_a_reversed_ordering_and_says_one_seed(a_params):
    cells = _study(gap=-0.05)  # none better, unified worse than standard
    led = _by_id(claims_a.ledger(cells, scaling.fit_all(cells, ScalingConfig(bootstrap=50)), a_params))
    assert led["base.none_hurts"]["verdict"] == claims.CONTRADICTED
    assert led["base.unified_helps"]["verdict"] == claims.CONTRADICTED
    one = _study(seeds=(0,))
    led1 = _by_id(claims_a.ledger(one, scaling.fit_all(one, ScalingConfig()), a_params))
    assert led1["base.unified_helps"]["verdict"] == "inconclusive (1 seed)"
    assert led1["base.unified_helps"]["spread"] is None and led1["base.unified_helps"]["effect"] > 0
    assert led1["base.alpha_unified"]["verdict"] == "inconclusive (1 seed)"
    # γ that never left init (a treatment that did not act): untested
    frozen = cells.with_columns(pl.when(pl.col("variant") == "unified").then(0.0).otherwise(pl.col("gamma_std"))
                                .alias("gamma_std"))
    led = _by_id(claims_a.ledger(frozen, {}, a_params))
    assert led["base.unified_helps"]["verdict"] == "untested (γ left init: unified: 0)"


def test_alpha_claim_uses_only_identified_fits(a_params):
    cells = _study(sizes="abc")  # 3 sizes: fits exist but have no residual dof
    fits = scaling.fit_all(cells, ScalingConfig(bootstrap=50))
    assert not fits["unified"].identified
    led = _by_id(claims_a.ledger(cells, fits, a_params))
    assert led["base.alpha_unified"]["verdict"].startswith("inconclusive (standard fit not identified")
    # 4 sizes: the mean fits are identified, but one seed's unified curve is flat (its α at a bound): blocked
    flat = pl.col("variant").eq("unified") & pl.col("seed").eq(1)
    cells = _study().with_columns(pl.when(flat).then(4.0 + 0.001 * pl.col("non_embedding_params").rank("dense")
                                                     .over("variant", "seed")).otherwise(pl.col("val_loss"))
                                  .alias("val_loss"))
    fits = scaling.fit_all(cells, ScalingConfig(bootstrap=50))
    led = _by_id(claims_a.ledger(cells, fits, a_params))
    assert led["base.alpha_unified"]["verdict"].startswith("inconclusive (unified fit of seed 1 not identified")
    assert led["base.alpha_unified"]["spread"] is None


def test_peri_ln_wd_out_names_its_branch_output_gammas(micro_params):
    assert claims_a.output_gammas(micro_params, "base") == "QK-norm γ"
    assert claims_a.output_gammas(micro_params, "peri_ln") == "QK-norm and post-branch γ"


def test_interval_claim_follows_the_same_decision():
    rule = "test rule"
    REG_ = {"regime": REG, "smallest_effect": claims.Sesoi(0.05, "a test's")}
    up = claims.interval_claim("x", "c", "m", 0.3, (0.1, 0.5), 3, rule, "p", **REG_)
    assert up["verdict"] == claims.REPRODUCED and up["spread"] == pytest.approx(0.2)
    down = claims.interval_claim("x", "c", "m", -0.3, (-0.5, -0.1), 3, rule, "p", **REG_)
    assert down["verdict"] == claims.CONTRADICTED
    flat = claims.interval_claim("x", "c", "m", 0.3, (-0.1, 0.5), 3, rule, "p", **REG_)
    assert flat["verdict"] == claims.INCONCLUSIVE
    blocked = claims.interval_claim("x", "c", "m", 0.3, (0.1, 0.5), 3, rule, "p", unusable="fit not identified",
                                     **REG_)
    assert blocked["verdict"] == "inconclusive (fit not identified)"
    assert tuple(up) == claims.FIELDS


def test_fits_table_and_plot_show_flags(tmp_path):
    cells = _study(sizes="abc")
    fits = scaling.fit_all(cells, ScalingConfig(bootstrap=20))
    table = scaling.fits_table(fits)
    assert set(table["identified"]) == {False} and (table["dof"] == 0).all()
    scaling.plot(scaling.summarize(cells), fits, tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 10_000


def _write_cells(tmp_path, losses):
    for (variant, size, seed), loss in losses.items():
        n = {"a": 1e4, "b": 3e4, "c": 1e5}[size]
        cell = {"variant": variant, "size": size, "recipe": "base", "seed": seed, "val_loss": loss,
                "params": n * 2, "non_embedding_params": n, "flops": 6 * n * 1e5}
        (tmp_path / f"{variant}-{size}-base-{seed}.json").write_text(json.dumps(cell))


def test_collect_refuses_foreign_files(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"val_loss": 1.0}))
    with pytest.raises(ValueError, match="missing keys"):
        scaling.collect(tmp_path)


def test_collect_reads_only_the_current_grid(tmp_path, micro_params):
    grid = micro_params.pretrain.grid
    names = scaling.grid_cells(grid)
    assert len(names) == len(grid.variants) * len(grid.sizes) * len(grid.seeds) + len(grid.recipes) * len(
        grid.recipe_variants) * len(grid.recipe_sizes) * len(grid.seeds)
    assert "unified-c-base-0" in names and "standard-a-muon-0" in names
    assert "standard-a-peri_ln-0" not in names  # a recipe defined but not in grid.recipes
    _write_cells(tmp_path, {("standard", "a", 0): 5.0, ("standard", "b", 0): 4.8})
    (tmp_path / "gone-a-base-0.json").write_text("{}")  # a cell since removed from params: ignored
    cells = scaling.collect(tmp_path, ["standard-a-base-0", "standard-b-base-0"])
    assert cells.height == 2 and cells["sharpness"].null_count() == 2  # not measured: null, not 0
    with pytest.raises(ValueError, match="standard-c-base-0.json: missing"):
        scaling.collect(tmp_path, ["standard-c-base-0"])


def test_the_recipe_table_shows_every_recipe_and_a_claim_without_data(a_params):
    cells = _study()
    entries = claims_a.ledger(cells, scaling.fit_all(cells, ScalingConfig(bootstrap=50)), a_params)
    entries[0] = {**entries[0], "effect": None, "spread": None, "verdict": "inconclusive (no data)"}
    table = claims_a.recipe_table(entries).splitlines()
    assert table[0] == "| claim | base |" and "inconclusive (no data)" in table[2]
    unified = next(r for r in table if r.startswith("| unified is better than standard |"))
    assert "**reproduced**" in unified and "±" in unified


# ---------------------------------------------------------------- the α claim on variants of known α
def _alpha_cells(alpha_unified: float, alpha_standard: float = 0.45, seeds=(0, 1, 2), noise=0.002) -> pl.DataFrame:
    """Each seed's curve L = E + A·N^-α of its variant's α (the curves meet at the smallest N) plus seeded noise."""
    rng = np.random.default_rng(1)
    out = {}
    for seed in seeds:
        for variant, alpha in (("standard", alpha_standard), ("unified", alpha_unified)):
            law = PowerLaw(E=2.0, A=TRUTH.A * N4[0] ** (alpha - TRUTH.alpha), alpha=alpha)
            for size, n in zip("abcd", N4):
                out[("base", variant, size, seed)] = (float(law(n)) + rng.normal(0, noise), 1.0)
    return _cells(out)


@pytest.mark.parametrize("alpha_unified, expected", [(0.60, claims.REPRODUCED), (0.30, claims.CONTRADICTED),
                                                     (0.45, claims.INCONCLUSIVE)])
def test_the_alpha_claim_follows_the_variants_exponents(micro_params, alpha_unified, expected):
    """Larger α for unified reproduces "unified scales better", smaller contradicts, equal is inconclusive; the
    effect is the per-seed α difference (noise 0.002 nats per cell: within ±0.05 of the truth)."""
    cells = _alpha_cells(alpha_unified)
    (entry,) = claims_a.scaling_claim(cells, scaling.fit_all(cells, ScalingConfig(bootstrap=20)), micro_params)
    assert entry["verdict"] == expected, entry
    assert entry["n_seeds"] == 3 and entry["spread"] > 0
    assert entry["effect"] == pytest.approx(alpha_unified - 0.45, abs=0.05)


@mutant("alpha-sign-flipped")
def _(monkeypatch):  # the comparison the wrong way round: α(standard) − α(unified)
    swap = {"unified": "standard", "standard": "unified"}
    real = claims_a.seed_matrix
    monkeypatch.setattr(claims_a, "seed_matrix", lambda cells, recipe, variant, seeds=None:
                        real(cells, recipe, swap.get(variant, variant), seeds))


@mutant("alpha-ignored")
def _(monkeypatch):  # every per-seed fit reports the same α, whatever the curve
    real = claims_a.fit_power_law

    def fit(n, loss, bounds):
        f = real(n, loss, bounds)
        return dataclasses.replace(f, law=dataclasses.replace(f.law, alpha=0.45))
    monkeypatch.setattr(claims_a, "fit_power_law", fit)


@pytest.mark.mutation
@pytest.mark.parametrize("name", ["alpha-sign-flipped", "alpha-ignored"])
def test_the_alpha_claim_test_catches(name):
    assert_caught("tests/test_scaling.py::test_the_alpha_claim_follows_the_variants_exponents[0.6-reproduced]", name)


# ---------------------------------------------------------------- zero spread over seeds
def test_identical_seed_differences_are_inconclusive_by_the_stated_rule(micro_params):
    """Spread 0 (every seed's difference the same) is a degenerate t interval: "inconclusive (no seed variance)",
    for 2 seeds or more, with the rule in the entry; differences that vary at all are decided as before."""
    d = claims.Sesoi(0.001, "a test's")
    for diffs in ([0.02, 0.02], [0.02] * 3, [-0.5] * 4):
        entry = claims.claim("x", "c", "m", diffs, "p", regime=REG, smallest_effect=d)
        assert entry["verdict"] == f"{claims.INCONCLUSIVE} (no seed variance)", entry
        assert entry["spread"] == 0.0 and entry["effect"] == pytest.approx(diffs[0])
    assert "identical differences" in claims.rule_text(0.95, d.value)
    assert claims.claim("x", "c", "m", [0.02, 0.021], "p", regime=REG, smallest_effect=d)["verdict"] == claims.REPRODUCED
    assert claims.claim("x", "c", "m", [0.02], "p", regime=REG,
                        smallest_effect=d)["verdict"] == f"{claims.INCONCLUSIVE} (1 seed)"
    # the α claim by the same rule: three seeds with the very same curves give identical α differences
    same = _alpha_cells(0.6, noise=0.0)
    (entry,) = claims_a.scaling_claim(same, scaling.fit_all(same, ScalingConfig(bootstrap=20)), micro_params)
    assert entry["verdict"] == f"{claims.INCONCLUSIVE} (no seed variance)" and "identical differences" in entry["rule"]


@mutant("spread0-old-rule")
def _(monkeypatch):  # the rule before: a zero-width interval above 0 reproduces
    monkeypatch.setattr(claims, "no_seed_variance", lambda diffs: False)
    monkeypatch.setattr(claims_a, "no_seed_variance", lambda diffs: False)


@pytest.mark.mutation
def test_the_zero_spread_test_catches_the_old_rule():
    assert_caught("tests/test_scaling.py::test_identical_seed_differences_are_inconclusive_by_the_stated_rule",
                  "spread0-old-rule")


# ---------------------------------------------------------------- what the premises and regimes count
@pytest.mark.parametrize("size", ["a", "b", "c"])
@pytest.mark.parametrize("variant, recipe", [("standard", "base"), ("wd_in", "base"), ("wd_out", "peri_ln"),
                                             ("none", "base"), ("standard", "moe")])
def test_the_counts_are_the_models(a_params, size, variant, recipe):
    """Parameters (dense) and γ vectors by kind as the model has them: what the regimes and γ moved read."""
    from scalelab.model import Transformer
    from scalelab.model.norm import Scale

    moe = recipe == "moe"  # the MoE MLP (the micro params have no MoE recipe)
    cfg = a_params.resolve_model(size, variant, vocab_size=97, moe=moe, recipe=None if moe else recipe)
    model = Transformer(cfg)
    kinds = [m.kind for m in model.modules() if isinstance(m, Scale)]
    assert premises_a.gamma_vectors(cfg) == {k: kinds.count(k) for k in ("input_scale", "output_scale")}
    if cfg.moe is None:
        assert premises_a.dense_counts(cfg) == (model.num_params(), model.num_params(non_embedding=True))
    with pytest.raises(ValueError, match="one γ per norm"):
        premises_a.gamma_vectors(a_params.resolve_model(size, "unified", vocab_size=97))


def test_the_papers_pull_is_the_gpu_presets():
    """The paper's per-step pull on γ is the 0.12B preset's AdamW lr × decay (the plan that preset reproduces)."""
    from scalelab.config.params import read_yaml

    adamw = read_yaml(ROOT / "configs" / "gpu-0.12b.yaml")["optim"]["adamw"]  # the preset composed over its base
    assert premises_a.PAPER_PULL == pytest.approx(adamw["lr"] * adamw["weight_decay"])
