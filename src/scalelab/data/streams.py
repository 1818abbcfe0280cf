"""The token streams a compressed model is calibrated and evaluated on, in that model's own vocabulary.

A pretrain cell's export uses the pipeline's tokenizer, so its streams are the checksummed shards of the tokenize
stage (data/tokens). Any other causal LM brings its own tokenizer: the prepared corpus text (data/prepared, the same
documents and the same train/val split) is encoded with it, documents joined by its EOS token. Either way calibration
reads only `train`; `val` is kept for the fixed evaluation windows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scalelab.data import DataError, read_prepared
from scalelab.data.shards import encode_joined, shard_dtype

CHARS_PER_TOKEN = 8  # generous: read this many characters per wanted token before encoding, then cut


@dataclass
class Streams:
    train: np.ndarray
    val: np.ndarray
    vocab_size: int  # token ids lie below this


def from_shards(shard_dir: str | os.PathLike) -> Streams:
    from scalelab.data.loader import open_shards

    shards = open_shards(shard_dir)
    return Streams(shards.train, shards.val, shards.vocab_size)


def _encode(tokenizer, texts: list[str], max_tokens: int) -> np.ndarray:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise DataError(f"{type(tokenizer).__name__}: needs a fast (Rust) tokenizer to encode the corpus")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DataError("the model's tokenizer has no eos token to join documents with")
    taken, chars = [], 0
    for t in texts:  # in order: the same prefix of the split for every cell
        taken.append(t)
        chars += len(t)
        if chars >= CHARS_PER_TOKEN * max_tokens:
            break
    ids = encode_joined(backend, taken, eot_id=eos, dtype=shard_dtype(len(tokenizer)), lead_eot=False)
    return ids[:max_tokens]


def hub_texts(split) -> list[str]:
    """The documents of a hub dataset split (`scalelab.config.compress.HubSplit`), in order, empty lines dropped."""
    from datasets import load_dataset

    try:
        ds = load_dataset(split.hub_id, split.hub_config, split=split.hub_split, revision=split.hub_revision)
    except Exception as err:  # offline and not cached, unknown id or split: one line naming it
        raise DataError(f"compress.eval.hub: cannot read {split.hub_id}/{split.hub_config}:{split.hub_split} "
                        f"({type(err).__name__}: {err})") from None
    return [t for t in ds[split.text_column] if t.strip()]


def from_text(prepared_dir: str | os.PathLike, tokenizer, max_tokens: int, eval_split=None) -> Streams:
    """Encode the first `max_tokens` tokens of each prepared split with the model's tokenizer; with `eval_split`
    (a HubSplit) the evaluation stream is that whole split instead (the papers' WikiText-2 test), never capped."""
    prepared_dir = Path(prepared_dir)
    train = _encode(tokenizer, read_prepared(prepared_dir, "train"), max_tokens)
    if eval_split is None:
        val = _encode(tokenizer, read_prepared(prepared_dir, "val"), max_tokens)
    else:
        texts = hub_texts(eval_split)
        val = _encode(tokenizer, texts, sum(len(t) + 1 for t in texts))  # ≥ its token count: all of it
    return Streams(train, val, len(tokenizer))
