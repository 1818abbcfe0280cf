r"""Train one cell (variant × size × recipe × seed) with Lightning, resuming its checkpoint when one matches.

    python -m scalelab.train.fit --params params.yaml --variant unified --size xs --recipe base --seed 0 \
        --out data/pretrain/unified-xs-base-0 --shards data/tokens

(The untracked entry point: the DDP launcher re-executes this command line for ranks > 0. The pretrain stage calls
`fit` with an MLflow run.)

Resume: `out_dir/ckpt/run.json` holds {"run_id", "config_hash", "complete"}. The `last.ckpt` of an interrupted run
under the same config hash is resumed (the stage reopens the same MLflow run through `resume_run_id`). Any other
checkpoint, from another config or from a run that completed (DVC reruns a finished cell only when its code or
inputs changed, so its checkpoint must not stand in for the new run), is never resumed nor deleted: it moves to
`out_dir/ckpt/stale-<its hash>/` and training starts fresh.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only

from scalelab.config import Params, ParamsError, RecipeConfig, load_params
from scalelab.data import atomic_dir, open_shards, write_json_atomic
from scalelab.model import Transformer
from scalelab.model.export import save_model
from scalelab.train.callbacks import (
    GammaStats, MetricsFile, NonFiniteGuard, Sharpness, StepCheckpoint, Throughput, Validation,
)
from scalelab.train.datamodule import TokenDataModule
from scalelab.train.module import LitLM

if TYPE_CHECKING:
    from scalelab.tracking import StageRun

PRECISION_DTYPE = {"32-true": torch.float32, "bf16-mixed": torch.bfloat16, "bf16-true": torch.bfloat16}


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
        "pretrain": params.pretrain.model_dump(mode="json", exclude={"grid", "recipes"}),
        "seed": cell.seed,
        "data": data,
        "code": _code_digest(),
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def _code_digest() -> str:
    """sha256 of the training code (schema, loader, model, optim, train): an interrupted run resumes only under the
    code that started it, never mixing two versions in one result."""
    pkg = Path(__file__).resolve().parents[1]
    files = [pkg / "data" / "loader.py",
             *sorted(f for d in ("config", "model", "optim", "train") for f in (pkg / d).glob("*.py"))]
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.read_bytes())
    return digest.hexdigest()[:16]


def _resumable(ckpt_dir: Path, chash: str) -> tuple[Path | None, dict]:
    """(last.ckpt of an interrupted run under config hash `chash`, else None; the stored run.json)."""
    path = ckpt_dir / "run.json"
    stored = json.loads(path.read_text()) if path.is_file() else {}
    last = ckpt_dir / "last.ckpt"
    ok = last.is_file() and stored.get("config_hash") == chash and not stored.get("complete")
    return (last if ok else None), stored


def resume_run_id(out_dir: str | Path, config_hash: str) -> str | None:
    """The MLflow run id to reopen: that of a resumable checkpoint under the same config hash, else None."""
    last, stored = _resumable(Path(out_dir) / "ckpt", config_hash)
    return stored.get("run_id") if last else None


def _claim_ckpt_dir(ckpt_dir: Path, chash: str, run_id: str | None) -> Path | None:
    """Return the checkpoint to resume (or None); move a foreign config's checkpoint aside; record run.json.

    Runs on rank 0 before the DDP launcher starts the other ranks, which then find the directory settled.
    """
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    resume, stored = _resumable(ckpt_dir, chash)
    if resume is None and (ckpt_dir / "last.ckpt").is_file():
        leftovers = [p for p in ckpt_dir.iterdir() if not p.name.startswith("stale-")]
        stale = ckpt_dir / f"stale-{stored.get('config_hash', 'unknown')}"
        n = 1
        while stale.exists():  # the same old config moved aside before: keep both
            n += 1
            stale = ckpt_dir / f"stale-{stored.get('config_hash', 'unknown')}-{n}"
        stale.mkdir()
        for p in leftovers:
            p.rename(stale / p.name)
    write_json_atomic(ckpt_dir / "run.json", {"run_id": run_id, "config_hash": chash})
    return resume


def _device(accelerator: str) -> torch.device:
    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))  # this rank's GPU, before Lightning's setup
    return torch.device("cpu")


def peak_flops(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", seconds: float = 0.25) -> float:
    """Measured dense matmul throughput (FLOP/s) of one device in `dtype`: the MFU denominator when params give no
    `peak_flops`. An achievable peak, not the datasheet's, so MFU reads as a fraction of what matmuls reach here."""
    device = torch.device(device)
    n = 4096 if device.type == "cuda" else 1024
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b  # warm-up
    sync()
    iters, start = 0, time.perf_counter()
    while iters < 3 or time.perf_counter() - start < seconds:
        a @ b
        sync()
        iters += 1
    return 2 * n**3 * iters / (time.perf_counter() - start)


def _peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


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
    start_time = time.perf_counter()
    pre, out_dir = params.pretrain, Path(out_dir)
    recipe = _recipe(params, cell)
    shards = open_shards(shards_dir)
    model_cfg = params.resolve_model(cell.size, cell.variant, vocab_size=shards.vocab_size, recipe=cell.recipe)
    if pre.threads:
        torch.set_num_threads(pre.threads)
    chash = config_hash(params, cell, shards_dir)
    if rank_zero_only.rank == 0:
        resume = _claim_ckpt_dir(out_dir / "ckpt", chash, run.run_id if run is not None else None)
    else:
        resume, _ = _resumable(out_dir / "ckpt", chash)
    device = _device(pre.accelerator)
    peak = (pre.peak_flops or peak_flops(PRECISION_DTYPE[pre.precision], device)) * pre.devices * pre.num_nodes

    L.seed_everything(cell.seed, verbose=False)  # model init is a function of the seed
    model = Transformer(model_cfg)
    if pre.compile:
        model.compile()  # in place: parameter names (and checkpoints) stay those of the plain model
    total, tokens_per_step = pre.total_steps(), pre.batch_size * pre.seq_len
    lit = LitLM(model, optimizer=params.optim[recipe.optimizer], scale=model_cfg.scale, schedule=recipe.schedule,
                total_steps=total, accumulate=pre.accumulate, grad_clip=pre.grad_clip)
    throughput = Throughput(tokens_per_step, model.flops_per_token(pre.seq_len), peak)
    gamma, curve = GammaStats(pre.gamma_every, total), MetricsFile(tokens_per_step, pre.ckpt_every, total)
    sharpness = Sharpness(pre.sharpness, total)
    logger = run.lightning_logger() if run is not None and rank_zero_only.rank == 0 else None
    trainer = L.Trainer(
        accelerator=pre.accelerator, devices=pre.devices, num_nodes=pre.num_nodes, strategy=pre.strategy,
        precision=pre.precision, max_epochs=1, max_steps=-1,  # the stream ends at total_steps
        # Throughput first (its timer stops before the others' work), the checkpoint last.
        callbacks=[throughput, NonFiniteGuard(), Validation(pre.val_every, total), sharpness, gamma, curve,
                   *callbacks, StepCheckpoint(out_dir / "ckpt", pre.ckpt_every, total)],
        logger=logger or False, default_root_dir=out_dir, enable_progress_bar=sys.stdout.isatty(),
        enable_model_summary=False, use_distributed_sampler=False,
    )
    trainer.fit(lit, datamodule=TokenDataModule(shards, pre, cell.seed), ckpt_path=resume, weights_only=True)

    metrics = {**_summary(lit, throughput, curve, sharpness, gamma, tokens_per_step),
               "peak_mem_mb": _peak_mem_mb(device), "wall_s": time.perf_counter() - start_time}
    if trainer.is_global_zero:  # the final weights with their curves, all or nothing
        with atomic_dir(out_dir / "model") as tmp:
            save_model(model, tmp)
            curve.write_csv(tmp / "curve.csv")
            gamma.write_csv(tmp / "gamma.csv")
            write_json_atomic(tmp / "metrics.json", metrics)
        run_json = out_dir / "ckpt" / "run.json"
        write_json_atomic(run_json, {**json.loads(run_json.read_text()), "complete": True})
    trainer.strategy.barrier("fit outputs")  # every rank returns once rank 0's files exist
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
