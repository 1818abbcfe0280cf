"""The γ weight-decay dose-response (scalelab.scale_vectors.dose): its runs read from a study's pretrain cells (the dose
from each cell's recipe), the paired dose table, and the wd_in / wd_out claims decided at one dose by their measured
premises (γ moved, the per-step pull, the final norm not decayed or measured apart)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import test_scaling  # noqa: F401  (registers the decay premises' mutants: gamma-moved-off, pull-off)
import yaml
from mutants import mutant, mutation_checks

from scalelab.ledger import claims
from scalelab.scale_vectors import dose as dose_a, premises as premises_a
from scalelab.runtime import yamlio

ROOT = Path(__file__).resolve().parents[1]
T = "tests/test_gamma_dose.py::"


def _by_id(entries):
    return {e["id"]: e for e in entries}


# ---------------------------------------------------------------- the claims on runs
def _dose_rows(moved_at: float, gain: float, doses=(0.5, 1.0, 2.0, 10.0), final: bool = True):
    """Three seeds at size a; decay on one kind of γ (wd_in: input, wd_out: output) at `doses`: that kind's mean γ
    shrinks by 0.01 below `moved_at` and by 0.3 from it on (seed noise 0.01), the other kind's stays, and wd_in
    shrinks the final γ by as much (`final`: recorded apart, else the rows have no final γ); where γ moved wd_in lowers
    the loss by `gain` and wd_out raises it by `gain` (± 0.002 by seed), elsewhere ± 0.001 by seed."""
    rows = []
    for seed in (0, 1, 2):
        rows.append({"arm": "standard", "dose": 0.0, "size": "a", "seed": seed, "val_loss": 5.0, "gamma_in": 1.05,
                     "gamma_out": 1.0, "gamma_final": 1.1, "sharpness": 50.0})
        for dose in doses:
            moved = dose >= moved_at
            shrunk = (0.3 if moved else 0.01) + 0.01 * seed
            change = gain + 0.002 * seed if moved else 0.001 * seed
            rows.append({"arm": "wd_in", "dose": dose, "size": "a", "seed": seed, "gamma_in": 1.05 - shrunk,
                         "gamma_out": 1.0, "gamma_final": 1.1 - shrunk, "sharpness": 40.0, "val_loss": 5.0 - change})
            rows.append({"arm": "wd_out", "dose": dose, "size": "a", "seed": seed, "gamma_in": 1.05,
                         "gamma_out": 1.0 - shrunk, "gamma_final": 1.1, "sharpness": 50.0, "val_loss": 5.0 + change})
    return rows if final else [{k: v for k, v in r.items() if k != "gamma_final"} for r in rows]


@pytest.fixture
def dose_params(micro_params):
    """The micro params with the dose study's arms (its AdamW: lr 3e-3, decay 0.1: the paper's pull at 1x)."""
    variants = {**micro_params.model.variants, "wd_in": premises_a.ScaleConfig(wd_input_scales=True),
                "wd_out": premises_a.ScaleConfig(wd_output_scales=True)}
    return micro_params.model_copy(update={"model": micro_params.model.model_copy(update={"variants": variants})})


def test_the_dose_table_pairs_every_dose_with_no_decay_by_seed():
    table = {(e["arm"], e["dose"]): e for e in dose_a.dose_table(_dose_rows(moved_at=1.0, gain=0.05))}
    assert set(table) == {(a, d) for a in ("wd_in", "wd_out") for d in (0.5, 1.0, 2.0, 10.0)}
    assert table["wd_in", 0.5]["shrinkage"] == pytest.approx(0.02) and table["wd_in", 1.0]["n_seeds"] == 3
    assert table["wd_out", 1.0]["shrinkage"] == pytest.approx(0.31)
    assert table["wd_in", 1.0]["final_shrinkage"] == pytest.approx(0.31)
    assert table["wd_out", 1.0]["final_shrinkage"] == pytest.approx(0.0) and table["wd_out", 1.0]["loss_gain"] < 0
    assert table["wd_in", 1.0]["loss_gain"] == pytest.approx(0.052)
    assert table["wd_in", 1.0]["sharpness_drop"] == pytest.approx(np.log(50 / 40))
    mean, _, high = claims.t_interval([0.0, 1.0, 2.0])  # the shrinkage's seed noise, in units of 0.01
    assert table["wd_in", 0.5]["shrinkage_spread"] == pytest.approx(0.01 * (high - mean), rel=1e-9)
    no_final = {(e["arm"], e["dose"]): e for e in dose_a.dose_table(_dose_rows(1.0, 0.05, final=False))}
    assert no_final["wd_in", 1.0]["final_shrinkage"] is None


def test_gamma_decay_claims_are_decided_at_one_dose_by_their_premises(dose_params):
    """Each claim is decided at the lowest dose whose premises hold (γ moved; a per-step pull within 3x of the paper's
    3e-4: doses 0.5-2 at lr 3e-3 and decay 0.1), else at the lowest that moved γ, else at the dose nearest the paper's
    pull; a failed premise leaves it untested there."""
    rows = _dose_rows(moved_at=1.0, gain=0.05)
    led = _by_id(dose_a.dose_claims(rows, dose_params))
    for key in ("dose.wd_out_hurts", "dose.wd_in_helps"):
        e = led[key]
        assert "at 1x" in e["claim"] and "premises hold" in e["claim"], e["claim"]
        assert e["verdict"] == claims.REPRODUCED and e["effect"] == pytest.approx(0.052)
    assert [p["name"] for p in led["dose.wd_out_hurts"]["premises"]] == ["γ moved", "per-step pull"]
    final = led["dose.wd_in_helps"]["premises"][2]
    assert final["name"] == "final norm" and final["passed"] and "measured apart" in final["value"], final
    assert "shrank 0.3100 [" in final["value"] and "of the blocks" in led["dose.wd_in_helps"]["premises"][0]["need"]
    pre = dose_params.pretrain
    total, non_emb = premises_a.dense_counts(dose_params.resolve_model("a", "standard",
                                                                        dose_params.tokenizer.vocab_size))
    e = led["dose.wd_out_hurts"]
    assert e["regime"]["params"] == total and e["regime"]["non_embedding_params"] == non_emb
    assert e["regime"]["tokens"] == pre.total_steps() * pre.batch_size * pre.seq_len
    assert _by_id(dose_a.dose_claims(_dose_rows(1.0, -0.05), dose_params))["dose.wd_out_hurts"]["verdict"] == \
        claims.CONTRADICTED
    # γ moved only at 10x the matrices' decay: a pull 10x the paper's, untested
    e = _by_id(dose_a.dose_claims(_dose_rows(10.0, 0.05), dose_params))["dose.wd_out_hurts"]
    assert "at 10x" in e["claim"] and e["verdict"].startswith("untested (per-step pull: λ·η 0.003, 10x the paper's")
    # γ never moved: read at the paper's pull (1x), untested because γ did not move, whatever the loss did
    e = _by_id(dose_a.dose_claims(_dose_rows(math.inf, 0.05), dose_params))["dose.wd_out_hurts"]
    assert "at 1x" in e["claim"] and e["verdict"].startswith("untested (γ moved: 0.0200 [")


def test_a_final_norm_decayed_and_not_measured_apart_leaves_wd_in_untested(dose_params):
    """Runs that record one mean of every input-norm γ (no final γ apart) cannot separate the final norm's decay: no
    dose passes, so wd_in is read at the lowest that moved γ and is untested there; wd_out is not concerned."""
    led = _by_id(dose_a.dose_claims(_dose_rows(1.0, 0.05, final=False), dose_params))
    e = led["dose.wd_in_helps"]
    assert "at 1x" in e["claim"] and "moves γ" in e["claim"] and e["effect"] == pytest.approx(0.052)
    assert e["verdict"] == "untested (final norm: decayed, no mean of it apart in the cells)"
    assert led["dose.wd_out_hurts"]["verdict"] == claims.REPRODUCED


def test_dose_claims_compare_one_size(dose_params):
    rows = _dose_rows(1.0, 0.05)
    with pytest.raises(ValueError, match="one size"):
        dose_a.dose_claims(rows + [{**rows[0], "size": "b"}], dose_params)


# ---------------------------------------------------------------- the generator on a study's cells
def _study(tmp_path: Path, cells: dict, **changes) -> Path:
    """A committed study folder: params.yaml (the micro profile with the dose arms, AdamW at 10x as recipe wd10;
    `changes` edit that recipe's optimizer), and one cell folder per {(variant, recipe, seed): metrics}, each with its
    cell.json and metrics/pretrain/<cell>.json as `scalelab study` keeps them."""
    raw = yamlio.safe_load((ROOT / "tests" / "micro_params.yaml").read_text())
    raw["model"]["variants"] |= {"wd_in": {"wd_input_scales": True}, "wd_out": {"wd_output_scales": True}}
    raw["optim"]["adamw_wd10"] = {**raw["optim"]["adamw"], "scale_wd_mult": 10.0, **changes}
    raw["pretrain"]["recipes"]["wd10"] = {"optimizer": "adamw_wd10"}
    folder = tmp_path / "results" / "dose"
    folder.mkdir(parents=True)
    (folder / "params.yaml").write_text(yaml.safe_dump(raw))
    for (variant, recipe, seed), m in cells.items():
        name = f"{variant}-a-{recipe}-{seed}"
        rel = f"metrics/pretrain/{name}.json"
        cell = folder / "cells" / f"pretrain@{name}-0123"
        (cell / rel).parent.mkdir(parents=True)
        (cell / rel).write_text(json.dumps({"variant": variant, "size": "a", "recipe": recipe, "seed": seed, **m}))
        (cell / "cell.json").write_text(json.dumps({"files": {rel: "md5"}}))
    return folder


def _cells(blocks: float, final: float, gain: float = 0.05) -> dict:
    """Three seeds: standard, and wd_in and wd_out at 1x (base) and 10x (wd10). A dosed kind's blocks' mean γ shrinks
    by `blocks` at 1x and 0.3 at 10x, the final γ (wd_in) by `final` at both (each + 0.01 by seed); the loss moves
    by `gain` in the claims' direction wherever the decay acts (+ 0.002 by seed)."""
    out = {}
    for seed in (0, 1, 2):
        base = {"val_loss": 5.0, "gamma_input_mean": 1.0, "gamma_output_mean": 1.0, "gamma_final_mean": 1.2,
                "sharpness": 40.0, "sharpness_converged": True}
        out["standard", "base", seed] = base
        for recipe, shrink in (("base", blocks), ("wd10", 0.3)):
            s, g = shrink + 0.01 * seed, gain + 0.002 * seed
            out["wd_in", recipe, seed] = {**base, "gamma_input_mean": 1.0 - s, "val_loss": 5.0 - g,
                                          "gamma_final_mean": 1.2 - final - 0.01 * seed}
            out["wd_out", recipe, seed] = {**base, "gamma_output_mean": 1.0 - s, "val_loss": 5.0 + g,
                                           "sharpness_converged": False}
    return out


def test_the_generator_reads_each_cells_dose_from_its_recipe(tmp_path):
    """The ledger of a study of cells: the dose of each from its recipe's AdamW (1x base, 10x wd10); at 1x γ moved by
    0.1 on either kind under the paper's pull, and the final γ is measured apart: both claims decided at 1x; the dose
    table as markdown, λ·η·T from the params (3e-4 × steps × dose), a sharpness that missed its tolerance left out."""
    folder = _study(tmp_path, _cells(blocks=0.1, final=0.2))
    led = _by_id(dose_a.gamma_wd_dose(folder))
    assert led["dose.wd_in_helps"]["verdict"] == claims.REPRODUCED and "at 1x" in led["dose.wd_in_helps"]["claim"]
    assert led["dose.wd_out_hurts"]["verdict"] == claims.REPRODUCED
    moved, _, final = led["dose.wd_in_helps"]["premises"]
    assert moved["value"].startswith("0.1100 [") and final["passed"] and "its mean shrank 0.2100 [" in final["value"]
    table = dose_a.table_markdown(folder / "cells").splitlines()
    steps = premises_a.study_params(folder).pretrain.total_steps()
    assert len(table) == 2 + 4
    assert table[2].startswith(f"| input | 1 | {3e-4 * steps:.3g} | +0.1100 ± ") and "| +0.2100 ± " in table[2]
    assert table[3].startswith(f"| input | 10 | {3e-3 * steps:.3g} | +0.3100 ± ")
    assert table[4].startswith("| output | 1 |") and table[4].endswith("| – | 3 |")  # no converged sharpness


def test_gamma_moved_reads_the_blocks_input_gamma_not_the_final_norms(tmp_path):
    """Decay at 1x that moved only the final γ (0.3) and the blocks' input-norm γ by 0.01 did not move the γ the claim
    speaks of: wd_in at 1x fails γ moved, and is read at 10x (pull 10x the paper's), untested either way."""
    led = _by_id(dose_a.gamma_wd_dose(_study(tmp_path, _cells(blocks=0.01, final=0.3))))
    e = led["dose.wd_in_helps"]
    assert "at 10x" in e["claim"] and e["verdict"].startswith("untested (per-step pull: "), e


def test_the_generator_refuses_cells_that_are_no_dose_of_one_treatment(tmp_path):
    cells = _cells(0.1, 0.2)
    with pytest.raises(ValueError, match="recipe 'wd10' differs from the base recipe in more than optim.adamw_wd10"):
        dose_a.gamma_wd_dose(_study(tmp_path / "lr", cells, lr=6e-3))
    with pytest.raises(ValueError, match="the dose-response's arms are standard, wd_in, wd_out"):
        dose_a.gamma_wd_dose(_study(tmp_path / "arm", {**cells, ("unified", "base", 0): cells["standard", "base", 0]}))
    with pytest.raises(ValueError, match=r"more than one cell for \(arm, dose, size, seed\) \('standard', 0.0"):
        dose_a.gamma_wd_dose(_study(tmp_path / "dup", {**cells, ("standard", "wd10", 0): cells["standard", "base", 0]}))
    old = {k: {n: v for n, v in m.items() if n != "gamma_final_mean"} for k, m in cells.items()}
    with pytest.raises(ValueError, match="no gamma_final_mean .* rerun it with --refresh"):
        dose_a.gamma_wd_dose(_study(tmp_path / "old", old))


def test_the_cells_beside_the_runs_of_the_script_they_replace(tmp_path):
    """Per run of an earlier record (its input γ one mean of every input-norm vector, the final norm's included),
    then → now, the cells' input γ pooled the same way: at size a (one layer) two block vectors and the final one; a
    run without its cell yet (a study in progress) is counted, not shown."""
    cells = _cells(0.1, 0.2)
    folder = _study(tmp_path, cells)
    then = [{"arm": "wd_in", "dose": 10.0, "seed": 1, "val_loss": 5.0, "gamma_in": 0.5, "gamma_out": 1.0,
             "sharpness": 30.0}, {"arm": "standard", "dose": 0.0, "seed": 0, "val_loss": 4.9, "gamma_in": 1.1,
                                  "gamma_out": 1.0, "sharpness": None}]
    (folder / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in then))
    table = dose_a.previous_markdown(folder / "runs.jsonl", folder / "cells").splitlines()
    now = cells["wd_in", "wd10", 1]
    pooled = (2 * now["gamma_input_mean"] + now["gamma_final_mean"]) / 3
    assert table[2] == "| standard | 0 | 0 | 4.9000 → 5.0000 | +0.1000 | 1.1000 → 1.0667 | 1.0000 → 1.0000 | – |"
    assert table[3] == (f"| wd_in | 10 | 1 | 5.0000 → {now['val_loss']:.4f} | {now['val_loss'] - 5:+.4f} | "
                        f"0.5000 → {pooled:.4f} | 1.0000 → 1.0000 | 30.0 → 40.0 |")
    assert table[-1] == (f"Largest difference over the 2 runs: val loss 0.1, input γ {abs(pooled - 0.5):.2g}, "
                         "output γ 0, λ_max (relative) 0.33.")  # the λ_max of one run only: the other has none
    (folder / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*then, {**then[0], "dose": 100.0}]))
    part = dose_a.previous_markdown(folder / "runs.jsonl", folder / "cells").splitlines()
    assert part[:-1] == table[:-1] and "2 runs (1 of the 3 runs have no cell yet): val loss 0.1" in part[-1]


# ---------------------------------------------------------------- the premises are load-bearing
@mutant("dose-lowest-ignored")  # the claims read at the largest dose, whether or not lower doses hold their premises
def _(monkeypatch):
    monkeypatch.setattr(dose_a, "min", max, raising=False)


@mutant("dose-final-pooled")  # γ moved read on the input γ pooled with the final norm's (as one mean of every γ)
def _(monkeypatch):
    real = dose_a.runs

    def pooled(folder):
        params, rows = real(folder)
        return params, [{**r, "gamma_in": (2 * r["gamma_in"] + r["gamma_final"]) / 3} for r in rows]

    monkeypatch.setattr(dose_a, "runs", pooled)


test_the_dose_premises_are_caught = mutation_checks([
    ("dose-lowest-ignored", T + "test_gamma_decay_claims_are_decided_at_one_dose_by_their_premises"),
    ("gamma-moved-off", T + "test_gamma_decay_claims_are_decided_at_one_dose_by_their_premises"),
    ("pull-off", T + "test_gamma_decay_claims_are_decided_at_one_dose_by_their_premises"),
    ("dose-final-pooled", T + "test_gamma_moved_reads_the_blocks_input_gamma_not_the_final_norms")])
