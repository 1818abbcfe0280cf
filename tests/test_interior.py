"""The interior premise of a tuned hyperparameter (scalelab.ledger.interior): an edge is interior only within the
seed spread or at a natural bound."""

import math

from scalelab.ledger.interior import edge


def test_a_best_with_neighbours_on_both_sides_is_interior():
    assert edge({1e-3: 3.2, 2e-3: 3.1, 4e-3: 3.3}, tolerance=0.0) is None


def test_an_edge_that_beats_its_neighbour_by_more_than_the_noise_is_at_the_edge():
    why = edge({1e-3: 3.3, 2e-3: 3.2, 4e-3: 3.1}, tolerance=0.02)
    assert why is not None and why.startswith("0.004, the largest tried, beats its neighbour 0.002 by 0.1000")
    assert edge({1e-3: 3.0, 2e-3: 3.2, 4e-3: 3.3}, tolerance=0.02).startswith("0.001, the smallest")


def test_an_edge_within_the_seed_spread_of_its_neighbour_is_interior():
    assert edge({1e-3: 3.3, 2e-3: 3.105, 4e-3: 3.1}, tolerance=0.01) is None
    assert edge({1e-3: 3.3, 2e-3: 3.105, 4e-3: 3.1}, tolerance=0.004) is not None  # the same margin, less noise


def test_a_natural_bound_is_no_edge_and_a_diverged_neighbour_brackets_nothing_by_itself():
    assert edge({0.0: 3.10, 0.1: 3.2, 0.3: 3.3}, tolerance=0.0, bounds=(0.0,)) is None
    assert edge({0.0: 3.10, 0.1: 3.2, 0.3: 3.3}, tolerance=0.0) is not None
    assert edge({1e-3: 3.3, 2e-3: 3.1, 4e-3: math.nan}, tolerance=0.0) is None  # best between two tried values
    assert edge({1e-3: 3.3, 2e-3: 3.1}, tolerance=0.0) is not None
    assert edge({1e-3: math.nan, 2e-3: math.inf}, tolerance=1.0) == "nothing trained"
    assert edge({1e-3: 3.0}, tolerance=1.0) == "0.001 is the only value tried"
