"""Training callbacks, one concern each (validation, throughput/MFU, γ statistics, non-finite guard, metrics file,
checkpoints; sharpness in scalelab.train.sharpness).

Each step, the module fills `step_metrics` with its training metrics; the callbacks below add theirs in list order
(fit.py builds the list) and MetricsFile logs the lot at the module's step. Every callback keeps what the final
metrics need in its `state_dict`, so it lands in the checkpoint and a resumed run reports the same history as an
uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, Checkpoint
from torch import nn

from scalelab.data import write_json_atomic
from scalelab.model.norm import Scale

log = logging.getLogger(__name__)


def _due(step: int, every: int, total: int) -> bool:
    """Periodic events also fire at the last step."""
    return step % every == 0 or step == total


class Throughput(Callback):
    """Step wall time (the training step alone), tokens/s and MFU = flops_per_token·tokens/s / peak FLOP/s.

    `peak_flops` is the peak of all devices together (per-device peak × world size), raised to any step's achieved
    FLOP/s: what was achieved is achievable, so MFU ≤ 1 even when the peak was measured while something else held
    the device. Put this callback first, so its timer stops before the other callbacks' work (validation,
    sharpness, checkpoints). `flops_per_token` is the model's analytic count, which tests/test_train.py pins equal to
    what Lightning's `measure_flops` counts (forward + backward).

    Not Lightning's ThroughputMonitor: its peak comes from Lightning's GPU table only (none on CPU: no MFU) and is
    never raised, its rate is wall time since training started (the other callbacks' work included), and it logs
    each step apart at `global_step` (a request per step, twice the step under Muon), outside MetricsFile's batching.
    """

    def __init__(self, tokens_per_step: int, flops_per_token: float, peak_flops: float) -> None:
        self.tokens_per_step, self.flops_per_token, self.peak_flops = tokens_per_step, flops_per_token, peak_flops
        self.times: list[float] = []
        self._start = self._loop_start = 0.0
        self.loop_s = 0.0  # wall time of this fit's training loop (steps and the callbacks' work), set at its end

    def on_train_start(self, trainer, pl_module) -> None:
        self._loop_start = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        self.loop_s = time.perf_counter() - self._loop_start

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        dt = time.perf_counter() - self._start  # loss.item() in the step already synchronised the device
        self.times.append(dt)
        tokens_per_s = self.tokens_per_step / dt
        self.peak_flops = max(self.peak_flops, self.flops_per_token * tokens_per_s)
        pl_module.step_metrics.update({"perf/step_time_s": dt, "perf/tokens_per_s": tokens_per_s,
                                       "perf/mfu": self.mfu(tokens_per_s)})

    def mfu(self, tokens_per_s: float) -> float:
        return self.flops_per_token * tokens_per_s / self.peak_flops

    def state_dict(self) -> dict:
        return {"times": self.times, "peak_flops": self.peak_flops}

    def load_state_dict(self, state_dict: dict) -> None:
        self.times = list(state_dict["times"])
        self.peak_flops = max(self.peak_flops, state_dict.get("peak_flops", 0.0))


class Progress(Callback):
    """A log line every `every_pct` percent of the steps and at the last one: step, tokens, training loss (and the
    validation loss when measured at that step), tokens/s since this fit started, ETA. For output that is not a
    terminal (the Prefect log, `dvc repro` into a file, CI), where Lightning's progress bar is off. Rank 0 only."""

    def __init__(self, name: str, total: int, tokens_per_step: int, every_pct: float = 5.0) -> None:
        self.name, self.total, self.tokens_per_step = name, total, tokens_per_step
        self.every = max(1, round(total * every_pct / 100))
        self._start, self._first = 0.0, 0

    def on_train_start(self, trainer, pl_module) -> None:
        self._start, self._first = time.perf_counter(), pl_module.step  # a resumed run starts past step 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = pl_module.step
        if not trainer.is_global_zero or not _due(step, self.every, self.total):
            return
        elapsed, done = time.perf_counter() - self._start, step - self._first
        rate = done * self.tokens_per_step / elapsed if elapsed > 0 else 0.0
        eta = _duration((self.total - step) * elapsed / done) if done else "?"
        m = pl_module.step_metrics
        val = f", val loss {m['val/loss']:.4f}" if "val/loss" in m else ""
        log.info("%s: step %d/%d (%d%%), %s tokens, loss %.4f%s, %.0f tokens/s, ETA %s", self.name, step, self.total,
                 100 * step // self.total, f"{step * self.tokens_per_step:,}", m["train/loss"], val, rate, eta)


def _duration(seconds: float) -> str:
    """42s, 3m05s, 2h07m."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    return f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


class NonFiniteGuard(Callback):
    """Fail fast on a NaN/inf loss or gradient norm, before any optimizer changes a weight.

    Checked when the first optimizer calls Lightning's closure (torch.optim's do, before updating), and again at the
    end of the step for optimizers that do not; either way before StepCheckpoint (always the last callback), so no
    checkpoint is written and the last good one stays. The exception propagates out of `fit`, and the stage's MLflow
    run ends FAILED. The loss is averaged over ranks, so every DDP rank raises at the same step.
    """

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._check(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._check(pl_module)

    @staticmethod
    def _check(pl_module: L.LightningModule) -> None:
        m = pl_module.step_metrics
        if bad := {k: m[k] for k in ("train/loss", "train/grad_norm") if not math.isfinite(m[k])}:
            raise FloatingPointError(
                f"non-finite training values at step {pl_module.step}: {bad}; stopped before writing a checkpoint "
                "(the last good one is kept). Lower the learning rate, enable grad_clip, or use fp32.")


class Validation(Callback):
    """val/loss (token-weighted mean over the fixed validation windows) every `every` steps and at the end.

    Not the Trainer's `val_check_interval`: Lightning validates after every on_train_batch_end hook, so the step's
    curve row, log line and checkpoint would be written before its validation loss exists (a resumed run would lack
    it), and it skips the last step when the interval does not divide the total.
    """

    def __init__(self, every: int, total: int) -> None:
        self.every, self.total = every, total

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if _due(pl_module.step, self.every, self.total):
            pl_module.step_metrics["val/loss"] = pl_module.evaluate(trainer.datamodule.val_share())


class GammaStats(Callback):
    """Per-layer statistics of every effective γ (the scale-vector diagnostics) every `every` steps and at the end,
    and the mean γ of each scale kind (`kind_means`): what weight decay on one kind moves (docs/scale-vectors.md)."""

    def __init__(self, every: int, total: int) -> None:
        self.every, self.total = every, total
        self.rows: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if _due(pl_module.step, self.every, self.total) and (stats := pl_module.model.gamma_stats()):
            stats |= kind_means(pl_module.model)
            pl_module.step_metrics.update(stats)
            self.rows.append({"step": pl_module.step, **stats})

    def summary(self) -> dict[str, float]:
        """The last row reduced over layers: mean of the means and stds, max of the maxima, min of the minima (over
        every γ vector); and each kind's mean γ apart (`gamma_input_mean`, `gamma_output_mean`, `gamma_final_mean`)."""
        last = self.rows[-1] if self.rows else {}
        reducers = {"mean": statistics.fmean, "std": statistics.fmean, "max": max, "min": min}
        return ({f"gamma_{stat}": reduce(vals) for stat, reduce in reducers.items()
                 if (vals := [v for k, v in last.items() if k.endswith(f"/{stat}")])}
                | {f"gamma_{k.removeprefix(KIND_MEAN)}_mean": v for k, v in last.items() if k.startswith(KIND_MEAN)})

    def write_csv(self, path: Path) -> None:
        columns = list(self.rows[0]) if self.rows else ["step"]
        _write_csv(path, columns, [[row.get(c) for c in columns] for row in self.rows])

    def state_dict(self) -> dict:
        return {"rows": self.rows}

    def load_state_dict(self, state_dict: dict) -> None:
        self.rows = list(state_dict["rows"])


KIND_MEAN = "gamma_mean/"  # the step metrics of the kinds' means: gamma_mean/input, gamma_mean/output, gamma_mean/final


@torch.no_grad()
def kind_means(model: nn.Module) -> dict[str, float]:
    """Mean effective γ of each scale kind, every vector weighing once (as `gamma_mean` weighs them): `input` (the
    γ that feed a linear map: pre-attention and pre-MLP norms, branch γ, s_out), `output` (QK-norm and post-branch
    norm γ) and `final` (the final norm's, the LM head's input, apart from the other input γ: its decay scales the
    logits directly). A kind the model lacks is left out."""
    final = getattr(model, "final_scale", None)
    groups: dict[str, list[torch.Tensor]] = {}
    for module in model.modules():
        if isinstance(module, Scale):
            kind = "final" if module is final else module.kind.removesuffix("_scale")
            groups.setdefault(kind, []).append(module().float().mean())
    if not groups:
        return {}
    means = torch.stack([torch.stack(v).mean() for v in groups.values()]).tolist()  # one host sync
    return {f"{KIND_MEAN}{k}": m for k, m in zip(groups, means)}


class MetricsFile(Callback):
    """Logs each step's metrics to the loggers at the module's step and keeps the loss curve
    (step, tokens, train_loss, val_loss, lr) that fit() writes as `curve.csv`.

    Metrics are sent at validation steps and every `flush_every` steps (the checkpoints), MLflow's as one request
    for all pending steps: a request per step costs about as much as a micro model's training step on a local sqlite
    store. A validation step may fall after the last checkpoint, so a resumed run would send its steps again: after
    each flush `logged_file` (beside the checkpoint) records {"run_id", "step"}, and a resumed run in the same MLflow
    run skips the steps up to it. A flush the logger could not deliver (an outage) is not recorded, so a resume
    fills that gap instead.

    The loggers get a step's metrics every `log_every` steps, at the last step, and at any step that carries more than
    the metrics every step has (`ROUTINE`: validation, γ, sharpness); the curve keeps every step. MLflow's store costs
    ~0.4 ms a metric row, 2.7 ms a step for the 7 routine metrics: 5% of an `xxs` cell's step (`log_every` 1: all).
    """

    COLUMNS = ("step", "tokens", "train_loss", "val_loss", "lr")
    ROUTINE = frozenset({"train/loss", "train/aux_loss", "train/grad_norm", "lr", "perf/step_time_s",
                         "perf/tokens_per_s", "perf/mfu"})  # the module's and Throughput's metrics, on every step

    def __init__(self, tokens_per_step: int, flush_every: int, total: int, logged_file: Path | None = None,
                 run_id: str | None = None, log_every: int = 1) -> None:
        self.tokens_per_step, self.flush_every, self.total = tokens_per_step, flush_every, total
        self.log_every = log_every
        self.logged_file, self.run_id = logged_file, run_id
        self.rows: list[list[float | None]] = []
        self.pending: list[tuple[int, int, dict[str, float]]] = []  # (step, timestamp ms, metrics)
        self._logged_through: int | None = None  # the last step this run already holds (read once)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        m, step = pl_module.step_metrics, pl_module.step
        self.rows.append([step, step * self.tokens_per_step, m["train/loss"], m.get("val/loss"), m["lr"]])
        if _due(step, self.log_every, self.total) or not m.keys() <= self.ROUTINE:
            self.pending.append((step, int(time.time() * 1000), dict(m)))
        if "val/loss" in m or _due(step, self.flush_every, self.total):
            self.flush(trainer)

    def flush(self, trainer: L.Trainer) -> None:
        pending = [p for p in self.pending if p[0] > self._already_logged()]
        for logger in trainer.loggers:  # only rank 0 has loggers
            if hasattr(logger, "log_batch"):  # tracking's MLflow logger: one request, never raises
                from mlflow.entities import Metric

                logger.log_batch([Metric(k, v, ts, step) for step, ts, m in pending for k, v in m.items()])
            else:
                for step, _, m in pending:
                    logger.log_metrics(m, step=step)
        delivered = trainer.loggers and not any(getattr(lg, "_down", False) for lg in trainer.loggers)
        if pending and delivered and self.logged_file is not None and self.run_id:
            write_json_atomic(self.logged_file, {"run_id": self.run_id, "step": pending[-1][0]})
        self.pending = []

    def _already_logged(self) -> int:
        """The last step the MLflow run holds from an earlier attempt (recorded in logged_file), else -1."""
        if self._logged_through is None:
            path = self.logged_file
            stored = json.loads(path.read_text()) if path is not None and path.is_file() else {}
            self._logged_through = stored["step"] if self.run_id and stored.get("run_id") == self.run_id else -1
        return self._logged_through

    def last(self, column: str) -> float | None:
        """The latest non-empty value of a column."""
        i = self.COLUMNS.index(column)
        return next((r[i] for r in reversed(self.rows) if r[i] is not None), None)

    def write_csv(self, path: Path) -> None:
        """The curve as CSV (an empty cell where a step had no validation)."""
        _write_csv(path, self.COLUMNS, self.rows)

    def state_dict(self) -> dict:
        return {"rows": self.rows}

    def load_state_dict(self, state_dict: dict) -> None:
        self.rows = [list(r) for r in state_dict["rows"]]


class StepCheckpoint(Checkpoint):
    """Full training state (weights, optimizer states, callback states, step) to `dirpath/last.ckpt` every `every`
    steps and at the end, written atomically: a crash mid-write leaves the previous checkpoint intact.

    Not Lightning's `ModelCheckpoint(every_n_train_steps=every, save_last=True)`: it counts `global_step`, which
    advances once per optimizer (twice per step under Muon + AdamW), does not save the last step when `every` does
    not divide it, and writes last.ckpt through fsspec's transaction, a temp file in $TMPDIR moved into place: a
    copy, not an atomic rename, when $TMPDIR is on another filesystem (a node-local /tmp on a cluster).
    """

    def __init__(self, dirpath: Path, every: int, total: int) -> None:
        self.dirpath, self.every, self.total = Path(dirpath), every, total

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if _due(pl_module.step, self.every, self.total):
            tmp = self.dirpath / ".last.ckpt.tmp"
            trainer.save_checkpoint(tmp, weights_only=False)  # every rank calls it; rank 0 writes
            if trainer.is_global_zero:
                os.replace(tmp, self.dirpath / "last.ckpt")
            trainer.strategy.barrier("StepCheckpoint")


def _write_csv(path: Path, columns: list[str] | tuple[str, ...], rows: list[list]) -> None:
    """CSV with empty cells for missing values, written atomically."""
    lines = [",".join(columns), *(",".join("" if v is None else repr(v) for v in row) for row in rows)]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)
