"""Learning-rate schedules as multipliers of each group's `base_lr` (cosine, WSD, linear, constant).

A pure function of (step, total_steps) so a resumed run needs no scheduler state.
"""

from __future__ import annotations

import math

import torch

from scalelab.config import ScheduleConfig


def lr_factor(cfg: ScheduleConfig, step: int, total_steps: int) -> float:
    """Multiplier in [min_lr_ratio, 1] after warmup; linear warmup from 1/warmup_steps."""
    warmup = int(cfg.warmup * total_steps)
    if step < warmup:
        return (step + 1) / warmup
    floor = cfg.min_lr_ratio
    progress = (step - warmup) / max(1, total_steps - warmup)  # 0 → 1 after warmup
    if cfg.name == "constant":
        return 1.0
    if cfg.name == "cosine":
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    if cfg.name == "linear":
        return floor + (1 - floor) * (1 - min(progress, 1.0))
    if cfg.name == "wsd":  # warmup-stable-decay: flat at 1, then linear decay over the last `decay` fraction
        decay_steps = max(1, int(cfg.decay * total_steps))
        into_decay = step - (total_steps - decay_steps)
        if into_decay < 0:
            return 1.0
        return floor + (1 - floor) * (1 - min(into_decay / decay_steps, 1.0))
    raise ValueError(f"unknown schedule {cfg.name!r}")


def apply_lr(optimizers: list[torch.optim.Optimizer], factor: float) -> None:
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * factor
