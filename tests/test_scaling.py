"""Scaling-law fit and claim checks (METHODS §A reproduction target)."""

import json

import numpy as np
import pytest

from scalelab.evaluate import scaling


def test_fit_recovers_a_known_power_law():
    n = np.array([1e5, 3e5, 1e6, 3e6, 1e7])
    truth = scaling.PowerLaw(E=1.7, A=400.0, alpha=0.45, rmse=0.0)
    fit = scaling.fit_power_law(n, truth(n))
    assert fit.E == pytest.approx(1.7, abs=0.02)
    assert fit.alpha == pytest.approx(0.45, abs=0.01)
    assert np.allclose(fit(n), truth(n), atol=1e-3)


def test_fit_with_three_points_interpolates_and_respects_bounds():
    n = np.array([2e4, 6e4, 2e5])
    loss = np.array([5.0, 4.6, 4.4])
    fit = scaling.fit_power_law(n, loss)
    assert fit.E >= 0 and fit.A >= 0 and fit.rmse < 0.01
    with pytest.raises(ValueError, match="≥ 3 distinct sizes"):
        scaling.fit_power_law(n[:2], loss[:2])


def _write_cells(tmp_path, losses):
    for (variant, size, seed), loss in losses.items():
        n = {"a": 1e4, "b": 3e4, "c": 1e5}[size]
        cell = {"variant": variant, "size": size, "recipe": "base", "seed": seed, "val_loss": loss,
                "params": n * 2, "non_embedding_params": n, "flops": 6 * n * 1e5}
        (tmp_path / f"{variant}-{size}-base-{seed}.json").write_text(json.dumps(cell))


def test_collect_summarize_claims_and_fit(tmp_path):
    losses = {}
    for size, base in zip("abc", (5.0, 4.6, 4.4)):
        for seed, jitter in ((0, 0.01), (1, -0.01)):
            losses[("none", size, seed)] = base + 0.2 + jitter
            losses[("standard", size, seed)] = base + jitter
            losses[("unified", size, seed)] = base - 0.1 + jitter
    _write_cells(tmp_path, losses)
    summary = scaling.summarize(scaling.collect(tmp_path))
    row = summary.filter((summary["variant"] == "standard") & (summary["size"] == "a")).row(0, named=True)
    assert row["seeds"] == 2 and row["val_loss"] == pytest.approx(5.0) and row["val_loss_std"] == pytest.approx(0.01414, rel=1e-3)
    c = scaling.claims(summary)
    assert c["none_worse_than_standard"] == 1.0 and c["standard_worse_than_unified"] == 1.0
    assert c["branch_better_than_standard"] is None  # not in this grid
    fits = scaling.fit_all(summary, min_sizes=3)
    assert set(fits) == {"none", "standard", "unified"}
    assert fits["unified"](np.array([1e5]))[0] < fits["standard"](np.array([1e5]))[0]
    scaling.plot(summary, fits, tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 10_000


def test_collect_refuses_foreign_files(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"val_loss": 1.0}))
    with pytest.raises(ValueError, match="missing keys"):
        scaling.collect(tmp_path)


def test_collect_reads_only_the_current_grid(tmp_path, micro_params):
    grid = micro_params.pretrain.grid
    names = scaling.grid_cells(grid)
    assert len(names) == len(grid.variants) * len(grid.sizes) * len(grid.seeds) + len(grid.recipes) * len(
        grid.recipe_variants) * len(grid.seeds)
    assert "unified-c-base-0" in names and "standard-a-muon-0" in names
    _write_cells(tmp_path, {("standard", "a", 0): 5.0, ("standard", "b", 0): 4.8})
    (tmp_path / "gone-a-base-0.json").write_text("{}")  # a cell since removed from params: ignored
    cells = scaling.collect(tmp_path, ["standard-a-base-0", "standard-b-base-0"])
    assert cells.height == 2
    with pytest.raises(ValueError, match="standard-c-base-0.json: missing"):
        scaling.collect(tmp_path, ["standard-c-base-0"])
