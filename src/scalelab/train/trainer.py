"""The one trainer every cell trains through: pretrain cells (scalelab.train.fit), the optimizer benchmark's runs
(through fit) and Hidden Decoding cells (scalelab.hidden_decoding.train). What differs between them is their
LightningModule, their data module and the callbacks they add; the rest is here:

- `train`: the Lightning Trainer with the named callbacks in their order (Throughput first, its timer stopping before
  the others' work; the cell's own callbacks; the curve; the checkpoint last), run to `total` steps from the
  resumable checkpoint when there is one;
- `write_model`: the cell's model folder with its curves and metrics, all or nothing, then run.json marked complete;
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only

from scalelab.data import atomic_dir, write_json_atomic
from scalelab.runtime import placement
from scalelab.train.callbacks import MetricsFile, NonFiniteGuard, Progress, StepCheckpoint, Throughput, Validation
from scalelab.train.dispatch import lean
from scalelab.train.heap import FrozenHeap

if TYPE_CHECKING:
    from scalelab.tracking import StageRun


@dataclass(frozen=True)
class Machine:
    """Where the trainer runs (the machine settings of a train section)."""

    accelerator: str = "cpu"
    devices: int = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"


@dataclass(frozen=True)
class Loop:
    """A finished training loop: its trainer and the callbacks whose state the cell's metrics read."""

    trainer: L.Trainer
    throughput: Throughput
    curve: MetricsFile


def train(lit: L.LightningModule, datamodule: L.LightningDataModule, *, machine: Machine, out_dir: Path, name: str,
          total: int, tokens_per_step: int, flops_per_token: float, peak_flops: float, val_every: int,
          ckpt_every: int, log_every: int, run: StageRun | None, resume: Path | None,
          before_curve: Sequence[Callback] = (), after_curve: Sequence[Callback] = ()) -> Loop:
    """Train `lit` on `datamodule` to `total` steps into `out_dir`/ckpt, resuming `resume` when given.

    `before_curve`: callbacks that add metrics to the step's (the curve logs them); `after_curve`: callbacks that
    act on a finished step (a cell's schedule of frozen weights, a test's faults), before the checkpoint."""
    throughput = Throughput(tokens_per_step, flops_per_token, peak_flops)
    curve = MetricsFile(tokens_per_step, ckpt_every, total, logged_file=out_dir / "ckpt" / "metrics_logged.json",
                        run_id=run.run_id if run is not None else None, log_every=log_every)
    tty = sys.stdout.isatty()
    progress = [] if tty else [Progress(name, total, tokens_per_step)]  # a terminal has Lightning's bar instead
    logger = run.lightning_logger() if run is not None and rank_zero_only.rank == 0 else None
    trainer = L.Trainer(
        accelerator=machine.accelerator, devices=machine.devices, num_nodes=machine.num_nodes,
        strategy=machine.strategy, precision=machine.precision, max_epochs=1, max_steps=-1,  # the stream ends at total
        callbacks=lean([throughput, FrozenHeap(), NonFiniteGuard(), Validation(val_every, total), *before_curve,
                        curve, *progress, *after_curve, StepCheckpoint(out_dir / "ckpt", ckpt_every, total)]),
        logger=logger or False, default_root_dir=out_dir, enable_progress_bar=tty,
        enable_model_summary=False, use_distributed_sampler=False,
    )
    with placement.launch_scope():  # no rank variables left for the next fit or child
        trainer.fit(lit, datamodule=datamodule, ckpt_path=resume, weights_only=True)
    return Loop(trainer, throughput, curve)


def write_model(loop: Loop, out_dir: Path, save: Callable[[Path], None], metrics: dict,
                files: dict[str, Callable[[Path], None]] | None = None) -> None:
    """On rank 0: `out_dir`/model with the weights (`save`), curve.csv, each of `files` and metrics.json, all or
    nothing; then the checkpoint folder's run.json marked complete (a rerun of the cell starts it anew)."""
    if not loop.trainer.is_global_zero:
        return
    with atomic_dir(out_dir / "model") as tmp:
        save(tmp)
        loop.curve.write_csv(tmp / "curve.csv")
        for filename, write in (files or {}).items():
            write(tmp / filename)
        write_json_atomic(tmp / "metrics.json", metrics)
    run_json = out_dir / "ckpt" / "run.json"
    write_json_atomic(run_json, {**json.loads(run_json.read_text()), "complete": True})
