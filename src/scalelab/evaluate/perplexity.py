"""Perplexity on the fixed validation windows, and what a forward pass costs (timed on those same passes).

A model that shares the project's tokenizer is scored on exactly the windows the pretrain stage validates on
(`scalelab.data.loader.val_batches` over data/tokens), so its `val_loss` here equals the training-time one. A model
with another tokenizer is scored on the same validation text tokenized its own way, cut into windows the same way.
Nats per token are not comparable across tokenizers, so bits per byte are reported too:
    bpb = Σ CE (nats) / (ln 2 · Σ UTF-8 bytes of the predicted tokens).
"""

from __future__ import annotations

import logging
import math
import resource
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from scalelab.data import DataError
from scalelab.evaluate.lm import EvalLM
from scalelab.runtime.log import progress

log = logging.getLogger(__name__)

Batches = list[tuple[torch.Tensor, torch.Tensor]]


def same_tokenizer(lm: EvalLM, tokenizer_json: str | Path) -> bool:
    """True when the model's vocabulary is the project tokenizer's, id for id."""
    from tokenizers import Tokenizer

    return lm.tokenizer.get_vocab() == Tokenizer.from_file(str(tokenizer_json)).get_vocab()


def val_windows(lm: EvalLM, *, shards_dir: str | Path, val_text: list[str], tokenizer_json: str | Path,
                seq_len: int, val_tokens: int, batch_size: int) -> tuple[Batches, str]:
    """The validation batches for `lm` and where they come from ("shards" or "retokenized")."""
    from scalelab.data.loader import open_shards, val_batches

    seq_len = min(seq_len, lm.max_len)
    if same_tokenizer(lm, tokenizer_json):
        tokens, source = open_shards(shards_dir).val, "shards"
    else:  # documents joined as the tokenize stage joins them: each one followed by the end-of-text token
        eos = lm.tokenizer.eos_token_id
        ids: list[int] = []
        for doc in val_text:
            ids += lm.encode(doc) + ([eos] if eos is not None else [])
        tokens, source = np.asarray(ids, dtype=np.int64), "retokenized"
    return val_batches(tokens, seq_len=seq_len, val_tokens=val_tokens, batch_size=batch_size), source


def timed_logits(lm: EvalLM, x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The logits of `x` and the forward's wall seconds (the GPU synchronised on both sides)."""
    if lm.device.type == "cuda":
        torch.cuda.synchronize(lm.device)
    start = time.perf_counter()
    logits = lm.logits(x)
    if lm.device.type == "cuda":
        torch.cuda.synchronize(lm.device)
    return logits, time.perf_counter() - start


def perplexity(lm: EvalLM, batches: Batches, times: list[float] | None = None) -> dict[str, float]:
    """Token-weighted mean cross-entropy over the windows (as the pretrain stage's val/loss), its exp, and bpb; each
    batch's forward seconds appended to `times` (the throughput's samples)."""
    nats, tokens, n_bytes = 0.0, 0, 0
    for x, y in progress(batches, "evaluate perplexity", unit="batches", logger=log):  # minutes on a real model
        logits, seconds = timed_logits(lm, x)
        if times is not None:
            times.append(seconds)
        nats += float(F.cross_entropy(logits.flatten(0, 1), y.to(lm.device).flatten(), reduction="sum"))
        tokens += y.numel()
        # special tokens (end of text) carry no bytes of text
        n_bytes += sum(len(lm.tokenizer.decode(row, skip_special_tokens=True).encode()) for row in y.tolist())
    if tokens == 0:
        raise DataError("no validation tokens to score")
    loss = nats / tokens
    return {"val_loss": loss, "ppl": math.exp(loss), "bpb": nats / (math.log(2) * max(n_bytes, 1)),
            "val_tokens": tokens}


def peak_memory_mb(device: torch.device) -> float:
    """The process's peak memory: CUDA's max allocated on a GPU; on CPU the peak resident set (ru_maxrss, KiB on
    Linux), which includes the Python runtime and libraries, not only the model."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def throughput(lm: EvalLM, batches: Batches, repeats: int, times: Sequence[float] = ()) -> dict[str, Any]:
    """Forward tokens/s (inference mode): the median of `repeats` timed forward passes of batches shaped like the
    first, after a warm-up pass. `times` are passes already timed, one per batch (the perplexity pass: its first is
    the warm-up), read first; passes over the first batch make up the rest. And the process's peak memory so far."""
    x = batches[0][0]
    timed = [t for t, (b, _) in zip(times, batches) if b.shape == x.shape][1: repeats + 1]
    if len(timed) < repeats and not times:
        lm.logits(x)  # warm-up: lazy init, allocator, kernels
    timed += [timed_logits(lm, x)[1] for _ in range(repeats - len(timed))]
    return {"tokens_per_s": x.numel() / float(np.median(timed)), "peak_mem_mb": peak_memory_mb(lm.device),
            "forward_batch": list(x.shape)}
