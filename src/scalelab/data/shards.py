"""Token shards: flat memmaps with EOT between documents and a meta.json with sha256 per shard (CONTRACT
"Data outputs"), plus the atomic-write helpers the data stages use (DESIGN: a failed stage leaves no partial output).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer


# ---------------------------------------------------------------- atomic writes
@contextmanager
def atomic_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp sibling folder to fill; on success it replaces `final`, on error it is removed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    tmp.chmod(0o755)
    old = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def write_json_atomic(path: str | os.PathLike, obj: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def file_sha256(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# ---------------------------------------------------------------- encoding
def shard_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 65535 else np.uint32)


def encode_joined(tok: Tokenizer, texts: Sequence[str], *, eot_id: int, dtype: np.dtype, lead_eot: bool) -> np.ndarray:
    """Ids of `texts` joined by EOT (with a leading EOT when a previous batch precedes this one).

    encode_batch_fast parallelises across documents in Rust; the rest is one numpy concatenation, no per-token
    Python work, so the stage runs close to raw encode_batch_fast speed (benchmarks/tokenize.py).
    """
    sep = np.array([eot_id], dtype=dtype)
    parts = []
    for enc in tok.encode_batch_fast(list(texts), add_special_tokens=False):
        parts += (sep, np.asarray(enc.ids, dtype=dtype))
    return np.concatenate(parts[0 if lead_eot else 1 :]) if parts else np.empty(0, dtype)


def write_shard(tok: Tokenizer, texts: Sequence[str], path: Path, *, eot_id: int, dtype: np.dtype,
                batch_size: int) -> dict:
    """Stream `texts` into a flat binary shard, batch by batch, hashing as it goes; returns its meta entry."""
    digest, tokens = hashlib.sha256(), 0
    with open(path, "wb") as f:
        for i in range(0, len(texts), batch_size):
            ids = encode_joined(tok, texts[i : i + batch_size], eot_id=eot_id, dtype=dtype, lead_eot=i > 0)
            f.write(ids.data)
            digest.update(ids.data)
            tokens += ids.size
    return {"file": path.name, "tokens": tokens, "bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def tokenize_splits(tok: Tokenizer, splits: dict[str, Sequence[str]], out_dir: str | os.PathLike, *, eot_id: int,
                    batch_size: int, tokenizer_sha256: str) -> dict:
    """Write `<split>.bin` for every split and meta.json into out_dir; returns the meta."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_size = max(tok.get_vocab(with_added_tokens=True).values()) + 1  # ids index the embedding
    dtype = shard_dtype(vocab_size)
    shards = {name: write_shard(tok, texts, out_dir / f"{name}.bin", eot_id=eot_id, dtype=dtype,
                                batch_size=batch_size)
              for name, texts in splits.items()}
    meta = {"dtype": dtype.name, "vocab_size": vocab_size, "eot_id": eot_id, "tokenizer_sha256": tokenizer_sha256,
            "shards": shards}
    write_json_atomic(out_dir / "meta.json", meta)
    return meta
