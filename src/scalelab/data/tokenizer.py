"""Tokenizer: byte-level BPE trained on the train split, or an existing tokenizer.json (file or hub)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from scalelab.config import TokenizerConfig
from scalelab.data import DataError
from scalelab.data.shards import PIECE_CHARS, batched, pieces, utf8_len
from scalelab.runtime.log import Every, progress

log = logging.getLogger(__name__)


def train_bpe(texts: Iterable[str], *, vocab_size: int, min_frequency: int, eot_token: str,
              length: int | None = None) -> Tokenizer:
    """GPT-2-style byte-level BPE: every byte is in the alphabet, so any text round-trips exactly.

    `texts` streams (the trainer keeps word counts, not text); documents longer than PIECE_CHARS go in pieces cut
    where the pre-tokenizer splits anyway, so one huge document never sits in the trainer whole."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[eot_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    length = length if length is not None else _len(texts)
    if length is not None:  # the documents read, with an ETA (the merges that follow report nothing)
        texts = progress(texts, "tokenizer: reading", total=length, unit="docs", logger=log)
    stream = (piece for text in texts for piece in (pieces(text) if len(text) > PIECE_CHARS else (text,)))
    tok.train_from_iterator(stream if length is not None else _progress(stream), trainer=trainer, length=length)
    return tok


def _progress(stream: Iterable[str]) -> Iterator[str]:
    """`stream` as is, with a log line every few seconds of the trainer's reading pass (its merges follow)."""
    tick, n, chars = Every(), 0, 0
    for text in stream:
        n, chars = n + 1, chars + len(text)
        if tick():
            log.info("tokenizer: read %s pieces, %.1f M characters, %.1f M/s", f"{n:,}", chars / 1e6,
                     chars / 1e6 / tick.elapsed())
        yield text


def _len(texts: Iterable[str]) -> int | None:
    return len(texts) if hasattr(texts, "__len__") else None


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"tokenizer file not found: {path}")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:
        raise DataError(f"{path} is not a loadable tokenizer.json: {err}") from err


def _hub_tokenizer(hub_id: str) -> Tokenizer:
    """tokenizer.json of a hub repo via huggingface_hub (honours HF_HUB_OFFLINE and the local cache)."""
    from huggingface_hub import hf_hub_download

    try:
        return load_tokenizer(hf_hub_download(hub_id, "tokenizer.json"))
    except Exception as err:
        hint = (" HF_HUB_OFFLINE is set (scalelab's offline default): set HF_HUB_OFFLINE=0 on a machine with network "
                "access, or use tokenizer.kind file" if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") else "")
        raise DataError(f"cannot load tokenizer.json of hub repo {hub_id!r}: {type(err).__name__}: {err}.{hint}") \
            from err


def eot_id(tok: Tokenizer, eot_token: str) -> int:
    """The id of the end-of-text token that separates documents in the shards."""
    idx = tok.token_to_id(eot_token)
    if idx is None:
        raise DataError(f"the tokenizer has no end-of-text token {eot_token!r}; set tokenizer.eot_token to its "
                        "document separator (e.g. '<|endoftext|>' or '</s>')")
    return idx


def build_tokenizer(cfg: TokenizerConfig, train_texts: Iterable[str], length: int | None = None) -> Tokenizer:
    """The configured tokenizer; checked to contain the EOT token. `train_texts` may stream (`length`: their count,
    for the trainer's progress estimate)."""
    if cfg.kind == "bpe":
        tok = train_bpe(train_texts, vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency,
                        eot_token=cfg.eot_token, length=length)
    elif cfg.kind == "file":
        tok = load_tokenizer(cfg.path)
    else:
        tok = _hub_tokenizer(cfg.hub_id)
    eot_id(tok, cfg.eot_token)
    return tok


def bytes_per_token(tok: Tokenizer, texts: Iterable[str], batch_size: int = 256) -> float:
    """UTF-8 bytes per token: the compression the tokenizer achieves (higher is better); `texts` may stream."""
    n_bytes = n_tokens = 0
    for batch in batched((p for t in texts for p in (pieces(t) if len(t) > PIECE_CHARS else (t,))), batch_size):
        n_tokens += sum(len(e.ids) for e in tok.encode_batch_fast(batch, add_special_tokens=False))
        n_bytes += sum(map(utf8_len, batch))
    return n_bytes / max(n_tokens, 1)
