"""params section `optim` and the LR schedules: optimizers of the registry (scalelab.optim)."""

from __future__ import annotations

from typing import Any, Literal

from scalelab.config.base import Fraction, NonNegFloat, PosFloat, Strict

class OptimizerConfig(Strict):
    """One optimizer of the registry (scalelab.optim). Scale vectors always go to AdamW (METHODS §A)."""

    name: str = "adamw"
    lr: PosFloat = 3e-3
    weight_decay: NonNegFloat = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: PosFloat = 1e-8
    momentum: Fraction = 0.95  # Muon / SGD
    adamw_lr: PosFloat | None = None  # lr of the AdamW side-group under matrix optimizers (None: lr)
    kwargs: dict[str, Any] = {}  # passed through to the library optimizer


class ScheduleConfig(Strict):
    name: Literal["cosine", "wsd", "linear", "constant"] = "cosine"
    warmup: Fraction = 0.05  # fraction of total steps
    min_lr_ratio: Fraction = 0.1
    decay: Fraction = 0.2  # WSD: fraction of total steps in the final decay
