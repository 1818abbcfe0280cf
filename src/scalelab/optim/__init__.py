"""Optimizers and learning-rate schedules."""

from scalelab.optim.registry import OPTIMIZERS, OptimizerSpec, build_optimizers, param_groups, register
from scalelab.optim.schedules import apply_lr, lr_factor

__all__ = ["OPTIMIZERS", "OptimizerSpec", "apply_lr", "build_optimizers", "lr_factor", "param_groups", "register"]
