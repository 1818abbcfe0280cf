"""The optimizer benchmark's training runs (METHODS §B): an LR sweep cell and a seed-rerun cell per optimizer and
model size, every run through the pretraining trainer (scalelab.train.fit) on a params copy built on the fly.

A cell runs its runs one after another in one process: a process costs seconds of start-up (imports, DVC, MLflow)
against a few seconds per run at the default profile, so a cell per run would spend more on overhead than on
training (the stage's docstring has the measurement). Each run keeps its own folder with fit's checkpoint and a
`result.json` under its config hash: a rerun of a cell reuses the finished runs and resumes an interrupted one from
its checkpoint, with the optimizer state (fit's resume).

Per run: final validation loss, the validation curve (tokens at which it reaches a target: the leaderboard's speed-up
in data), median step time, optimizer-state bytes per parameter read from the state tensors, peak memory (RSS high
water mark on CPU, reset per run; max_memory_allocated on GPU) and divergence: a non-finite loss or gradient
(NonFiniteGuard's FloatingPointError, caught here so the sweep goes on) or a final training loss above the first.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import statistics
import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from scalelab.config import OptBenchConfig, Params, ParamsError, RecipeConfig
from scalelab.data import write_json_atomic
from scalelab.optim import OPTIMIZERS, hooks, spec
from scalelab.train import Cell, config_hash, fit, resume_run_id

RECIPE = "optbench"  # the recipe and optim key of the run in its params copy
NON_FINITE, ABOVE_START = "non-finite", "loss above start"


def bench(params: Params) -> OptBenchConfig:
    if params.optimizers is None:
        raise ParamsError("params has no `optimizers` section (the optimizer benchmark, config/optbench.py)")
    for name in params.optimizers.optimizers:
        spec_name = params.optim[name].name
        if spec_name not in OPTIMIZERS:
            raise ParamsError(f"optim.{name}.name: unknown optimizer {spec_name!r}; registered: {sorted(OPTIMIZERS)}")
    return params.optimizers


def check_cell(params: Params, optimizer: str, size: str) -> OptBenchConfig:
    """The cell's names and its optimizer's registry name, checked before any compute."""
    ob = bench(params)
    ob.check_cell(optimizer, size)
    return ob


def lr_key(lr: float) -> str:
    return f"{lr:.6g}"


def run_params(params: Params, optimizer: str, lr: float) -> Params:
    """`params` with recipe and optim entry RECIPE = `optim.<optimizer>` at `lr` (its AdamW side-group's lr scaled by
    the same factor: one LR knob per optimizer), and the benchmark's overrides of `pretrain`. Schedule-Free optimizers
    keep the schedule's warmup and no decay: their averaging is the decay."""
    ob, base = params.optimizers, params.optim[optimizer]
    factor = lr / base.lr
    cfg = base.model_copy(update={"lr": lr, "adamw_lr": base.adamw_lr * factor if base.adamw_lr else None})
    schedule = ob.schedule.model_copy(update={"name": "constant"}) if spec(base.name).schedule_free else ob.schedule
    pre = params.pretrain
    steps = ob.max_steps
    update = {
        "recipes": {**pre.recipes, RECIPE: RecipeConfig(optimizer=RECIPE, schedule=schedule)},
        "val_every": ob.val_every,
        "val_tokens": ob.val_tokens or pre.val_tokens,
        "sharpness": pre.sharpness.model_copy(update={"enabled": False}),  # §A's diagnostic, not this study's
        **({"max_steps": steps, "max_tokens": None} if steps else {}),
    }
    return params.model_copy(update={"optim": {**params.optim, RECIPE: cfg}, "pretrain": pre.model_copy(update=update)})


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


def _reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        try:  # Linux: "5" resets this process's RSS high-water mark (VmHWM), so each run gets its own peak
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass


def _peak_memory_mb(device: torch.device) -> float | None:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024
    except (OSError, AttributeError):
        return None


def train_run(params: Params, optimizer: str, size: str, lr: float, seed: int, out_dir: Path, shards: Path,
              stage: str | None) -> dict:
    """One run of the benchmark (fit on the params copy), or its earlier result under the same config hash.

    `stage` names its MLflow child run (None: no tracking)."""
    from scalelab import tracking

    sub = run_params(params, optimizer, lr)
    cell = Cell(variant=params.optimizers.variant, size=size, recipe=RECIPE, seed=seed)
    chash = config_hash(sub, cell, shards)
    done = out_dir / "result.json"
    if done.is_file() and (old := json.loads(done.read_text())).get("config_hash") == chash:
        return old
    pre = sub.pretrain
    device = torch.device("cuda") if pre.accelerator in ("gpu", "cuda") else torch.device("cpu")
    probe = Probe(pre.batch_size * pre.seq_len)
    result = {"optimizer": optimizer, "size": size, "seed": seed, "lr": lr, "config_hash": chash}
    _reset_peak_memory(device)
    logged = {"cell": {**result, "variant": cell.variant}, "optim": sub.optim[RECIPE].model_dump(mode="json"),
              "recipe": sub.pretrain.recipes[RECIPE].model_dump(mode="json")}

    def record(diverged: str | None, run_id: str | None) -> dict:
        result.update({"diverged": diverged, "start_loss": probe.start_loss, "state_bytes": probe.state_bytes,
                       "state_bytes_per_param": probe.state_bytes / probe.n_params if probe.n_params else None,
                       "peak_mem_mb": _peak_memory_mb(device), "curve": probe.curve, "mlflow_run_id": run_id})
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


def step_time_ratio(params: Params, optimizer: str, size: str, shards: Path) -> dict:
    """The optimizer's training step against the baseline's, timed in this process and interleaved step by step (one
    of each in turn, on the same batches, each on its own copy of the same model), so both see the same load: the
    median over pairs of their ratio, after two warm-up pairs. The pair's order alternates: the second step of a
    pair ran ~8% slower (AdamW timed against itself read 1.08-1.09). The bare step (no Lightning), whose work
    differs only in the update."""
    from scalelab.data import open_shards
    from scalelab.data.loader import train_batch
    from scalelab.model import Transformer
    from scalelab.optim import build_optimizers

    ob, pre = params.optimizers, params.pretrain
    data = open_shards(shards)
    device = torch.device("cuda") if pre.accelerator in ("gpu", "cuda") else torch.device("cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=pre.precision.startswith("bf16"))
    arms = []
    for name in (ob.baseline, optimizer):
        torch.manual_seed(ob.seed)
        model = Transformer(params.resolve_model(size, ob.variant, data.vocab_size)).to(device)
        if pre.precision == "bf16-true":
            model = model.to(torch.bfloat16)
        arms.append((model, build_optimizers(model, params.optim[name], model.cfg.scale), []))
    for step in range(ob.timing_steps + 2):
        x, y = (t.to(device) for t in train_batch(data.train, seed=ob.seed, step=step, batch_size=pre.batch_size,
                                                  seq_len=pre.seq_len))
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


def _best(runs: list[dict]) -> dict | None:
    ok = [r for r in runs if not r["diverged"]]
    return min(ok, key=lambda r: r["val_loss"]) if ok else None


def _summary(params: Params, optimizer: str, size: str, runs: list[dict]) -> dict:
    cfg = params.optim[optimizer]
    family = spec(cfg.name)
    steps = [r["step_time_s"] for r in runs if r.get("step_time_s")]
    return {"optimizer": optimizer, "size": size, "name": cfg.name, "family": family.family,
            "library": family.library, "centre_lr": cfg.lr,
            "diverged": sum(bool(r["diverged"]) for r in runs), "n_runs": len(runs),
            "step_time_s": statistics.median(steps) if steps else None,
            "state_bytes_per_param": max((r["state_bytes_per_param"] or 0 for r in runs), default=None),
            "peak_mem_mb": max((r["peak_mem_mb"] for r in runs if r["peak_mem_mb"]), default=None)}


def sweep_cell(params: Params, optimizer: str, size: str, out_dir: Path, shards: Path, stage: str) -> dict:
    """The LR grid of `optimizer` at `size` (sweep seed), then its step time against the baseline's, interleaved
    in this process (`step_time_ratio`)."""
    ob = check_cell(params, optimizer, size)
    grid = ob.lr_grid(params.optim[optimizer].lr)
    runs = [train_run(params, optimizer, size, lr, ob.seed, out_dir / f"lr{lr_key(lr)}-s{ob.seed}", shards,
                      f"{stage} lr={lr_key(lr)} seed={ob.seed}") for lr in grid]
    best = _best(runs)
    return {**_summary(params, optimizer, size, runs), "seed": ob.seed, "lr_grid": grid,
            "best_lr": best["lr"] if best else None, "best_val_loss": best["val_loss"] if best else None,
            **step_time_ratio(params, optimizer, size, shards), "runs": runs}


def seeds_cell(params: Params, optimizer: str, size: str, sweep: dict, out_dir: Path, shards: Path,
               stage: str) -> dict:
    """`sweep`: the sweep cell's metrics (`cell_metrics`). The sweep's best LR rerun with `rerun_seeds`; for the baseline also its centre LR (the default recipe) at
    every seed where the sweep has none, for the "tuned vs default" comparison. No best LR (every run diverged): no
    reruns."""
    ob = check_cell(params, optimizer, size)
    jobs = [(sweep["best_lr"], s) for s in ob.rerun_seeds] if sweep["best_lr"] is not None else []
    if optimizer == ob.baseline:
        centre = params.optim[optimizer].lr
        have = {(r["lr"], r["seed"]) for r in sweep["runs"].values()} | set(jobs)
        jobs += [(centre, s) for s in [ob.seed, *ob.rerun_seeds] if (centre, s) not in have]
    runs = [train_run(params, optimizer, size, lr, s, out_dir / f"lr{lr_key(lr)}-s{s}", shards,
                      f"{stage} lr={lr_key(lr)} seed={s}") for lr, s in jobs]
    return {"optimizer": optimizer, "size": size, "best_lr": sweep["best_lr"], "runs": runs}


CURVE_COLUMNS = ("optimizer", "size", "seed", "lr", "tokens", "val_loss")


def curve_rows(runs: list[dict]) -> list[tuple]:
    return [(r["optimizer"], r["size"], r["seed"], r["lr"], t, v) for r in runs for t, v in r["curve"]]


def cell_metrics(cell: dict) -> dict:
    """The cell's JSON for DVC metrics: its summary and each run without its curve (the curves go to the CSV)."""
    return {**{k: v for k, v in cell.items() if k != "runs"},
            "runs": {f"lr{lr_key(r['lr'])}-s{r['seed']}": {k: v for k, v in r.items() if k != "curve"}
                     for r in cell["runs"]}}
