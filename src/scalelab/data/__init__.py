"""Data layer: corpus loading and cleaning, tokenizer, token shards with checksums, deterministic loaders."""

from __future__ import annotations


class DataError(ValueError):
    """Bad data or data paths: the message names the file or source and what is wrong."""


# Re-exports below DataError: the submodules import it from here.
from scalelab.data.sources import iter_documents  # noqa: E402
from scalelab.data.corpus import (  # noqa: E402
    count_prepared,
    iter_prepared,
    prepare_corpus,
    prepared_texts,
    read_prepared,
)
from scalelab.data.shards import (  # noqa: E402
    atomic_dir, check_windows, file_sha256, tokenize_splits, write_json_atomic,
)
from scalelab.data.tokenizer import build_tokenizer, bytes_per_token, eot_id, load_tokenizer  # noqa: E402

_LOADER = ("Shards", "open_shards", "train_batch", "val_batches")


def __getattr__(name: str):
    """The loader's names, imported on first use: it needs torch, which the data stages never load."""
    if name in _LOADER:
        from scalelab.data import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'scalelab.data' has no attribute {name!r}")


__all__ = [
    *_LOADER,
    "DataError",
    "atomic_dir",
    "build_tokenizer",
    "bytes_per_token",
    "check_windows",
    "count_prepared",
    "eot_id",
    "file_sha256",
    "iter_documents",
    "iter_prepared",
    "load_tokenizer",
    "prepare_corpus",
    "prepared_texts",
    "read_prepared",
    "tokenize_splits",
    "write_json_atomic",
]
