"""Optimizer registry and parameter grouping (METHODS §A weight-decay policy, §B families).

Parameters are grouped by the model's `param_kind`: "matrix", "embedding", "input_scale", "output_scale". Decay on
the two scale kinds follows the variant's policy (`wd_input_scales`, `wd_output_scales`), at the matrices' rate times
`scale_wd_mult` (the dose of METHODS §A's γ decay).
An optimizer takes the hidden matrices and the embeddings (LM head included), or with `matrices_only` the hidden 2-D
matrices alone; everything else, scale vectors always included, goes to an AdamW side-optimizer (METHODS §A: "scale
vectors are always optimised by AdamW-style updates"; §B: 1-D params and embeddings to AdamW under Muon). A
Schedule-Free optimizer (itself AdamW-style) takes every group, scale vectors included: a side AdamW would run on the
constant schedule Schedule-Free trains with and never be averaged (issue 19). The families themselves live in
scalelab.optim.families, which registers them here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from scalelab.config import OptimizerConfig, ScaleConfig

# factory(groups, cfg, model) -> optimizer over `groups`; `model` for families whose partition needs more than the
# parameters (Adam-mini's heads). Each group carries "name", "params", "weight_decay", "lr" and "base_lr".
Factory = Callable[[list[dict], OptimizerConfig, nn.Module], torch.optim.Optimizer]


@dataclass(frozen=True)
class OptimizerSpec:
    factory: Factory
    matrices_only: bool = False  # True: the hidden 2-D "matrix" groups only; the rest goes to AdamW
    family: str = ""  # METHODS §B family (the leaderboard groups by it)
    library: str = "torch.optim"
    schedule_free: bool = False  # averaged iterate: evaluation weights via optimizer.eval()/train(), no LR decay


def _adamw(groups: list[dict], cfg: OptimizerConfig, model: nn.Module | None = None) -> torch.optim.Optimizer:
    # foreach: one fused kernel per op over the many small scale vectors (torch picks it by default on CUDA only).
    kwargs = {"foreach": True, **cfg.kwargs}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **kwargs)


OPTIMIZERS: dict[str, OptimizerSpec] = {"adamw": OptimizerSpec(_adamw, family="adaptive")}


def register(name: str, spec: OptimizerSpec) -> None:
    """Add an optimizer family (scalelab.optim.families registers METHODS §B's)."""
    OPTIMIZERS[name] = spec


SCALE_KINDS = ("input_scale", "output_scale")


def param_groups(model: nn.Module, cfg: OptimizerConfig, scale: ScaleConfig) -> dict[str, dict]:
    """Named groups {name: {"params", "weight_decay", "name"}}; empty ones are left out.

    Under magdir (γ = g·v/‖v‖) decay applies to the magnitude g only: γ does not change when v is scaled, so decaying
    v would not pull γ toward 0, it would only shrink ‖v‖ and so raise the effective step on the direction. The
    direction vectors get their own undecayed groups ("<kind>_direction")."""
    on_scales = cfg.weight_decay * cfg.scale_wd_mult
    decay = {
        "matrix": cfg.weight_decay,
        "embedding": cfg.weight_decay,
        "input_scale": on_scales if scale.wd_input_scales else 0.0,
        "output_scale": on_scales if scale.wd_output_scales else 0.0,
    }
    groups: dict[str, dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        kind = model.param_kind(name)
        if kind not in decay:
            raise ValueError(f"parameter {name!r} has unknown kind {kind!r}; expected one of {sorted(decay)}")
        group, wd = kind, decay[kind]
        if kind in SCALE_KINDS and name.endswith(".v"):  # scalelab.model.norm.Scale's magdir direction
            group, wd = f"{kind}_direction", 0.0
        groups.setdefault(group, {"name": group, "params": [], "weight_decay": wd})["params"].append(p)
    return groups


def spec(name: str) -> OptimizerSpec:
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; registered: {sorted(OPTIMIZERS)}")
    return OPTIMIZERS[name]


def build_optimizers(model: nn.Module, cfg: OptimizerConfig, scale: ScaleConfig) -> list[torch.optim.Optimizer]:
    """The optimizer of `cfg` over its parameters, plus AdamW for the rest. Each group carries `base_lr`.

    Scale vectors always get AdamW (METHODS §A), whatever the matrices get; a matrix optimizer (Muon, SOAP, GaLore)
    takes only the hidden 2-D matrices, so embeddings, LM head and router go to AdamW too (METHODS §B: documented
    grouping). The AdamW side runs at `cfg.adamw_lr` (None: `cfg.lr`) with the optimizer's betas, eps and decay."""
    family = spec(cfg.name)
    groups = param_groups(model, cfg, scale)
    if family.factory is _adamw or family.schedule_free:  # one optimizer for everything
        for g in groups.values():
            g["base_lr"] = g["lr"] = cfg.lr
        return [family.factory(list(groups.values()), cfg, model)]
    mine = ("matrix",) if family.matrices_only else ("matrix", "embedding")
    main = [groups.pop(k) for k in mine if k in groups]
    if family.matrices_only and any(p.ndim != 2 for g in main for p in g["params"]):
        raise ValueError(f"{cfg.name} takes 2-D matrices only; the model reported a non-2-D 'matrix' parameter")
    side_lr = cfg.adamw_lr or cfg.lr
    for g in main:
        g["base_lr"] = g["lr"] = cfg.lr
    for g in groups.values():
        g["base_lr"] = g["lr"] = side_lr
    optimizers = [family.factory(main, cfg, model)] if main else []
    for g in optimizers[0].param_groups if optimizers else []:  # families that regroup (Adam-mini) keep a base_lr
        g.setdefault("base_lr", cfg.lr)
    if groups:
        side = OptimizerConfig(name="adamw", lr=side_lr, weight_decay=cfg.weight_decay, betas=cfg.betas, eps=cfg.eps,
                               scale_wd_mult=cfg.scale_wd_mult)
        optimizers.append(_adamw(list(groups.values()), side))
    return optimizers
