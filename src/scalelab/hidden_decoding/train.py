"""Continued pretraining of one Hidden Decoding cell through the one trainer (scalelab.train.trainer, as a pretrain
cell): LitLM (the model returns the last stream's logits and loss like a Transformer), the token data module, and the
resume logic of scalelab.train.resume (a persisted checkpoint of the same config hash is resumed, any other moved
aside); its own callbacks are the step-0 validation and the tables' warm-up.

Every cell continues the same backbone on the same batches (a pure function of seed and step); cells differ in
n_streams, attention, and the step budget: the base budget, or (`flops_of`) as many steps as make the cell's
training FLOPs equal those of another stream configuration on the base budget (counted analytically,
scalelab.hidden_decoding.model.flops_per_token).

The token streams are the pipeline's shards for a pretrain cell, and for any other backbone the prepared corpus
encoded with the backbone's own tokenizer (hidden_decoding.train.corpus; the compress stage's
scalelab.data.streams), so a user's Hugging Face model continues on the project's documents without retokenizing
the project; or a probe's task (`corpus: parity`, scalelab.hidden_decoding.task) on a random backbone.

Every run validates before its first step (the curve's step-0 row, `val_loss_start`): how far the cell starts from
its backbone. A `forward_only` cell stops there: it trains nothing and records its step-0 loss per validation
window, so a start's gap is read paired by window.
"""

from __future__ import annotations

import csv
import hashlib
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from functools import partial
from typing import TYPE_CHECKING

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from scalelab.data.streams import from_text
from scalelab.config import HiddenDecodingConfig, HiddenDecodingModelConfig, ScaleConfig
from scalelab.config.machine import MACHINE_KEYS
from scalelab.data import DataError, atomic_dir, check_windows, open_shards, write_json_atomic
from scalelab.data.loader import Shards, val_batches
from scalelab.model.hf import load_hf_tokenizer
from scalelab.hidden_decoding.model import HiddenDecodingLM, flops_per_token
from scalelab.hidden_decoding.answers import window_losses
from scalelab.hidden_decoding.io import backbone_config, from_source, save_hidden_decoding
from scalelab.runtime import placement
from scalelab.hidden_decoding import task as probe
from scalelab.train.callbacks import MetricsFile
from scalelab.train.datamodule import TokenDataModule
from scalelab.train.device import PRECISION_DTYPE, device_of, peak_flops, peak_mem_mb
from scalelab.train.module import LitLM
from scalelab.train.resume import claim_ckpt_dir
from scalelab.train.resume import resume_run_id as stored_run_id
from scalelab.runtime import code
from scalelab.train.trainer import Machine, train, write_model

if TYPE_CHECKING:
    from scalelab.tracking import StageRun


def cell_steps(hd: HiddenDecodingConfig, cell: str, backbone_config, train_tokens: int | None = None) -> int:
    """Optimizer steps of `cell`: the base budget, the FLOP-matched one for a `flops_of` control (capped at
    `max_passes` passes over the `train_tokens` of the training stream), or 0 for a `forward_only` cell."""
    c, base = hd.cells[cell], hd.train.max_steps
    if c.forward_only:
        return 0
    if c.flops_of is None:
        return base
    target = hd.model(cell).model_copy(update=c.flops_of.model_dump())
    tc = probe.cell_train(hd, cell)
    ratio = (flops_per_token(backbone_config, target, tc.seq_len)
             / flops_per_token(backbone_config, hd.model(cell), tc.seq_len))
    steps = max(1, round(base * ratio))
    if c.max_passes is None:
        return steps
    if train_tokens is None:
        raise ValueError(f"cell {cell}: max_passes needs the training stream's length")
    return min(steps, max(1, int(c.max_passes * train_tokens) // (tc.batch_size * tc.seq_len)))


# A continued pretraining of a pipeline-pretrained backbone draws its windows from another stream than its backbone's
# pretraining: train_batch is a pure function of (seed, step), so on the same seed, batch and window length the first
# steps would replay the backbone's first batches in their order.
CPT_STREAM = 1 << 20


def stream_seed(hd: HiddenDecodingConfig, seed: int) -> int:
    """The seed of the cell's training windows: `seed`, offset by CPT_STREAM for a pretrain cell's backbone."""
    return seed + CPT_STREAM if getattr(hd.source, "cell", None) is not None else seed


def backbone_run(hd: HiddenDecodingConfig) -> dict | None:
    """What the backbone's own pretraining recorded beside its export (a pretrain cell's model/metrics.json and
    curve.csv): its cell, tokens, non-embedding parameters and validation curve [(tokens, val_loss)], read by the
    premise that it was trained (scalelab.hidden_decoding.premises.backbone_trained); None for any other source."""
    if getattr(hd.source, "cell", None) is None:
        return None
    folder = Path(hd.source.location()).parent
    metrics, curve = folder / "metrics.json", folder / "curve.csv"
    if not metrics.is_file() or not curve.is_file():
        return None
    m = json.loads(metrics.read_text())
    with open(curve) as f:
        points = [[float(r["tokens"]), float(r["val_loss"])] for r in csv.DictReader(f) if r.get("val_loss")]
    return {"cell": hd.source.cell, "tokens": m.get("tokens"), "params": m.get("params"),
            "non_embedding_params": m.get("non_embedding_params"), "val_loss": m.get("val_loss"),
            "val_curve": points}


def cell_backbone_config(hd: HiddenDecodingConfig, cell: str):
    """The Hugging Face config of the cell's backbone, read before any compute (a random one's vocabulary is its
    task's)."""
    task = probe.task_of(hd, cell)
    return backbone_config(hd.source, None if task is None else probe.VOCAB)


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
    """The tokenizer saved beside the backbone, or None (a folder of weights only, a random backbone)."""
    if hd.random_init():
        return None
    try:
        return load_hf_tokenizer(hd.source.location())
    except ValueError:
        return None


def load_corpus(hd: HiddenDecodingConfig, cell: str, shards_dir: str | Path, prepared_dir: str | Path,
                tokenizer) -> Corpus:
    """The pipeline's checksummed shards, or (hd.uses_text) the first `text_tokens` tokens of each prepared split
    encoded with the backbone's tokenizer, documents joined by its EOS (as the compress stage encodes them), or the
    cell's parity task (scalelab.hidden_decoding.task)."""
    if probe.task_of(hd, cell) is not None:
        return Corpus(*probe.task_shards(hd, cell))
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
    machine = set(MACHINE_KEYS["hidden_decoding.train"])  # where it runs is no part of the trajectory, nor logging
    section = probe.cell_train(hd, cell).model_dump(mode="json", exclude=machine | {"log_every"})
    backbone = None if hd.random_init() else source_digest(hd.source.location())  # a random one: its shape, seed
    blob = {"model": hd.model(cell).model_dump(mode="json"), "cell": hd.cells[cell].model_dump(mode="json"),
            "train": section, "steps": steps, "seed": seed,
            "source": hd.source.model_dump(mode="json"), "backbone": backbone, "data": corpus.digest,
            "code": code.digest(__name__)}
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


@torch.no_grad()
def gate_mean(model: HiddenDecodingLM) -> float | None:
    """Mean over the mixing layers of a gated start's α (scalelab.hidden_decoding.gate): 0 is the backbone's
    function, 1 the method's mixing; None without gates (an open start, n = 1)."""
    if not len(model.mix_gates):
        return None
    return statistics.fmean(float(g) for g in model.mix_gates)


class StartValidation(Callback):
    """The validation loss before the first step as the curve's step-0 row (the trainer's MetricsFile), logged with
    the others: how far the cell starts from its backbone. A resumed run's curve holds it already (the curve is in
    the checkpoint)."""

    def on_train_start(self, trainer, pl_module) -> None:
        curve = next(cb for cb in trainer.callbacks if isinstance(cb, MetricsFile))
        if pl_module.step == 0 and not curve.rows:
            loss = pl_module.evaluate(trainer.datamodule.val_share())
            curve.rows.append([0, 0, None, loss, None])
            curve.pending.append((0, int(time.time() * 1000), {"val/loss": loss}))


class TableWarmup(Callback):
    """The cell's `table_warmup`: before step `steps` the backbone's weights take no gradient (AdamW skips them,
    their decay included), so only the extra tables and a gated start's gates train."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        for p in pl_module.model.backbone.parameters():
            p.requires_grad_(pl_module.step >= self.steps)


def fit_cell(hd: HiddenDecodingConfig, cell: str, seed: int, out_dir: str | Path, shards_dir: str | Path,
             run: StageRun | None = None, plot: Path | None = None, prepared_dir: str | Path = "data/prepared",
             corpus: Corpus | None = None) -> dict:
    """Continue the backbone as `cell` into `out_dir` (ckpt/ persistent; model/ with the Hugging Face folder plus
    extra tables, curve.csv and metrics.json); return its final metrics. `plot`: a second copy of curve.csv.
    `corpus`: the streams if already loaded (load_corpus), else loaded from `shards_dir` or `prepared_dir`.
    `table_spread_start` and `table_spread` (`table_spread` at init and at the end) say whether separate tables
    moved apart; on the parity corpus the answer token's loss and accuracy are in too."""
    start_time, tc, out_dir = time.perf_counter(), probe.cell_train(hd, cell), Path(out_dir)
    tokenizer = backbone_tokenizer(hd)  # None: the vocabulary size check alone
    corpus = corpus or load_corpus(hd, cell, shards_dir, prepared_dir, tokenizer)
    shards, task = corpus.shards, probe.task_of(hd, cell)
    placement.set_torch_threads(tc.threads)
    device = device_of(tc.accelerator)
    cfg: HiddenDecodingModelConfig = hd.model(cell)
    L.seed_everything(seed, verbose=False)  # a random backbone and the extra tables' noise: functions of the seed
    model = from_source(hd.source, cfg, device, shards.vocab_size).train()  # Lightning keeps a module's mode
    spread_start = table_spread(model)  # before a resumed checkpoint's weights: the init's noise
    # Data checks before the checkpoint folder is claimed: a run that fails them leaves it as it was.
    check_vocab(model, shards.vocab_size, tokenizer if not hd.uses_text() else None)
    check_windows(len(shards.train), len(shards.val), seq_len=tc.seq_len, val_tokens=tc.val_tokens)
    total = cell_steps(hd, cell, model.backbone.config, len(shards.train))
    tokens_per_step, fpt = tc.batch_size * tc.seq_len, model.flops_per_token(tc.seq_len)
    facts = {"n_streams": cfg.n_streams, "attention": cfg.attention, "mixing_layers": sorted(model.mixing_layers),
             "local_layers": sorted(model.local_layers), "flops_per_token": fpt, "params": model.num_params()}
    if total == 0:
        return _forward_only(model, shards, tc, out_dir, plot, facts | (
            probe.answer_metrics(model, task, shards, tc) if task else {}), start_time)
    module = (TokenDataModule if task is None else partial(probe.BlockDataModule, task))
    datamodule = module(shards, tc.model_copy(update={"max_steps": total}), stream_seed(hd, seed))
    chash = config_hash(hd, cell, seed, total, corpus)
    resume = claim_ckpt_dir(out_dir / "ckpt", chash, run.run_id if run is not None else None, tc.keep_stale)
    peak = (tc.peak_flops or peak_flops(PRECISION_DTYPE[tc.precision], device)) * tc.devices

    own = {"extra_embeds.": hd.cells[cell].table_lr, "mix_gates.": hd.cells[cell].gate_lr}
    lit = LitLM(model, optimizer=tc.optimizer, scale=ScaleConfig(), schedule=tc.schedule, total_steps=total,
                accumulate=tc.accumulate, grad_clip=tc.grad_clip,
                own_lr=(lambda name: own.get(name.split(".")[0] + ".")) if any(own.values()) else None)
    warmup = [TableWarmup(hd.cells[cell].table_warmup)] if hd.cells[cell].table_warmup else []
    loop = train(lit, datamodule, machine=Machine(tc.accelerator, tc.devices, tc.num_nodes, "auto", tc.precision),
                 out_dir=out_dir, name=f"hidden_decoding@{cell}-{seed}", total=total, tokens_per_step=tokens_per_step,
                 flops_per_token=fpt, peak_flops=peak, val_every=tc.val_every, ckpt_every=tc.ckpt_every,
                 log_every=tc.log_every, run=run, resume=resume, before_curve=[StartValidation()],
                 after_curve=warmup)

    curve, times = loop.curve, loop.throughput.times
    mixing = mixing_check(lit, model, datamodule.val_share()) if cfg.n_streams > 1 and not model.local_layers else {}
    step_time = statistics.median(times) if times else None
    trained = [r[2] for r in curve.rows[-10:] if r[2] is not None]
    metrics = {
        "val_loss": curve.last("val_loss"),  # last stream, the fixed validation windows
        "val_loss_start": curve.rows[0][3] if curve.rows and curve.rows[0][0] == 0 else None,
        "train_loss": statistics.fmean(trained) if trained else None, **facts,
        "steps": lit.step, "tokens": lit.step * tokens_per_step, "flops": fpt * lit.step * tokens_per_step,
        "step_time_s": step_time, "tokens_per_s": tokens_per_step / step_time if step_time else None,
        "peak_mem_mb": peak_mem_mb(device), "table_spread_start": spread_start, "table_spread": table_spread(model),
        "gate_mean": gate_mean(model), **mixing,
        "passes": lit.step * tokens_per_step / len(shards.train), "backbone_run": backbone_run(hd),
        **(probe.answer_metrics(model, task, shards, tc) if task is not None else {}),
        "wall_s": time.perf_counter() - start_time,
    }
    write_model(loop, out_dir, lambda tmp: save_hidden_decoding(model, tmp, tokenizer), metrics)
    if loop.trainer.is_global_zero and plot is not None:
        plot.parent.mkdir(parents=True, exist_ok=True)
        curve.write_csv(plot)
    return metrics


def mixing_check(lit: LitLM, model: HiddenDecodingLM, batches) -> dict:
    """The trained model's validation loss with its cross-stream mixing on and switched off (HiddenDecodingLM.
    mixing_off), on the same windows: the premise that the mixing acts reads their difference per seed."""
    on = lit.evaluate(batches)
    with model.mixing_off():
        off = lit.evaluate(batches)
    return {"val_loss_mixing_on": on, "val_loss_mixing_off": off}


def _forward_only(model: HiddenDecodingLM, shards: Shards, tc, out_dir: Path, plot: Path | None, facts: dict,
                  start_time: float) -> dict:
    """A cell that trains nothing: its model at step 0 on the validation windows, the loss of each window kept
    (equal windows: their mean is the token-weighted loss). Its model/ folder holds the metrics and the one-row
    curve, no weights: the model is its source and its seed."""
    device = next(model.parameters()).device
    batches = [(x.to(device), y.to(device))
               for x, y in val_batches(shards.val, seq_len=tc.seq_len, val_tokens=tc.val_tokens,
                                       batch_size=tc.batch_size)]
    losses = window_losses(model, batches)
    loss = statistics.fmean(losses)
    metrics = {"val_loss": loss, "val_loss_start": loss, "val_window_losses": losses, "train_loss": None, **facts,
               "steps": 0, "tokens": 0, "flops": 0.0, "table_spread_start": table_spread(model),
               "table_spread": table_spread(model), "wall_s": time.perf_counter() - start_time}
    curve = MetricsFile(0, 1, 0)
    curve.rows = [[0, 0, None, loss, None]]
    with atomic_dir(out_dir / "model") as tmp:
        curve.write_csv(tmp / "curve.csv")
        write_json_atomic(tmp / "metrics.json", metrics)
    if plot is not None:
        plot.parent.mkdir(parents=True, exist_ok=True)
        curve.write_csv(plot)
    return metrics


def resume_run_id(hd: HiddenDecodingConfig, cell: str, seed: int, out_dir: str | Path, corpus: Corpus,
                  backbone_config) -> str | None:
    """The MLflow run to reopen: that of a resumable checkpoint of this cell under the same config hash."""
    chash = config_hash(hd, cell, seed, cell_steps(hd, cell, backbone_config, len(corpus.shards.train)), corpus)
    return stored_run_id(out_dir, chash)
