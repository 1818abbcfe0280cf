"""A cell's cost and output outside its compute: lean imports, quiet start-up, progress lines, MFU <= 1."""

import logging
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import ROOT
from mutants import assert_caught, mutant

from scalelab.runtime.log import Every
from scalelab.train.callbacks import Progress, Throughput

# lean.py loaded on its own: scalelab.train's package init also imports the optimizers' libraries, not at issue here
PROBE = f"""\
import importlib.util, sys
from scalelab.runtime.log import setup
setup()
spec = importlib.util.spec_from_file_location("lean", {str(ROOT / "src" / "scalelab" / "train" / "lean.py")!r})
lean = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lean)
lean.import_lightning()
import lightning as L
L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_checkpointing=False)
print(",".join(m for m in ("transformers", "scipy.signal", "matplotlib") if m in sys.modules))
"""


@pytest.mark.parametrize("lean", ["1", "0"])
def test_training_process_imports_lean_and_starts_quietly(lean):
    """With scalelab.train.lean, Lightning comes without torchmetrics' optional backends (SCALELAB_LEAN_IMPORTS=0:
    with them, the control), and a Trainer prints no banner or advertisement either way."""
    import os

    env = {**os.environ, "SCALELAB_LEAN_IMPORTS": lean}
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    heavy = set(filter(None, res.stdout.strip().split(",")))
    assert heavy == (set() if lean == "1" else {"transformers", "scipy.signal", "matplotlib"})
    for noise in ("GPU available", "TPU available", "litlogger", "LeafSpec"):
        assert noise not in res.stdout + res.stderr


def _module(step: int, loss: float, val: float | None = None):
    metrics = {"train/loss": loss} | ({"val/loss": val} if val is not None else {})
    return SimpleNamespace(step=step, step_metrics=metrics)


def test_progress_logs_every_few_percent_with_eta(caplog):
    trainer = SimpleNamespace(is_global_zero=True)
    progress = Progress("none-xs-base-0", total=100, tokens_per_step=1024, every_pct=10)
    progress.on_train_start(trainer, _module(0, 0.0))
    with caplog.at_level(logging.INFO, logger="scalelab.train.callbacks"):
        for step in range(1, 101):
            progress.on_train_batch_end(trainer, _module(step, 5.0 - step / 100, 4.5 if step == 50 else None),
                                        None, None, step - 1)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 10  # steps 10, 20, ..., 100
    assert lines[4].startswith("none-xs-base-0: step 50/100 (50%), 51,200 tokens, loss 4.5000, val loss 4.5000,")
    assert "tokens/s, ETA" in lines[0] and lines[-1].endswith("ETA 0s")


def test_progress_is_silent_on_other_ranks(caplog):
    trainer = SimpleNamespace(is_global_zero=False)
    progress = Progress("cell", total=10, tokens_per_step=1)
    progress.on_train_start(trainer, _module(0, 0.0))
    with caplog.at_level(logging.INFO, logger="scalelab.train.callbacks"):
        for step in range(1, 11):
            progress.on_train_batch_end(trainer, _module(step, 1.0), None, None, step - 1)
    assert not caplog.records


def test_mfu_never_exceeds_one_even_with_a_peak_measured_under_load():
    """A peak measured while another process held the cores (here: far too low) is raised to what a step achieved."""
    tput = Throughput(tokens_per_step=1000, flops_per_token=1e6, peak_flops=1e3)
    module = SimpleNamespace(step_metrics={})
    for _ in range(3):
        tput.on_train_batch_start(None, module, None, 0)
        tput.on_train_batch_end(None, module, None, None, 0)
        assert 0 < module.step_metrics["perf/mfu"] <= 1.0
    assert tput.peak_flops > 1e3
    assert tput.mfu(1000 / min(tput.times)) <= 1.0


def test_every_fires_once_per_interval(monkeypatch):
    """On a fake clock ticked each second: the first firing one interval after the start, then once per interval."""
    import scalelab.runtime.log

    now = [100.0]
    monkeypatch.setattr(scalelab.runtime.log.time, "monotonic", lambda: now[0])
    tick, fired = Every(seconds=10), []
    for t in range(100, 131):
        now[0] = float(t)
        if tick():
            fired.append(t)
    assert fired == [110, 120, 130] and tick.elapsed() == 30


@mutant("every-never-advances")
def _(monkeypatch):
    import scalelab.runtime.log

    def call(self):
        return scalelab.runtime.log.time.monotonic() >= self._next  # the deadline never moves: fires on every later call

    monkeypatch.setattr(scalelab.runtime.log.Every, "__call__", call)


@mutant("every-fires-at-start")
def _(monkeypatch):
    import scalelab.runtime.log

    init = scalelab.runtime.log.Every.__init__

    def start_due(self, seconds=scalelab.runtime.log.PROGRESS_S):
        init(self, seconds)
        self._next = self.start

    monkeypatch.setattr(scalelab.runtime.log.Every, "__init__", start_due)


@pytest.mark.mutation
@pytest.mark.parametrize("name", ["every-never-advances", "every-fires-at-start"])
def test_every_catches_its_mutants(name):
    assert_caught("tests/test_cells.py::test_every_fires_once_per_interval", name)


def test_the_flows_share_of_cores_wins_over_a_stages_own_threads(monkeypatch):
    """Every stage sets its threads through placement: a profile's `threads: 2` beside another cell on 2 cores ran
    Hidden Decoding cells ~10x slower; the flow's share (SCALELAB_THREADS) must win, the profile's value apply alone."""
    import torch

    from scalelab import THREADS_ENV
    from scalelab.runtime import placement

    before = torch.get_num_threads()
    try:
        monkeypatch.setenv(THREADS_ENV, "1")
        placement.set_torch_threads(2)
        assert torch.get_num_threads() == 1
        monkeypatch.delenv(THREADS_ENV)
        placement.set_torch_threads(2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
