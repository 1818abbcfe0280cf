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

With `optimizers.lr_last` every arm's LR is searched once more after its second hyperparameters (`retune_points`
LRs centred on the first choice, at the chosen second hyperparameters, the LR's extension rule): the LR chosen first
was chosen at the second hyperparameters' defaults, and a reference's curve must not have its budget-1 point tuned
less than the others (each retuned at its budget with every second hyperparameter as chosen).

The interior premise (`at_edge`) is the shared rule of scalelab.ledger.interior: a choice at an end of the values
tried is at an edge only where it beats its neighbour by more than the held-out seed spread, and a natural bound
(`BOUNDS`) is never an edge.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from scalelab.config import OptimizerConfig, Params
from scalelab.config.optbench import BOUNDED, OptBenchConfig
from scalelab.ledger.interior import edge
from scalelab.optim.registry import spec

SHORT = {"weight_decay": "wd", "warmup": "wu", "momentum": "mom", "beta1": "b1", "beta2": "b2",
         "embedding_lr_mult": "emb"}
Job = tuple[dict, int, float, int]  # (hyperparameters, seed, data budget, batch factor) of one run
# Natural bounds of the tuned hyperparameters: nothing lies below no decay or no warmup (a β or a momentum never
# reaches 1 on the protocol's steps, so theirs is never tried)
BOUNDS = {"weight_decay": (0.0,), "warmup": (0.0,)}


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


def _lr_search(ob: OptBenchConfig, grid: list[float], trial: Callable[[float], float],
               known: dict[float, float] | None = None) -> dict:
    """`known`: scores already measured at these settings (the centre of a final pass: not trained twice)."""
    known = known or {}
    scores = {lr: known[lr] if lr in known else trial(lr) for lr in grid}
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
    out = {**found, "best_hp": chosen if lr is not None else None, "best_score": _finite(top), "second": second}
    if ob.lr_last and lr is not None:  # the LR again at the chosen second hyperparameters (module doc)
        last = retune_lr(params, optimizer, chosen, trial, known={lr: top})
        out |= {"lr_first": found["best_lr"], "lr_last": last, "best_lr": last["best_lr"],
                "best_hp": last["best_hp"], "best_score": last["best_score"]}
    return out


def retune_lr(params: Params, optimizer: str, chosen: dict, trial: Callable[[dict], float],
              known: dict[float, float] | None = None) -> dict:
    """A reference's LR retuned at another data budget (step 3; `trial` trains at that budget), or any arm's LR
    searched again at its own budget after its second hyperparameters (`lr_last`): `retune_points` log-spaced LRs at
    lr_ratio centred on the LR `chosen` at the benchmark's own budget, extended past an edge by the LR's rule, every
    other hyperparameter as chosen there; `known`: {LR: score} already measured at these settings. `best_hp`: the
    choice (None: every LR diverged)."""
    ob = params.optimizers
    found = _lr_search(ob, ob.lr_grid(chosen["lr"], ob.retune_points), lambda lr: trial({**chosen, "lr": lr}), known)
    top = found.pop("_top")
    best = None if found["best_lr"] is None else normal(params, optimizer, {**chosen, "lr": found["best_lr"]})
    return {**found, "best_hp": best, "best_score": _finite(top)}


def rerun_jobs(ob: OptBenchConfig, optimizer: str, best: dict | None, budget_best: dict[float, dict | None],
               default: dict | None, lr_only: dict | None = None) -> list[Job]:
    """The held-out reruns (step 3) of the choice `best`: on every rerun seed; a reference (the baseline and each of
    `references`) also at every other data budget with the hyperparameters chosen there (`budget_best`: {budget:
    `retune_lr`'s best_hp}); the baseline also at its default recipe `default` and at `lr_only` (the first LR pass's
    choice, every other hyperparameter at its default: what tuning the LR alone gives, Wen et al.'s weak-baseline
    comparison) where each differs from the runs before it; and at batch_factor × the batch for the same tokens for
    each of `batch_optimizers` (and the baseline when there are any), at the LR chosen at 1x. Nothing chosen (every
    run diverged): no reruns."""
    if best is None:
        return []
    seeds = ob.rerun_seeds
    jobs = [(best, s, 1.0, 1) for s in seeds]
    if optimizer in ob.reference_arms:
        jobs += [(budget_best[b], s, b, 1) for b in ob.budgets if b != 1.0 and budget_best.get(b) for s in seeds]
    if optimizer == ob.baseline and default is not None and default != best:
        jobs += [(default, s, 1.0, 1) for s in seeds]
    if optimizer == ob.baseline and lr_only is not None and lr_only not in (best, default):
        jobs += [(lr_only, s, 1.0, 1) for s in seeds]
    if optimizer in ob.batch_optimizers or (optimizer == ob.baseline and ob.batch_optimizers):
        jobs += [(best, s, 1.0, ob.batch_factor) for s in seeds]
    return jobs


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _scores(values: list[float], scores: list[float | None] | None, best: float) -> dict[float, float]:
    """{value tried: score} (a diverged point: inf); a summary without scores (written before they were kept) gives
    its choice the only finite score, so the choice at an end is an edge whatever the tolerance."""
    if scores is None:
        return {v: (0.0 if v == best else math.inf) for v in values}
    return {v: math.inf if sc is None else sc for v, sc in zip(values, scores)}


def at_edge(sweep: dict, spread: float | Callable[[float], float] = 0.0) -> list[str]:
    """The tuned hyperparameters of a sweep summary (`tune`'s result) left at an edge of the values tried, by the
    interior rule of scalelab.ledger.interior: the LR (its last pass where `lr_last` ran one) after the extension (a
    diverged point past it is part of the grid and brackets it), each second hyperparameter after theirs, and a
    reference's LR retuned at another budget (`budget_tunes`, from its rerun cell: "lr@x<budget>"). `spread`: the
    held-out seed spread of the arm's loss (or budget -> spread), the tolerance within which an end that beats its
    neighbour is still interior; 0 and each of BOUNDS are natural bounds. A value the protocol did not move (a zero
    centre has no neighbours) is not at an edge. Nothing chosen (every run diverged) has no hyperparameters to be
    interior: ["nothing chosen"]."""
    if sweep.get("best_hp") is None:
        return ["nothing chosen"]
    tol = spread if callable(spread) else (lambda budget: spread)
    def edged(values: list[float], scores: list | None, best: float, spread: float, bounds=()) -> bool:
        # only the choice itself can be at an edge: a tie at an end that the choice did not take (a second
        # hyperparameter keeps its default unless a value beats it) is no edge
        return best in (min(values), max(values)) and edge(_scores(values, scores, best), spread, bounds) is not None

    lr = sweep.get("lr_last") or sweep
    out = ["lr"] if edged(lr["lr_grid"], lr.get("lr_scores"), lr["best_lr"], tol(1.0)) else []
    for hp, s in (sweep.get("second") or {}).items():
        if len(s["values"]) > 1 and edged(s["values"], s.get("scores"), s["best"], tol(1.0), BOUNDS.get(hp, ())):
            out.append(hp)
    for budget, t in sorted((sweep.get("budget_tunes") or {}).items(), key=lambda kv: float(kv[0])):
        if t.get("best_lr") is None:
            out.append(f"lr@x{budget} nothing chosen")
        elif edged(t["lr_grid"], t.get("lr_scores"), t["best_lr"], tol(float(budget))):
            out.append(f"lr@x{budget}")
    return out


Pin = dict  # a pinned arm's side group: {"lr", "weight_decay", "betas", "embedding_lr_mult"} of an AdamW reference


def pin_of(params: Params, reference: str, hp: dict) -> Pin:
    """The side-group hyperparameters an arm pinned to AdamW arm `reference` takes from its choice `hp`: its LR,
    weight decay, betas and embedding LR multiplier, each as chosen or at its default (all pinned, never mixed)."""
    c = lambda k: hp.get(k, centre(params, reference, k))  # noqa: E731
    return {"lr": hp["lr"], "weight_decay": c("weight_decay"), "betas": [c("beta1"), c("beta2")],
            "embedding_lr_mult": c("embedding_lr_mult")}


def side_lr(cfg: OptimizerConfig, lr: float, pinned: float | Pin | None = None) -> float:
    """The LR of the AdamW side group (scalelab.optim.registry: the scale vectors, and under a matrix family the
    embeddings and LM head too) of a benchmark run of `cfg` at LR `lr`: `pinned`'s where the arm pins it (an AdamW
    reference's tuned LR at that size, optimizers.pinned; a cell written before the pin held more than the LR
    records the LR alone); else `cfg.adamw_lr` moved by the same factor as the LR (lr / the centre `cfg.lr`: one LR
    knob per optimizer), or the run's LR itself where `adamw_lr` is unset (the registry's default)."""
    if pinned is not None:
        return pinned["lr"] if isinstance(pinned, dict) else pinned
    return cfg.adamw_lr * lr / cfg.lr if cfg.adamw_lr else lr


def side_settings(cfg: OptimizerConfig, hp: dict, pinned: float | Pin | None = None) -> dict:
    """The `optim` fields of a run of `cfg` at `hp` that set its AdamW side group: its LR always (`side_lr`); where
    the arm is pinned, also the reference's decay, betas and embedding LR multiplier (the group's hyperparameters
    all pinned); else the family's own decay and betas, as tuned (all the family's): nothing more to set."""
    out = {"adamw_lr": side_lr(cfg, hp["lr"], pinned)}
    if isinstance(pinned, dict):
        out |= {"adamw_weight_decay": pinned["weight_decay"], "adamw_betas": tuple(pinned["betas"]),
                "embedding_lr_mult": pinned["embedding_lr_mult"]}
    return out


def embedding_lr(cfg: OptimizerConfig, hp: dict, pinned: float | Pin | None = None) -> float:
    """The LR the token embedding and LM head train at in a run of `cfg` at hyperparameters `hp`: the side group's
    (`side_lr`) under a matrix family, else the family's own LR; × the embedding LR multiplier (hp's, else a pin's,
    else cfg's)."""
    matrix = spec(cfg.name).matrices_only
    own = side_lr(cfg, hp["lr"], pinned) if matrix else hp["lr"]
    mult = pinned["embedding_lr_mult"] if matrix and isinstance(pinned, dict) else cfg.embedding_lr_mult
    return own * hp.get("embedding_lr_mult", mult)
