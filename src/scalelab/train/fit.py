r"""Train one cell (variant × size × recipe × seed) with Lightning, resuming its checkpoint when one matches.

    python -m scalelab.train.fit --params params.yaml --variant unified --size xs --recipe base --seed 0 \
        --out data/pretrain/unified-xs-base-0 --shards data/tokens

(The untracked entry point: the DDP launcher re-executes this command line for ranks > 0. The pretrain stage calls
`fit` with an MLflow run.)

Resume: the `last.ckpt` of an interrupted run under the same config hash is resumed (the stage reopens the same
MLflow run through `resume_run_id`); any other checkpoint moves aside to `out_dir/ckpt/stale-<its hash>/`
(scalelab.train.resume). Every check on params and data runs before the checkpoint folder is touched.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
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

from scalelab.runtime import placement
from scalelab.config import Params, ParamsError, RecipeConfig, load_params
from scalelab.data import atomic_dir, check_windows, open_shards, write_json_atomic
from scalelab.config.machine import MACHINE_KEYS
from scalelab.model import Transformer
from scalelab.model.export import save_model
from scalelab.train.callbacks import (
    GammaStats, MetricsFile, NonFiniteGuard, Progress, StepCheckpoint, Throughput, Validation,
)
from scalelab.train.datamodule import TokenDataModule
from scalelab.train.dispatch import lean
from scalelab.train.heap import FrozenHeap
from scalelab.train.module import LitLM
from scalelab.train.resume import claim_ckpt_dir, find_resumable, resume_run_id  # noqa: F401  (re-exported)
from scalelab.train.sharpness import Sharpness

if TYPE_CHECKING:
    from scalelab.tracking import StageRun

log = logging.getLogger(__name__)
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
        # where it runs is no part of the trajectory: a checkpoint resumes on another machine's threads or devices
        "pretrain": params.pretrain.model_dump(mode="json", exclude={"grid", "recipes", "keep_stale", "log_every",
                                                                     *MACHINE_KEYS["pretrain"]}),
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


def _device(accelerator: str) -> torch.device:
    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))  # this rank's GPU, before Lightning's setup
    return torch.device("cpu")


# Dense bf16/fp16 tensor-core peaks (NVIDIA's datasheets give 1,979 and 1,671 TFLOP/s *with sparsity*, twice the
# dense rate) for the chips Lightning's device table gets wrong for MFU: it lists H200's sparse figures, under names
# ("h200 sxm1") the driver does not report ("NVIDIA H200"), so an H200 got half its MFU or a measured 4096² matmul.
DENSE_PEAK = {"h200 nvl": 835.5e12, "h200": 989.5e12}  # most specific first: "h200" is in both names


def datasheet_peak(device_name: str, dtype: torch.dtype) -> float | None:
    """This project's dense peak for a device name as torch reports it, when Lightning's table is wrong for it."""
    chip = device_name.lower()
    if dtype in (torch.bfloat16, torch.float16):
        return next((peak for key, peak in DENSE_PEAK.items() if key in chip), None)
    return None


def peak_flops(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", repeats: int = 5,
               seconds: float = 0.03) -> float:
    """Peak dense matmul FLOP/s of one device in `dtype`: the MFU denominator when params give no `peak_flops`.

    On a GPU its dense datasheet peak (DENSE_PEAK, else Lightning's device table). Otherwise measured: the best of `repeats` short
    timings (each at least `seconds` and 2 matmuls), since whatever else runs on the device only ever slows one down;
    a single timing once read 31 GFLOP/s while another process held the cores and a cell reported MFU 1.63.
    Throughput also raises it to any step's achieved rate, so MFU never exceeds 1."""
    device = torch.device(device)
    if device.type == "cuda":
        from lightning.fabric.utilities.throughput import get_available_flops

        if own := datasheet_peak(torch.cuda.get_device_name(device), dtype):
            return own
        if table := get_available_flops(device, dtype):
            return float(table)
    key = (dtype, str(device), torch.get_num_threads(), repeats, seconds)
    if key not in _MEASURED:  # once a process: 0.17 s a measurement, else paid by every fit of a sweep cell
        _MEASURED[key] = _measure_peak(dtype, device, repeats, seconds)
    return _MEASURED[key]


_MEASURED: dict[tuple, float] = {}


def _measure_peak(dtype: torch.dtype, device: torch.device, repeats: int, seconds: float) -> float:
    n = 4096 if device.type == "cuda" else 512
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b  # warm-up
    sync()
    best = 0.0
    for _ in range(repeats):
        iters, start = 0, time.perf_counter()
        while iters < 2 or time.perf_counter() - start < seconds:
            a @ b
            sync()
            iters += 1
        best = max(best, 2 * n**3 * iters / (time.perf_counter() - start))
    return best


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
    pre, out_dir = params.pretrain, Path(out_dir)
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
    gamma = GammaStats(pre.gamma_every, total)
    curve = MetricsFile(tokens_per_step, pre.ckpt_every, total, logged_file=out_dir / "ckpt" / "metrics_logged.json",
                        run_id=run.run_id if run is not None else None, log_every=pre.log_every)
    sharpness = Sharpness(pre.sharpness, total)
    logger = run.lightning_logger() if run is not None and rank_zero_only.rank == 0 else None
    name, tty = f"{cell.variant}-{cell.size}-{cell.recipe}-{cell.seed}", sys.stdout.isatty()
    progress = [] if tty else [Progress(name, total, tokens_per_step)]  # a terminal has Lightning's bar instead
    trainer = L.Trainer(
        accelerator=pre.accelerator, devices=pre.devices, num_nodes=pre.num_nodes, strategy=pre.strategy,
        precision=pre.precision, max_epochs=1, max_steps=-1,  # the stream ends at total_steps
        # Throughput first (its timer stops before the others' work), the checkpoint last.
        callbacks=lean([throughput, FrozenHeap(), NonFiniteGuard(), Validation(pre.val_every, total), sharpness, gamma,
                        curve, *progress, *callbacks, StepCheckpoint(out_dir / "ckpt", pre.ckpt_every, total)]),
        logger=logger or False, default_root_dir=out_dir, enable_progress_bar=tty,
        enable_model_summary=False, use_distributed_sampler=False,
    )
    with placement.launch_scope():  # no rank variables left for the next fit or child
        trainer.fit(lit, datamodule=datamodule, ckpt_path=resume, weights_only=True)

    metrics = {**_summary(lit, throughput, curve, sharpness, gamma, tokens_per_step),
               "peak_mem_mb": _peak_mem_mb(device), "wall_s": time.perf_counter() - start_time,
               "cpu_s": time.process_time() - start_cpu}  # all threads: with wall_s, how loaded the machine was
    if trainer.is_global_zero:  # the final weights with their curves, all or nothing
        with atomic_dir(out_dir / "model") as tmp:
            save_model(model, tmp)
            curve.write_csv(tmp / "curve.csv")
            gamma.write_csv(tmp / "gamma.csv")
            write_json_atomic(tmp / "metrics.json", metrics)
        run_json = out_dir / "ckpt" / "run.json"
        write_json_atomic(run_json, {**json.loads(run_json.read_text()), "complete": True})
        val = metrics["val_loss"]
        log.info("%s: done, val loss %s, %s tokens, %.1f s, %.0f tokens/s, MLflow run %s", name,
                 "-" if val is None else f"{val:.4f}", f"{metrics['tokens']:,}", metrics["wall_s"],
                 metrics["tokens_per_s"] or 0, run.run_id if run is not None and run.run_id else "-")
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
