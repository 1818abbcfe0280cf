"""Token shards: flat memmaps with EOT between documents and a meta.json with sha256 per shard, plus
the atomic-write helpers the data stages use (a failed stage leaves no partial output).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from scalelab.data import DataError
from scalelab.runtime.log import Every, Progress

log = logging.getLogger(__name__)


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


# ---------------------------------------------------------------- checks
def check_windows(train_tokens: int, val_tokens_available: int, *, seq_len: int, val_tokens: int) -> None:
    """The shards can fill pretrain's windows: a training window (seq_len + 1 tokens, the target shifted by one)
    and at least one validation window. Checked before a run claims its checkpoint folder."""
    if train_tokens <= seq_len:
        raise DataError(f"the train shard has {train_tokens} tokens: too few for one window of seq_len {seq_len} "
                        "(lower pretrain.seq_len or use a larger corpus)")
    if min(val_tokens, val_tokens_available - 1) // seq_len == 0:
        raise DataError(f"the val shard has {val_tokens_available} tokens: too few for one validation window of "
                        f"seq_len {seq_len} (pretrain.val_tokens {val_tokens}); lower pretrain.seq_len or raise "
                        "prepare.val_fraction")


# ---------------------------------------------------------------- encoding
PIECE_CHARS = 1 << 16  # longer documents are encoded in pieces (bounded memory in the tokenizer)


def shard_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 65535 else np.uint32)


def pieces(text: str, max_chars: int | None = None) -> Iterator[str]:
    """`text` in pieces of at most max_chars, each cut just before a space or newline that starts a word: where a
    byte-level BPE pre-tokenizer (GPT-2's regex) splits anyway, so the pieces' ids concatenate to the whole text's.
    Without such a point in the last 64 kB of a window, the cut falls at max_chars."""
    max_chars, start = max_chars or PIECE_CHARS, 0
    while len(text) - start > max_chars:
        cut = _cut(text, start, start + max_chars)
        yield text[start:cut]
        start = cut
    yield text[start:]


def _cut(text: str, start: int, end: int) -> int:
    """The last i in (max(start, end - 64k), end] where text[i] is a space or newline and text[i + 1] is not
    whitespace; else end."""
    lo, hi = max(start + 1, end - (1 << 16)), end + 1
    while (i := max(text.rfind(" ", lo, hi), text.rfind("\n", lo, hi))) >= 0:
        if not text[i + 1].isspace():
            return i
        hi = i
    return end


def utf8_len(text: str) -> int:
    """UTF-8 byte length without a copy of an ASCII text (the common case), piecewise otherwise."""
    return len(text) if text.isascii() else sum(len(p.encode()) for p in pieces(text))


def encoded_parts(tok: Tokenizer, texts: Sequence[str], *, eot_id: int, dtype: np.dtype,
                  lead_eot: bool) -> Iterator[np.ndarray]:
    """Ids of `texts` joined by EOT (with a leading EOT when a previous batch precedes this one), in parts to write
    one after the other.

    encode_batch_fast parallelises across documents in Rust; short documents go in one call and come out as one numpy
    concatenation, no per-token Python work, so the stage runs close to raw encode_batch_fast speed
    (benchmarks/tokenize.py). A document longer than PIECE_CHARS is encoded piece by piece (`pieces`), two pieces
    per call, and its parts are handed on as they come: memory stays bounded whatever one document's size.
    """
    sep = np.array([eot_id], dtype=dtype)
    need_sep = lead_eot  # EOT between documents, and before the first when a previous batch precedes this one
    short: list[str] = []

    def flush() -> list[np.ndarray]:
        nonlocal need_sep
        parts = []
        for ids in _encode(tok, short, dtype):
            parts += [sep, ids] if need_sep else [ids]
            need_sep = True
        short.clear()
        return [np.concatenate(parts)] if parts else []

    for text in texts:
        if len(text) <= PIECE_CHARS:
            short.append(text)
            continue
        yield from flush()
        if need_sep:
            yield sep
        need_sep = True
        for group in batched(pieces(text), 2):  # an Encoding costs ~80 bytes per token: small calls
            yield from _encode(tok, group, dtype)
    yield from flush()


def encode_joined(tok: Tokenizer, texts: Sequence[str], *, eot_id: int, dtype: np.dtype, lead_eot: bool) -> np.ndarray:
    """`encoded_parts` as one array."""
    parts = list(encoded_parts(tok, texts, eot_id=eot_id, dtype=dtype, lead_eot=lead_eot))
    return np.concatenate(parts) if parts else np.empty(0, dtype)


def _encode(tok: Tokenizer, texts: list[str], dtype: np.dtype) -> list[np.ndarray]:
    return [np.asarray(e.ids, dtype=dtype) for e in tok.encode_batch_fast(texts, add_special_tokens=False)] \
        if texts else []


def batched(items: Iterable, n: int) -> Iterator[list]:
    """Lists of n consecutive items (the last may be shorter); itertools.batched needs Python 3.12."""
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


def write_shard(tok: Tokenizer, texts: Iterable[str], path: Path, *, eot_id: int, dtype: np.dtype,
                batch_size: int) -> dict:
    """Stream `texts` into a flat binary shard, batch by batch, hashing as it goes; returns its meta entry (with the
    UTF-8 bytes of text it encodes, for throughput and compression figures)."""
    digest, tokens, text_bytes, tick = hashlib.sha256(), 0, 0, Every()
    # texts with a length (the prepared splits): progress with an ETA; a plain stream: throughput lines
    bar = Progress(len(texts), f"tokenize {path.stem}", "docs", logger=log) if hasattr(texts, "__len__") else None
    with open(path, "wb") as f, bar or nullcontext():
        for i, batch in enumerate(batched(texts, batch_size)):
            text_bytes += sum(map(utf8_len, batch))
            for ids in encoded_parts(tok, batch, eot_id=eot_id, dtype=dtype, lead_eot=i > 0):
                f.write(ids.data)
                digest.update(ids.data)
                tokens += ids.size
            if bar is not None:
                bar.update(len(batch))
            elif tick():  # a large corpus: a line every few seconds
                log.info("%s: %s tokens from %.1f MB of text, %.1f MB/s", path.name, f"{tokens:,}", text_bytes / 1e6,
                         text_bytes / 1e6 / tick.elapsed())
    return {"file": path.name, "tokens": tokens, "bytes": path.stat().st_size, "sha256": digest.hexdigest(),
            "text_bytes": text_bytes}


def tokenize_splits(tok: Tokenizer, splits: dict[str, Iterable[str]], out_dir: str | os.PathLike, *, eot_id: int,
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
