"""Training layer (Lightning): LightningModule, DataModule, callbacks and the fit/resume entry point."""

from scalelab.train.lean import import_lightning

import_lightning()  # first: Lightning without torchmetrics' optional backends (lean.py)

# ruff: noqa: E402
from scalelab.train.callbacks import (
    GammaStats,
    MetricsFile,
    NonFiniteGuard,
    Progress,
    StepCheckpoint,
    Throughput,
    Validation,
)
from scalelab.train.datamodule import StepBatches, TokenDataModule
from scalelab.train.device import peak_flops
from scalelab.train.fit import Cell, config_hash, fit, resume_run_id
from scalelab.train.module import LitLM
from scalelab.train.sharpness import Sharpness, top_hessian_eigenvalue

__all__ = [
    "Cell",
    "GammaStats",
    "LitLM",
    "MetricsFile",
    "NonFiniteGuard",
    "Progress",
    "Sharpness",
    "StepBatches",
    "StepCheckpoint",
    "Throughput",
    "TokenDataModule",
    "Validation",
    "config_hash",
    "fit",
    "peak_flops",
    "resume_run_id",
    "top_hessian_eigenvalue",
]
