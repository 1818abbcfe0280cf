"""Optimizer registry and parameter grouping (the scale vectors' weight-decay policy; the families).

Parameters are grouped by the model's `param_kind`: "matrix", "embedding", "input_scale", "output_scale". Decay on
the two scale kinds follows the variant's policy (`wd_input_scales`, `wd_output_scales`), at the matrices' rate times
`scale_wd_mult` (the dose of the decay on γ).
An optimizer takes the hidden matrices and the embeddings (LM head included), or with `matrices_only` the hidden 2-D
matrices alone; everything else, scale vectors always included, goes to an AdamW side-optimizer (scale
vectors always get AdamW-style updates; 1-D params and embeddings go to AdamW under Muon, as its authors do). A
Schedule-Free optimizer (itself AdamW-style) takes every group, scale vectors included: a side AdamW would run on the
constant schedule Schedule-Free trains with and never be averaged. The families themselves live in
scalelab.optim.families, which registers them here.
"""

from __future__ import annotations

import math
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
    family: str = ""  # the survey's family (the leaderboard groups by it)
    library: str = "torch.optim"
    schedule_free: bool = False  # averaged iterate: evaluation weights via optimizer.eval()/train(), no LR decay


def _adamw(groups: list[dict], cfg: OptimizerConfig, model: nn.Module | None = None) -> torch.optim.Optimizer:
    # fused: the whole update in one kernel over every tensor, on CPU as on CUDA (torch picks foreach by default on
    # CUDA only, and per-tensor loops on CPU). Measured at one thread: the step of the xxs/s/m models' AdamW took
    # 1.40/3.41/7.57 ms with foreach and 0.42/1.04/1.79 ms fused, 2-5% of a study cell's step; the same update,
    # equal to the foreach path's weights on a 3-step cell. A user's `foreach` or `differentiable` (which no fused
    # kernel has) chooses another path.
    kwargs = {**({} if {"foreach", "fused", "differentiable"} & cfg.kwargs.keys() else {"fused": True}), **cfg.kwargs}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **kwargs)


OPTIMIZERS: dict[str, OptimizerSpec] = {"adamw": OptimizerSpec(_adamw, family="adaptive")}


def register(name: str, spec: OptimizerSpec) -> None:
    """Add an optimizer family (scalelab.optim.families registers the benchmark's)."""
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


def has_side(name: str) -> bool:
    """Whether family `name` leaves groups to an AdamW side optimizer (the scale vectors; under a matrix family the
    embeddings and LM head too): every family but AdamW itself and the Schedule-Free ones, which take everything."""
    family = spec(name)
    return not (family.factory is _adamw or family.schedule_free)


def build_optimizers(model: nn.Module, cfg: OptimizerConfig, scale: ScaleConfig) -> list[torch.optim.Optimizer]:
    """The optimizer of `cfg` over its parameters, plus AdamW for the rest. Each group carries `base_lr`.

    Scale vectors always get AdamW, whatever the matrices get; a matrix optimizer (Muon, SOAP, GaLore)
    takes only the hidden 2-D matrices, so embeddings, LM head and router go to AdamW too (each family's
    documented grouping). The AdamW side runs at `cfg.adamw_lr` (None: `cfg.lr`), `cfg.adamw_weight_decay` and
    `cfg.adamw_betas` (None: the optimizer's decay and betas), with its eps. The embedding group (token embedding and LM head) runs at `cfg.embedding_lr_mult` × the LR of whichever
    optimizer takes it; a family that regroups its parameters and loses that LR is refused."""
    family = spec(cfg.name)
    groups = param_groups(model, cfg, scale)
    side_wd = cfg.weight_decay if cfg.adamw_weight_decay is None else cfg.adamw_weight_decay

    def at(g: dict, lr: float) -> dict:
        g["base_lr"] = g["lr"] = lr * (cfg.embedding_lr_mult if g["name"] == "embedding" else 1.0)
        return g

    if not has_side(cfg.name):  # one optimizer for everything
        optimizers = [family.factory([at(g, cfg.lr) for g in groups.values()], cfg, model)]
        _check_embedding_lr(optimizers, groups.get("embedding"), cfg)
        return optimizers
    mine = ("matrix",) if family.matrices_only else ("matrix", "embedding")
    main = [groups.pop(k) for k in mine if k in groups]
    if family.matrices_only and any(p.ndim != 2 for g in main for p in g["params"]):
        raise ValueError(f"{cfg.name} takes 2-D matrices only; the model reported a non-2-D 'matrix' parameter")
    side_lr = cfg.adamw_lr or cfg.lr
    embedding = next((g for g in [*main, *groups.values()] if g["name"] == "embedding"), None)
    main = [at(g, cfg.lr) for g in main]
    optimizers = [family.factory(main, cfg, model)] if main else []
    for g in optimizers[0].param_groups if optimizers else []:  # families that regroup (Adam-mini) keep a base_lr
        g.setdefault("base_lr", cfg.lr)
    if groups:
        if side_wd != cfg.weight_decay:  # the side groups' decays (the scale vectors' policy too) at the side's rate
            own = param_groups(model, cfg.model_copy(update={"weight_decay": side_wd}), scale)
            for name, g in groups.items():
                g["weight_decay"] = own[name]["weight_decay"]
        side = OptimizerConfig(name="adamw", lr=side_lr, weight_decay=side_wd, betas=cfg.adamw_betas or cfg.betas,
                               eps=cfg.eps, scale_wd_mult=cfg.scale_wd_mult)
        optimizers.append(_adamw([at(g, side_lr) for g in groups.values()], side))
    _check_embedding_lr(optimizers, embedding, cfg)
    return optimizers


def _check_embedding_lr(optimizers: list[torch.optim.Optimizer], embedding: dict | None, cfg: OptimizerConfig) -> None:
    """Every embedding parameter's group in the built optimizers has the LR asked for (a family that regroups by
    name, as Adam-mini does, puts them at its own LR: refused rather than trained at another LR than recorded)."""
    if embedding is None or cfg.embedding_lr_mult == 1.0:
        return
    want = {id(p): embedding["lr"] for p in embedding["params"]}
    for opt in optimizers:
        for g in opt.param_groups:
            if any(id(p) in want and not math.isclose(g["base_lr"], want[id(p)]) for p in g["params"]):
                raise ValueError(f"{cfg.name} regroups its parameters: embedding_lr_mult {cfg.embedding_lr_mult} "
                                 "would not reach the embeddings")


def own_lrs(optimizers: list[torch.optim.Optimizer], model: nn.Module,
            lr_of: Callable[[str], float | None]) -> list[torch.optim.Optimizer]:
    """The parameters `lr_of` gives a learning rate, by name, moved out of their groups into groups of their own at
    that base LR, with their old group's decay and hyperparameters (named "<group>@own"); the schedule scales them as
    every group (apply_lr: base_lr × factor). Before the first step only: an optimizer with state is refused."""
    own = {id(p): lr for name, p in model.named_parameters() if (lr := lr_of(name)) is not None}
    for opt in optimizers if own else []:
        if opt.state:
            raise ValueError("own_lrs: the optimizer has stepped already; regroup it before its first step")
        moved: dict[tuple[int, float], tuple[dict, list]] = {}
        for i, group in enumerate(opt.param_groups):
            for p in [p for p in group["params"] if id(p) in own]:
                moved.setdefault((i, own[id(p)]), (group, []))[1].append(p)
            group["params"] = [p for p in group["params"] if id(p) not in own]
        opt.param_groups = [g for g in opt.param_groups if g["params"]]
        for (_, lr), (group, params) in moved.items():
            opt.add_param_group({**group, "params": params, "name": f"{group.get('name', 'group')}@own", "lr": lr,
                                 "base_lr": lr})
    return optimizers
