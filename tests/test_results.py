"""The committed reference study (results/cpu-study, issue 7): it holds every cell its params name, and its ledger and
scaling fits follow from those cells' committed metrics under its own params (the summary is deterministic: the
bootstrap draws from a fixed seed). The cells themselves reproduce by rerunning the profile (results/cpu-study/README.md)."""

import json
from pathlib import Path

import pytest

from scalelab.config import load_params
from scalelab.analysis import claims_a, scaling

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


def test_the_readme_shows_the_committed_ledger():
    """The README's results table is the committed ledger's, not a copy typed in and left behind."""
    committed = json.loads((STUDY / "metrics" / "claims_a.json").read_text())
    table = claims_a.recipe_table(committed)
    assert (STUDY / "scaling" / "claims_a_by_recipe.md").read_text().strip() == table
    assert table in (STUDY.parents[1] / "README.md").read_text()
