"""One cell of the compression matrix: a model, a method, a kept fraction and a calibration seed (METHODS §D).

Loads the model named in params (a pretrain cell's Hugging Face export or any Llama/Qwen3 causal LM), calibrates on
train windows drawn from the seed, compresses, measures perplexity on the fixed validation windows (dense and
compressed, same windows), and saves the compressed checkpoint with its tokenizer. Every input is checked before the
first forward pass.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from scalelab.runtime import placement
from scalelab.compress.calibrate import calibration_batches, decoder_linears
from scalelab.compress.compressor import LayerRecord, compress_model
from scalelab.compress.data import Streams, from_shards, from_text
from scalelab.compress.lowrank import num_params, save_lowrank
from scalelab.config.compress import CompressConfig
from scalelab.data import DataError
from scalelab.data.loader import val_batches
from scalelab.model.hf import ModelLoadError, load_causal_lm, load_hf_tokenizer, mean_nll

SHARDS, PREPARED = Path("data/tokens"), Path("data/prepared")


def device(cfg: CompressConfig) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise DataError("compress.device is 'cuda' but no CUDA device is available")
    return torch.device(cfg.device)


def streams(cfg: CompressConfig, tokenizer) -> Streams:
    """The pipeline's shards for its own exports; the prepared corpus in the model's own tokens otherwise."""
    if cfg.source.cell is not None:
        return from_shards(SHARDS)
    return from_text(PREPARED, tokenizer, cfg.calibration.max_text_tokens)


def run_cell(cfg: CompressConfig, method: str, keep: str, seed: int, out_dir: str | os.PathLike,
             log: Callable[[str], None] = print) -> tuple[dict, list[LayerRecord]]:
    """Compress into `out_dir`/model; returns the cell's metrics and its per-layer records."""
    name, spec, rho = cfg.cell(method, keep, seed), cfg.methods[method], float(keep)
    dev = device(cfg)
    placement.set_torch_threads(cfg.threads)
    location = cfg.source.location()
    try:
        tokenizer = load_hf_tokenizer(location)
        model = load_causal_lm(location, cfg.source.dtype, dev)
    except ModelLoadError as err:
        raise DataError(str(err)) from None
    data = streams(cfg, tokenizer)
    vocab = model.get_input_embeddings().num_embeddings
    if data.vocab_size > vocab:
        raise DataError(f"{location}: embedding has {vocab} rows, the token data uses ids up to {data.vocab_size - 1} "
                        "(a different tokenizer?)")
    cal, ev = cfg.calibration, cfg.eval
    calib = calibration_batches(data.train, samples=cal.samples, seq_len=cal.seq_len, batch_size=cal.batch_size,
                                seed=seed)
    val = val_batches(data.val, seq_len=ev.seq_len, val_tokens=ev.val_tokens, batch_size=ev.batch_size)
    dense_nll, dense_params = mean_nll(model, val), num_params(model)
    dense_linear = sum(model.get_submodule(n).weight.numel() for b in decoder_linears(model) for n in b)

    start = time.perf_counter()
    records, refined = compress_model(model, calib, spec, rho, sigma_cfg=cfg.sigmascale, allocation=cfg.allocation,
                                      refine_cfg=cfg.refine, blocks_per_pass=cal.blocks_per_pass, seed=seed,
                                      log=lambda s: log(f"{name}: {s}"))
    seconds = time.perf_counter() - start
    val_nll, calib_nll = mean_nll(model, val), mean_nll(model, calib)
    kept = sum(r.m * r.n if r.rank is None else r.rank * (r.m + r.n) for r in records)
    rel = [r.loss_rel_svd_llm for r in records if r.loss_rel_svd_llm is not None]
    out = Path(out_dir) / "model"
    save_lowrank(model, out, tokenizer)
    metrics = {
        "cell": name, "method": method, "kind": spec.kind, "keep": rho, "seed": seed, "source": location,
        "val_nll": val_nll, "ppl": math.exp(val_nll), "val_nll_dense": dense_nll, "ppl_dense": math.exp(dense_nll),
        "calib_nll": calib_nll, "params": num_params(model), "params_dense": dense_params,
        "linear_weights_kept": kept / dense_linear,
        # geometric mean over compressed layers of loss / SVD-LLM's optimum (1 = optimal layer-wise)
        "loss_rel_svd_llm": math.exp(sum(map(math.log, rel)) / len(rel)) if rel else None,
        "seconds": seconds, "seconds_factorize": sum(r.seconds for r in records),
        "calib_tokens": cal.samples * cal.seq_len, "val_tokens": sum(y.numel() for _, y in val), **refined,
    }
    return metrics, records
