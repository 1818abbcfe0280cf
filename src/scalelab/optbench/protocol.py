"""The optimizer benchmark's tuning protocol (steps 1-3 of scalelab.config.optbench), free of training: `tune` and
`retune_lr` drive a `trial(hp) -> score` callback (scalelab.optbench.sweep trains it over the sweep seeds), so the
protocol's rules are tested on synthetic losses; `rerun_jobs` is the policy of the held-out reruns. Also the runs'
names, the hyperparameters' centres and neighbours, which tuned hyperparameters a choice left at an edge of the
values tried (`at_edge`), and the LRs a run's AdamW side group and its embeddings train at (`side_lr`,
`embedding_lr`).

One extension rule for every tuned hyperparameter (`_extend`): a best value at an end of the values tried adds one
point past it, at the hyperparameter's own step (the LR: × lr_ratio; a second hyperparameter: × hp_ratio, 1 − β for
betas and momenta), until the best is interior, the new point diverged on every sweep seed (it brackets the best), or
the allowance is spent (`max_extra` for the LR, `max_extra_second` for each second hyperparameter).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from scalelab.config import OptimizerConfig, Params
from scalelab.config.optbench import BOUNDED, OptBenchConfig
from scalelab.optim.registry import spec

SHORT = {"weight_decay": "wd", "warmup": "wu", "momentum": "mom", "beta1": "b1", "beta2": "b2",
         "embedding_lr_mult": "emb"}
Job = tuple[dict, int, float, int]  # (hyperparameters, seed, data budget, batch factor) of one run


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


def step(hp: str, value: float, ratio: float, direction: int) -> float | None:
    """`value` moved one step up (direction +1) or down (−1): × ratio (betas and momenta: 1 − β ÷ ratio going up, so
    they stay in (0, 1)); integer library arguments stay integers. None where there is no such value (a zero has no
    log neighbour, a β would leave (0, 1), an integer would not move)."""
    if hp in BOUNDED:
        out = 1 - (1 - value) * ratio ** -direction
        return out if 0 < out < 1 else None
    if value == 0:
        return None
    out = value * ratio ** direction
    if isinstance(value, int) and not isinstance(value, bool):
        out = max(1, round(out))
        return None if out == value else out
    return out


def neighbours(hp: str, value: float, ratio: float) -> list[float]:
    """The two values beside `value` at × ratio^±1 (momenta and betas: 1 − β moved by that factor, staying in (0, 1));
    integer library arguments stay integers. A zero value (no decay, no warmup) has no log neighbour: its others are
    left out (then the tuned value is the default)."""
    return [v for v in (step(hp, value, ratio, -1), step(hp, value, ratio, +1)) if v is not None]


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


def _best(scores: dict[float, float]) -> float | None:
    finite = [v for v in scores if math.isfinite(scores[v])]
    return min(finite, key=scores.__getitem__) if finite else None


def _extend(scores: dict[float, float], trial: Callable[[float], float], nxt: Callable[[float, int], float | None],
            max_extra: int) -> int:
    """The extension rule (module doc) on `scores` {value: score}, in place; returns the points it added."""
    extra = 0
    while extra < max_extra and len(scores) > 1 and (v := _best(scores)) is not None and v in (min(scores),
                                                                                                 max(scores)):
        new = nxt(v, +1 if v == max(scores) else -1)
        if new is None or new in scores:
            break
        scores[new], extra = trial(new), extra + 1
    return extra


def _lr_search(ob: OptBenchConfig, grid: list[float], trial: Callable[[float], float]) -> dict:
    scores = {lr: trial(lr) for lr in grid}
    extra = _extend(scores, trial, lambda lr, d: lr * ob.lr_ratio ** d, ob.max_extra)
    lr = _best(scores)
    return {"lr_grid": sorted(scores), "lr_scores": [_finite(scores[k]) for k in sorted(scores)],
            "extra_points": extra, "lr_at_edge": lr is not None and lr in (min(scores), max(scores)),
            "best_lr": lr, "_top": scores.get(lr)}


def tune(params: Params, optimizer: str, trial: Callable[[dict], float]) -> dict:
    """Steps 1 and 2 of the protocol (scalelab.config.optbench) on `trial(hp) -> score over the sweep seeds`: the
    odd LR grid and its extension past an edge optimum (the same `max_extra` for every optimizer), then each second
    hyperparameter in turn at × hp_ratio^±1 around its default, extended past an edge by the same rule
    (`max_extra_second` points each)."""
    ob = params.optimizers
    found = _lr_search(ob, ob.lr_grid(params.optim[optimizer].lr), lambda lr: trial({"lr": lr}))
    lr, top = found["best_lr"], found.pop("_top")
    chosen, second = {"lr": lr}, {}
    for hp in ob.second.get(optimizer, []) if lr is not None else []:
        c = centre(params, optimizer, hp)
        values = {c: top}
        values |= {v: trial({**chosen, hp: v}) for v in neighbours(hp, c, ob.hp_ratio)}
        extra = _extend(values, lambda v: trial({**chosen, hp: v}), lambda v, d: step(hp, v, ob.hp_ratio, d),
                        ob.max_extra_second)
        v = min(values, key=values.__getitem__)
        if values[v] < top:
            chosen[hp], top = v, values[v]
        best = chosen.get(hp, c)
        second[hp] = {"values": sorted(values), "scores": [_finite(values[k]) for k in sorted(values)],
                      "best": best, "at_edge": len(values) > 1 and best in (min(values), max(values)),
                      "extra_points": extra}
    return {**found, "best_hp": chosen if lr is not None else None, "best_score": _finite(top), "second": second}


def retune_lr(params: Params, optimizer: str, chosen: dict, trial: Callable[[dict], float]) -> dict:
    """A reference's LR retuned at another data budget (step 3; `trial` trains at that budget): `retune_points`
    log-spaced LRs at lr_ratio centred on the LR `chosen` at the benchmark's own budget, extended past an edge by the
    LR's rule, every other hyperparameter as chosen there. `best_hp`: the choice at that budget (None: every LR
    diverged)."""
    ob = params.optimizers
    found = _lr_search(ob, ob.lr_grid(chosen["lr"], ob.retune_points), lambda lr: trial({**chosen, "lr": lr}))
    top = found.pop("_top")
    best = None if found["best_lr"] is None else normal(params, optimizer, {**chosen, "lr": found["best_lr"]})
    return {**found, "best_hp": best, "best_score": _finite(top)}


def rerun_jobs(ob: OptBenchConfig, optimizer: str, best: dict | None, budget_best: dict[float, dict | None],
               default: dict | None) -> list[Job]:
    """The held-out reruns (step 3) of the choice `best`: on every rerun seed; a reference (the baseline and each of
    `references`) also at every other data budget with the hyperparameters chosen there (`budget_best`: {budget:
    `retune_lr`'s best_hp}); the baseline also at its default recipe `default` where that differs from the choice; and
    at batch_factor × the batch for the same tokens for each of `batch_optimizers` (and the baseline when there are
    any), at the LR chosen at 1x. Nothing chosen (every run diverged): no reruns."""
    if best is None:
        return []
    seeds = ob.rerun_seeds
    jobs = [(best, s, 1.0, 1) for s in seeds]
    if optimizer in ob.reference_arms:
        jobs += [(budget_best[b], s, b, 1) for b in ob.budgets if b != 1.0 and budget_best.get(b) for s in seeds]
    if optimizer == ob.baseline and default is not None and default != best:
        jobs += [(default, s, 1.0, 1) for s in seeds]
    if optimizer in ob.batch_optimizers or (optimizer == ob.baseline and ob.batch_optimizers):
        jobs += [(best, s, 1.0, ob.batch_factor) for s in seeds]
    return jobs


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def at_edge(sweep: dict) -> list[str]:
    """The tuned hyperparameters of a sweep summary (`tune`'s result) whose chosen value is the smallest or largest
    of the values tried: the LR at an end of its grid after the extension (a diverged point past it is part of the
    grid and brackets it), each second hyperparameter at an end of its values after theirs, and a reference's LR
    retuned at another budget (`budget_tunes`, from its rerun cell) at an end of that grid ("lr@x<budget>"). A value
    the protocol did not move (a zero centre has no neighbours) is not at an edge. Nothing chosen (every run
    diverged) has no hyperparameters to be interior: ["nothing chosen"]."""
    if sweep.get("best_hp") is None:
        return ["nothing chosen"]
    grid = sorted(sweep["lr_grid"])
    out = ["lr"] if sweep["best_lr"] in (grid[0], grid[-1]) else []
    for hp, s in (sweep.get("second") or {}).items():
        values = sorted(s["values"])
        if len(values) > 1 and s["best"] in (values[0], values[-1]):
            out.append(hp)
    for budget, t in sorted((sweep.get("budget_tunes") or {}).items(), key=lambda kv: float(kv[0])):
        grid = sorted(t["lr_grid"])
        if t.get("best_lr") is None:
            out.append(f"lr@x{budget} nothing chosen")
        elif t["best_lr"] in (grid[0], grid[-1]):
            out.append(f"lr@x{budget}")
    return out


def side_lr(cfg: OptimizerConfig, lr: float, pinned: float | None = None) -> float:
    """The LR of the AdamW side group (scalelab.optim.registry: the scale vectors, and under a matrix family the
    embeddings and LM head too) of a benchmark run of `cfg` at LR `lr`: `pinned` where the arm pins it (the
    baseline's tuned LR at that size, optimizers.pinned); else `cfg.adamw_lr` moved by the same factor as the LR
    (lr / the centre `cfg.lr`: one LR knob per optimizer), or the run's LR itself where `adamw_lr` is unset (the
    registry's default)."""
    if pinned is not None:
        return pinned
    return cfg.adamw_lr * lr / cfg.lr if cfg.adamw_lr else lr


def embedding_lr(cfg: OptimizerConfig, hp: dict, pinned: float | None = None) -> float:
    """The LR the token embedding and LM head train at in a run of `cfg` at hyperparameters `hp`: the side group's
    (`side_lr`) under a matrix family, else the family's own LR; × the embedding LR multiplier (hp's, else cfg's)."""
    own = side_lr(cfg, hp["lr"], pinned) if spec(cfg.name).matrices_only else hp["lr"]
    return own * hp.get("embedding_lr_mult", cfg.embedding_lr_mult)
