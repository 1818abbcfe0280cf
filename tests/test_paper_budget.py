"""The scale-vector study near the paper's token budget (scalelab.scale_vectors.paper_budget; configs/sv-paper-budget.yaml
and its spec): the budgets follow from the model shapes, a rung varies the LR alone, the LR choice and its extension
at an edge, the premises (budget by both counts, passes, LR chosen and interior, held out at the chosen LR, γ moved
against the spec's threshold) decide before any verdict, and every claim carries its declared smallest effect.

The ledger tests run the study's own generator on a synthetic results folder: the study's composed params and one
committed cell per (rung, variant, size, seed), written as `scalelab study` writes them."""

import json
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from scalelab.config import parse_params
from scalelab.config.params import read_yaml
from scalelab.config.machine import split
from scalelab.ledger import claims
from scalelab.scale_vectors import budget_tables, paper_budget as pb, premises as premises_a
from scalelab.study import costs, spec as study_spec

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "configs" / "sv-paper-budget.yaml"
VARIANTS = ("none", "standard", "wd_in", "wd_out", "branch", "placement", "magdir", "unified")
# a toy N per size (non-embedding, total) and a training split: 20 tokens per non-embedding parameter, < 4 passes
COUNTS = {"xxs": (250_000, 50_000), "xs": (360_000, 100_000), "s": (700_000, 300_000)}
TRAIN_TOKENS = 1_800_000


def _raw_params() -> dict:
    raw = read_yaml(PROFILE)
    raw["scaling"] = {**raw.get("scaling", {}), "gamma_moves": study_spec.load(ROOT, "sv-paper-budget")
                      .params["scaling.gamma_moves"]}
    return split(raw)[0]


@pytest.fixture(scope="module")
def params():
    return parse_params(_raw_params(), str(PROFILE))


# ---------------------------------------------------------------- the profile
def test_each_sizes_budget_is_20_tokens_per_non_embedding_parameter_of_its_shape(params):
    pre = params.pretrain
    step = pre.batch_size * pre.seq_len
    assert set(pre.max_tokens) == set(pre.grid.recipe_sizes) == {"xxs", "xs", "s"}
    for size, tokens in pre.max_tokens.items():
        _, non_emb = premises_a.dense_counts(params.resolve_model(size, "standard", vocab_size=params.tokenizer.vocab_size))
        assert tokens == math.ceil(pb.TOKENS_PER_PARAM * non_emb / step) * step, size  # whole steps, never below 20
        assert pre.for_size(size).total_steps() == tokens // step


def test_a_per_size_budget_needs_its_size(params):
    with pytest.raises(ValueError, match="per size"):
        params.pretrain.total_steps()
    with pytest.raises(ValueError, match="no budget for size 'm'"):
        params.pretrain.for_size("m")


def test_the_plan_costs_a_cell_at_its_own_sizes_budget(params):
    rates = costs.Rates({"xxs": {"base": 1000.0}, "s": {"base": 1000.0}}, 0.0, "test")
    flat = {f"pretrain.{k}": v for k, v in params.pretrain.model_dump(mode="json").items()}

    def cell(size):
        return SimpleNamespace(item={"size": size, "recipe": "lrx1"}, stage="pretrain_recipe",
                               params={"params.yaml": flat})

    small, big = rates.seconds(cell("xxs")), rates.seconds(cell("s"))
    assert small == pytest.approx(params.pretrain.max_tokens["xxs"] / 1000.0, rel=0.05)
    assert big == pytest.approx(params.pretrain.max_tokens["s"] / 1000.0, rel=0.05)


def test_the_rungs_are_a_ratio_2_ladder_of_the_base_recipes_lr_and_differ_in_nothing_else(params):
    rungs = pb.ladder(params)
    assert [r for r, _ in rungs][rungs.index(("lrx1", params.optim["adamw"].lr))] == "lrx1"
    assert all(params.optim[params.pretrain.recipes[r].optimizer].scale_wd_mult == 1.0 for r, _ in rungs)  # paper's λ
    bad = params.model_copy(update={"optim": {**params.optim, "adamw_x2": params.optim["adamw_x2"].model_copy(
        update={"weight_decay": 0.2})}})
    with pytest.raises(ValueError, match="no rung"):
        pb.ladder(bad)
    gap = params.model_copy(update={"pretrain": params.pretrain.model_copy(update={"grid": params.pretrain.grid
                            .model_copy(update={"recipes": ["lrd2", "lrx2"]})})})
    with pytest.raises(ValueError, match="factor 2"):
        pb.ladder(gap)


# ---------------------------------------------------------------- a synthetic committed study
def _loss(variant, size, recipe, seed, best="lrx1", gain=None, diverge=()):
    """A U in log-lr around `best` (0.02 a rung), a size trend, seed noise ± 0.003 shared by the variants and ± 0.001
    each variant's own; `gain` per variant lowers it."""
    lr_index = {"lrd8": -3, "lrd4": -2, "lrd2": -1, "lrx1": 0, "lrx2": 1, "lrx4": 2, "lrx8": 3}
    offset = lr_index[recipe] - lr_index[best]
    if recipe in diverge:
        return math.nan
    own = random.Random(f"{variant}-{size}-{recipe}-{seed}").uniform(-0.001, 0.001)  # str seeds: deterministic
    noise = 0.003 * ((seed * 7) % 3 - 1) + own
    base = {"xxs": 5.0, "xs": 4.8, "s": 4.5}[size] + 0.02 * offset ** 2 + noise
    return base - (gain or {}).get(variant, 0.0)


def _write_study(folder: Path, cells: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "params.yaml").write_text(yaml.safe_dump(_raw_params()))
    for m in cells:
        name = f"{m['variant']}-{m['size']}-{m['recipe']}-{m['seed']}"
        d = folder / "cells" / f"pretrain_recipe@{m['recipe']}-{m['variant']}-{m['size']}-{m['seed']}-k"
        rel = f"metrics/pretrain/{name}.json"
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(json.dumps(m))
        (d / "cell.json").write_text(json.dumps({"files": {rel: "x"}}))
    return folder


def _cell(variant, size, recipe, seed, loss, *, tokens=None, train_tokens=TRAIN_TOKENS, shrink=0.2):
    total, non_emb = COUNTS[size]
    tokens = tokens or 20 * non_emb
    decays_in = variant in ("wd_in", "unified")
    return {"variant": variant, "size": size, "recipe": recipe, "seed": seed, "val_loss": loss, "params": total,
            "non_embedding_params": non_emb, "flops": 1.0, "tokens": tokens, "steps": tokens // 1024,
            "train_tokens": train_tokens, "gamma_mean": None if variant == "none" else 1.0,
            "gamma_std": None if variant == "none" else 0.05,
            "gamma_input_mean": None if variant == "none" else 1.05 - (shrink if decays_in else 0.0),
            "gamma_output_mean": None if variant == "none" else 1.0 - (shrink if variant == "wd_out" else 0.0),
            "gamma_final_mean": None if variant == "none" else 1.1 - (shrink if decays_in else 0.0)}


def _study(tmp_path, *, sweep=("lrd2", "lrx1", "lrx2"), best=None, held=True, gain=None, held_rung=None, **kw):
    """Sweep cells of both arms at seed 0 on `sweep`; held-out seeds 1-3 of every variant at standard's chosen rung
    (or `held_rung`), unified at its own."""
    best = best or {"standard": "lrx1", "unified": "lrx1"}
    gain = gain if gain is not None else {"none": -0.05, "unified": 0.03, "wd_in": 0.02, "wd_out": -0.02,
                                          "branch": 0.015, "placement": 0.015, "magdir": 0.015}
    cells = []
    for size in COUNTS:
        for arm in pb.ARMS:
            cells += [_cell(arm, size, r, 0, _loss(arm, size, r, 0, best[arm], gain)) for r in sweep]
        if held:
            for v in VARIANTS:
                rung = held_rung or best["unified" if v == "unified" else "standard"]
                cells += [_cell(v, size, rung, s, _loss(v, size, rung, s, rung, gain), **kw) for s in (1, 2, 3)]
    return _write_study(tmp_path / "study", cells)


def _by_id(entries):
    return {e["id"]: e for e in entries}


def _premise(entry, name):
    return next(p for p in entry["premises"] if p["name"] == name)


def test_the_ledger_decides_each_claim_at_each_size_with_both_counts_its_premises_and_its_sesoi(tmp_path):
    entries = _by_id(pb.paper_budget(_study(tmp_path)))
    for size in COUNTS:
        none = entries[f"tuned.none_hurts@{size}"]
        assert none["verdict"] == "reproduced" and none["n_seeds"] == 3, none
        assert none["effect"] == pytest.approx(0.05, abs=0.002)
        assert entries[f"tuned.unified_helps@{size}"]["verdict"] == "reproduced"
        assert entries[f"tuned.wd_out_hurts@{size}"]["verdict"] == "reproduced"
        assert entries[f"tuned.unified_best@{size}"]["verdict"] == "reproduced"
    for e in entries.values():
        assert e["smallest_effect"] > 0 and e["sesoi"]["declared"] == claims.BEFORE and e["sesoi"]["reason"]
        budget = _premise(e, "budget")
        assert "20 tokens per non-embedding parameter" in budget["value"] and "per parameter" in budget["value"]
        assert e["regime"]["tokens_per_param"] and e["regime"]["non_embedding_params"]
    assert entries["tuned.alpha_unified"]["verdict"].startswith("inconclusive")  # 3 sizes: dof 0, not identified
    assert "not identified" in entries["tuned.alpha_unified"]["verdict"]


def test_the_readmes_tables_show_each_claim_at_each_size_and_each_arms_sweep(tmp_path):
    folder = _study(tmp_path)
    table = budget_tables.size_table(pb.paper_budget(folder)).splitlines()
    assert table[0] == "| claim (δ) | xxs | xs | s |"
    none = next(row for row in table if row.startswith("| no scale vectors"))
    assert none.count("**reproduced**") == 3 and "(0.01)" in none
    assert table[-1].startswith("| unified scales better") and "not identified" in table[-1]
    sweep = budget_tables.tuning_table(folder / "cells").splitlines()
    assert len(sweep) == 2 + len(COUNTS) * len(pb.ARMS) and all(row.endswith("| lrx1 |") for row in sweep[2:])


def test_the_loss_table_gives_each_variants_held_out_mean_per_size_and_says_three_sizes_identify_no_fit(tmp_path):
    folder = _study(tmp_path)
    rows = {r.split(" | ")[0][2:]: r for r in budget_tables.loss_table(folder / "cells").splitlines()[2:]}
    assert set(rows) == set(VARIANTS)
    mean = sum(_loss("none", "xs", "lrx1", s, "lrx1", None) + 0.05 for s in (1, 2, 3)) / 3  # the default gain of none
    xs = rows["none"].split(" | ")[2]
    assert xs.startswith(f"{mean:.4f} ± ") and f"(3; N {COUNTS['xs'][1]:,})" in xs, xs
    assert all("not identified (dof 0" in r for r in rows.values())  # 3 sizes, 3 parameters


def test_an_effect_inside_the_smallest_effect_contradicts(tmp_path):
    entries = _by_id(pb.paper_budget(_study(tmp_path, gain={"placement": 0.0})))
    e = entries["tuned.placement_helps@xs"]
    assert e["verdict"] == "contradicted" and abs(e["effect"]) < pb.SESOI["loss"].value, e


def test_a_budget_below_10_tokens_per_non_embedding_parameter_is_untested(tmp_path):
    entries = _by_id(pb.paper_budget(_study(tmp_path, tokens=9 * COUNTS["s"][1])))
    e = entries["tuned.none_hurts@s"]
    assert e["verdict"].startswith("untested (budget: 9 tokens per non-embedding parameter"), e["verdict"]


def test_more_than_4_passes_over_the_corpus_is_untested(tmp_path):
    entries = _by_id(pb.paper_budget(_study(tmp_path, train_tokens=COUNTS["s"][1] * 20 // 5)))
    assert entries["tuned.none_hurts@s"]["verdict"].startswith("untested (passes: 5 over"), entries["tuned.none_hurts@s"]
    ok = _by_id(pb.paper_budget(_study(tmp_path / "ok", train_tokens=COUNTS["s"][1] * 20 // 4)))
    assert _premise(ok["tuned.none_hurts@s"], "passes")["passed"]


def test_decay_that_did_not_move_gamma_past_the_specs_threshold_is_untested(tmp_path, params):
    threshold = params.scaling.gamma_moves
    still = _by_id(pb.paper_budget(_study(tmp_path, shrink=threshold / 2)))
    e = still["tuned.wd_out_hurts@xs"]
    assert e["verdict"].startswith("untested (γ moved"), e["verdict"]
    assert f"above {threshold}" in _premise(e, "γ moved")["need"]
    moved = _by_id(pb.paper_budget(_study(tmp_path / "moved", shrink=threshold * 2)))
    assert _premise(moved["tuned.wd_out_hurts@xs"], "γ moved")["passed"]
    # decay on input γ: its own premise reads the final norm apart
    assert _premise(moved["tuned.wd_in_helps@xs"], "final norm")["passed"]


def test_the_lr_is_chosen_on_the_sweep_seed_and_an_edge_asks_for_the_next_rung(tmp_path, params):
    folder = _study(tmp_path, best={"standard": "lrx1", "unified": "lrx4"}, held=False)
    _, cells, choices = pb.read(folder)
    assert choices["xs", "standard"].best == "lrx1" and choices["xs", "standard"].extend is None
    assert choices["xs", "unified"].best == "lrx2" and choices["xs", "unified"].extend == "lrx4"  # the top rung run
    lines = "\n".join(pb.next_slice(folder))
    assert '"lrx4-unified-xs-0"' in lines and "held out" not in lines  # no held-out entry until both arms chose
    entries = _by_id(pb.paper_budget(folder))
    e = entries["tuned.unified_helps@xs"]
    assert e["verdict"].startswith("untested") and not _premise(e, "LR chosen (unified, xs)")["passed"]
    assert _premise(e, "LR chosen (standard, xs)")["passed"]


def test_the_next_slice_lists_every_variant_at_standards_rung_and_unified_at_its_own(tmp_path):
    folder = _study(tmp_path, sweep=("lrd2", "lrx1", "lrx2", "lrx4"), best={"standard": "lrx1", "unified": "lrx2"},
                    held=False)
    lines = "\n".join(pb.next_slice(folder))
    assert "'lrx1-none-xxs-[123]'" in lines and "'lrx2-unified-xxs-[123]'" in lines
    assert "'lrx1-unified-xxs-[123]'" not in lines


def test_held_out_cells_at_another_rung_than_the_sweeps_choice_are_not_read(tmp_path):
    entries = _by_id(pb.paper_budget(_study(tmp_path, held_rung="lrx2")))  # the sweep chose lrx1
    e = entries["tuned.none_hurts@xs"]
    assert e["verdict"].startswith("untested") and not _premise(e, "held out at the chosen LR")["passed"], e
    assert "standard at lrx1: seeds none" in _premise(e, "held out at the chosen LR")["value"]


def test_an_edge_within_the_held_out_spread_is_interior_and_beyond_it_is_not(tmp_path):
    # the ladder's top rung best: nothing to extend to; interior only if it beats its neighbour within the spread
    top = ("lrx2", "lrx4", "lrx8")
    near = _by_id(pb.paper_budget(_study(tmp_path, sweep=top, best={"standard": "lrx8", "unified": "lrx8"})))
    premise = _premise(near["tuned.none_hurts@xs"], "LR chosen (standard, xs)")
    assert not premise["passed"] and "beats its neighbour" in premise["value"], premise
    c = pb.Choice("xs", "standard", {"lrx4": 4.001, "lrx8": 4.0}, {"lrx4": 1.2e-2, "lrx8": 2.4e-2}, "lrx8", None)
    assert c.edge(tolerance=0.003) is None and c.edge(tolerance=0.0005) is not None


def test_a_diverged_rung_is_never_chosen(tmp_path):
    folder = _study(tmp_path, best={"standard": "lrx2", "unified": "lrx1"}, held=False)
    cells = json.loads(next((folder / "cells").glob("pretrain_recipe@lrx2-standard-xs-0-k")).joinpath(
        "metrics/pretrain/standard-xs-lrx2-0.json").read_text())
    assert cells["val_loss"] < _loss("standard", "xs", "lrx1", 0, "lrx2")
    folder2 = _write_study(tmp_path / "nan", [_cell("standard", "xs", r, 0, _loss("standard", "xs", r, 0, "lrx2",
                                                                                 diverge=("lrx2",)))
                                              for r in ("lrd2", "lrx1", "lrx2")])
    _, _, choices = pb.read(folder2)
    assert choices["xs", "standard"].best == "lrx1"


def test_every_claim_refuses_a_missing_smallest_effect(tmp_path, monkeypatch):
    monkeypatch.setitem(pb.SESOI, "loss", None)
    with pytest.raises(ValueError, match="no smallest effect of interest"):
        pb.paper_budget(_study(tmp_path))


def test_the_sesoi_was_declared_before_the_study_and_rests_on_no_results():
    for sesoi in pb.SESOI.values():
        assert sesoi.declared_on and pb.STUDY not in sesoi.post_hoc_for and not sesoi.measured_on
        assert sesoi.row(pb.STUDY)["declared"] == claims.BEFORE
        assert not sesoi.row(pb.STUDY)["depends_on_results"]


def test_a_cell_trains_its_own_sizes_budget_and_records_the_corpus_it_passes_over(tmp_path):
    from test_train import make_shards, micro_raw

    from scalelab.train import Cell, fit

    shards = make_shards(tmp_path / "tokens", n_train=20_000)
    raw = micro_raw(max_steps=None, max_tokens={"a": 6 * 8 * 32, "b": 40 * 8 * 32}, sharpness={"enabled": False})
    raw["model"]["sizes"]["b"] = raw["model"]["sizes"]["a"]
    m = fit(parse_params(raw), Cell("standard", "a", "base", 0), tmp_path / "a", shards)
    assert m["steps"] == 6 and m["tokens"] == 6 * 8 * 32 and m["train_tokens"] == 20_000, m
