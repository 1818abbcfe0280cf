"""DVC's safe YAML parses, remembered by their text: in this process, and across the processes of one project.

A safe parse is a function of the text alone. One DVC command reads the same dvc.yaml, dvc.lock and params.yaml again
and again (each Repo, index and stage load reads them afresh: 47 parses in a `dvc exp run` of one micro cell), and a
flow runs one DVC process per stage, each reading them once more: in such a process, forked warm with DVC imported,
ruamel's Python constructor was ~60% of its 0.5-0.9 CPU s on the micro DAG, and the default DAG's dvc.lock is three
times the size. So each parse is kept, marshalled: in this process (`parsed`, an LRU), and under the project's
`.dvc/tmp/scalelab-yaml/<SHA-256 of the text>` (DVC's own untracked folder), where the next process that reads the
same text loads it at C speed. Every call gets a fresh object, as a parse returns, whatever DVC then changes in it.

dvc.lock changes at every stage, so the process that writes it stores what it wrote (`written`) when its data is
plain: dicts with str keys, lists, str, int, finite floats, bools and None, the types DVC's dumper writes and the safe
loader reads back equal (tests/test_dvcrun.py). The next stage's read of that text is then a hit too. A text holding a
type marshal cannot copy (a YAML date) is parsed every time; the newest KEEP entries stay on disk.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import marshal
import math
import os
from pathlib import Path

FOLDER = Path(".dvc") / "tmp" / "scalelab-yaml"
KEEP = 32  # entries kept on disk (pruned at twice that): a stage's lock, dvc.yaml and params.yaml, many times over


def _folder(path: str) -> Path | None:
    """The store of the DVC project whose root holds `path` (where dvc.yaml, dvc.lock and params.yaml sit)."""
    root = Path(path).parent
    return root / FOLDER if (root / ".dvc").is_dir() else None


@functools.cache
def _salt() -> bytes:
    """What else a stored parse depends on: the parser's version and marshal's (Python's), so an upgrade parses anew."""
    import sys

    from ruamel.yaml import __version__ as ruamel

    return f"ruamel {ruamel}; python {sys.version_info[0]}.{sys.version_info[1]}; marshal {marshal.version}\0".encode()


def _key(text: str) -> str:
    return hashlib.sha256(_salt() + text.encode("utf-8", "surrogatepass")).hexdigest()


def _load(text: str, path: str) -> bytes | None:
    """The stored parse of `text`; None when there is none (or a file that is not one)."""
    if (folder := _folder(path)) is None:
        return None
    try:
        blob = (folder / _key(text)).read_bytes()
        marshal.loads(blob)
    except (OSError, ValueError, EOFError, TypeError):
        return None
    return blob


def _save(text: str, path: str, blob: bytes) -> None:
    """Store `blob` as the parse of `text`, whole or not at all (a temporary name, then a rename)."""
    if (folder := _folder(path)) is None:
        return
    with contextlib.suppress(OSError):  # a read-only or vanished project: parsed again next time
        folder.mkdir(parents=True, exist_ok=True)
        name = folder / _key(text)
        tmp = folder / f".{name.name}.{os.getpid()}.tmp"
        tmp.write_bytes(blob)
        os.replace(tmp, name)
        entries = list(folder.iterdir())  # a killed writer's temporary file too
        if len(entries) > 2 * KEEP:
            entries.sort(key=lambda p: p.stat().st_mtime)
            for old in entries[:-KEEP]:
                old.unlink(missing_ok=True)


@functools.lru_cache(maxsize=32)  # a command reads a few files; a served flow's process sees each lock text once
def parsed(parse, text: str, path: str) -> bytes | None:
    """The safe parse of `text` (by `parse`, DVC's), marshalled: stored, or parsed and stored; None when it holds a
    type marshal cannot copy."""
    if (blob := _load(text, path)) is not None:
        return blob
    try:
        blob = marshal.dumps(parse(text, path))
    except ValueError:
        return None
    _save(text, path, blob)
    return blob


def plain(value) -> bool:
    """Only types that DVC's dumper writes and the safe loader reads back equal (exact types: no subclass, no tuple)."""
    kind = type(value)
    if kind is dict:
        return all(type(k) is str and plain(v) for k, v in value.items())
    if kind is list:
        return all(plain(v) for v in value)
    if kind is float:
        return math.isfinite(value)
    return kind in (str, int, bool, type(None))


def written(text: str, path: str, data) -> None:
    """DVC just wrote `data` to `path` as `text`: stored as that text's parse when it is plain."""
    if plain(data):
        _save(text, path, marshal.dumps(data))
