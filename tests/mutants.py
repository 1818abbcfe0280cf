"""Mutation checks: a test is only evidence if it fails when what it tests is broken.

A test module registers broken implementations by name:

    @mutant("muon-noop")
    def _(monkeypatch):
        monkeypatch.setattr(torch.optim.Muon, "step", lambda self, closure=None: None)

and a `mutation`-marked test requires that the real test fails with that mutant swapped in:

    @pytest.mark.mutation
    def test_loss_falls_catches_a_noop_muon():
        assert_caught("tests/test_optimizers.py::test_loss_falls[muon]", "muon-noop")

`assert_caught` runs the target test in a fresh pytest process with SCALELAB_MUTANT set; conftest's autouse fixture
applies the named mutant before the test body (in that process only: subprocesses the test starts run the real code).
The mutation checks are opt-in (`pytest -m mutation`): each one starts a pytest process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = "SCALELAB_MUTANT"
MUTANTS: dict[str, Callable] = {}


def mutant(name: str) -> Callable[[Callable], Callable]:
    """Register `fn(monkeypatch)` as the broken implementation called `name`."""

    def register(fn: Callable) -> Callable:
        if name in MUTANTS and MUTANTS[name] is not fn:
            raise ValueError(f"mutant {name!r} is registered twice")
        MUTANTS[name] = fn
        return fn

    return register


def apply(name: str, monkeypatch) -> None:
    if name not in MUTANTS:
        raise KeyError(f"unknown mutant {name!r} (registered: {', '.join(sorted(MUTANTS))})")
    MUTANTS[name](monkeypatch)


def run_mutant(test_id: str, name: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The pytest run of `test_id` (a node id relative to the repo root) with mutant `name` applied."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-o", "addopts=", "-p", "no:xdist",
           "--timeout", str(int(timeout)), test_id]
    env = {**os.environ, ENV: name}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout + 60)


def mutation_checks(caught: list[tuple[str, str]]) -> Callable:
    """A `mutation` test over (mutant, target test id) pairs, one case each: `test_x_is_caught = mutation_checks(...)`."""
    import pytest

    @pytest.mark.mutation
    @pytest.mark.parametrize("name,test_id", caught, ids=[f"{n}->{t.split('::')[-1]}" for n, t in caught])
    def check(name: str, test_id: str) -> None:
        assert_caught(test_id, name)

    return check


def assert_caught(test_id: str, name: str) -> None:
    """The target test passes on the real code (checked by the default run) and fails, not errors, on the mutant."""
    out = run_mutant(test_id, name)
    tail = (out.stdout + out.stderr)[-3000:]
    assert out.returncode != 0, f"{test_id} still passes with mutant {name!r}:\n{tail}"
    assert out.returncode == 1 and (" failed" in out.stdout), f"{test_id} did not fail cleanly on {name!r}:\n{tail}"
