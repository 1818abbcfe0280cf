"""Optimizers (the registry and the benchmark's families), their training-loop hooks, and learning-rate schedules."""

from scalelab.optim import families, hooks  # families: registers the benchmark's optimizers on import
from scalelab.optim.registry import (OPTIMIZERS, OptimizerSpec, build_optimizers, own_lrs, param_groups, register,
                                     spec)
from scalelab.optim.schedules import apply_lr, lr_factor

__all__ = ["OPTIMIZERS", "OptimizerSpec", "apply_lr", "build_optimizers", "families", "hooks", "lr_factor",
           "own_lrs", "param_groups", "register", "spec"]
