"""A study's committed cells: results/<name>/cells/<address>-<key>/, one folder per finished cell.

Each folder holds the cell's small results at their paths in the workspace (its metrics JSON, its curves CSV: the
outs DVC keeps out of its cache; never a checkpoint or data) and cell.json: its address, key, the params DVC
recorded for it and its upstream stages, the DVC md5 of every input (code and committed inputs) and their code
hash, the commit and whether its inputs differed from it, the cell's wall time and the machine it ran on.

A folder appears whole or not at all (written aside, then renamed), and at most one folder per address is kept:
a cell recomputed under other params replaces the old one (git keeps the history).

Against the grid (`classify`), a grid cell is
- done: a committed cell with its key and code hash: skipped;
- stale: a committed cell with its key, run by other code (its inputs' hashes differ): kept, used by the ledger and
  marked stale; recomputed only when asked (--refresh);
- missing: no committed cell with its key (never run, or run under other params): run.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from scalelab.ledger.studies import cell_files
from scalelab.study.grid import Cell, Grid, Pipeline, code_hash, key_of

CELLS = "cells"
CELL_JSON = "cell.json"
INDEX = f"{CELLS}/index.json"  # the cells table of the last run, beside the cells
DONE, STALE, MISSING = "done", "stale", "missing"


@dataclass(frozen=True)
class Record:
    """One committed cell: its folder and its cell.json."""

    folder: Path
    meta: dict

    @property
    def address(self) -> str:
        return self.meta["address"]

    @property
    def wall_s(self) -> float | None:
        return self.meta.get("wall_s")

    def key(self, pipeline: Pipeline) -> str | None:
        """Its key as today's pipeline tracks params; None when the pipeline has no such cell."""
        if self.address not in pipeline.tracked:
            return None
        return key_of(self.address, self.meta.get("params"), self.meta.get("upstream") or {}, pipeline)


@dataclass(frozen=True)
class Status:
    cell: Cell
    state: str                      # done, stale, missing
    record: Record | None           # the committed cell it matches (done, stale), or the one it replaces
    why: str = ""                   # stale: the inputs that changed; missing: "params changed" or ""


def folder_name(address: str, key: str) -> str:
    return f"{address}-{key[:12]}"


def read(folder: Path) -> list[Record]:
    """The committed cells of a results folder, in name order (the temporary folders of a write left out)."""
    base = Path(folder) / CELLS
    if not base.is_dir():
        return []
    out = []
    for d in sorted(base.iterdir()):
        if d.is_dir() and not d.name.startswith(".") and (d / CELL_JSON).is_file():
            out.append(Record(d, json.loads((d / CELL_JSON).read_text())))
    return out


def changed_inputs(cell: Cell, record: Record, pipeline: Pipeline) -> list[str]:
    then = {p: m for p, m in (record.meta.get("inputs") or {}).items() if pipeline.is_input(p)}
    now = cell.inputs
    return sorted(p for p in set(then) | set(now) if then.get(p) != now.get(p))


def classify(grid: Grid, records: list[Record]) -> list[Status]:
    """Each grid cell against the committed ones (see the module's docstring)."""
    by_key: dict[str, Record] = {}
    by_address: dict[str, Record] = {}
    for r in records:
        by_address[r.address] = r
        if (k := r.key(grid.pipeline)) is not None:
            by_key[k] = r
    out = []
    for cell in grid.cells:
        r = by_key.get(cell.key)
        if r is None:
            old = by_address.get(cell.address)
            out.append(Status(cell, MISSING, old, "params changed" if old else ""))
        elif code_hash(r.meta.get("inputs") or {}, grid.pipeline) == cell.code_hash:
            out.append(Status(cell, DONE, r))
        else:
            changed = changed_inputs(cell, r, grid.pipeline)
            out.append(Status(cell, STALE, r, ", ".join(changed)))
    return out


def record(cell: Cell, lock: dict, pipeline: Pipeline, files: dict[str, str], *, commit: str | None,
           dirty: bool | None, wall_s: float | None, machine: dict | None, origin: str,
           started: float | None = None) -> dict:
    """cell.json for `cell` from the lock entries DVC wrote for it and its upstream stages (`lock`: dvc.lock's
    `stages`): their params, and the md5 of each input dep (code, committed inputs); `files`: {path: md5} of its
    small results. Its key and code hash are computed from what the lock recorded, not from the grid."""
    entry = lock[cell.address]
    params = entry.get("params") or {}
    upstream = {u: lock[u].get("params") or {} for u in cell.upstream if u in lock}
    inputs = {}
    for a in (cell.address, *cell.upstream):
        for dep in (lock.get(a) or {}).get("deps") or []:
            if pipeline.is_input(dep["path"]):
                inputs[dep["path"]] = dep.get("md5") or dep.get("hash") or "absent"
    return {"address": cell.address, "stage": cell.stage, "item": cell.item,
            "key": key_of(cell.address, params, upstream, pipeline), "params": params, "upstream": upstream,
            "inputs": dict(sorted(inputs.items())), "code_hash": code_hash(inputs, pipeline), "files": files,
            "commit": commit, "dirty": dirty, "started": None if started is None else round(started, 3),
            "wall_s": None if wall_s is None else round(wall_s, 3),
            "machine": machine, "origin": origin, "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def persist(results: Path, meta: dict, sources: dict[str, Path]) -> Path:
    """Write one cell's folder atomically: its files (`sources`: {path in the cell: file to copy}) and cell.json
    into a temporary folder beside it, then renamed into place; an older folder of the same address goes after."""
    base = Path(results) / CELLS
    base.mkdir(parents=True, exist_ok=True)
    if not (ignore := base / ".gitignore").is_file():  # a write caught midway is never committed
        ignore.write_text(".tmp-*\n.old-*\n.*.tmp\n")
    final = base / folder_name(meta["address"], meta["key"])
    tmp = base / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    for rel, src in sources.items():
        dst = tmp / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        _fsync(dst)
    (tmp / CELL_JSON).write_text(json.dumps(meta, indent=1, sort_keys=False) + "\n")
    _fsync(tmp / CELL_JSON)
    old = None
    if final.exists():  # the same key recomputed (--refresh): the old one set aside, dropped once the new one is in
        old = base / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
        os.rename(final, old)
    os.rename(tmp, final)
    if old:
        shutil.rmtree(old)
    for r in read(results):  # the same cell under other params: replaced
        if r.address == meta["address"] and r.folder != final:
            shutil.rmtree(r.folder)
    return final


def cleanup(results: Path) -> None:
    """What a write killed midway left: a temporary folder is dropped; a set-aside folder whose replacement never
    arrived is put back."""
    base = Path(results) / CELLS
    if not base.is_dir():
        return
    for d in base.iterdir():
        if d.name.startswith(".tmp-"):
            shutil.rmtree(d, ignore_errors=True)
        elif d.name.startswith(".old-"):
            name = d.name.removeprefix(".old-").rsplit("-", 1)[0]
            if (base / name).exists():
                shutil.rmtree(d, ignore_errors=True)
            else:
                os.rename(d, base / name)


def files(results: Path, prefix: str, suffix: str = "") -> dict[str, Path]:
    """Every committed cell's file under `prefix` (e.g. "metrics/pretrain"), by file name: what a generator reads
    instead of a flat folder of per-cell files (scalelab.ledger.studies.cell_files, which generators import)."""
    return cell_files(results, prefix, suffix)


def write_index(results: Path, statuses: list[Status]) -> Path:
    """results/<name>/cells/index.json: every grid cell with a committed result, its folder, commit, wall time and
    whether it was stale against the code of the last `scalelab study` run."""
    rows = [{"address": s.cell.address, "stage": s.cell.stage, "folder": s.record.folder.name,
             "state": s.state, "commit": s.record.meta.get("commit"), "wall_s": s.record.wall_s,
             **({"changed": s.why} if s.state == STALE else {})}
            for s in statuses if s.state in (DONE, STALE) and s.record is not None]
    path = Path(results) / INDEX
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(rows, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
