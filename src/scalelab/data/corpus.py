"""Corpus cleaning and the train/val split, streamed in bounded memory; the prepared splits read back in batches.

Pipeline: raw documents (scalelab.data.sources) -> unicode normalization, strip -> drop
documents shorter than `min_chars` -> drop exact duplicates (keep first) -> train/val split by document hash ->
data/prepared/*.parquet.

Documents stream from the source to parquet row groups one batch at a time: memory is one batch, a few times the
largest document and 20 bytes per distinct document (the duplicate filter), not the corpus (a 200 MB corpus held
whole, as polars frames and lists, took 10x its size).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from scalelab.config import PrepareConfig
from scalelab.data import DataError
from scalelab.data.sources import TABLE_ROWS, iter_documents, source_info
from scalelab.runtime.log import Every

log = logging.getLogger(__name__)
SPLITS = ("train", "val")
BATCH_CHARS = 1 << 20  # characters per written row group: the granularity of the memory bound
SCHEMA = pa.schema([("doc_id", pa.string()), ("text", pa.large_string())])


# ---------------------------------------------------------------- cleaning and split
def text_sha1(text: str) -> bytes:
    """sha1 of the UTF-8 text, encoded piecewise: a huge document is not copied whole."""
    h = hashlib.sha1()
    for i in range(0, len(text), 1 << 22):
        h.update(text[i : i + (1 << 22)].encode())
    return h.digest()


def doc_id(text: str) -> str:
    return text_sha1(text).hex()


def hash_unit(doc_id_hex: str) -> float:
    """A document's position in [0, 1) from its sha1 (52 bits: exact in a float); < val_fraction means val."""
    return int(doc_id_hex[:13], 16) / 16**13


def clean(text: str, unicode_form: str) -> str:
    """Unicode normalization, then strip. Both return the same object when there is nothing to change (no copy)."""
    return unicodedata.normalize(unicode_form, text).strip()


class _SplitWriter:
    """Rows of one split into a parquet file, one row group per ~BATCH_CHARS characters."""

    def __init__(self, path: Path) -> None:
        # No dictionary and no min/max statistics: both copy every text value (a huge document several times over)
        # and buy nothing for unique documents.
        self.writer = pq.ParquetWriter(path, SCHEMA, use_dictionary=False, write_statistics=False)
        self.ids: list[str] = []
        self.texts: list[str] = []
        self.pending = 0
        self.documents = self.characters = 0

    def add(self, doc_id_hex: str, text: str) -> None:
        self.ids.append(doc_id_hex)
        self.texts.append(text)
        self.pending += len(text)
        self.documents += 1
        self.characters += len(text)

    def flush(self, at_least: int = 0) -> None:
        """Write the pending rows as a row group once they hold `at_least` characters. Called when the document
        generators have moved on, so the rows' strings are referenced here alone and go before the group is encoded:
        a huge document is held about twice (its text, then its UTF-8 bytes), not four times."""
        if not self.ids or self.pending < at_least:
            return
        data = [t.encode() for t in self.texts]
        self.texts = []
        offsets = np.zeros(len(data) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in data], out=offsets[1:])
        buf = pa.py_buffer(data[0] if len(data) == 1 else b"".join(data))  # one document: no copy
        del data
        texts = pa.LargeStringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets), buf)
        self.writer.write_table(pa.Table.from_arrays([pa.array(self.ids, pa.string()), texts], schema=SCHEMA))
        self.ids, self.pending = [], 0

    def close(self) -> None:
        self.flush()
        self.writer.close()


def prepare_corpus(cfg: PrepareConfig, out_dir: str | os.PathLike) -> dict:
    """Clean and split the configured corpus into out_dir/{train,val}.parquet (columns doc_id = sha1 of the text,
    text), streaming; returns the metrics/prepare.json payload. Raises DataError on an empty corpus or split."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    where = cfg.corpus.path if cfg.corpus.source == "local" else cfg.corpus.hub_id or cfg.corpus.source
    replaced: dict[str, int] = {}
    seen: set[bytes] = set()
    n_raw = n_short = n_dup = 0
    writers = {name: _SplitWriter(out_dir / f"{name}.parquet") for name in SPLITS}
    tick = Every()
    try:
        for raw in iter_documents(cfg.corpus, cfg.errors, replaced):
            for w in writers.values():  # the generators dropped the previous documents: write them now
                w.flush(at_least=BATCH_CHARS)
            n_raw += 1
            if tick():  # a large corpus: a line every few seconds
                log.info("prepare: %s documents read, %s kept, %.0f M characters written", f"{n_raw:,}",
                         f"{len(seen):,}", sum(w.characters for w in writers.values()) / 1e6)
            text = clean(raw, cfg.unicode_form)
            del raw
            if len(text) < cfg.min_chars:
                n_short += 1
                continue
            digest = text_sha1(text)
            if digest in seen:
                n_dup += 1
                continue
            seen.add(digest)
            writers["val" if hash_unit(digest.hex()) < cfg.val_fraction else "train"].add(digest.hex(), text)
            del text
    finally:
        for w in writers.values():
            w.close()
    if n_raw == 0:
        raise DataError(f"the corpus ({cfg.corpus.source}: {where}) is empty: no documents")
    if not seen:
        raise DataError(f"the corpus ({where}) is empty after cleaning: all {n_raw} documents were "
                        f"shorter than prepare.min_chars={cfg.min_chars} or duplicates")
    for name, w in writers.items():
        if w.documents == 0:
            raise DataError(f"the {name} split is empty ({len(seen)} documents, prepare.val_fraction="
                            f"{cfg.val_fraction}): add documents (or split them with doc_split_regex) or change "
                            "val_fraction")
    if replaced:
        files = ", ".join(f"{path} ({n} bytes)" for path, n in sorted(replaced.items()))
        print(f"prepare: replaced {sum(replaced.values())} bytes of invalid UTF-8 with U+FFFD in {len(replaced)} "
              f"file(s): {files}; prepare.errors: strict refuses such files", file=sys.stderr)
    if cfg.corpus.source == "hub" and cfg.corpus.hub_revision is None:
        print(f"prepare: hub dataset {cfg.corpus.hub_id!r} read at its moving default branch; pin "
              "prepare.corpus.hub_revision (metrics/prepare.json records the sha when online)", file=sys.stderr)
    stats = {name: {"documents": w.documents, "characters": w.characters} for name, w in writers.items()}
    return stats | {"dropped_empty": n_short, "dropped_duplicates": n_dup,
                    "replaced_invalid_bytes": sum(replaced.values()), "invalid_utf8_files": dict(sorted(replaced.items())),
                    "source": source_info(cfg.corpus)}


# ---------------------------------------------------------------- reading the prepared splits
def _prepared_path(prepared_dir: str | os.PathLike, split: str) -> Path:
    path = Path(prepared_dir) / f"{split}.parquet"
    if not path.is_file():
        raise DataError(f"prepared split not found: {path} (run the prepare stage first)")
    return path


def iter_prepared(prepared_dir: str | os.PathLike, split: str, batch_rows: int = TABLE_ROWS) -> Iterator[list[str]]:
    """The texts of a prepared split in batches of at most `batch_rows` documents (bounded memory)."""
    with pq.ParquetFile(_prepared_path(prepared_dir, split)) as f:
        for i in range(f.metadata.num_row_groups):  # row groups hold ~BATCH_CHARS (iter_batches keeps what it read)
            texts = f.read_row_group(i, columns=["text"]).column(0).to_pylist()  # the arrow copy goes right away
            for start in range(0, len(texts), batch_rows):
                yield texts[start : start + batch_rows]


class PreparedTexts:
    """The texts of a prepared split, one by one, read a batch at a time; `len()` is its document count (from the
    parquet footer), so a consumer can report progress with an ETA (scalelab.runtime.log.Progress)."""

    def __init__(self, prepared_dir: str | os.PathLike, split: str, batch_rows: int = TABLE_ROWS) -> None:
        self._n = count_prepared(prepared_dir, split)
        self._texts = (text for batch in iter_prepared(prepared_dir, split, batch_rows) for text in batch)

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> "PreparedTexts":
        return self

    def __next__(self) -> str:
        return next(self._texts)


def prepared_texts(prepared_dir: str | os.PathLike, split: str, batch_rows: int = TABLE_ROWS) -> PreparedTexts:
    """The texts of a prepared split, one by one, read a batch at a time (an iterator with a length)."""
    return PreparedTexts(prepared_dir, split, batch_rows)


def count_prepared(prepared_dir: str | os.PathLike, split: str) -> int:
    """Documents in a prepared split (from the parquet footer)."""
    with pq.ParquetFile(_prepared_path(prepared_dir, split)) as f:
        return f.metadata.num_rows


def read_prepared(prepared_dir: str | os.PathLike, split: str) -> list[str]:
    """A whole prepared split as a list (small corpora: tests, benchmarks)."""
    return [text for batch in iter_prepared(prepared_dir, split) for text in batch]
