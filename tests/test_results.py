"""The committed reference study (results/cpu-study, issue 7): it holds every cell its params name, and its ledger and
scaling fits follow from those cells' committed metrics under its own params (the summary is deterministic: the
bootstrap draws from a fixed seed). The cells themselves reproduce by rerunning the profile (results/cpu-study/README.md)."""

import json
import re
from pathlib import Path

import pytest

from scalelab.config import load_params
from scalelab.analysis import claims_a, scaling, studies

STUDY = Path(__file__).resolve().parents[1] / "results" / "cpu-study"


@pytest.fixture(scope="module")
def study():
    params = load_params(STUDY / "params.yaml")
    cells = scaling.collect(STUDY / "metrics" / "pretrain", scaling.grid_cells(params.pretrain.grid))
    return params, cells


def test_every_cell_of_the_study_grid_is_committed(study):
    params, cells = study
    grid = params.pretrain.grid
    assert len(grid.sizes) >= 4 and len(grid.seeds) >= 3  # issue 7: a study of 4 sizes and 3 seeds at least
    names = scaling.grid_cells(grid)
    assert cells.height == len(names) == len(list((STUDY / "metrics" / "pretrain").glob("*.json")))
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
    entries = _plain(claims_a.ledger(cells, fits, params))
    committed = json.loads((STUDY / "metrics" / "claims_a.json").read_text())
    assert [e["id"] for e in entries] == [e["id"] for e in committed]
    _close(entries, committed, "claims")
    _close(_plain({v: f.row() for v, f in fits.items()}),
           json.loads((STUDY / "metrics" / "scaling.json").read_text())["fits"], "fits")


def test_the_recipe_table_is_the_committed_ledgers():
    """results/cpu-study's ledger at a glance is the committed ledger's, not a copy typed in and left behind (the docs
    that show it carry it as a generated block: tests/test_docs.py)."""
    committed = json.loads((STUDY / "metrics" / "claims_a.json").read_text())
    assert (STUDY / "scaling" / "claims_a_by_recipe.md").read_text().strip() == claims_a.recipe_table(committed)


def test_every_committed_study_meets_the_study_contract():
    """A study folder with a study.json is read whole by the report (docs/workflow.md "Committed studies"): its
    fields, its ledger in the claims format, seeds as a list, the method's letter in the ledger's name. Folders still
    without a study.json are listed by the report as "no ledger" and skipped here."""
    folders = [f for f in sorted(STUDY.parent.iterdir()) if (f / studies.STUDY).is_file()]
    assert STUDY in folders
    for folder in folders:
        s = studies.read_study(folder)
        assert s["problem"] is None, f"{folder.name}: {s['problem']}"
        assert s["name"] == folder.name and isinstance(s["seeds"], list) and s["entries"], folder.name
        assert isinstance(s["wall_time_s"], (int, float)) and re.fullmatch(r"[0-9a-f]{7,40}", s["commit"]), folder.name
