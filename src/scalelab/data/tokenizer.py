"""Tokenizer: byte-level BPE trained on the train split, or an existing tokenizer.json (file or hub)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from scalelab.config import TokenizerConfig
from scalelab.data import DataError


def train_bpe(texts: Sequence[str], *, vocab_size: int, min_frequency: int, eot_token: str) -> Tokenizer:
    """GPT-2-style byte-level BPE: every byte is in the alphabet, so any text round-trips exactly."""
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
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


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


def build_tokenizer(cfg: TokenizerConfig, train_texts: Sequence[str]) -> Tokenizer:
    """The configured tokenizer; checked to contain the EOT token."""
    if cfg.kind == "bpe":
        tok = train_bpe(train_texts, vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency,
                        eot_token=cfg.eot_token)
    elif cfg.kind == "file":
        tok = load_tokenizer(cfg.path)
    else:
        tok = _hub_tokenizer(cfg.hub_id)
    eot_id(tok, cfg.eot_token)
    return tok


def bytes_per_token(tok: Tokenizer, texts: Sequence[str]) -> float:
    """UTF-8 bytes per token: the compression the tokenizer achieves (higher is better)."""
    n_tokens = sum(len(e.ids) for e in tok.encode_batch_fast(list(texts), add_special_tokens=False))
    return sum(len(t.encode()) for t in texts) / max(n_tokens, 1)
