"""The optimizer benchmark's cells (docs/optimizers.md; the protocol of scalelab.config.optbench, its rules in
scalelab.optbench.protocol): a sweep cell and a rerun cell per optimizer and model size, every run through the
pretraining trainer (scalelab.optbench.runs) on a params copy built on the fly.

A cell runs its runs one after another in one process: a process costs seconds of start-up (imports, DVC, MLflow)
against a few seconds per run at the default profile, so a cell per run would spend more on overhead than on
training. Each run keeps its own folder with fit's checkpoint and a `result.json` under its config hash: a rerun of a
cell reuses the finished runs and resumes an interrupted one from its checkpoint, with the optimizer state.

Per cell, in the sweep's process: the step-time ratio to the baseline and the optimizer step's own peak memory
(scalelab.optbench.timing). A pinned arm's sweep takes its reference's sweep at that size (the baseline's, or the
one `optimizers.pin_to` names): its tuned LR, decay, betas and embedding LR multiplier are the arm's side group's; a
reference's rerun cell retunes its LR at every other data budget first.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from scalelab.config import OptBenchConfig, Params, ParamsError
from scalelab.optim import OPTIMIZERS, spec
from scalelab.optbench.protocol import Pin, lr_key, normal, pin_of, rerun_jobs, retune_lr, run_name, score, tune
from scalelab.optbench.runs import RECIPE, bench_steps, run_params, train_run  # noqa: F401  (the cells' API)
from scalelab.optbench.timing import step_memory, step_time_ratio, train_step  # noqa: F401


def bench(params: Params) -> OptBenchConfig:
    """The section, with what it needs of `optim` checked before any compute: registered names, the centre of each
    second hyperparameter, a GaLore projector refreshed within the run (its gap shorter than the run), and pinned
    arms that are matrix families (the only ones whose embeddings train on the side group)."""
    if params.optimizers is None:
        raise ParamsError("params has no `optimizers` section (the optimizer benchmark, config/optbench.py)")
    ob = params.optimizers
    steps = bench_steps(params)
    if bad := sorted(set(ob.pinned) - set(params.optim)):
        raise ParamsError(f"optimizers.pinned: unknown {bad}; known: {sorted(params.optim)}")
    for name in ob.arms:
        cfg = params.optim[name]
        if cfg.name not in OPTIMIZERS:
            raise ParamsError(f"optim.{name}.name: unknown optimizer {cfg.name!r}; registered: {sorted(OPTIMIZERS)}")
        for hp in ob.second.get(name, []):
            if hp.startswith("kwargs.") and hp[7:] not in cfg.kwargs:
                raise ParamsError(f"optimizers.second.{name}: {hp!r} needs optim.{name}.kwargs.{hp[7:]} (its centre)")
        gap = cfg.kwargs.get("update_proj_gap")
        if cfg.name == "galore" and (gap is None or gap >= steps):
            raise ParamsError(f"optim.{name}.kwargs.update_proj_gap {gap}: must be set below the run's {steps} steps "
                              "(else GaLore's projector is never refreshed)")
        if name in ob.pinned and not spec(cfg.name).matrices_only:
            raise ParamsError(f"optimizers.pinned: {name} ({cfg.name}) trains its embeddings itself: nothing to pin "
                              "(only matrix families leave them to the AdamW side group)")
    return ob


def check_cell(params: Params, optimizer: str, size: str) -> OptBenchConfig:
    """The cell's names and its optimizer's registry name, checked before any compute."""
    ob = bench(params)
    ob.check_cell(optimizer, size)
    return ob


def pinned_lr(params: Params, optimizer: str, baseline: dict | None) -> Pin | None:
    """The side group of a pinned arm (protocol.pin_of: LR, decay, betas, embedding LR multiplier): what its
    reference (`optimizers.pin_to`, default the baseline) chose at the cell's size, from that reference's sweep
    metrics `baseline` (None for an arm that is not pinned)."""
    ref = params.optimizers.pinned_to(optimizer)
    if ref is None:
        return None
    if baseline is None:
        raise ParamsError(f"{optimizer} is pinned (optimizers.pinned): its sweep needs the {ref} sweep's metrics "
                          "(the baseline's sweep or its reference's)")
    if baseline.get("best_lr") is None or baseline.get("best_hp") is None:
        raise ParamsError(f"{optimizer} is pinned to {ref}'s tuned side-group hyperparameters, and {ref}'s sweep "
                          "chose none (every run diverged)")
    return pin_of(params, ref, baseline["best_hp"])


def _summary(params: Params, optimizer: str, size: str, runs: list[dict]) -> dict:
    cfg = params.optim[optimizer]
    family = spec(cfg.name)
    steps = [r["step_time_s"] for r in runs if r.get("step_time_s")]
    return {"optimizer": optimizer, "size": size, "name": cfg.name, "family": family.family,
            "library": family.library, "centre_lr": cfg.lr,
            "diverged": sum(bool(r["diverged"]) for r in runs), "n_runs": len(runs),
            "step_time_s": statistics.median(steps) if steps else None,
            "state_bytes_per_param": max((r["state_bytes_per_param"] or 0 for r in runs), default=None)}


def sweep_cell(params: Params, optimizer: str, size: str, out_dir: Path, shards: Path, stage: str | None,
               baseline: dict | None = None) -> dict:
    """The protocol's choice for `optimizer` at `size` (`tune`, every trial over the sweep seeds), then its step time
    against the baseline's and its step's peak memory, each in this process. `baseline`: the baseline's sweep
    metrics at `size` (of the reference the arm is pinned to), which a pinned arm needs (its side group)."""
    ob = check_cell(params, optimizer, size)
    pin = pinned_lr(params, optimizer, baseline)
    runs: list[dict] = []

    def trial(hp: dict) -> float:
        hp = normal(params, optimizer, hp)
        mine = [train_run(params, optimizer, size, hp, s, out_dir / run_name(hp, s), shards,
                          stage and f"{stage} {run_name(hp, s)}", pinned_lr=pin) for s in ob.sweep_seeds]
        runs.extend(mine)
        return score(mine)

    chosen = tune(params, optimizer, trial)
    at = chosen["best_hp"] or None
    pinned = {"pinned_lr": pin["lr"], "pinned_side": pin, "pinned_to": ob.pinned_to(optimizer)} if pin else {}
    return {**_summary(params, optimizer, size, runs), "sweep_seeds": ob.sweep_seeds, **pinned, **chosen,
            **step_time_ratio(params, optimizer, size, shards, at, pin),
            **step_memory(params, optimizer, size, shards, at, pin), "runs": runs}


def seeds_cell(params: Params, optimizer: str, size: str, sweep: dict, out_dir: Path, shards: Path,
               stage: str | None) -> dict:
    """`sweep`: the sweep cell's metrics (`cell_metrics`). A reference (the baseline, each of `references`) first
    retunes its LR at every other data budget on the sweep seeds (`retune_lr`); then the held-out reruns of
    `rerun_jobs`: the choice on `rerun_seeds`, a reference's at every budget with the LR chosen there, the baseline's
    default recipe, the large-batch reruns. Nothing chosen (every run diverged): no runs."""
    ob = check_cell(params, optimizer, size)
    best, pin = sweep["best_hp"], sweep.get("pinned_side") or sweep.get("pinned_lr")
    runs: list[dict] = []

    def run(hp: dict, seed: int, budget: float, batch: int = 1) -> dict:
        hp = normal(params, optimizer, hp)
        name = run_name(hp, seed, budget, batch)
        r = train_run(params, optimizer, size, hp, seed, out_dir / name, shards, stage and f"{stage} {name}",
                      budget=budget, batch=batch, pinned_lr=pin)
        runs.append(r)
        return r

    tunes = {}
    if best is not None and optimizer in ob.reference_arms:
        for b in [b for b in ob.budgets if b != 1.0]:
            tunes[b] = retune_lr(params, optimizer, best, lambda hp: score([run(hp, s, b) for s in ob.sweep_seeds]))
    default = normal(params, optimizer, {"lr": params.optim[optimizer].lr})
    # the LR alone tuned: the first pass's choice (before the second hyperparameters), the rest at their defaults
    first = sweep.get("lr_first", sweep["best_lr"])
    lr_only = None if first is None else normal(params, optimizer, {"lr": first})
    for hp, s, b, k in rerun_jobs(ob, optimizer, best and normal(params, optimizer, best),
                                  {b: t["best_hp"] for b, t in tunes.items()}, default, lr_only):
        run(hp, s, b, k)
    return {"optimizer": optimizer, "size": size, "best_lr": sweep["best_lr"], "best_hp": best,
            **({k: sweep[k] for k in ("pinned_lr", "pinned_side", "pinned_to") if k in sweep}),
            **({"budget_tunes": {lr_key(b): t for b, t in tunes.items()}} if tunes else {}), "runs": runs}


CURVE_COLUMNS = ("optimizer", "size", "seed", "lr", "budget", "batch", "run", "tokens", "val_loss")


def _name(r: dict) -> str:
    return run_name(r["hp"], r["seed"], r["budget"], r["batch"])


def curve_rows(runs: list[dict]) -> list[tuple]:
    return [(r["optimizer"], r["size"], r["seed"], r["lr"], r["budget"], r["batch"], _name(r), t, v)
            for r in runs for t, v in r["curve"]]


def cell_metrics(cell: dict) -> dict:
    """The cell's JSON for DVC metrics: its summary and each run without its curve (the curves go to the CSV)."""
    return {**{k: v for k, v in cell.items() if k != "runs"},
            "runs": {_name(r): {k: v for k, v in r.items() if k != "curve"} for r in cell["runs"]}}
