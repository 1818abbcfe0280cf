"""The committed scale-vector studies: results/cpu-study holds every cell its params name, and its ledger and
scaling fits follow from those cells' committed metrics under its own params (the summary is deterministic: the
bootstrap draws from a fixed seed); results/gamma-wd-dose's ledger follows from its cells (tests/test_ledgers.py, as
every study's). The cells themselves reproduce by rerunning the profile (results/cpu-study/README.md). Each ledger
entry carries its regime and premises: a weight-decay claim whose decay did not move γ, or moved it under a per-step
pull far from the paper's, is untested."""

import importlib
import json
import re
from pathlib import Path

import pytest

from scalelab.ledger import claims, studies
from scalelab.scale_vectors import claims as claims_a, dose as dose_a, premises as premises_a, scaling

STUDY = Path(__file__).resolve().parents[1] / "results" / "cpu-study"
DOSE = STUDY.parent / "gamma-wd-dose"


# The study ran at commit 951c18e, under that commit's schema: the ledger reads its params' scale-vector sections
# (premises_a.LEDGER_SECTIONS); its other sections have since gained or lost keys, and its machine settings sat inline;
# reproducing the whole study means checking out its commit (results/cpu-study/README.md).
@pytest.fixture(scope="module")
def study():
    params = premises_a.study_params(STUDY)
    cells = scaling.collect(studies.cell_files(STUDY, "metrics/pretrain", ".json"), scaling.grid_cells(params.pretrain.grid))
    return params, cells


def test_every_cell_of_the_study_grid_is_committed(study):
    params, cells = study
    grid = params.pretrain.grid
    assert len(grid.sizes) >= 4 and len(grid.seeds) >= 3  # a study of 4 sizes and 3 seeds at least
    names = scaling.grid_cells(grid)
    assert cells.height == len(names) == len(studies.cell_files(STUDY, "metrics/pretrain", ".json"))
    assert not (STUDY / "metrics" / "pretrain").exists()  # the cells are the study's only copy of them
    assert cells["val_loss"].is_finite().all()


def _plain(x):
    return json.loads(json.dumps(x))  # tuples -> lists, numpy floats -> floats, as the committed JSON holds them


def _close(a, b, path="") -> None:
    """Equal structures; numbers equal to rounding."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and not isinstance(b, bool):
        assert b == pytest.approx(a, rel=1e-9, abs=1e-12, nan_ok=True), path
    else:
        assert a == b, path


def test_the_committed_ledger_and_fits_follow_from_the_committed_cells(study):
    params, cells = study
    fits = scaling.fit_all(cells, params.scaling)
    with claims.judging(STUDY.name):  # judged as the committed study: its smallest effects are post hoc for it
        entries = _plain(claims_a.ledger(cells, fits, params))
    committed = json.loads((STUDY / "metrics" / "claims_a.json").read_text())
    assert [e["id"] for e in entries] == [e["id"] for e in committed]
    _close(entries, committed, "claims")
    with claims.judging(STUDY.name):
        _close(entries, _plain(claims_a.cpu_study(STUDY)), "generator")  # study.json's generator: the same ledger
    _close(_plain({v: f.row() for v, f in fits.items()}),
           json.loads((STUDY / "metrics" / "scaling.json").read_text())["fits"], "fits")


def test_the_recipe_table_is_the_committed_ledgers():
    """results/cpu-study's ledger at a glance is the committed ledger's, not a copy typed in and left behind (the docs
    that show it carry it as a generated block: tests/test_docs.py)."""
    committed = json.loads((STUDY / "metrics" / "claims_a.json").read_text())
    assert (STUDY / "scaling" / "claims_a_by_recipe.md").read_text().strip() == claims_a.recipe_table(committed)
    assert (STUDY / "scaling" / "claims_a.md").read_text().strip() == claims.markdown(committed)


def test_every_decay_claim_is_decided_only_where_the_decay_moved_gamma_near_the_papers_pull():
    """Each weight-decay entry of both studies carries the measured γ moved and per-step pull premises: where either
    fails it is untested (never reproduced or contradicted) with that premise named; at the matrices' rate over 300
    steps (cpu-study) the decayed γ shrink by under 0.05 in every recipe but WSD; the dose study's 10x moves γ at a
    pull 10x the paper's (read once every cell of its grid has a result)."""
    led = {e["id"]: e for e in json.loads((STUDY / "metrics" / "claims_a.json").read_text())}
    dose_done = not json.loads((DOSE / studies.STUDY).read_text()).get("cells_missing")
    if dose_done:
        led |= {e["id"]: e for e in json.loads((DOSE / "claims_a.json").read_text())}
    decay = [e for i, e in led.items() if "wd_" in i]
    assert len(decay) == 2 * 5 + 1 + 2 * dose_done
    for e in decay:
        premises = {p["name"]: p for p in e["premises"]}
        assert {"γ moved", "per-step pull"} <= set(premises), e["id"]
        bad = [p["name"] for p in claims.failed(e["premises"])]
        verdict = claims.verdict_of(e)
        assert (verdict == claims.UNTESTED) == bool(bad), e["id"]
        assert all(f"{name}: " in e["verdict"] for name in bad), e["id"]
        if "wd_in" in e["id"] and not e["id"].startswith("dose."):  # the final γ decayed, no cell records it apart
            assert "final norm" in bad, e["id"]
    assert not led["base.wd_out_hurts"]["premises"][0]["passed"] and led["wsd.wd_out_hurts"]["premises"][0]["passed"]
    # its interval (-0.0025 ± 0.0072) lies wholly below the smallest effect (0.01 nats, declared after the cells ran,
    # on a reason that rests on no study's results): contradicted since the smallest effect was declared
    wsd = led["wsd.wd_out_hurts"]
    assert wsd["verdict"] == claims.CONTRADICTED and wsd["effect"] + wsd["spread"] < wsd["smallest_effect"]
    assert wsd["sesoi"] == {"reason": claims_a.LOSS_SESOI.reason, "declared": claims.POST_HOC,
                            "depends_on_results": False}
    if not dose_done:
        return
    final = next(p for p in led["dose.wd_in_helps"]["premises"] if p["name"] == "final norm")
    assert final["passed"] and "measured apart" in final["value"]  # the dose study's cells record the final γ apart
    dose = led["dose.wd_out_hurts"]
    assert "at 10x" in dose["claim"] and dose["verdict"].startswith("untested (per-step pull: λ·η 0.003, 10x")
    assert dose["regime"]["steps"] == 80 and dose["regime"]["params"] == led["base.none_hurts@xs"]["regime"]["params"]


COMMITS = r"[0-9a-f]{7,40}(, [0-9a-f]{7,40})*"  # a study resumed over several commits names each of its cells' commits


def test_every_committed_study_meets_the_study_contract():
    """A study folder with a study.json is read whole by the report (docs/workflow.md "Committed studies"): its
    fields, its ledger in the claims format, seeds as a list, the method's letter in the ledger's name. Folders still
    without a study.json are listed by the report as "no ledger" and skipped here; a study still being run in slices
    (`cells_missing`) has no ledger yet and says so."""
    folders = [f for f in sorted(STUDY.parent.iterdir()) if (f / studies.STUDY).is_file()]
    assert STUDY in folders
    for folder in folders:
        s = studies.read_study(folder)
        if json.loads((folder / studies.STUDY).read_text()).get("cells_missing"):
            assert s["entries"] is None and s["problem"].startswith("in progress: "), folder.name
            continue
        if s["problem"] == studies.TABLE_ONLY:  # finished, its spec names no ledger: the README's tables
            assert s["seeds"] and re.fullmatch(COMMITS, s["commit"]), folder.name
            continue
        assert s["problem"] is None, f"{folder.name}: {s['problem']}"
        assert s["name"] == folder.name and isinstance(s["seeds"], list) and s["entries"], folder.name
        assert isinstance(s["wall_time_s"], (int, float)) and re.fullmatch(COMMITS, s["commit"]), folder.name
    for folder in (STUDY, DOSE):  # the scale-vector studies name the function that re-derives their ledger
        module, _, name = json.loads((folder / studies.STUDY).read_text())["generator"].partition(":")
        assert getattr(importlib.import_module(module), name) in (claims_a.cpu_study, dose_a.gamma_wd_dose)
