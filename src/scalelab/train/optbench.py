"""The optimizer benchmark's training runs (METHODS §B, the protocol of scalelab.config.optbench): a sweep cell and a
rerun cell per optimizer and model size, every run through the pretraining trainer (scalelab.train.fit) on a params
copy built on the fly.

A cell runs its runs one after another in one process: a process costs seconds of start-up (imports, DVC, MLflow)
against a few seconds per run at the default profile, so a cell per run would spend more on overhead than on
training. Each run keeps its own folder with fit's checkpoint and a `result.json` under its config hash: a rerun of a
cell reuses the finished runs and resumes an interrupted one from its checkpoint, with the optimizer state.

A run is named by its hyperparameters (`hp`: {"lr": …, and each second hyperparameter that differs from its default}),
seed and data budget (a fraction of the benchmark's steps, each with its own full schedule). Per run: final
validation loss (the end-of-run loss every comparison uses), the validation curve (a secondary plot only), median
step time, optimizer-state bytes per parameter and divergence: a non-finite loss or gradient (NonFiniteGuard's
FloatingPointError, caught here so the sweep goes on) or a final training loss above the first. Per cell, in the
sweep's process: the step-time ratio to the baseline and the optimizer step's own peak memory (hooks.step_peak_bytes).
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from scalelab.config import OptBenchConfig, Params, ParamsError, RecipeConfig
from scalelab.data import write_json_atomic
from scalelab.optim import OPTIMIZERS, hooks, spec
from scalelab.optim.protocol import normal, run_name, score, tune
from scalelab.train import Cell, config_hash, fit, resume_run_id

RECIPE = "optbench"  # the recipe and optim key of the run in its params copy
NON_FINITE, ABOVE_START = "non-finite", "loss above start"


def bench(params: Params) -> OptBenchConfig:
    """The section, with what it needs of `optim` checked before any compute: registered names, the centre of each
    second hyperparameter, and a GaLore projector refreshed within the run (its gap shorter than the run)."""
    if params.optimizers is None:
        raise ParamsError("params has no `optimizers` section (the optimizer benchmark, config/optbench.py)")
    ob = params.optimizers
    steps = bench_steps(params)
    for name in ob.optimizers:
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
    return ob


def bench_steps(params: Params) -> int:
    """The benchmark's own budget in steps (budget 1.0)."""
    return params.optimizers.max_steps or params.pretrain.total_steps()


def check_cell(params: Params, optimizer: str, size: str) -> OptBenchConfig:
    """The cell's names and its optimizer's registry name, checked before any compute."""
    ob = bench(params)
    ob.check_cell(optimizer, size)
    return ob


def run_params(params: Params, optimizer: str, hp: dict | float, budget: float = 1.0, batch: int = 1) -> Params:
    """`params` with recipe and optim entry RECIPE = `optim.<optimizer>` at the hyperparameters `hp` (a dict, or an
    LR alone), its AdamW side-group's lr scaled by the same factor as the LR (one LR knob per optimizer), for
    `budget` × the benchmark's tokens with its own full schedule, at `batch` × pretrain's batch (the same tokens in
    1/batch the steps), and the benchmark's overrides of `pretrain`.
    Schedule-Free optimizers keep the schedule's warmup and no decay: their averaging is the decay. AdEMAMix warms α
    and β3 up over the whole run (Pagliardini et al. 2024: T_α = T_β3 = the run's steps) unless its kwargs say."""
    ob, base = params.optimizers, params.optim[optimizer]
    hp = {"lr": hp} if isinstance(hp, (int, float)) else hp
    steps = max(1, round(bench_steps(params) * budget / batch))
    factor = hp["lr"] / base.lr
    update: dict = {"lr": hp["lr"], "adamw_lr": base.adamw_lr * factor if base.adamw_lr else None}
    kwargs = dict(base.kwargs)
    for k, v in hp.items():
        if k in ("beta1", "beta2"):
            betas = list(update.get("betas", base.betas))
            betas[k == "beta2"] = v
            update["betas"] = tuple(betas)
        elif k.startswith("kwargs."):
            kwargs[k[7:]] = v
        elif k in ("weight_decay", "momentum"):
            update[k] = v
    if base.name == "ademamix":
        kwargs.setdefault("t_alpha_beta3", steps)
    cfg = base.model_copy(update={**update, "kwargs": kwargs})
    schedule = ob.schedule.model_copy(update={"warmup": hp.get("warmup", ob.schedule.warmup)})
    if spec(base.name).schedule_free:
        schedule = schedule.model_copy(update={"name": "constant"})
    pre = params.pretrain
    pre_update = {
        "recipes": {**pre.recipes, RECIPE: RecipeConfig(optimizer=RECIPE, schedule=schedule)},
        "val_every": ob.val_every,
        "val_tokens": ob.val_tokens or pre.val_tokens,
        "sharpness": pre.sharpness.model_copy(update={"enabled": False}),  # §A's diagnostic, not this study's
        "max_steps": steps, "max_tokens": None, "batch_size": pre.batch_size * batch,
    }
    return params.model_copy(update={"optim": {**params.optim, RECIPE: cfg},
                                     "pretrain": pre.model_copy(update=pre_update)})


class Probe(Callback):
    """What the sweep needs beyond fit's metrics, kept in the checkpoint: the first training loss, the validation
    curve (also of a run that diverges, which writes no model folder) and the optimizer-state bytes."""

    def __init__(self, tokens_per_step: int) -> None:
        self.tokens_per_step = tokens_per_step
        self.start_loss: float | None = None
        self.curve: list[tuple[int, float]] = []  # (tokens, val loss)
        self.state_bytes = self.n_params = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        m = pl_module.step_metrics
        if self.start_loss is None:
            self.start_loss, self.n_params = m["train/loss"], pl_module.model.num_params()
        if "val/loss" in m:
            self.curve.append((pl_module.step * self.tokens_per_step, m["val/loss"]))
        self.state_bytes = hooks.state_bytes(trainer.optimizers)

    def state_dict(self) -> dict:
        return {"start_loss": self.start_loss, "curve": self.curve, "state_bytes": self.state_bytes,
                "n_params": self.n_params}

    def load_state_dict(self, state_dict: dict) -> None:
        self.start_loss, self.state_bytes = state_dict["start_loss"], state_dict["state_bytes"]
        self.n_params = state_dict["n_params"]
        self.curve = [tuple(r) for r in state_dict["curve"]]


def train_run(params: Params, optimizer: str, size: str, hp: dict | float, seed: int, out_dir: Path, shards: Path,
              stage: str | None, budget: float = 1.0, batch: int = 1) -> dict:
    """One run of the benchmark (fit on the params copy), or its earlier result under the same config hash.

    `stage` names its MLflow child run (None: no tracking)."""
    from scalelab import tracking

    hp = normal(params, optimizer, {"lr": hp} if isinstance(hp, (int, float)) else hp)
    sub = run_params(params, optimizer, hp, budget, batch)
    cell = Cell(variant=params.optimizers.variant, size=size, recipe=RECIPE, seed=seed)
    chash = config_hash(sub, cell, shards)
    done = out_dir / "result.json"
    if done.is_file() and (old := json.loads(done.read_text())).get("config_hash") == chash:
        return old
    pre = sub.pretrain
    probe = Probe(pre.batch_size * pre.seq_len)
    result = {"optimizer": optimizer, "size": size, "seed": seed, "lr": hp["lr"], "hp": hp, "budget": budget,
              "batch": batch, "config_hash": chash}
    logged = {"cell": {**result, "variant": cell.variant}, "optim": sub.optim[RECIPE].model_dump(mode="json"),
              "recipe": sub.pretrain.recipes[RECIPE].model_dump(mode="json")}

    def record(diverged: str | None, run_id: str | None) -> dict:
        result.update({"diverged": diverged, "start_loss": probe.start_loss, "state_bytes": probe.state_bytes,
                       "state_bytes_per_param": probe.state_bytes / probe.n_params if probe.n_params else None,
                       "curve": probe.curve, "mlflow_run_id": run_id})
        write_json_atomic(done, result)
        return result

    run = None
    track = contextlib.nullcontext() if stage is None else tracking.stage_run(
        stage, params=logged, experiment=params.tracking.experiment, deps=[str(shards / "meta.json")],
        run_id=resume_run_id(out_dir, chash))
    try:
        with track as run:  # result.json inside the run: FINISHED only once it is written (issue 21)
            metrics = fit(sub, cell, out_dir, shards, run, callbacks=[probe])
            diverged = None
            if metrics["val_loss"] is None or not math.isfinite(metrics["val_loss"]):
                diverged = NON_FINITE
            elif probe.start_loss is not None and metrics["train_loss"] >= probe.start_loss:
                diverged = ABOVE_START
            result |= {k: metrics[k] for k in ("val_loss", "train_loss", "steps", "tokens", "params", "step_time_s",
                                               "wall_s")}
            return record(diverged, run.run_id if run else None)
    except FloatingPointError as err:  # NonFiniteGuard: recorded, the sweep goes on (its MLflow run ends FAILED)
        result |= {"val_loss": None, "params": probe.n_params or None, "error": str(err).split(";")[0]}
        return record(NON_FINITE, run.run_id if run else None)


def train_step(model: torch.nn.Module, opts: list[torch.optim.Optimizer], x: torch.Tensor, y: torch.Tensor,
               seed: int) -> float:
    """One step of the optimizers' protocol in LitLM.training_step, without Lightning, accumulation or clipping:
    Schedule-Free's training iterate, forward, backward, Sophia's estimate when due, every optimizer's step."""
    hooks.train_weights(opts)
    loss = model(x, y).loss
    loss.backward()
    for opt in opts:
        if hooks.hessian_due(opt):
            opt.step(hessian=hooks.gnb_hessian(model, x, hooks.params_of(opt), seed=seed))
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
    return loss.item()


def _arms(params: Params, names: list[str], size: str, data, device: torch.device) -> list[tuple]:
    """(model, optimizers) per optimizer key: each its own copy of the same initial model (first sweep seed)."""
    from scalelab.model import Transformer
    from scalelab.optim import build_optimizers

    ob, pre = params.optimizers, params.pretrain
    arms = []
    for name in names:
        torch.manual_seed(ob.sweep_seeds[0])
        model = Transformer(params.resolve_model(size, ob.variant, data.vocab_size)).to(device)
        if pre.precision == "bf16-true":
            model = model.to(torch.bfloat16)
        arms.append((model, build_optimizers(model, params.optim[name], model.cfg.scale)))
    return arms


def _device(params: Params) -> torch.device:
    return torch.device("cuda") if params.pretrain.accelerator in ("gpu", "cuda") else torch.device("cpu")


def step_time_ratio(params: Params, optimizer: str, size: str, shards: Path) -> dict:
    """The optimizer's training step against the baseline's, timed in this process and interleaved step by step (one
    of each in turn, on the same batches, each on its own copy of the same model), so both see the same load: the
    median over pairs of their ratio, after two warm-up pairs. The pair's order alternates: the second step of a
    pair ran ~8% slower (AdamW timed against itself read 1.08-1.09). The bare step (no Lightning), whose work
    differs only in the update."""
    from scalelab.data import open_shards
    from scalelab.data.loader import train_batch

    ob, pre = params.optimizers, params.pretrain
    data, device = open_shards(shards), _device(params)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=pre.precision.startswith("bf16"))
    arms = [(*arm, []) for arm in _arms(params, [ob.baseline, optimizer], size, data, device)]
    for step in range(ob.timing_steps + 2):
        x, y = (t.to(device) for t in train_batch(data.train, seed=ob.sweep_seeds[0], step=step,
                                                  batch_size=pre.batch_size, seq_len=pre.seq_len))
        for model, opts, times in arms if step % 2 == 0 else arms[::-1]:
            sync()
            start = time.perf_counter()
            with autocast:
                train_step(model, opts, x, y, seed=step)
            sync()
            times.append(time.perf_counter() - start)
    base, mine = (times[2:] for _, _, times in arms)
    return {"timing_step_s": statistics.median(mine), "baseline_step_time_s": statistics.median(base),
            "step_time_ratio": statistics.median([m / b for m, b in zip(mine, base)])}


def step_memory(params: Params, optimizer: str, size: str, shards: Path) -> dict:
    """The optimizer step's own peak memory (hooks.step_peak_bytes): the first step of a fresh model and optimizer,
    after its forward and backward (and Sophia's Hessian estimate) so only the update is measured. The first step is
    the one that allocates the state, so the peak holds the state plus the step's temporaries; per parameter of the
    model (all optimizers of the run, the AdamW side included, as state_bytes_per_param)."""
    from scalelab.data import open_shards
    from scalelab.data.loader import train_batch

    ob, pre = params.optimizers, params.pretrain
    data, device = open_shards(shards), _device(params)
    (model, opts), = _arms(params, [optimizer], size, data, device)
    x, y = (t.to(device) for t in train_batch(data.train, seed=ob.sweep_seeds[0], step=0,
                                              batch_size=pre.batch_size, seq_len=pre.seq_len))
    hooks.train_weights(opts)
    model(x, y).loss.backward()
    hessians = {id(o): hooks.gnb_hessian(model, x, hooks.params_of(o), seed=0) for o in opts if hooks.hessian_due(o)}

    def step() -> None:
        for opt in opts:
            opt.step(hessian=hessians[id(opt)]) if id(opt) in hessians else opt.step()

    peak = hooks.step_peak_bytes(step, device)
    return {"step_peak_mb": peak / 2**20, "step_peak_bytes_per_param": peak / model.num_params()}


def _summary(params: Params, optimizer: str, size: str, runs: list[dict]) -> dict:
    cfg = params.optim[optimizer]
    family = spec(cfg.name)
    steps = [r["step_time_s"] for r in runs if r.get("step_time_s")]
    return {"optimizer": optimizer, "size": size, "name": cfg.name, "family": family.family,
            "library": family.library, "centre_lr": cfg.lr,
            "diverged": sum(bool(r["diverged"]) for r in runs), "n_runs": len(runs),
            "step_time_s": statistics.median(steps) if steps else None,
            "state_bytes_per_param": max((r["state_bytes_per_param"] or 0 for r in runs), default=None)}


def sweep_cell(params: Params, optimizer: str, size: str, out_dir: Path, shards: Path, stage: str | None) -> dict:
    """The protocol's choice for `optimizer` at `size` (`tune`, every trial over the sweep seeds), then its step time
    against the baseline's and its step's peak memory, each in this process."""
    ob = check_cell(params, optimizer, size)
    runs: list[dict] = []

    def trial(hp: dict) -> float:
        hp = normal(params, optimizer, hp)
        mine = [train_run(params, optimizer, size, hp, s, out_dir / run_name(hp, s), shards,
                          stage and f"{stage} {run_name(hp, s)}") for s in ob.sweep_seeds]
        runs.extend(mine)
        return score(mine)

    chosen = tune(params, optimizer, trial)
    return {**_summary(params, optimizer, size, runs), "sweep_seeds": ob.sweep_seeds, **chosen,
            **step_time_ratio(params, optimizer, size, shards), **step_memory(params, optimizer, size, shards),
            "runs": runs}


def seeds_cell(params: Params, optimizer: str, size: str, sweep: dict, out_dir: Path, shards: Path,
               stage: str | None) -> dict:
    """`sweep`: the sweep cell's metrics (`cell_metrics`). Its chosen configuration rerun with `rerun_seeds`; for the
    baseline also at every other data budget (the speed-up's reference curve) and at its default recipe (tuned vs
    default), and the large-batch reruns of `batch_optimizers` (and of the baseline when there are any). Nothing
    chosen (every run diverged): no reruns."""
    ob = check_cell(params, optimizer, size)
    best = sweep["best_hp"]
    jobs = [(best, s, 1.0, 1) for s in ob.rerun_seeds] if best is not None else []
    if optimizer == ob.baseline and best is not None:
        jobs += [(best, s, b, 1) for b in ob.budgets if b != 1.0 for s in ob.rerun_seeds]
        default = normal(params, optimizer, {"lr": params.optim[optimizer].lr})
        if default != normal(params, optimizer, best):
            jobs += [(default, s, 1.0, 1) for s in ob.rerun_seeds]
    if best is not None and (optimizer in ob.batch_optimizers or (optimizer == ob.baseline and ob.batch_optimizers)):
        jobs += [(best, s, 1.0, ob.batch_factor) for s in ob.rerun_seeds]
    runs = []
    for hp, s, b, k in jobs:
        hp = normal(params, optimizer, hp)
        runs.append(train_run(params, optimizer, size, hp, s, out_dir / run_name(hp, s, b, k), shards,
                              stage and f"{stage} {run_name(hp, s, b, k)}", budget=b, batch=k))
    return {"optimizer": optimizer, "size": size, "best_lr": sweep["best_lr"], "best_hp": best, "runs": runs}


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
