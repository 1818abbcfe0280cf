"""Every cell of one calibration seed: each method × kept fraction of the grid on one model.

Loads the model named in params (a pretrain cell's Hugging Face export or any Llama/Qwen3 causal LM), draws the
calibration windows from the seed, calibrates once (shared.py) and measures the dense model once, then compresses a
copy per cell, measures its perplexity on the fixed validation windows (the dense model's windows) and its forward
speed, and optionally saves its checkpoint. Every input is checked before the first forward pass.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import shutil
import time
from pathlib import Path

import torch

from scalelab.runtime import placement
from scalelab.compress.calibrate import calibration_batches, decoder_linears
from scalelab.compress.compressor import LayerRecord, compress_model
from scalelab.data.streams import Streams, from_shards, from_text
from scalelab.compress.lowrank import num_params, save_lowrank
from scalelab.compress import keys
from scalelab.compress.keys import digest
from scalelab.compress.shared import Calibration
from scalelab.compress.store import Store
from scalelab.config.compress import CompressConfig
from scalelab.data import DataError
from scalelab.data.loader import val_batches
from scalelab.model.hf import ModelLoadError, load_causal_lm, load_hf_tokenizer, mean_nll

SHARDS, PREPARED = Path("data/tokens"), Path("data/prepared")
log = logging.getLogger(__name__)


def device(cfg: CompressConfig) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise DataError("compress.device is 'cuda' but no CUDA device is available")
    return torch.device(cfg.device)


def streams(cfg: CompressConfig, tokenizer, prepared: str | os.PathLike | None = None) -> Streams:
    """The pipeline's shards for its own exports; the prepared corpus (`prepared`, default the prepare stage's out)
    in the model's own tokens otherwise (and the evaluation split named in compress.eval.hub, when set)."""
    if cfg.source.cell is not None:
        return from_shards(SHARDS)
    return from_text(Path(prepared or PREPARED), tokenizer, cfg.calibration.max_text_tokens, cfg.eval.hub)


def measured(model: torch.nn.Module, batches) -> dict:
    """Validation NLL with the forward pass's speed: tokens/s over the evaluation windows, the weights' bytes and,
    on CUDA, the peak memory allocated during the pass."""
    dev = next(model.parameters()).device
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    start = time.perf_counter()
    with torch.no_grad():
        nll = mean_nll(model, batches)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - start
    tokens = sum(y.numel() for _, y in batches)
    params = {id(p): p for p in model.parameters()}.values()
    return {"val_nll": nll, "tokens_per_s": tokens / seconds, "weight_bytes": sum(p.numel() * p.element_size()
                                                                               for p in params),
            "peak_memory_bytes": torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None}


def allocation_metrics(records: list[LayerRecord], shared: Calibration, cfg: CompressConfig, kind: str) -> dict:
    """What a cell's ranks were: their digest (equal digests: equal ranks on every map) and, for the sensitivity
    allocation, what the probe cost and whether its table was read from the store."""
    out = {"ranks_digest": digest({r.name: r.rank for r in records})[:16]}
    info = shared.sensitivity_info.get((tuple(cfg.allocation.ratios), cfg.allocation.samples))
    if kind == "sensitivity" and info is not None:
        out |= {"sensitivity_seconds": info["seconds"], "sensitivity_stored": info["stored"],
                "sensitivity_ratios": list(cfg.allocation.ratios), "sensitivity_samples": cfg.allocation.samples}
    return out


def part_key(cfg: CompressConfig, method: str, keep: float, seed: int, identity: dict, val_tokens: str) -> dict:
    """Everything one (method, ρ) part of a seed's cell depends on (store.py's parts): the model and calibration
    windows (`identity`), the evaluation windows, the method and the settings it reads."""
    spec = cfg.methods[method]
    kind = spec.allocation or cfg.allocation.kind
    return {"kind": "part", "version": keys.VERSION, **identity, "val": val_tokens, "seed": seed, "keep": keep,
            "method": spec.model_dump(mode="json"), "eval": cfg.eval.model_dump(mode="json"),
            "sigmascale": cfg.sigmascale.model_dump(mode="json") if spec.kind == "sigmascale" else None,
            "allocation": cfg.allocation.model_dump(mode="json") if kind != "uniform" and keep < 1 else None,
            "refine": cfg.refine.model_dump(mode="json") if spec.refine != "none" else None}


def run_seed(cfg: CompressConfig, seed: int, out_dir: str | os.PathLike,
             store: str | os.PathLike | None = None, *, optimise: bool = True,
             prepared: str | os.PathLike | None = None) -> list[tuple[dict, list[LayerRecord]]]:
    """Every (method, kept fraction) cell of the grid at calibration seed `seed`; saved checkpoints (when
    compress.save_models) go to `out_dir`/<cell>/model. Returns each cell's metrics and per-layer records.
    `store` (default compress.store): the folder of reusable results (store.py); `optimise=False` freezes it (a
    SigmaScale map it lacks is store.MissingScalings, never optimised). `prepared`: the prepared corpus (`streams`)."""
    store = store if store is not None else cfg.store
    if store is None and not optimise:
        raise ValueError("run_seed(optimise=False) answers from a store's scalings: name the store")
    results_store = Store(store, frozen=not optimise) if store is not None else None
    dev = device(cfg)
    placement.set_torch_threads(cfg.threads)
    location = cfg.source.location()
    try:
        tokenizer = load_hf_tokenizer(location)
        model = load_causal_lm(location, cfg.source.dtype, dev)
    except ModelLoadError as err:
        raise DataError(str(err)) from None
    data = streams(cfg, tokenizer, prepared)
    vocab = model.get_input_embeddings().num_embeddings
    if data.vocab_size > vocab:
        raise DataError(f"{location}: embedding has {vocab} rows, the token data uses ids up to {data.vocab_size - 1} "
                        "(a different tokenizer?)")
    cal, ev = cfg.calibration, cfg.eval
    available = len(data.val) - 1
    if ev.val_tokens is not None and ev.val_tokens > available:
        raise DataError(f"compress.eval.val_tokens is {ev.val_tokens} but the evaluation split has only {available} "
                        "tokens (set it lower, or null for the whole split)")
    calib = calibration_batches(data.train, samples=cal.samples, seq_len=cal.seq_len, batch_size=cal.batch_size,
                                seed=seed)
    val = val_batches(data.val, seq_len=ev.seq_len, val_tokens=ev.val_tokens or available, batch_size=ev.batch_size)
    dense = measured(model, val)
    dense_calib_nll = mean_nll(model, calib) if ev.calib_nll else None
    dense_params = num_params(model)
    dense_linear = sum(model.get_submodule(n).weight.numel() for b in decoder_linears(model) for n in b)
    log.info("seed %d: dense ppl %.3f on %d tokens, %.0f tokens/s", seed, math.exp(dense["val_nll"]),
             sum(y.numel() for _, y in val), dense["tokens_per_s"])

    out = Path(out_dir)
    spill = out / ".calibration" if cal.blocks_per_pass else None
    kinds = {cfg.methods[m].kind for m in cfg.grid.methods}
    try:
        shared = Calibration(model, calib, blocks_per_pass=cal.blocks_per_pass, fisher="fwsvd" in kinds, spill=spill)
        log.info("seed %d: calibrated on %d tokens in %.1f s", seed, cal.samples * cal.seq_len, shared.seconds)
        results = []
        for method in (m for m in cfg.grid.methods if cfg.runs_at(m, seed)):
            spec = cfg.methods[method]
            for keep in cfg.grid.keep:
                name = cfg.cell(method, str(keep), seed)
                # a part a stopped slice of this cell finished is read back, not recomputed (not when its model is
                # to be saved: the store keeps numbers, never checkpoints)
                key = None if results_store is None or cfg.save_models else \
                    part_key(cfg, method, keep, seed, shared.identity(model), keys.tokens_fingerprint(val))
                if key is not None and (hit := results_store.get_part(key)) is not None:
                    metrics, rows = hit
                    log.info("%s: read back from the store (ppl %.3f)", name, metrics["ppl"])
                    results.append(({**metrics, "cell": name, "source": location, "part_stored": True},
                                    [LayerRecord.from_json(r) for r in rows]))
                    continue
                student = copy.deepcopy(model)
                start = time.perf_counter()
                records, refined = compress_model(student, shared, spec, keep, sigma_cfg=cfg.sigmascale,
                                                  allocation=cfg.allocation, refine_cfg=cfg.refine, seed=seed,
                                                  store=results_store, held=val,
                                                  log_line=lambda s, name=name: log.info("%s: %s", name, s))
                seconds = time.perf_counter() - start
                after = measured(student, val)
                kept = sum(r.m * r.n if r.rank is None else r.rank * (r.m + r.n) for r in records)
                rel = [r.loss_rel_svd_llm for r in records if r.loss_rel_svd_llm is not None]
                steps = [r.info for r in records if "stop" in r.info]
                if cfg.save_models:
                    save_lowrank(student, out / name / "model", tokenizer)
                metrics = {
                    "cell": name, "method": method, "kind": spec.kind, "keep": keep, "seed": seed, "source": location,
                    "allocation": spec.allocation or cfg.allocation.kind,
                    "val_nll": after["val_nll"], "ppl": math.exp(after["val_nll"]), "val_nll_dense": dense["val_nll"],
                    "ppl_dense": math.exp(dense["val_nll"]),
                    "calib_nll": mean_nll(student, calib) if ev.calib_nll else None, "calib_nll_dense": dense_calib_nll,
                    "params": num_params(student), "params_dense": dense_params,
                    "linear_weights_kept": kept / dense_linear,
                    # geometric mean over compressed layers of loss / SVD-LLM's optimum (1 = optimal layer-wise)
                    "loss_rel_svd_llm": math.exp(sum(map(math.log, rel)) / len(rel)) if rel else None,
                    "seconds": seconds, "seconds_factorize": sum(r.seconds for r in records),
                    "seconds_calibration": shared.seconds,
                    "tokens_per_s": after["tokens_per_s"], "tokens_per_s_dense": dense["tokens_per_s"],
                    "weight_bytes": after["weight_bytes"], "weight_bytes_dense": dense["weight_bytes"],
                    "peak_memory_bytes": after["peak_memory_bytes"],
                    "peak_memory_bytes_dense": dense["peak_memory_bytes"],
                    "calib_tokens": cal.samples * cal.seq_len, "val_tokens": sum(y.numel() for _, y in val),
                    **allocation_metrics(records, shared, cfg, spec.allocation or cfg.allocation.kind),
                    # a SigmaScale that cannot reach its plateau by construction: a smoke run, in no claim
                    **({"smoke": True} if method in cfg.smoke() else {}),
                    **({"sigmascale_maps": len(steps), "sigmascale_plateau": sum(s["stop"] in ("plateau", "rising") for s in steps),
                        "sigmascale_steps_median": sorted(s["steps"] for s in steps)[len(steps) // 2],
                        "sigmascale_stop_rule": cfg.sigmascale.stop,
                        "sigmascale_plateau_fired": sum(s.get("plateau_step") is not None for s in steps),
                        "sigmascale_reused": sum(s.get("cache") == "hit" for s in steps),
                        # the optimisation this process ran (maps read back from the store cost none here)
                        "seconds_sigmascale_optimise": sum(s.get("seconds_optimise", 0.0) for s in steps
                                                           if s.get("cache") != "hit")}
                       if steps else {}),
                    **refined,
                }
                log.info("%s: ppl %.3f (dense %.3f), %.1f s", name, metrics["ppl"], metrics["ppl_dense"], seconds)
                if key is not None:
                    results_store.put_part(key, metrics, [r.to_json() for r in records])
                results.append((metrics, records))
                del student
        return results
    finally:
        if spill is not None:
            shutil.rmtree(spill, ignore_errors=True)
