"""One training run of the optimizer benchmark: the params copy it trains under (`run_params`) and the run itself
through the pretraining trainer (`train_run`: scalelab.train.fit), cached under its config hash.

A run is named by its hyperparameters (`hp`: {"lr": …, and each second hyperparameter that differs from its default}),
seed and data budget (a fraction of the benchmark's steps, each with its own full schedule). Per run: final
validation loss (the end-of-run loss every comparison uses), the validation curve (a secondary plot only), median
step time, parameters (all, and without the token embedding and LM head) with the tokens per parameter, the LRs the
AdamW side group and the embeddings trained at, optimizer-state bytes per parameter and divergence: a non-finite loss
or gradient (NonFiniteGuard's FloatingPointError, caught here so the sweep goes on) or a final training loss above
the first.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

from lightning.pytorch.callbacks import Callback

from scalelab.config import Params, RecipeConfig
from scalelab.data import write_json_atomic
from scalelab.optim import hooks, spec
from scalelab.optim.registry import has_side
from scalelab.optbench.protocol import Pin, embedding_lr, normal, side_lr, side_settings
from scalelab.train.fit import Cell, config_hash, fit, resume_run_id

RECIPE = "optbench"  # the recipe and optim key of the run in its params copy
NON_FINITE, ABOVE_START = "non-finite", "loss above start"


def bench_steps(params: Params) -> int:
    """The benchmark's own budget in steps (budget 1.0)."""
    return params.optimizers.max_steps or params.pretrain.total_steps()


def run_params(params: Params, optimizer: str, hp: dict | float, budget: float = 1.0, batch: int = 1,
               pinned_lr: float | Pin | None = None) -> Params:
    """`params` with recipe and optim entry RECIPE = `optim.<optimizer>` at the hyperparameters `hp` (a dict, or an
    LR alone), its AdamW side group set by `protocol.side_settings` (a pinned arm's: the LR, decay, betas and
    embedding LR multiplier its reference chose, `pinned_lr`; else its LR moved by the same factor as the LR, one LR
    knob per optimizer, with the family's own decay and betas), for `budget` × the benchmark's tokens with
    its own full schedule, at `batch` × pretrain's batch (the same tokens in 1/batch the steps), and the benchmark's
    overrides of `pretrain`.
    Schedule-Free optimizers keep the schedule's warmup and no decay: their averaging is the decay. AdEMAMix warms α
    and β3 up over the whole run (Pagliardini et al. 2024: T_α = T_β3 = the run's steps) unless its kwargs say."""
    ob, base = params.optimizers, params.optim[optimizer]
    hp = {"lr": hp} if isinstance(hp, (int, float)) else hp
    steps = max(1, round(bench_steps(params) * budget / batch))
    update: dict = {"lr": hp["lr"], **side_settings(base, hp, pinned_lr)}
    kwargs = dict(base.kwargs)
    for k, v in hp.items():
        if k in ("beta1", "beta2"):
            betas = list(update.get("betas", base.betas))
            betas[k == "beta2"] = v
            update["betas"] = tuple(betas)
        elif k.startswith("kwargs."):
            kwargs[k[7:]] = v
        elif k in ("weight_decay", "momentum", "embedding_lr_mult"):
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
        "sharpness": pre.sharpness.model_copy(update={"enabled": False}),  # the scale vectors' diagnostic
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


FIT_KEYS = ("val_loss", "train_loss", "steps", "tokens", "params", "non_embedding_params", "step_time_s", "wall_s")


def train_run(params: Params, optimizer: str, size: str, hp: dict | float, seed: int, out_dir: Path, shards: Path,
              stage: str | None, budget: float = 1.0, batch: int = 1, pinned_lr: float | Pin | None = None) -> dict:
    """One run of the benchmark (fit on the params copy), or its earlier result under the same config hash.

    `stage` names its MLflow child run (None: no tracking); `pinned_lr`: a pinned arm's side group (protocol.Pin)."""
    from scalelab import tracking

    hp = normal(params, optimizer, {"lr": hp} if isinstance(hp, (int, float)) else hp)
    sub = run_params(params, optimizer, hp, budget, batch, pinned_lr)
    cell = Cell(variant=params.optimizers.variant, size=size, recipe=RECIPE, seed=seed)
    chash = config_hash(sub, cell, shards)
    done = out_dir / "result.json"
    if done.is_file() and (old := json.loads(done.read_text())).get("config_hash") == chash:
        return old
    pre, cfg = sub.pretrain, params.optim[optimizer]
    probe = Probe(pre.batch_size * pre.seq_len)
    result = {"optimizer": optimizer, "size": size, "seed": seed, "lr": hp["lr"], "hp": hp, "budget": budget,
              "batch": batch, "side_lr": side_lr(cfg, hp["lr"], pinned_lr) if has_side(cfg.name) else None,
              "embedding_lr": embedding_lr(cfg, hp, pinned_lr), "config_hash": chash}
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
        with track as run:  # result.json inside the run: FINISHED only once it is written
            metrics = fit(sub, cell, out_dir, shards, run, callbacks=[probe])
            diverged = None
            if metrics["val_loss"] is None or not math.isfinite(metrics["val_loss"]):
                diverged = NON_FINITE
            elif probe.start_loss is not None and metrics["train_loss"] >= probe.start_loss:
                diverged = ABOVE_START
            result |= {k: metrics[k] for k in FIT_KEYS}
            result["tokens_per_param"] = metrics["tokens"] / metrics["params"]
            return record(diverged, run.run_id if run else None)
    except FloatingPointError as err:  # NonFiniteGuard: recorded, the sweep goes on (its MLflow run ends FAILED)
        result |= {"val_loss": None, "params": probe.n_params or None, "error": str(err).split(";")[0]}
        return record(NON_FINITE, run.run_id if run else None)
