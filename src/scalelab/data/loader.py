"""Deterministic batches from verified token shards.

The global training batch is a pure function of (seed, step), so a resumed run sees exactly the batches it would
have seen, and DDP rank r takes rows r::world_size of that same global batch.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from scalelab.data import DataError
from scalelab.data.shards import file_sha256


@dataclass
class Shards:
    train: np.memmap
    val: np.memmap
    vocab_size: int
    eot_id: int
    meta: dict


def _verified_memmap(shard_dir: Path, name: str, entry: dict, dtype: np.dtype) -> np.memmap:
    path = shard_dir / entry["file"]
    if not path.is_file():
        raise DataError(f"shard {name} is missing: {path} (rerun the tokenize stage)")
    size = path.stat().st_size
    if size != entry["bytes"]:
        what = "truncated" if size < entry["bytes"] else "longer than recorded"
        raise DataError(f"shard {path} is {what}: size {size} bytes, meta.json says {entry['bytes']}")
    if (digest := file_sha256(path)) != entry["sha256"]:
        raise DataError(f"shard {path} was altered: sha256 {digest} differs from meta.json's {entry['sha256']}")
    if size == 0:
        raise DataError(f"shard {path} is empty")
    return np.memmap(path, dtype=dtype, mode="r")


def open_shards(shard_dir: str | os.PathLike) -> Shards:
    """Open train/val memmaps after checking each shard's byte size and sha256 against meta.json."""
    shard_dir = Path(shard_dir)
    meta_path = shard_dir / "meta.json"
    if not meta_path.is_file():
        raise DataError(f"no meta.json in {shard_dir} (run the tokenize stage first)")
    meta = json.loads(meta_path.read_text())
    missing = {"train", "val"} - set(meta.get("shards", {}))
    if missing:
        raise DataError(f"{meta_path} lists no {sorted(missing)} shard")
    dtype = np.dtype(meta["dtype"])
    train, val = (_verified_memmap(shard_dir, name, meta["shards"][name], dtype) for name in ("train", "val"))
    top = max(int(train.max()), int(val.max()), meta["eot_id"])  # an id past the embedding fails mid-training
    if top >= meta["vocab_size"]:
        raise DataError(f"{meta_path}: token id {top} is not below vocab_size {meta['vocab_size']}: meta.json does not "
                        "match its shards (rerun the tokenize stage)")
    return Shards(train=train, val=val, vocab_size=meta["vocab_size"], eot_id=meta["eot_id"], meta=meta)


def _windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x = tokens[s : s+T], y = tokens[s+1 : s+T+1] for every start s, as int64 tensors."""
    buf = torch.from_numpy(tokens[starts[:, None] + np.arange(seq_len + 1)].astype(np.int64))
    return buf[:, :-1], buf[:, 1:]


def train_batch(tokens: np.ndarray, *, seed: int, step: int, batch_size: int, seq_len: int, rank: int = 0,
                world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s rows (r::world_size) of the global batch of `batch_size` random windows drawn from (seed, step)."""
    if batch_size % world_size or not 0 <= rank < world_size:
        raise ValueError(f"batch_size {batch_size} must split evenly over world_size {world_size} (rank {rank})")
    if len(tokens) <= seq_len:
        raise DataError(f"train shard has {len(tokens)} tokens: too few for seq_len {seq_len}")
    rng = np.random.Generator(np.random.PCG64([seed, step]))
    starts = rng.integers(0, len(tokens) - seq_len, size=batch_size)
    return _windows(tokens, starts[rank::world_size], seq_len)


def val_batches(tokens: np.ndarray, *, seq_len: int, val_tokens: int,
                batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed, non-overlapping windows from the start of the val shard covering min(val_tokens, available) tokens."""
    n_windows = min(val_tokens, len(tokens) - 1) // seq_len
    if n_windows == 0:
        raise DataError(f"val shard has {len(tokens)} tokens: too few for one window of seq_len {seq_len} "
                        f"(val_tokens {val_tokens})")
    starts = np.arange(n_windows) * seq_len
    return [_windows(tokens, starts[i : i + batch_size], seq_len) for i in range(0, n_windows, batch_size)]
