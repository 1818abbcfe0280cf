"""Per-map diagnostics of SigmaScale's optimisation, on maps of a real model (beyond the paper).

SVD-LLM's factors are the exact rank-k minimiser of the layer loss SigmaScale minimises, so a SigmaScale map's
excess over it, loss / loss_SVD-LLM − 1, has two possible sources: the optimiser (the paper's AdamW from a random
start stops short of the best diagonal scalings) and the family (no diagonal D_r, D_c reaches the whitened optimum).
Two measurements, each on the same maps, from each map's own start (keys.map_generator):

`stopping`  one run of `max_steps` AdamW steps: the last iterate (the paper's runs, `stop: fixed`) against the best
            up to where the official plateau rule fires (`stop: plateau`: the same trajectory, cut there).
`optimiser` the same family optimised harder: L-BFGS (strong Wolfe line search) from the paper's start, AdamW at a
            larger learning rate, and both from ASVD's scaling (`init: asvd`, whose step 0 is ASVD's factorisation).
            The lowest loss any of them reaches bounds the family's own floor from above: the part of the paper-Adam
            excess above it is the optimiser's (at least); the part below it is the family's (at most, up to optimisers
            not tried).

Every loss is the layer loss ‖WX − ŴX‖²_F/(m·n) of the factors rebuilt in float64 (no regulariser), divided by
SVD-LLM's at the same rank. `python -m scalelab.compress.diagnose` runs them as one cell (diagnose.py).
"""

from __future__ import annotations

import math
import time

import torch

from scalelab.compress import keys, methods
from scalelab.compress.calibrate import Stats
from scalelab.compress.sigmascale import factors_of, initial_scalings, optimise, problem_of, scaled_loss
from scalelab.config.compress import SigmaScaleConfig


def loss_of(weight: torch.Tensor, k: int, gram: torch.Tensor, d_r: torch.Tensor, d_c: torch.Tensor) -> float:
    """The layer loss of the factors of scalings (d_r, d_c)."""
    f = factors_of(weight, k, d_r, d_c)
    return methods.layer_loss(weight, f.left, f.right, gram)


def _adam(weight, k, gram, start, cfg: SigmaScaleConfig, **over):
    settings = {**cfg.model_dump(exclude={"init_std"}), **over}
    t0 = time.perf_counter()
    run = optimise(weight, k, gram, *start, **settings)
    return run, time.perf_counter() - t0


def stopping(name: str, weight: torch.Tensor, k: int, stats: Stats, seed: int, cfg: SigmaScaleConfig,
             init: str = "random") -> dict:
    """The plateau rule's answer against the last of `cfg.max_steps` steps, on one map (module docstring), from the
    start `init` (sigmascale.initial_scalings: the paper's `random`, or a warm start)."""
    best = methods.svd_llm_loss(weight, k, stats.gram)
    start = initial_scalings(weight, init=init, init_std=cfg.init_std, generator=keys.map_generator(name, seed),
                             gram=stats.gram, abs_mean=stats.abs_mean)
    run, seconds = _adam(weight, k, stats.gram, start, cfg, stop="fixed")
    plateau = run.alternatives["plateau"] or run.alternatives["best"]  # the rule never fired: a capped run's best
    out = {"loss_svd_llm": best, "loss_init": loss_of(weight, k, stats.gram, *start),
           "loss_fixed": loss_of(weight, k, stats.gram, run.d_r, run.d_c),
           "loss_plateau": loss_of(weight, k, stats.gram, *plateau),
           "loss_best_seen": loss_of(weight, k, stats.gram, *run.alternatives["best"]),
           "plateau_step": run.info["plateau_step"], "plateau_rule": run.info["plateau_rule"],
           "steps": run.info["steps"], "seconds": seconds, "init": init}
    out["fixed_over_plateau"] = out["loss_fixed"] / out["loss_plateau"]
    return out


def lbfgs(weight: torch.Tensor, k: int, gram: torch.Tensor, start: tuple[torch.Tensor, torch.Tensor], *,
          lam: float = 1e-6, max_evals: int = 400, history: int = 20) -> tuple[tuple, dict]:
    """L-BFGS with a strong-Wolfe line search on the same objective (float64; scaled by its value at the start, so
    the line search's tolerances mean the same on every map). Returns the best scalings evaluated and its record."""
    m, n = weight.shape
    problem = problem_of(weight, gram, torch.float64)
    d_r = start[0].double().clone().requires_grad_(True)
    d_c = start[1].double().clone().requires_grad_(True)
    with torch.no_grad():
        scale = float(scaled_loss(d_r, d_c, problem, k)) / (m * n) + lam * float(d_r.square().sum() + d_c.square().sum())
    opt = torch.optim.LBFGS([d_r, d_c], lr=1.0, max_iter=max_evals, max_eval=max_evals, history_size=history,
                            tolerance_grad=1e-12, tolerance_change=1e-14, line_search_fn="strong_wolfe")
    state = {"evals": 0, "best": math.inf, "at": (start[0].clone(), start[1].clone()), "nonfinite": 0}

    def closure():
        opt.zero_grad()
        obj = (scaled_loss(d_r, d_c, problem, k) / (m * n) + lam * (d_r.square().sum() + d_c.square().sum())) / scale
        state["evals"] += 1
        value = obj.item()
        if not math.isfinite(value):
            state["nonfinite"] += 1
            return torch.tensor(math.inf, dtype=torch.float64)  # the line search backs off
        obj.backward()
        if value < state["best"]:
            state["best"], state["at"] = value, (d_r.detach().float().clone(), d_c.detach().float().clone())
        return obj

    t0 = time.perf_counter()
    try:
        opt.step(closure)
    except RuntimeError:  # a degenerate gap at the cut mid line search: keep the best point evaluated
        state["nonfinite"] += 1
    return state["at"], {"evals": state["evals"], "objective_best": state["best"] * scale,
                         "nonfinite": state["nonfinite"], "seconds": time.perf_counter() - t0}


def optimiser(name: str, weight: torch.Tensor, k: int, stats: Stats, seed: int, cfg: SigmaScaleConfig, *,
              alpha: float = 0.5, lrs: tuple[float, ...] = (2e-2,), max_evals: int = 400,
              paper: dict | None = None) -> dict:
    """The same diagonal family optimised harder on one map (module docstring). `paper`: this map's `stopping`
    record when already measured (its fixed-steps AdamW run is the paper's optimiser here)."""
    gram = stats.gram
    best = methods.svd_llm_loss(weight, k, gram)
    paper = paper or stopping(name, weight, k, stats, seed, cfg)
    rand = initial_scalings(weight, init="random", init_std=cfg.init_std, generator=keys.map_generator(name, seed))
    asvd = initial_scalings(weight, init="asvd", abs_mean=stats.abs_mean, alpha=alpha)
    rows = {"adam_paper": {"loss": paper["loss_fixed"], "seconds": paper["seconds"]},
            "asvd_step0": {"loss": loss_of(weight, k, gram, *asvd), "seconds": 0.0}}
    for label, start in (("random", rand), ("asvd", asvd)):
        at, info = lbfgs(weight, k, gram, start, lam=cfg.lam, max_evals=max_evals)
        rows[f"lbfgs_{label}"] = {"loss": loss_of(weight, k, gram, *at), **info}
        for lr in lrs if label == "random" else (cfg.lr, *lrs):
            run, seconds = _adam(weight, k, gram, start, cfg, lr=lr, stop="fixed")
            rows[f"adam_{label}_lr{lr:g}"] = {"loss": loss_of(weight, k, gram, run.d_r, run.d_c), "seconds": seconds}
    for row in rows.values():
        row["rel_svd_llm"] = row["loss"] / best
    floor = min(r["loss"] for r in rows.values())
    excess = paper["loss_fixed"] - best
    return {"loss_svd_llm": best, "runs": rows, "best_run": min(rows, key=lambda r: rows[r]["loss"]),
            "floor_rel_svd_llm": floor / best, "paper_rel_svd_llm": paper["loss_fixed"] / best,
            # of the paper optimiser's excess over SVD-LLM: the share another optimiser or start removed
            "optimiser_share": (paper["loss_fixed"] - floor) / excess if excess > 0 else 0.0}


def geo_mean(values) -> float | None:
    values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None
