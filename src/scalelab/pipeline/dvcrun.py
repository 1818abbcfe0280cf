"""`dvc` as the flow runs it: DVC's own CLI, with dvc.lock read by the fast safe YAML loader when a stage
updates it.

    python -m scalelab.pipeline.dvcrun repro --single-item pretrain@standard-xs-0      # any dvc command line

DVC rewrites dvc.lock after every stage, reading it first with ruamel's round-trip loader, which keeps comments and
layout for the next dump and is pure Python: with the default DAG's 102 stages (375 kB of dvc.lock) the read took
2.6 s of each stage's ~4.3 s of lock update, under the repo lock, so cells waited on each other. dvc.lock is written
only by DVC and holds no comments; the safe loader (ruamel's C parser) reads it in 0.4 s, and DVC's own dumper writes
the same bytes from the plain data (tests/test_dvcrun.py). dvc.yaml and every other file keep the round-trip loader.

Then, DVC's safe parses go through scalelab.pipeline.yamlcache: each text is parsed once per process and, under the
project's .dvc/tmp, once per project (the writer of dvc.lock stores what it wrote), not 47 times a `dvc exp run`.

DVC's reads of params go one key at a time through `dpath.get`, which walks the whole params tree for each key:
a `dvc status` of the micro DAG made 480 such walks of ~400 nodes. A key of plain dictionary names (no glob
character, every dictionary on its way keyed by strings) is looked up directly (`plain_get`); anything else still goes
to dpath. That `dvc status` 1.5 -> 1.0 CPU s.

Second, every file DVC writes (dvc.lock, dvc.yaml, its rwlock of running stages) is written under a temporary name and
renamed over the old one once complete. DVC truncates and rewrites them in place: a whole-flow kill -9 in the middle
(tests/test_crash.py) left `.dvc/tmp/rwlock` empty, and every later `dvc` command in the workspace failed with
"Unable to read RWLock-file ... JSON structure is corrupted" until someone deleted it; a truncated dvc.lock would lose
every stage's record. A rename is atomic: a kill leaves the old file or the new one, and at worst a stray `.tmp`.
"""

from __future__ import annotations

import contextlib
import io
import json
import marshal
import os
import sys

from scalelab.pipeline import lockfile, yamlcache

LOCKFILE = "dvc.lock"


class WholeFiles:
    """A local filesystem (DVC's, or Python's `open` when None) on which a file opened for writing appears under its
    name only once it is complete (write to `<name>.<pid>.tmp`, then os.replace)."""

    def __init__(self, fs=None):
        self._fs = fs

    def __getattr__(self, name):
        return getattr(self._fs, name)

    @contextlib.contextmanager
    def open(self, path, mode="r", **kwargs):
        open_fn = self._fs.open if self._fs is not None else open
        if "w" not in mode:
            with open_fn(path, mode, **kwargs) as f:
                yield f
            return
        tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
        try:
            with open_fn(tmp, mode, **kwargs) as f:
                yield f
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


GLOB = frozenset("*?[]")


def plain_get(get):
    """`dpath.get` (as `get`) with a direct lookup for a key of plain names: the value dpath's walk finds, since
    with string keys all the way and no glob character exactly one path matches, that one (dpath matches each segment
    with fnmatchcase, an int key by its int value: a level with a key other than a string is left to dpath). Not
    seen here: dpath's refusal of an empty key elsewhere in the tree, which params.yaml's schema refuses first."""

    def fast(obj, glob, separator="/", *args, **kwargs):
        if not isinstance(glob, str) or not glob.strip(separator) or GLOB & set(glob):
            return get(obj, glob, separator, *args, **kwargs)
        node = obj
        for part in glob.lstrip(separator).split(separator):
            if not (isinstance(node, dict) and part in node and all(type(k) is str for k in node)):
                return get(obj, glob, separator, *args, **kwargs)
            node = node[part]
        return node

    fast.scalelab = True
    return fast


def _local(fs) -> bool:
    return fs is None or getattr(fs, "protocol", None) in ("local", "file")


def patch() -> None:
    """Route DVC's read-for-update of dvc.lock through its safe parser, its safe parses through yamlcache, and its
    writes of dvc.lock, dvc.yaml and the rwlock through WholeFiles (idempotent)."""
    from dvc import rwlock
    from dvc.utils import strictyaml
    from dvc.utils.serialize import _common, _yaml

    if getattr(_yaml.parse_yaml_for_update, "scalelab", False):
        return
    import dpath

    dpath.get = plain_get(dpath.get)  # DVC's params reads (dvc.dependency.param) look it up at call time
    parse = _yaml.parse_yaml

    def parse_yaml(text, path, typ="safe"):
        if typ != "safe" or not isinstance(text, str):
            return parse(text, path, typ)
        data = yamlcache.parsed(parse, text, os.fspath(path))
        return marshal.loads(data) if data is not None else parse(text, path, typ)

    _yaml.parse_yaml = parse_yaml  # load_yaml's parser and parse_yaml_for_update's, looked up at call time
    strictyaml.parse_yaml = parse_yaml  # dvc.yaml's and dvc.lock's loader imported it by name
    dump_data, edit_rwlock = _common._dump_data, rwlock._edit_rwlock

    def whole_dump_data(path, data, dumper, fs=None, **kwargs):
        if not _local(fs) or os.path.basename(os.fspath(path)) != LOCKFILE:
            return dump_data(path, data, dumper, fs=WholeFiles(fs) if _local(fs) else fs, **kwargs)
        stream = io.StringIO()  # dvc.lock: its text, then stored as the parse of that text (yamlcache.written)
        dumper(data, stream, **kwargs)
        result = dump_data(path, stream.getvalue(), lambda text, f: f.write(text), fs=WholeFiles(fs))
        yamlcache.written(stream.getvalue(), os.fspath(path), data)
        return result

    _common._dump_data = whole_dump_data  # modify_yaml's and dump_yaml's writer, looked up at call time
    if getattr(_yaml, "_dump_data", None) is dump_data:
        _yaml._dump_data = whole_dump_data
    rwlock._edit_rwlock = lambda lock_dir, fs, hardlink: edit_rwlock(lock_dir, WholeFiles(fs), hardlink)
    round_trip, dump = _yaml.parse_yaml_for_update, _yaml._dump
    read: dict[int, tuple[str, dict]] = {}  # id(the data handed to DVC) -> (the text, a copy of the data as read)

    def parse_for_update(text, path):
        if os.path.basename(os.fspath(path)) == LOCKFILE:
            data = _yaml.parse_yaml(text, path)  # typ="safe": plain dicts, what DVC's dumper writes back unchanged
            if isinstance(data, dict):
                read.clear()
                read[id(data)] = (text, json.loads(json.dumps(data)))  # plain data: a deep copy at C speed
            return data
        return round_trip(text, path)

    def splice_dump(data, stream):
        """dvc.lock read above and updated by DVC: its unchanged stages keep their bytes (scalelab.pipeline.lockfile)."""
        text, old = read.pop(id(data), (None, None))
        spliced = lockfile.splice(text, old, data, dump) if text is not None and isinstance(data, dict) else None
        return stream.write(spliced) if spliced is not None else dump(data, stream)

    parse_for_update.scalelab = True
    _yaml.parse_yaml_for_update = parse_for_update  # modify_yaml looks both up at call time
    _yaml._dump = splice_dump


def main(argv: list[str] | None = None) -> int:
    patch()
    from dvc.cli import main as dvc_main

    return dvc_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    from scalelab.pipeline.handoff import handoff

    handoff(module="scalelab.pipeline.dvcrun")  # under the flow: DVC runs in its warm server, DVC's imports done
    sys.exit(main())
