"""Training callbacks, one concern each (validation, throughput/MFU, γ statistics, sharpness, non-finite guard,
metrics file, checkpoints).

Each step, the module fills `step_metrics` with its training metrics; the callbacks below add theirs in list order
(fit.py builds the list) and MetricsFile logs the lot at the module's step. Every callback keeps what the final
metrics need in its `state_dict`, so it lands in the checkpoint and a resumed run reports the same history as an
uninterrupted one.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, Checkpoint
from torch.nn.attention import SDPBackend, sdpa_kernel

from scalelab.config import SharpnessConfig


def _due(step: int, every: int, total: int) -> bool:
    """Periodic events also fire at the last step."""
    return step % every == 0 or step == total


class Throughput(Callback):
    """Step wall time (the training step alone), tokens/s and MFU = flops_per_token·tokens/s / peak FLOP/s.

    `peak_flops` is the peak of all devices together (per-device peak × world size). Put this callback first, so its
    timer stops before the other callbacks' work (validation, sharpness, checkpoints).
    """

    def __init__(self, tokens_per_step: int, flops_per_token: float, peak_flops: float) -> None:
        self.tokens_per_step, self.flops_per_token, self.peak_flops = tokens_per_step, flops_per_token, peak_flops
        self.times: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        dt = time.perf_counter() - self._start  # loss.item() in the step already synchronised the device
        self.times.append(dt)
        tokens_per_s = self.tokens_per_step / dt
        pl_module.step_metrics.update({"perf/step_time_s": dt, "perf/tokens_per_s": tokens_per_s,
                                       "perf/mfu": self.mfu(tokens_per_s)})

    def mfu(self, tokens_per_s: float) -> float:
        return self.flops_per_token * tokens_per_s / self.peak_flops

    def state_dict(self) -> dict:
        return {"times": self.times}

    def load_state_dict(self, state_dict: dict) -> None:
        self.times = list(state_dict["times"])


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
    """val/loss (token-weighted mean over the fixed validation windows) every `every` steps and at the end."""

    def __init__(self, every: int, total: int) -> None:
        self.every, self.total = every, total

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if _due(pl_module.step, self.every, self.total):
            pl_module.step_metrics["val/loss"] = pl_module.evaluate(trainer.datamodule.val_share())


class GammaStats(Callback):
    """Per-layer statistics of every effective γ (METHODS §A diagnostics) every `every` steps and at the end."""

    def __init__(self, every: int, total: int) -> None:
        self.every, self.total = every, total
        self.rows: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if _due(pl_module.step, self.every, self.total) and (stats := pl_module.model.gamma_stats()):
            pl_module.step_metrics.update(stats)
            self.rows.append({"step": pl_module.step, **stats})

    def summary(self) -> dict[str, float]:
        """The last row reduced over layers: mean of the means and stds, max of the maxima, min of the minima."""
        last = self.rows[-1] if self.rows else {}
        reducers = {"mean": statistics.fmean, "std": statistics.fmean, "max": max, "min": min}
        return {f"gamma_{stat}": reduce(vals) for stat, reduce in reducers.items()
                if (vals := [v for k, v in last.items() if k.endswith(f"/{stat}")])}

    def write_csv(self, path: Path) -> None:
        columns = list(self.rows[0]) if self.rows else ["step"]
        _write_csv(path, columns, [[row.get(c) for c in columns] for row in self.rows])

    def state_dict(self) -> dict:
        return {"rows": self.rows}

    def load_state_dict(self, state_dict: dict) -> None:
        self.rows = list(state_dict["rows"])


def top_hessian_eigenvalue(loss_fn: Callable[[], torch.Tensor], params: list[torch.Tensor], iters: int,
                           seed: int = 0) -> float:
    """Largest eigenvalue λ_max of the Hessian of `loss_fn()` w.r.t. `params` (METHODS §A sharpness).

    Power iteration v ← Hv/‖Hv‖ on Hessian-vector products (double backward through one graph) finds the eigenvalue
    of largest magnitude. Away from a minimum that can be a negative one; then a second run on the shifted operator
    H − λI (whose dominant eigenvalue is λ_max − λ ≥ 0) gives λ_max. The start vector comes from `seed`.
    """
    grads = torch.autograd.grad(loss_fn(), params, create_graph=True, allow_unused=True, materialize_grads=True)

    def hvp(v: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(torch.autograd.grad(grads, params, grad_outputs=v, retain_graph=True, allow_unused=True,
                                        materialize_grads=True))

    def power(shift: float) -> float:
        gen = torch.Generator().manual_seed(seed)
        v = [torch.randn(p.shape, generator=gen).to(p) for p in params]
        eig = 0.0
        for _ in range(iters):
            norm = torch.sqrt(sum((u * u).sum() for u in v))
            v = [u / norm for u in v]
            hv = [h.detach() - shift * u for h, u in zip(hvp(v), v)]
            eig = sum((h * u).sum() for h, u in zip(hv, v)).item()  # Rayleigh quotient of the unit vector
            v = hv
        return eig + shift

    dominant = power(0.0)
    return dominant if dominant >= 0 else power(dominant)


class Sharpness(Callback):
    """Top Hessian eigenvalue of the training loss on a fixed batch, every `every` steps (the checkpoints) and at
    the end. Every rank computes the same value on the same batch; no collective is needed."""

    def __init__(self, cfg: SharpnessConfig, every: int, total: int) -> None:
        self.cfg, self.every, self.total = cfg, every, total
        self.rows: list[tuple[int, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.cfg.enabled and _due(pl_module.step, self.every, self.total):
            value = self.measure(pl_module, trainer.datamodule.sharpness_batch(self.cfg.batch_size))
            pl_module.step_metrics["sharpness"] = value
            self.rows.append((pl_module.step, value))

    def measure(self, pl_module: L.LightningModule, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        model = pl_module.model
        x, y = (t.to(pl_module.device) for t in batch)
        params = [p for p in model.parameters() if p.requires_grad]
        # `model.forward` bypasses a torch.compile wrapper (no double backward there); the math SDPA kernel is the one
        # with a second derivative (the fused CPU/flash kernels have none).
        with sdpa_kernel(SDPBackend.MATH), torch.enable_grad():
            return top_hessian_eigenvalue(lambda: model.forward(x, y).loss.float(), params, self.cfg.iters)

    def state_dict(self) -> dict:
        return {"rows": self.rows}

    def load_state_dict(self, state_dict: dict) -> None:
        self.rows = [tuple(r) for r in state_dict["rows"]]


class MetricsFile(Callback):
    """Logs each step's metrics to the loggers at the module's step and keeps the loss curve
    (step, tokens, train_loss, val_loss, lr) that fit() writes as `curve.csv`.

    Metrics are sent at validation steps and every `flush_every` steps (the checkpoints: a resumed run re-logs
    exactly the steps after its checkpoint), MLflow's as one request for all pending steps: a request per step costs
    about as much as a micro model's training step on a local sqlite store.
    """

    COLUMNS = ("step", "tokens", "train_loss", "val_loss", "lr")

    def __init__(self, tokens_per_step: int, flush_every: int, total: int) -> None:
        self.tokens_per_step, self.flush_every, self.total = tokens_per_step, flush_every, total
        self.rows: list[list[float | None]] = []
        self.pending: list[tuple[int, int, dict[str, float]]] = []  # (step, timestamp ms, metrics)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        m, step = pl_module.step_metrics, pl_module.step
        self.rows.append([step, step * self.tokens_per_step, m["train/loss"], m.get("val/loss"), m["lr"]])
        self.pending.append((step, int(time.time() * 1000), dict(m)))
        if "val/loss" in m or _due(step, self.flush_every, self.total):
            self.flush(trainer)

    def flush(self, trainer: L.Trainer) -> None:
        for logger in trainer.loggers:  # only rank 0 has loggers
            if hasattr(logger, "log_batch"):  # tracking's MLflow logger: one request, never raises
                from mlflow.entities import Metric

                logger.log_batch([Metric(k, v, ts, step) for step, ts, m in self.pending for k, v in m.items()])
            else:
                for step, _, m in self.pending:
                    logger.log_metrics(m, step=step)
        self.pending = []

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

    Lightning's ModelCheckpoint counts `global_step`, which advances once per optimizer (twice per step under
    Muon + AdamW); this one counts the module's optimizer steps.
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
