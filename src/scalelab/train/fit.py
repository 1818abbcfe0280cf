r"""Train one cell (variant × size × recipe × seed) with Lightning, resuming its checkpoint when one matches.

    python -m scalelab.train.fit --params params.yaml --variant unified --size xs --recipe base --seed 0 \
        --out data/pretrain/unified-xs-base-0 --shards data/tokens

(The untracked entry point: the DDP launcher re-executes this command line for ranks > 0. The pretrain stage calls
`fit` with an MLflow run.) The cell trains through the one trainer (scalelab.train.trainer) with its own callbacks:
the γ statistics and the sharpness.

Resume: the `last.ckpt` of an interrupted run under the same config hash is resumed (the stage reopens the same
MLflow run through `resume_run_id`); any other checkpoint moves aside to `out_dir/ckpt/stale-<its hash>/`
(scalelab.train.resume). Every check on params and data runs before the checkpoint folder is touched.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only

from scalelab.runtime import placement
from scalelab.config import Params, ParamsError, RecipeConfig, load_params
from scalelab.data import check_windows, open_shards
from scalelab.config.machine import MACHINE_KEYS
from scalelab.model import Transformer
from scalelab.model.export import save_model
from scalelab.train.callbacks import GammaStats, MetricsFile, Throughput
from scalelab.train.datamodule import TokenDataModule
from scalelab.train.device import PRECISION_DTYPE, device_of, peak_flops, peak_mem_mb  # noqa: F401  (peak_flops re-exported)
from scalelab.train.module import LitLM
from scalelab.train.resume import claim_ckpt_dir, find_resumable, resume_run_id  # noqa: F401  (re-exported)
from scalelab.train.sharpness import Sharpness
from scalelab.runtime import code
from scalelab.train.trainer import Machine, train, write_model

if TYPE_CHECKING:
    from scalelab.tracking import StageRun

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Cell:
    """One cell of the pretrain matrix."""

    variant: str
    size: str
    recipe: str
    seed: int


def _recipe(params: Params, cell: Cell) -> RecipeConfig:
    if cell.recipe not in params.pretrain.recipes:
        raise ParamsError(f"recipe {cell.recipe!r} is not in pretrain.recipes ({sorted(params.pretrain.recipes)})")
    return params.pretrain.recipes[cell.recipe]


def config_hash(params: Params, cell: Cell, shards_dir: str | Path) -> str:
    """Hash of everything that determines the cell's training trajectory: the resolved model (without the vocabulary
    size, which comes from the data), the recipe and its optimizer, the pretrain section (less the grid and the
    other recipes), the seed, and the data (the shards' checksums in meta.json), so a persisted checkpoint is never
    resumed on a re-tokenized corpus."""
    meta = Path(shards_dir) / "meta.json"
    data = {k: v["sha256"] for k, v in json.loads(meta.read_text())["shards"].items()} if meta.is_file() else None
    recipe = _recipe(params, cell)
    model = params.resolve_model(cell.size, cell.variant, vocab_size=1, recipe=cell.recipe)
    blob = {
        "model": model.model_dump(mode="json", exclude={"vocab_size"}),
        "recipe": recipe.model_dump(mode="json"),
        "optimizer": params.optim[recipe.optimizer].model_dump(mode="json"),
        # where it runs is no part of the trajectory: a checkpoint resumes on another machine's threads or devices
        "pretrain": params.pretrain.model_dump(mode="json", exclude={"grid", "recipes", "keep_stale", "log_every",
                                                                     *MACHINE_KEYS["pretrain"]}),
        "seed": cell.seed,
        "data": data,
        "code": code.digest(__name__),
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def _summary(lit: LitLM, throughput: Throughput, curve: MetricsFile, sharpness: Sharpness, gamma: GammaStats,
             tokens_per_step: int) -> dict:
    """Final training metrics, from the callbacks' state (restored with a checkpoint, so a resumed run reports its
    whole history)."""
    step_time = statistics.median(throughput.times) if throughput.times else None
    tokens_per_s = tokens_per_step / step_time if step_time else None
    losses = [row[2] for row in curve.rows[-10:]]
    return {
        "val_loss": curve.last("val_loss"),
        "train_loss": statistics.fmean(losses) if losses else None,
        "steps": lit.step,
        "tokens": lit.step * tokens_per_step,
        "params": lit.model.num_params(),
        "non_embedding_params": lit.model.num_params(non_embedding=True),
        "flops_per_token": throughput.flops_per_token,
        "flops": throughput.flops_per_token * lit.step * tokens_per_step,
        "step_time_s": step_time,
        "tokens_per_s": tokens_per_s,
        "mfu": throughput.mfu(tokens_per_s) if tokens_per_s else None,
        "peak_flops": throughput.peak_flops,
        "train_loop_s": throughput.loop_s,
        **sharpness.summary(),
        **gamma.summary(),
    }


def fit(params: Params, cell: Cell, out_dir: str | Path, shards_dir: str | Path, run: StageRun | None = None, *,
        callbacks: Sequence[Callback] = ()) -> dict:
    """Train `cell` into `out_dir` (ckpt/; model/ with the weights, curve.csv, gamma.csv, metrics.json); return its
    final metrics.

    `run` is the stage's tracking.StageRun (or None): its Lightning logger receives the metrics on rank 0.
    `callbacks` run after the training callbacks, before the checkpoint (tests inject faults through them).
    """
    start_time, start_cpu = time.perf_counter(), time.process_time()
    pre, out_dir = params.pretrain.for_size(cell.size), Path(out_dir)  # a per-size token budget: this size's
    recipe = _recipe(params, cell)
    shards = open_shards(shards_dir)
    model_cfg = params.resolve_model(cell.size, cell.variant, vocab_size=shards.vocab_size, recipe=cell.recipe)
    # Data checks before the checkpoint folder is claimed: a run that fails them leaves an interrupted checkpoint
    # resumable. The datamodule builds the validation windows here, too.
    check_windows(len(shards.train), len(shards.val), seq_len=pre.seq_len, val_tokens=pre.val_tokens)
    datamodule = TokenDataModule(shards, pre, cell.seed)
    placement.set_torch_threads(pre.threads)
    chash = config_hash(params, cell, shards_dir)
    if rank_zero_only.rank == 0:
        resume = claim_ckpt_dir(out_dir / "ckpt", chash, run.run_id if run is not None else None, pre.keep_stale)
    else:
        resume = out_dir / "ckpt" / "last.ckpt" if find_resumable(out_dir / "ckpt", chash) else None
    device = device_of(pre.accelerator)
    peak = (pre.peak_flops or peak_flops(PRECISION_DTYPE[pre.precision], device)) * pre.devices * pre.num_nodes

    L.seed_everything(cell.seed, verbose=False)  # model init is a function of the seed
    model = Transformer(model_cfg)
    if pre.compile:
        model.compile()  # in place: parameter names (and checkpoints) stay those of the plain model
    total, tokens_per_step = pre.total_steps(), pre.batch_size * pre.seq_len
    lit = LitLM(model, optimizer=params.optim[recipe.optimizer], scale=model_cfg.scale, schedule=recipe.schedule,
                total_steps=total, accumulate=pre.accumulate, grad_clip=pre.grad_clip)
    gamma, sharpness = GammaStats(pre.gamma_every, total), Sharpness(pre.sharpness, total)
    name = f"{cell.variant}-{cell.size}-{cell.recipe}-{cell.seed}"
    loop = train(lit, datamodule, machine=Machine(pre.accelerator, pre.devices, pre.num_nodes, pre.strategy,
                                                  pre.precision),
                 out_dir=out_dir, name=name, total=total, tokens_per_step=tokens_per_step,
                 flops_per_token=model.flops_per_token(pre.seq_len), peak_flops=peak, val_every=pre.val_every,
                 ckpt_every=pre.ckpt_every, log_every=pre.log_every, run=run, resume=resume,
                 before_curve=[sharpness, gamma], after_curve=callbacks)

    metrics = {**_summary(lit, loop.throughput, loop.curve, sharpness, gamma, tokens_per_step),
               "train_tokens": len(shards.train),  # the corpus a cell's tokens pass over (passes = tokens / this)
               "peak_mem_mb": peak_mem_mb(device), "wall_s": time.perf_counter() - start_time,
               "cpu_s": time.process_time() - start_cpu}  # all threads: with wall_s, how loaded the machine was
    write_model(loop, out_dir, lambda tmp: save_model(model, tmp), metrics, {"gamma.csv": gamma.write_csv})
    if loop.trainer.is_global_zero:
        val = metrics["val_loss"]
        log.info("%s: done, val loss %s, %s tokens, %.1f s, %.0f tokens/s, MLflow run %s", name,
                 "-" if val is None else f"{val:.4f}", f"{metrics['tokens']:,}", metrics["wall_s"],
                 metrics["tokens_per_s"] or 0, run.run_id if run is not None and run.run_id else "-")
    loop.trainer.strategy.barrier("fit outputs")  # every rank returns once rank 0's files exist
    return metrics


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    for axis in ("variant", "size", "recipe", "out"):
        ap.add_argument(f"--{axis}", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--shards", default="data/tokens")
    args = ap.parse_args(argv)
    try:
        params = load_params(args.params)
        cell = Cell(variant=args.variant, size=args.size, recipe=args.recipe, seed=args.seed)
        config_hash(params, cell, args.shards)  # names checked before any compute
    except ParamsError as err:
        print(err, file=sys.stderr)
        return 2
    metrics = fit(params, cell, Path(args.out), Path(args.shards), run=None)
    if rank_zero_only.rank == 0:
        print(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
