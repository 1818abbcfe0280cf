"""Continued pretraining of one Hidden Decoding cell with the pretrain trainer's parts: LitLM (the model
returns the last stream's logits and loss like a Transformer), the token data module, the callbacks and the resume
logic of scalelab.train.resume (a persisted checkpoint of the same config hash is resumed, any other moved aside).

Every cell continues the same backbone on the same batches (a pure function of seed and step); cells differ in
n_streams, attention, and the step budget: the base budget, or (`flops_of`) as many steps as make the cell's
training FLOPs equal those of another stream configuration on the base budget (counted analytically,
scalelab.model.hidden_decoding.flops_per_token).

The token streams are the pipeline's shards for a pretrain cell, and for any other backbone the prepared corpus
encoded with the backbone's own tokenizer (hidden_decoding.train.corpus; the compress stage's
scalelab.compress.data), so a user's Hugging Face model continues on the project's documents without retokenizing
the project.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING

import lightning as L
import torch

from scalelab.compress.data import from_text
from scalelab.config import HiddenDecodingConfig, HiddenDecodingModelConfig, ScaleConfig
from scalelab.config.machine import MACHINE_KEYS
from scalelab.data import DataError, atomic_dir, check_windows, open_shards, write_json_atomic
from scalelab.data.loader import Shards
from scalelab.model.hf import load_hf_tokenizer
from scalelab.model.hidden_decoding import HiddenDecodingLM, flops_per_token
from scalelab.model.hidden_decoding_io import from_source, save_hidden_decoding
from scalelab.runtime import placement
from scalelab.train.callbacks import MetricsFile, NonFiniteGuard, Progress, StepCheckpoint, Throughput, Validation
from scalelab.train.datamodule import TokenDataModule
from scalelab.train.fit import PRECISION_DTYPE, _code_digest, _device, _peak_mem_mb, peak_flops
from scalelab.train.module import LitLM
from scalelab.train.resume import claim_ckpt_dir
from scalelab.train.resume import resume_run_id as stored_run_id

if TYPE_CHECKING:
    from scalelab.tracking import StageRun


def cell_steps(hd: HiddenDecodingConfig, cell: str, backbone_config) -> int:
    """Optimizer steps of `cell`: the base budget, or the FLOP-matched one for a `flops_of` control."""
    c, base = hd.cells[cell], hd.train.max_steps
    if c.flops_of is None:
        return base
    target = hd.model(cell).model_copy(update=c.flops_of.model_dump())
    ratio = (flops_per_token(backbone_config, target, hd.train.seq_len)
             / flops_per_token(backbone_config, hd.model(cell), hd.train.seq_len))
    return max(1, round(base * ratio))


def source_digest(location: str) -> str:
    """Identity of the backbone: its files (name, size, content; big ones by size and mtime), or the hub id."""
    folder = Path(location)
    if not folder.is_dir():
        return location
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        st = f.stat()
        h.update(f"{f.relative_to(folder)}:{st.st_size}".encode())
        h.update(f.read_bytes() if st.st_size < 2**26 else str(st.st_mtime_ns).encode())
    return h.hexdigest()[:16]


@dataclass
class Corpus:
    """The token streams of every cell, in the backbone's vocabulary, and their identity for the config hash."""

    shards: Shards
    digest: str


def backbone_tokenizer(hd: HiddenDecodingConfig):
    """The tokenizer saved beside the backbone, or None (a folder of weights only)."""
    try:
        return load_hf_tokenizer(hd.source.location())
    except ValueError:
        return None


def load_corpus(hd: HiddenDecodingConfig, shards_dir: str | Path, prepared_dir: str | Path, tokenizer) -> Corpus:
    """The pipeline's checksummed shards, or (hd.uses_text) the first `text_tokens` tokens of each prepared split
    encoded with the backbone's tokenizer, documents joined by its EOS (as the compress stage encodes them)."""
    if not hd.uses_text():
        shards = open_shards(shards_dir)
        sums = {k: v["sha256"] for k, v in shards.meta["shards"].items()}
        return Corpus(shards, hashlib.sha256(json.dumps(sums, sort_keys=True).encode()).hexdigest())
    if tokenizer is None:
        raise DataError(f"hidden_decoding.train.corpus: {hd.source.location()!r} has no tokenizer to encode the "
                        "prepared corpus with (save one beside the weights, or set train.corpus: shards)")
    if not (Path(prepared_dir) / "train.parquet").is_file():
        raise DataError(f"no {Path(prepared_dir) / 'train.parquet'} (run the prepare stage first)")
    s = from_text(prepared_dir, tokenizer, hd.train.text_tokens)
    digest = hashlib.sha256(s.train.tobytes() + b"|" + s.val.tobytes()).hexdigest()
    return Corpus(Shards(train=s.train, val=s.val, vocab_size=s.vocab_size, eot_id=tokenizer.eos_token_id,
                         meta={"source": "text", "tokens": [len(s.train), len(s.val)]}), digest)


def config_hash(hd: HiddenDecodingConfig, cell: str, seed: int, steps: int, corpus: Corpus) -> str:
    """Everything that fixes a cell's trajectory: its model, the train section, its budget, the seed, the backbone's
    files, the data's identity and the training code. A checkpoint resumes only under the same hash."""
    machine = set(MACHINE_KEYS["hidden_decoding.train"])  # where it runs is no part of the trajectory
    blob = {"model": hd.model(cell).model_dump(mode="json"), "train": hd.train.model_dump(mode="json", exclude=machine),
            "steps": steps, "seed": seed, "source": hd.source.model_dump(mode="json"),
            "backbone": source_digest(hd.source.location()), "data": corpus.digest, "code": _code_digest()}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def check_vocab(model: HiddenDecodingLM, vocab_size: int, tokenizer) -> None:
    """The shards must be in the backbone's tokenizer: one clear line before any compute otherwise."""
    if vocab_size > model.backbone.config.vocab_size:
        raise DataError(f"token shards have vocab_size {vocab_size}, more than the backbone's "
                        f"{model.backbone.config.vocab_size}: tokenize with the backbone's tokenizer")
    if tokenizer is not None and len(tokenizer) != vocab_size:
        raise DataError(f"token shards have vocab_size {vocab_size}, the backbone's tokenizer {len(tokenizer)} "
                        "tokens: tokenize with the backbone's tokenizer (tokenizer.kind: file)")


@torch.no_grad()
def table_spread(model: HiddenDecodingLM) -> float | None:
    """Mean over s ≥ 2 of ‖E_s − E_1‖ / ‖E_1‖ (Frobenius): how far the separate tables are from the backbone's;
    None without separate extra tables (n = 1, tied tables)."""
    e1 = model.backbone.get_input_embeddings().weight.float()
    if not model.extra_embeds:
        return None
    return statistics.fmean(float((t.weight.float() - e1).norm() / e1.norm()) for t in model.extra_embeds)


def fit_cell(hd: HiddenDecodingConfig, cell: str, seed: int, out_dir: str | Path, shards_dir: str | Path,
             run: StageRun | None = None, plot: Path | None = None, prepared_dir: str | Path = "data/prepared",
             corpus: Corpus | None = None,
             evaluate: Callable[[HiddenDecodingLM, Shards], dict] | None = None) -> dict:
    """Continue the backbone as `cell` into `out_dir` (ckpt/ persistent; model/ with the Hugging Face folder plus
    extra tables, curve.csv and metrics.json); return its final metrics. `plot`: a second copy of curve.csv.
    `corpus`: the streams if already loaded (load_corpus), else loaded from `shards_dir` or `prepared_dir`.
    `evaluate(model, shards)`: extra metrics of the trained model (a probe's answer tokens), merged in.
    `table_spread_start` and `table_spread` (`table_spread` at init and at the end) say whether separate tables
    moved apart."""
    start_time, tc, out_dir = time.perf_counter(), hd.train, Path(out_dir)
    tokenizer = backbone_tokenizer(hd)  # None: the vocabulary size check alone
    corpus = corpus or load_corpus(hd, shards_dir, prepared_dir, tokenizer)
    shards = corpus.shards
    placement.set_torch_threads(tc.threads)
    device = _device(tc.accelerator)
    cfg: HiddenDecodingModelConfig = hd.model(cell)
    L.seed_everything(seed, verbose=False)  # the extra tables' noise is a function of the seed
    model = from_source(hd.source, cfg, device).train()  # loaded in eval mode; Lightning keeps a module's mode
    spread_start = table_spread(model)  # before a resumed checkpoint's weights: the init's noise
    # Data checks before the checkpoint folder is claimed: a run that fails them leaves it as it was.
    check_vocab(model, shards.vocab_size, tokenizer if not hd.uses_text() else None)
    check_windows(len(shards.train), len(shards.val), seq_len=tc.seq_len, val_tokens=tc.val_tokens)
    total = cell_steps(hd, cell, model.backbone.config)
    datamodule = TokenDataModule(shards, tc.model_copy(update={"max_steps": total}), seed)
    chash = config_hash(hd, cell, seed, total, corpus)
    resume = claim_ckpt_dir(out_dir / "ckpt", chash, run.run_id if run is not None else None, tc.keep_stale)
    peak = (tc.peak_flops or peak_flops(PRECISION_DTYPE[tc.precision], device)) * tc.devices

    lit = LitLM(model, optimizer=tc.optimizer, scale=ScaleConfig(), schedule=tc.schedule, total_steps=total,
                accumulate=tc.accumulate, grad_clip=tc.grad_clip)
    tokens_per_step, fpt = tc.batch_size * tc.seq_len, model.flops_per_token(tc.seq_len)
    throughput = Throughput(tokens_per_step, fpt, peak)
    curve = MetricsFile(tokens_per_step, tc.ckpt_every, total, logged_file=out_dir / "ckpt" / "metrics_logged.json",
                        run_id=run.run_id if run is not None else None)
    trainer = L.Trainer(
        accelerator=tc.accelerator, devices=tc.devices, precision=tc.precision, max_epochs=1, max_steps=-1,
        callbacks=[throughput, NonFiniteGuard(), Validation(tc.val_every, total), curve,
                   *([] if sys.stdout.isatty() else [Progress(f"hidden_decoding@{cell}-{seed}", total,
                                                              tokens_per_step)]),
                   StepCheckpoint(out_dir / "ckpt", tc.ckpt_every, total)],
        logger=(run.lightning_logger() if run is not None else None) or False, default_root_dir=out_dir,
        enable_progress_bar=sys.stdout.isatty(), enable_model_summary=False, use_distributed_sampler=False,
    )
    with placement.launch_scope():  # no rank variables left for the next fit or child
        trainer.fit(lit, datamodule=datamodule, ckpt_path=resume, weights_only=True)

    step_time = statistics.median(throughput.times) if throughput.times else None
    metrics = {
        "val_loss": curve.last("val_loss"),  # last stream, the fixed validation windows
        "train_loss": statistics.fmean(r[2] for r in curve.rows[-10:]) if curve.rows else None,
        "n_streams": cfg.n_streams, "attention": cfg.attention, "mixing_layers": sorted(model.mixing_layers),
        "local_layers": sorted(model.local_layers),
        "steps": lit.step, "tokens": lit.step * tokens_per_step, "flops_per_token": fpt,
        "flops": fpt * lit.step * tokens_per_step, "params": model.num_params(),
        "step_time_s": step_time, "tokens_per_s": tokens_per_step / step_time if step_time else None,
        "peak_mem_mb": _peak_mem_mb(device), "table_spread_start": spread_start, "table_spread": table_spread(model),
        **(evaluate(model, shards) if evaluate is not None else {}),
        "wall_s": time.perf_counter() - start_time,
    }
    if trainer.is_global_zero:  # the final model with its curve, all or nothing
        with atomic_dir(out_dir / "model") as tmp:
            save_hidden_decoding(model, tmp, tokenizer)
            curve.write_csv(tmp / "curve.csv")
            write_json_atomic(tmp / "metrics.json", metrics)
        if plot is not None:
            plot.parent.mkdir(parents=True, exist_ok=True)
            curve.write_csv(plot)
        run_json = out_dir / "ckpt" / "run.json"
        write_json_atomic(run_json, {**json.loads(run_json.read_text()), "complete": True})
    return metrics


def resume_run_id(hd: HiddenDecodingConfig, cell: str, seed: int, out_dir: str | Path, corpus: Corpus,
                  backbone_config) -> str | None:
    """The MLflow run to reopen: that of a resumable checkpoint of this cell under the same config hash."""
    chash = config_hash(hd, cell, seed, cell_steps(hd, cell, backbone_config), corpus)
    return stored_run_id(out_dir, chash)
