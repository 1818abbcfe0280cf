"""The optimizer benchmark's controls: the embedding-LR control (AdamW with its embeddings' LR a tuned multiple of its
own, a reference of its own; matrix families with their AdamW side group pinned at the baseline's tuned LR), the
references' LR retuned at every data budget, every tuned hyperparameter extended past an edge by the LR's rule, the
timed step being the trained step (clipping included), and the study profile that runs them at three sizes."""

import copy
import dataclasses
import math
from pathlib import Path

import pytest
import torch
from mutants import mutant, mutation_checks
from test_optimizers import _batch, _entries, _law, _model, _premise, _synthetic
from test_train import make_shards

from scalelab.ledger import claims
from scalelab.optbench import claims as claims_b, leaderboard, speedup
from scalelab.optbench.data import chosen
from scalelab.config import OptBenchConfig, ParamsError, load_params
from scalelab.model import Transformer
from scalelab.optim import build_optimizers
from scalelab.optbench import protocol
from scalelab.optbench import sweep as optbench, runs as optbench_run, timing as optbench_timing
from scalelab.runtime import yamlio

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 64


@pytest.fixture(scope="module")
def params():
    from conftest import MICRO

    return load_params(MICRO)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("tokens"), vocab=VOCAB, n_train=20_000, n_val=2_000)


def _control(params, optim: dict | None = None, **ob):
    """The micro profile with the control's arms: adamw_emb (AdamW, embeddings' LR multiplier centre 3) a reference,
    muon_pinned a pinned arm; `ob` overrides the section (validated)."""
    optim = {**params.optim, "adamw_emb": params.optim["adamw"].model_copy(update={"embedding_lr_mult": 3.0}),
             "muon_pinned": params.optim["muon"], **(optim or {})}
    raw = {**params.optimizers.model_dump(), "optimizers": ["adamw", "adamw_emb", "muon"], "pinned": ["muon_pinned"],
           "references": ["adamw_emb"], "max_runs": 40, **ob}
    pin_to = raw.get("pin_to") or {}
    if "pinned_cells" not in ob:
        raw["pinned_cells"] = {f"{o}-{s}": {"optimizer": o, "size": s, "ref": pin_to.get(o, raw["baseline"])}
                               for o in raw["pinned"] for s in raw["sizes"]}
    return params.model_copy(update={"optim": optim, "optimizers": OptBenchConfig(**raw)})


def _groups(run) -> dict[str, dict]:
    """{group name: group} of the optimizers the registry builds for a run's params copy (run_params)."""
    model = Transformer(run.resolve_model("a", "standard", vocab_size=VOCAB))
    return {g["name"]: g for o in build_optimizers(model, run.optim[optbench.RECIPE], model.cfg.scale)
            for g in o.param_groups}


# ---------------------------------------------------------------- the arms' groups
def test_a_pinned_arms_side_group_trains_at_the_baselines_tuned_lr(params):
    """Muon pinned, at 4x its centre LR and its own tuned decay 0.01: its matrices at that LR and decay, its AdamW side
    group (embeddings, LM head, scale vectors) at the LR, decay and betas the baseline chose, read from the baseline's
    sweep (all pinned, none the family's); the same family unpinned trains its side group at its own 4x LR, decay and
    betas (all the family's). What the run records (protocol.embedding_lr) is the LR the group is built with."""
    sub = _control(params)
    chosen = {"lr": 1.5e-3, "weight_decay": 0.3, "beta2": 0.99}
    pin = optbench.pinned_lr(sub, "muon_pinned", {"best_lr": 1.5e-3, "best_hp": chosen})
    assert pin == {"lr": 1.5e-3, "weight_decay": 0.3, "betas": [0.9, 0.99], "embedding_lr_mult": 1.0}
    assert optbench.pinned_lr(sub, "muon", {"best_lr": 1.5e-3, "best_hp": chosen}) is None
    hp = {"lr": 4 * 3e-3, "weight_decay": 0.01}
    run = optbench.run_params(sub, "muon_pinned", hp, pinned_lr=pin)
    groups = _groups(run)
    assert groups["matrix"]["lr"] == pytest.approx(1.2e-2) and groups["matrix"]["weight_decay"] == 0.01
    side = {k: g for k, g in groups.items() if k != "matrix"}
    assert set(side) >= {"embedding", "input_scale", "output_scale"}
    assert all(g["lr"] == g["base_lr"] == pytest.approx(1.5e-3) for g in side.values()), side
    assert side["embedding"]["weight_decay"] == 0.3 and all(g["betas"] == (0.9, 0.99) for g in side.values())
    assert groups["matrix"]["momentum"] == sub.optim["muon_pinned"].momentum  # the family's own, untouched
    assert protocol.embedding_lr(sub.optim["muon_pinned"], hp, pin) == pytest.approx(groups["embedding"]["lr"])
    free = _groups(optbench.run_params(sub, "muon", hp))
    assert free["embedding"]["lr"] == pytest.approx(1.2e-2) == protocol.embedding_lr(sub.optim["muon"], hp)
    assert free["embedding"]["weight_decay"] == 0.01 and free["embedding"]["betas"] == sub.optim["muon"].betas
    # pinned to the embedding control instead: its multiplier comes with the rest
    emb = _control(params, pin_to={"muon_pinned": "adamw_emb"})
    pin = optbench.pinned_lr(emb, "muon_pinned", {"best_lr": 2e-3, "best_hp": {"lr": 2e-3, "embedding_lr_mult": 9.0}})
    assert pin["embedding_lr_mult"] == 9.0 and pin["weight_decay"] == emb.optim["adamw_emb"].weight_decay
    groups = _groups(optbench.run_params(emb, "muon_pinned", hp, pinned_lr=pin))
    assert groups["embedding"]["lr"] == pytest.approx(1.8e-2) and groups["input_scale"]["lr"] == pytest.approx(2e-3)
    with pytest.raises(ValueError, match=r"pin_to: \['muon'\] not in optimizers.pinned"):
        _control(params, pin_to={"muon": "adamw_emb"})
    with pytest.raises(ValueError, match=r"pin_to: \['muon'\] not a reference arm"):
        _control(params, pin_to={"muon_pinned": "muon"})
    with pytest.raises(ParamsError, match="needs the adamw sweep's metrics"):
        optbench.pinned_lr(sub, "muon_pinned", None)
    with pytest.raises(ParamsError, match="sweep chose none"):
        optbench.pinned_lr(sub, "muon_pinned", {"best_lr": None})
    bad = _control(params, optim={"adamw_pinned": params.optim["adamw"]}, pinned=["adamw_pinned"])
    with pytest.raises(ParamsError, match="adamw_pinned .adamw. trains its embeddings itself: nothing to pin"):
        optbench.bench(bad)
    with pytest.raises(ValueError, match="also in optimizers.optimizers"):
        _control(params, pinned=["muon"])
    # the pinned arms' stage cells (dvc.yaml's foreach) written out as pinned x sizes with each arm's reference
    cells = _control(params).optimizers.pinned_cells
    assert {k: c.ref for k, c in cells.items()} == {f"muon_pinned-{s}": "adamw" for s in params.optimizers.sizes}
    wrong = {k: {**c.model_dump(), "ref": "adamw"} for k, c in emb.optimizers.pinned_cells.items()}
    with pytest.raises(ValueError, match=r"optimizers.pinned_cells .* must be .*'ref': 'adamw_emb'"):
        _control(params, pin_to={"muon_pinned": "adamw_emb"}, pinned_cells=wrong)
    with pytest.raises(ValueError, match=r"optimizers.pinned_cells \{\} must be"):
        _control(params, pinned_cells={})


def test_the_embedding_control_trains_its_embeddings_at_lr_times_the_multiplier(params):
    """adamw_emb at LR 4e-3 and multiplier 9: one AdamW, its embedding group (token embedding and LM head) at 3.6e-2,
    every other group at 4e-3; Adam's first step moves each LM-head weight by its group's LR (the update is the
    gradient's sign), so the built LR is the one trained. A family that regroups its parameters by name (Adam-mini)
    would lose the multiplier: refused."""
    sub = _control(params)
    hp = {"lr": 4e-3, "embedding_lr_mult": 9.0}
    run = optbench.run_params(sub, "adamw_emb", hp)
    groups = _groups(run)
    assert groups["embedding"]["lr"] == groups["embedding"]["base_lr"] == pytest.approx(3.6e-2)
    assert all(g["lr"] == pytest.approx(4e-3) for k, g in groups.items() if k != "embedding")
    assert protocol.embedding_lr(sub.optim["adamw_emb"], hp) == pytest.approx(3.6e-2)
    assert protocol.embedding_lr(sub.optim["adamw_emb"], {"lr": 4e-3}) == pytest.approx(1.2e-2)  # at its centre 3
    model = _model(run)
    opts = build_optimizers(model, run.optim[optbench.RECIPE].model_copy(update={"weight_decay": 0.0}),
                            model.cfg.scale)
    head, mat = model.lm_head.weight, model.blocks[0].mlp.up.weight
    before = head.detach().clone(), mat.detach().clone()
    optbench.train_step(model, opts, *_batch())
    assert (head.detach() - before[0]).abs().median().item() == pytest.approx(3.6e-2, rel=0.02)
    assert (mat.detach() - before[1]).abs().median().item() == pytest.approx(4e-3, rel=0.05)
    mini = params.optim["adam_mini"].model_copy(update={"embedding_lr_mult": 3.0})
    model = _model(params)
    with pytest.raises(ValueError, match="adam_mini regroups its parameters"):
        build_optimizers(model, mini, model.cfg.scale)


def test_the_control_arms_sweep_and_rerun_with_their_side_lr_recorded(params, shards, tmp_path):
    """Through the trainer: the pinned arm's sweep and reruns train every run with its side group at the baseline's
    tuned LR (the cell and each run record it), the LR grid unchanged; the embedding control's sweep tunes its
    multiplier over 1, 3, 9 at its chosen LR and records each run's embedding LR."""
    sub = _control(params, second={"adamw_emb": ["embedding_lr_mult"]}, timing_steps=1)
    sweep = optbench.sweep_cell(sub, "muon_pinned", "a", tmp_path / "pinned", shards, None,
                                baseline={"best_lr": 1.5e-3, "best_hp": {"lr": 1.5e-3}})
    assert sweep["pinned_lr"] == 1.5e-3 and sorted({r["lr"] for r in sweep["runs"]}) == pytest.approx(
        [1.5e-3, 3e-3, 6e-3])
    assert all(r["side_lr"] == r["embedding_lr"] == 1.5e-3 for r in sweep["runs"])
    seeds = optbench.seeds_cell(sub, "muon_pinned", "a", optbench.cell_metrics(sweep), tmp_path / "ps", shards, None)
    assert [r["seed"] for r in seeds["runs"]] == [2, 3] and all(r["side_lr"] == 1.5e-3 for r in seeds["runs"])
    emb = optbench.sweep_cell(sub, "adamw_emb", "a", tmp_path / "emb", shards, None)
    assert emb["second"]["embedding_lr_mult"]["values"] == pytest.approx([1.0, 3.0, 9.0])
    lr = emb["best_lr"]
    assert {r["hp"].get("embedding_lr_mult", 3.0): r["embedding_lr"] for r in emb["runs"] if r["lr"] == lr} == {
        m: pytest.approx(lr * m) for m in (1.0, 3.0, 9.0)}


# ---------------------------------------------------------------- the ledger against both references
def _with_control(params, emb_hp: dict, muon_lr: float, factor: float = 1.5):
    """_synthetic's adamw and muon, plus adamw_emb as a reference: its final losses the law's at `factor` × its tokens
    at every budget (it needs 1/factor the baseline's data), chosen at `emb_hp` from an interior sweep."""
    bench, cells, runs = _synthetic(params, {2: 1500.0, 3: 1800.0}, muon_lr=muon_lr)
    emb = params.optim["adamw"].model_copy(update={"embedding_lr_mult": 3.0})
    bench = dataclasses.replace(bench, optimizers=(*bench.optimizers, "adamw_emb"), references=("adamw_emb",),
                                optim={**bench.optim, "adamw_emb": emb})
    for size in bench.sizes:
        base = cells["adamw", size]
        cells["adamw_emb", size] = {**copy.deepcopy(base), "best_lr": emb_hp["lr"], "best_hp": emb_hp,
                                    "lr_grid": [emb_hp["lr"] / 2, emb_hp["lr"], emb_hp["lr"] * 2],
                                    "second": {"embedding_lr_mult": {"values": [1.0, 3.0, 9.0], "best": 3.0}}}
        for r in [r for r in runs if r["optimizer"] == "adamw" and r["size"] == size and r["batch"] == 1]:
            runs.append({**r, "optimizer": "adamw_emb", "hp": emb_hp, "lr": emb_hp["lr"],
                         "val_loss": _law(factor * r["tokens"])})
    return bench, cells, runs


def test_claims_are_built_against_the_baseline_and_against_the_embedding_control(params):
    """Muon at 4x AdamW's LR: its embeddings train at 4x the baseline's, so its claim against adamw is untested;
    adamw_emb trains its embeddings at 3 × 3e-3, within half a grid step of Muon's 1.2e-2, so the same claim against
    adamw_emb has every premise, and its speed-up is read off adamw_emb's own curve (1/1.5 of the one against adamw).
    The control itself is an observation against the baseline; the leaderboard shows both speed-ups."""
    bench, cells, runs = _with_control(params, {"lr": 3e-3}, muon_lr=4 * 3e-3)
    e = _entries(bench, cells, runs)
    vs_base, vs_emb = e["b-wen-muon-leads-a"], e["b-wen-muon-leads-a-vs-adamw_emb"]
    assert vs_base["verdict"].startswith("untested (embeddings trained like the baseline's: 4x")
    p = _premise(vs_emb, "embeddings trained like the baseline's")
    assert p["passed"] and p["value"].startswith("1.33x") and "adamw_emb" in p["need"]
    assert all(q["passed"] for q in vs_emb["premises"]) and "adamw_emb" in vs_emb["claim"]
    assert vs_base["effect"] == pytest.approx(0.65, rel=1e-3) and vs_emb["effect"] == pytest.approx(0.1, rel=1e-3)
    assert "adamw_emb's fitted" in vs_emb["metric"] and "b-wen-muon-lead-shrinks-vs-adamw_emb" in e
    assert claims.verdict_of(e["b-obs-adamw_emb-a"]) == "observation" and "embedding-LR control" in e[
        "b-obs-adamw_emb-a"]["published"]
    assert "b-obs-adamw_emb-a-vs-adamw_emb" not in e  # never against itself
    # the embedding-LR effect itself: adamw_emb over adamw on adamw's curve (1.5x on both seeds)
    emb = e["b-emb-adamw_emb-a"]
    assert emb["effect"] == pytest.approx(0.5, rel=1e-3) and emb["n_seeds"] == 2 and "baseline's" in emb["metric"]
    assert emb["smallest_effect"] == pytest.approx(0.1) and "embedding-LR control" in emb["published"]
    table = leaderboard.table(bench, cells, runs)
    row = table.filter((table["optimizer"] == "muon") & (table["size"] == "a")).row(0, named=True)
    assert row["speedup"] == pytest.approx(1.65, rel=1e-3) and row["speedup_vs_adamw_emb"] == pytest.approx(1.1)
    assert row["embedding_lr_ratio"] == pytest.approx(4.0) and row["embedding_lr_ratio_vs_adamw_emb"] == pytest.approx(
        4 / 3)
    assert "speed-up vs adamw_emb" in leaderboard.markdown(table)
    # a pinned arm (its cell's side LR the baseline's tuned one): the premise against the baseline holds
    for size in bench.sizes:
        cells["muon", size]["pinned_lr"] = 3e-3
    assert _premise(_entries(bench, cells, runs)["b-wen-muon-leads-a"], "embeddings trained like the baseline's")[
        "value"].startswith("1x")


def test_the_embedding_lr_pairs_each_treated_arm_with_its_own_control(params):
    """The embedding-LR effect's pairs: the reference beyond the baseline against the baseline, and the arm pinned to
    that reference against its twin of the same family pinned to the baseline; the pinned pair's effect is the ratio
    of their speed-ups on the baseline's curve (1.5x and 1.2x: +0.25)."""
    bench, cells, runs = _with_control(params, {"lr": 3e-3}, muon_lr=3e-3)
    muon = bench.optim["muon"]
    bench = dataclasses.replace(bench, optimizers=(*bench.optimizers, "muon_emb"),
                                optim={**bench.optim, "muon_emb": muon})
    for size in bench.sizes:
        cells["muon", size]["pinned_to"] = "adamw"
        cells["muon_emb", size] = {**copy.deepcopy(cells["muon", size]), "pinned_to": "adamw_emb"}
    for r in [r for r in runs if r["optimizer"] == "muon"]:
        r["val_loss"] = _law(1200.0)
        runs.append({**r, "optimizer": "muon_emb", "val_loss": _law(1500.0)})
    assert claims_b.embedding_pairs(bench, cells, "a") == [("adamw_emb", "adamw"), ("muon_emb", "muon")]
    e = _entries(bench, cells, runs)["b-emb-muon_emb-a-vs-muon"]
    assert e["effect"] == pytest.approx(0.25, rel=1e-3) and "muon_emb over muon" in e["metric"]
    assert all(p["passed"] for p in e["premises"]), e["premises"]
    cells["muon_emb", "a"]["pinned_to"] = "adamw"  # both pinned to the baseline: no treatment, no pair
    assert claims_b.embedding_pairs(bench, cells, "a") == [("adamw_emb", "adamw")]


# ---------------------------------------------------------------- the protocol
def _tune(params, best: dict, diverge: dict | None = None, optimizer="adamw", **ob):
    """protocol.tune on a parabola in log value around `best` (each hyperparameter absent: at its default),
    infinite where a value exceeds `diverge[hp]`; (choice, trials)."""
    sub = params.model_copy(update={"optimizers": params.optimizers.model_copy(update=ob)})
    trials = []

    def trial(hp):
        trials.append(dict(hp))
        value = {k: hp.get(k, protocol.centre(sub, optimizer, k)) for k in best}
        if any(value[k] > v for k, v in (diverge or {}).items()):
            return math.inf
        return 3.0 + sum(math.log(value[k] / best[k]) ** 2 if k not in ("beta1", "beta2") else
                         math.log((1 - value[k]) / (1 - best[k])) ** 2 for k in best)

    return protocol.tune(sub, optimizer, trial), trials, sub


def test_a_second_hyperparameter_at_an_edge_is_extended_by_the_lrs_rule(params):
    """Weight decay best at 0.9 (centre 0.1, ratio 3): the pass 0.033, 0.1, 0.3 ends at its edge, so 0.9 and then 2.7
    are tried, and 0.9 is chosen inside the values tried; with one extra point it stays at the edge and the choice
    says so; a diverged new point brackets it. A β moves on 1 − β and stays below 1. The schema's budget counts the
    extension."""
    second = {"adamw": ["weight_decay"]}
    choice, trials, sub = _tune(params, {"lr": 3e-3, "weight_decay": 0.9}, second=second, max_extra_second=2)
    s = choice["second"]["weight_decay"]
    assert s["values"] == pytest.approx([0.1 / 3, 0.1, 0.3, 0.9, 2.7]) and s["extra_points"] == 2
    assert s["best"] == pytest.approx(0.9) and s["at_edge"] is False and protocol.at_edge(choice) == []
    assert len(trials) <= sub.optimizers.planned_runs("adamw") // len(sub.optimizers.sweep_seeds)
    choice, _, _ = _tune(params, {"lr": 3e-3, "weight_decay": 0.9}, second=second, max_extra_second=1)
    assert choice["second"]["weight_decay"]["values"][-1] == pytest.approx(0.9)
    assert protocol.at_edge(choice) == ["weight_decay"]
    choice, _, _ = _tune(params, {"lr": 3e-3, "weight_decay": 0.9}, {"weight_decay": 0.5}, second=second,
                         max_extra_second=2)
    s = choice["second"]["weight_decay"]
    assert s["values"][-1] == pytest.approx(0.9) and s["scores"][-1] is None  # diverged: it brackets 0.3
    assert s["best"] == pytest.approx(0.3) and protocol.at_edge(choice) == []
    choice, _, _ = _tune(params, {"lr": 3e-3, "beta2": 1 - 0.05 / 9}, second={"adamw": ["beta2"]},
                         max_extra_second=2)
    values = choice["second"]["beta2"]["values"]
    assert values == pytest.approx([0.85, 0.95, 1 - 0.05 / 3, 1 - 0.05 / 9, 1 - 0.05 / 27]) and max(values) < 1
    assert choice["best_hp"]["beta2"] == pytest.approx(1 - 0.05 / 9)
    ob = sub.optimizers
    with pytest.raises(ValueError, match="max_runs 12: the protocol may need 14"):
        type(ob)(**{**ob.model_dump(), "max_runs": 12})


def test_a_references_lr_is_retuned_at_every_data_budget(params):
    """The references' LR is chosen again at each other budget: 3 points at the grid's ratio around the budget-1
    LR, extended past an edge (here the optimum halves with 4x the data: two points below); the reruns at each budget
    use that budget's choice, only for the references; the baseline's held-out reruns add its default recipe and its
    LR alone tuned; the reference curve reads those runs, and a retuned LR left at an edge is named among the
    edges."""
    sub = _control(params, max_extra=2)
    best = {"lr": 3e-3, "weight_decay": 0.3}

    def at(budget):
        return lambda hp: 3.0 + math.log(hp["lr"] / (3e-3 / math.sqrt(budget))) ** 2

    t = protocol.retune_lr(sub, "adamw", best, at(4.0))
    assert t["lr_grid"] == pytest.approx([7.5e-4, 1.5e-3, 3e-3, 6e-3]) and t["extra_points"] == 1
    assert t["best_hp"] == {"lr": pytest.approx(1.5e-3), "weight_decay": 0.3} and t["lr_at_edge"] is False
    assert protocol.retune_lr(sub, "adamw", best, at(1.0))["best_lr"] == pytest.approx(3e-3)
    ob = sub.optimizers
    per_budget = {0.25: {"lr": 6e-3}, 0.5: {"lr": 4e-3}, 2.0: {"lr": 2e-3}}
    jobs = protocol.rerun_jobs(ob, "adamw_emb", {"lr": 3e-3}, per_budget, None)
    assert sorted((hp["lr"], b) for hp, s, b, _ in jobs if s == 2) == sorted(
        [(3e-3, 1.0), (6e-3, 0.25), (4e-3, 0.5), (2e-3, 2.0)])
    assert {b for _, _, b, _ in protocol.rerun_jobs(ob, "muon", {"lr": 3e-3}, per_budget, None)} == {1.0}
    # the baseline also at its default recipe and at its LR alone tuned (the first pass's choice, the rest default),
    # each on every held-out seed; neither where it is a run already there, and no other arm gets them
    tuned, default, lr_only = {"lr": 3e-3, "weight_decay": 0.3}, {"lr": 1e-3}, {"lr": 6e-3}
    extra = {str(hp): sorted(s for h, s, b, _ in protocol.rerun_jobs(ob, "adamw", tuned, {}, default, lr_only)
                             if h == hp and b == 1.0) for hp in (tuned, default, lr_only)}
    assert extra == dict.fromkeys(map(str, (tuned, default, lr_only)), ob.rerun_seeds)
    assert len(protocol.rerun_jobs(ob, "adamw", tuned, {}, default, default)) == 2 * len(ob.rerun_seeds)
    assert len(protocol.rerun_jobs(ob, "adamw", tuned, {}, default, tuned)) == 2 * len(ob.rerun_seeds)
    assert len(protocol.rerun_jobs(ob, "adamw_emb", tuned, {}, default, lr_only)) == len(ob.rerun_seeds)
    # the curve: the baseline's runs at the budget-1 LR and at each budget's own; the reference reads the latter
    bench, cells, runs = _synthetic(params, {2: 1500.0, 3: 1800.0})
    for r in [r for r in runs if r["optimizer"] == "adamw" and r["budget"] != 1.0]:
        runs.append({**r, "lr": 1e-3, "hp": {"lr": 1e-3}, "val_loss": r["val_loss"] - 0.01})
    for size in bench.sizes:
        cells["adamw", size]["budget_tunes"] = {protocol.lr_key(b): {"best_lr": 1e-3, "best_hp": {"lr": 1e-3},
                                                                     "lr_grid": [5e-4, 1e-3, 2e-3]}
                                                for b in bench.budgets if b != 1.0}
    assert chosen(cells["adamw", "a"], 0.25) == {"lr": 1e-3} and chosen(cells["adamw", "a"]) == {"lr": 3e-3}
    curve = speedup.reference(bench, cells, runs, "a", 2)
    assert [v for _, v in curve.points] == pytest.approx(
        [_law(1000 * b) - (0.01 if b != 1.0 else 0) for b in bench.budgets])
    cells["adamw", "b"]["budget_tunes"]["0.25"]["lr_grid"] = [1e-3, 2e-3, 4e-3]
    assert protocol.at_edge(cells["adamw", "b"]) == ["lr@x0.25"]
    e = _entries(bench, cells, runs)
    assert e["b-wen-muon-leads-b"]["verdict"] == "untested (hyperparameters interior: adamw-b lr@x0.25 at edge)"


# ---------------------------------------------------------------- the timed step
def test_the_timed_step_is_the_trained_step_with_its_gradient_clipping(params, shards, monkeypatch):
    """The step the benchmark times is LitLM's training step: under SGD with Nesterov momentum μ (first step:
    Δw = −lr·(1 + μ)·g) with gradients clipped to 1% of their norm, every SGD weight moves by −lr·(1 + μ)·g·c/‖g‖,
    not −lr·(1 + μ)·g (a step without the clipping moves 100x as far); step_time_ratio runs that step, clipping at
    pretrain.grad_clip, for every timed step of both arms."""
    model = _model(params)
    opts = build_optimizers(model, params.optim["sgd"], model.cfg.scale)
    x, y = _batch()
    ref = copy.deepcopy(model)
    ref(x, y).loss.backward()
    grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()])).item()
    clip = 0.01 * norm
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    sgd = {id(p): g["lr"] for g in opts[0].param_groups for p in g["params"]}
    optbench_timing.train_step(model, opts, x, y, grad_clip=clip)
    moved = 0
    for n, p in model.named_parameters():
        if id(p) in sgd:
            want = before[n] - sgd[id(p)] * (1 + params.optim["sgd"].momentum) * grads[n] * clip / (norm + 1e-6)
            torch.testing.assert_close(p.detach(), want, rtol=1e-4, atol=1e-7)
            moved += 1
    assert moved >= 7
    calls = []
    real = torch.nn.utils.clip_grads_with_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grads_with_norm_", lambda ps, c, n, *a, **k: (calls.append(c),
                                                                                             real(ps, c, n, *a, **k)))
    sub = params.model_copy(update={"optimizers": params.optimizers.model_copy(update={"optimizers": ["adamw", "sgd"],
                                                                                       "timing_steps": 2})})
    ratio = optbench.step_time_ratio(sub, "sgd", "a", shards)
    assert calls == [params.pretrain.grad_clip] * 8 and ratio["step_time_ratio"] > 0


# ---------------------------------------------------------------- the study
def test_the_size_study_profile_and_spec_validate():
    """configs/optbench-sizes.yaml: the six arms at xxs, xs and s, 64 steps, held-out seeds, the control's reference
    and pinned arms (matrix families), the embeddings' multiplier tried at 1, 3, 9, every arm within the stated
    budget of runs; configs/studies/optbench-sizes.yaml names it and the ledger's generator."""
    from scalelab.ledger import studies
    from scalelab.study import spec

    p = load_params(ROOT / "configs" / "optbench-sizes.yaml")
    ob = optbench.bench(p)
    assert ob.arms == ["adamw", "adamw_emb", "muon", "galore", "muon_pinned", "galore_pinned"]
    assert ob.sizes == ["xxs", "xs", "s"] and ob.max_steps == 64 and ob.reference_arms == ["adamw", "adamw_emb"]
    assert not set(ob.sweep_seeds) & set(ob.rerun_seeds) and len(ob.rerun_seeds) >= 3
    assert ob.max_extra_second >= 1 and all(ob.planned_runs(o) <= ob.max_runs for o in ob.arms)
    c = protocol.centre(p, "adamw_emb", "embedding_lr_mult")
    assert sorted([c, *protocol.neighbours("embedding_lr_mult", c, ob.hp_ratio)]) == pytest.approx([1.0, 3.0, 9.0])
    assert {p.optim[o].name for o in ob.pinned} == {"muon", "galore"}
    s = spec.load(ROOT, "optbench-sizes")
    assert s.profile == Path("configs/optbench-sizes.yaml") and s.ledger == "claims_b.json"
    assert studies.generator(s.generator).__name__ == "study"
    assert {g.stage for g in s.grid} >= {"optimizers", "optimizers_seeds"}


def test_the_2x2_profile_matches_embeddings_at_1x_chinchilla_with_every_arm_tuned_alike():
    """configs/optbench-2x2.yaml: {adamw, muon} x {embeddings at adamw's tuned LR, at adamw_emb's}: muon_pinned pinned
    to adamw, muon_emb to adamw_emb; one size, xxs, at 20 tokens per non-embedding parameter (within 5%); every arm
    tunes the shared hyperparameters and its LR again after them; 5 held-out seeds; the references over 5 budgets;
    the claims read the profile's own validation tokens. The spec names it, and its grid (as DVC resolves it) runs
    each pinned arm after its own reference's sweep, keyed by that reference's params."""
    from scalelab.config.optbench import SHARED_HPS
    from scalelab.ledger import studies
    from scalelab.optbench.data import Bench
    from scalelab.study import grid, spec

    p = load_params(ROOT / "configs" / "optbench-2x2.yaml")
    ob = optbench.bench(p)
    assert ob.arms == ["adamw", "adamw_emb", "muon_pinned", "muon_emb"] and ob.reference_arms == ["adamw", "adamw_emb"]
    assert {o: ob.pinned_to(o) for o in ob.pinned} == {"muon_pinned": "adamw", "muon_emb": "adamw_emb"}
    assert {p.optim[o].name for o in ob.pinned} == {"muon"} and ob.sizes == ["xxs"]
    assert all(set(SHARED_HPS) <= set(ob.second[o]) for o in ob.arms) and ob.lr_last
    assert len(ob.rerun_seeds) == 5 and len(ob.budgets) == 5 and 1.0 in ob.budgets
    assert ob.val_tokens == p.pretrain.val_tokens and ob.val_every == p.pretrain.val_every
    model = Transformer(p.resolve_model("xxs", ob.variant, vocab_size=p.tokenizer.vocab_size))
    rest = model.num_params() - Bench.from_params(p).embedding_params["xxs"]
    tokens = ob.max_steps * p.pretrain.batch_size * p.pretrain.seq_len
    assert tokens / rest == pytest.approx(20.0, rel=0.05), (tokens, rest)
    s = spec.load(ROOT, "optbench-2x2")
    assert s.profile == Path("configs/optbench-2x2.yaml") and studies.generator(s.generator).__name__ == "study"
    pinned = {c.address: c for c in grid.plan_grid(s, ROOT).cells if c.stage.startswith("optimizers_pinned")}
    assert set(pinned) == {f"optimizers_pinned{k}@{o}-xxs" for k in ("", "_seeds") for o in ob.pinned}
    for address, cell in pinned.items():
        ref = ob.pinned_to(cell.item["optimizer"])
        assert f"optimizers@{ref}-xxs" in cell.upstream, address
        assert f"optim.{ref}" in cell.params["params.yaml"], address


def test_the_study_generator_reads_the_committed_cells(params, tmp_path):
    """`scalelab study` keeps each stage cell as results/<study>/cells/<cell>/ with its metrics at their workspace
    paths and cell.json listing them, and the study's params.yaml beside: the generator reads those (a folder being
    replaced, ".old-…", is not read) and gives the ledger the same cells give in memory."""
    import json

    import yaml
    from conftest import MICRO

    from scalelab.optbench import claims as claims_b

    bench, cells, runs = _synthetic(params, {2: 1500.0, 3: 1800.0})
    raw = yamlio.safe_load(MICRO.read_text())
    raw["optimizers"]["sizes"] = list(bench.sizes)  # the study ran the synthetic cells' sizes
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    for (opt, size), c in cells.items():
        held = {f"r{i}": r for i, r in enumerate(runs) if r["optimizer"] == opt and r["size"] == size}
        for kind, body in (("sweep", c), ("seeds", {"optimizer": opt, "size": size, "runs": held})):
            rel = f"metrics/optimizers/{kind}/{opt}-{size}.json"
            for folder in (f"optimizers_{kind}@{opt}-{size}-0a1b2c", f".old-optimizers_{kind}@{opt}-{size}-9f"):
                cell = tmp_path / "cells" / folder
                (cell / rel).parent.mkdir(parents=True)
                (cell / rel).write_text(json.dumps(body if not folder.startswith(".") else {}))
                (cell / "cell.json").write_text(json.dumps({"address": folder, "files": {rel: "md5"}}))
    every = runs + [r for c in cells.values() for r in c["runs"].values()]
    assert claims_b.study(tmp_path) == claims_b.ledger(bench, cells, every)


# Mutation checks (tests/mutants.py): each control broken, and the test above that must notice.
@mutant("pin-ignored")  # the pinned arm's side group moves with the family's LR, as before the control
def _(monkeypatch):
    real = optbench_run.side_settings
    monkeypatch.setattr(optbench_run, "side_settings", lambda cfg, hp, pinned=None: real(cfg, hp))


@mutant("pin-lr-only")  # the side group's LR pinned, its decay and betas the family's (mixed)
def _(monkeypatch):
    real = optbench_run.side_settings
    monkeypatch.setattr(optbench_run, "side_settings", lambda cfg, hp, pinned=None: {
        "adamw_lr": real(cfg, hp, pinned)["adamw_lr"]})


@mutant("timed-step-unclipped")  # the timed step without the gradient clipping the trained step has
def _(monkeypatch):
    real = optbench_timing.trained_step

    def unclipped(lit, optimizers):
        lit.grad_clip = 0.0
        return real(lit, optimizers)

    monkeypatch.setattr(optbench_timing, "trained_step", unclipped)


@mutant("curve-at-the-budget-1-choice")  # the reference curve at the LR chosen at budget 1, as before the retune
def _(monkeypatch):
    monkeypatch.setattr(speedup, "chosen", lambda cell, budget=1.0: cell["best_hp"])


@mutant("second-never-extended")  # a second hyperparameter at an edge stays there
def _(monkeypatch):
    real = protocol.tune
    monkeypatch.setattr(protocol, "tune", lambda params, opt, trial: real(params.model_copy(update={
        "optimizers": params.optimizers.model_copy(update={"max_extra_second": 0})}), opt, trial))


T = "tests/test_optbench_control.py::"
test_a_broken_control_is_caught = mutation_checks([
    ("pin-ignored", f"{T}test_a_pinned_arms_side_group_trains_at_the_baselines_tuned_lr"),
    ("pin-lr-only", f"{T}test_a_pinned_arms_side_group_trains_at_the_baselines_tuned_lr"),
    ("timed-step-unclipped", f"{T}test_the_timed_step_is_the_trained_step_with_its_gradient_clipping"),
    ("curve-at-the-budget-1-choice", f"{T}test_a_references_lr_is_retuned_at_every_data_budget"),
    ("second-never-extended", f"{T}test_a_second_hyperparameter_at_an_edge_is_extended_by_the_lrs_rule"),
])
