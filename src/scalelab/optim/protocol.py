"""The optimizer benchmark's tuning protocol (steps 1-2 of scalelab.config.optbench), free of training: `tune` drives
a `trial(hp) -> score` callback (scalelab.train.optbench trains it over the sweep seeds), so the protocol's rules are
tested on synthetic losses. Also the runs' names, the hyperparameters' centres and neighbours, which tuned
hyperparameters a choice left at an edge of the values tried (`at_edge`), and the LR of a run's AdamW side group
(`side_lr`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from scalelab.config import OptimizerConfig, Params
from scalelab.config.optbench import BOUNDED

SHORT = {"weight_decay": "wd", "warmup": "wu", "momentum": "mom", "beta1": "b1", "beta2": "b2"}


def lr_key(lr: float) -> str:
    return f"{lr:.6g}"


def centre(params: Params, optimizer: str, hp: str) -> float:
    """The default (grid centre) of hyperparameter `hp` of `optimizer`."""
    cfg = params.optim[optimizer]
    if hp == "warmup":
        return params.optimizers.schedule.warmup
    if hp in ("beta1", "beta2"):
        return cfg.betas[hp == "beta2"]
    if hp.startswith("kwargs."):
        return cfg.kwargs[hp[7:]]
    return getattr(cfg, hp)


def neighbours(hp: str, value: float, ratio: float) -> list[float]:
    """The two values beside `value` at × ratio^±1 (momenta and betas: 1 − β moved by that factor, staying in (0, 1));
    integer library arguments stay integers. A zero value (no decay, no warmup) has no log neighbour: its others are
    left out (then the tuned value is the default)."""
    if hp in BOUNDED:
        out = [1 - (1 - value) * f for f in (ratio, 1 / ratio)]
        return [v for v in out if 0 < v < 1]
    if value == 0:
        return []
    out = [value / ratio, value * ratio]
    return [max(1, round(v)) for v in out] if isinstance(value, int) and not isinstance(value, bool) else out


def normal(params: Params, optimizer: str, hp: dict) -> dict:
    """`hp` without the second hyperparameters at their default (one run, one name, whichever path reached it)."""
    return {"lr": hp["lr"], **{k: v for k, v in sorted(hp.items()) if k != "lr" and v != centre(params, optimizer, k)}}


def run_name(hp: dict, seed: int, budget: float = 1.0, batch: int = 1) -> str:
    """Folder and metrics key of a run: lr<lr>[-<hp><value>…]-s<seed>[-x<budget>][-b<batch factor>]."""
    parts = [f"lr{lr_key(hp['lr'])}"] + [f"{SHORT.get(k, k.removeprefix('kwargs.'))}{lr_key(v)}"
                                          for k, v in hp.items() if k != "lr"]
    return ("-".join([*parts, f"s{seed}"]) + ("" if budget == 1.0 else f"-x{lr_key(budget)}")
            + ("" if batch == 1 else f"-b{batch}"))


def score(runs: list[dict]) -> float:
    """A trial's score: the mean final validation loss over its seeds; inf when any seed diverged."""
    if any(r["diverged"] or r["val_loss"] is None for r in runs):
        return math.inf
    return statistics.fmean(r["val_loss"] for r in runs)


def tune(params: Params, optimizer: str, trial: Callable[[dict], float]) -> dict:
    """Steps 1 and 2 of the protocol (scalelab.config.optbench) on `trial(hp) -> score over the sweep seeds`: the
    odd LR grid, its extension past an edge optimum (the same `max_extra` for every optimizer; a diverged new point
    brackets the optimum), then each second hyperparameter at × hp_ratio^±1 around its default, in turn."""
    ob = params.optimizers
    scores = {lr: trial({"lr": lr}) for lr in ob.lr_grid(params.optim[optimizer].lr)}

    def best() -> float | None:
        finite = [lr for lr in scores if math.isfinite(scores[lr])]
        return min(finite, key=scores.__getitem__) if finite else None

    extra = 0
    while (lr := best()) is not None and lr in (min(scores), max(scores)) and extra < ob.max_extra:
        nxt = lr * ob.lr_ratio if lr == max(scores) else lr / ob.lr_ratio
        scores[nxt], extra = trial({"lr": nxt}), extra + 1
    lr = best()
    chosen, top, second = {"lr": lr}, scores.get(lr), {}
    for hp in ob.second.get(optimizer, []) if lr is not None else []:
        values = {centre(params, optimizer, hp): top}
        values |= {v: trial({**chosen, hp: v}) for v in neighbours(hp, centre(params, optimizer, hp), ob.hp_ratio)}
        v = min(values, key=values.__getitem__)
        if values[v] < top:
            chosen[hp], top = v, values[v]
        second[hp] = {"values": sorted(values), "scores": [_finite(values[k]) for k in sorted(values)],
                      "best": chosen.get(hp, centre(params, optimizer, hp)),
                      "at_edge": v != centre(params, optimizer, hp)}
    return {"lr_grid": sorted(scores), "lr_scores": [_finite(scores[k]) for k in sorted(scores)],
            "extra_points": extra, "lr_at_edge": lr is not None and lr in (min(scores), max(scores)),
            "best_lr": lr, "best_hp": chosen if lr is not None else None, "best_score": _finite(top), "second": second}


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def at_edge(sweep: dict) -> list[str]:
    """The tuned hyperparameters of a sweep summary (`tune`'s result) whose chosen value is the smallest or largest
    of the values tried: the LR at an end of its grid after the extension (a diverged point past it is part of the
    grid and brackets it), each second hyperparameter at an end of its one pass (values × hp_ratio^±1). A value the
    protocol did not move (a zero centre has no neighbours) is not at an edge. An optimizer with nothing chosen
    (every run diverged) has no hyperparameters to be interior: ["nothing chosen"]."""
    if sweep.get("best_hp") is None:
        return ["nothing chosen"]
    grid = sorted(sweep["lr_grid"])
    out = ["lr"] if sweep["best_lr"] in (grid[0], grid[-1]) else []
    for hp, s in (sweep.get("second") or {}).items():
        values = sorted(s["values"])
        if len(values) > 1 and s["best"] in (values[0], values[-1]):
            out.append(hp)
    return out


def side_lr(cfg: OptimizerConfig, lr: float) -> float:
    """The LR of the AdamW side group (scalelab.optim.registry: the scale vectors, and under a matrix family the
    embeddings and LM head too) of a benchmark run of `cfg` at LR `lr`: `cfg.adamw_lr` moved by the same factor as
    the LR (lr / the centre `cfg.lr`: one LR knob per optimizer, scalelab.train.optbench.run_params), or the run's LR
    itself where `adamw_lr` is unset (the registry's default)."""
    return cfg.adamw_lr * lr / cfg.lr if cfg.adamw_lr else lr
