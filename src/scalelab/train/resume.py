"""A cell's checkpoint folder: which checkpoint resumes, what moves aside, what is pruned.

`ckpt/run.json` holds {"run_id", "config_hash", "complete"}. The `last.ckpt` of an interrupted run under the same
config hash is resumed, and the stage reopens its MLflow run (`resume_run_id`). Any other checkpoint, from another
config or from a run that completed (DVC reruns a finished cell only when its code or inputs changed, so its
checkpoint must not stand in for the new run), is never resumed: it moves to `ckpt/stale-<its hash>/` and training
starts fresh. An interrupted checkpoint that was moved aside (another config ran in between) is found there again by
its config hash and moved back. Stale checkpoints of completed runs are pruned to the newest `keep` (params
`pretrain.keep_stale`); interrupted ones stay, since their own params resume them.

The caller claims the folder only after every check on params and data has passed (fit.py), so a run that fails
its checks leaves the folder as it found it.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from scalelab.data import write_json_atomic


def run_json(folder: Path) -> dict:
    path = folder / "run.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _interrupted(folder: Path, chash: str | None = None) -> bool:
    """`folder` holds the last.ckpt of a run that did not complete (under config hash `chash`, if given)."""
    stored = run_json(folder)
    return ((folder / "last.ckpt").is_file() and not stored.get("complete")
            and (chash is None or stored.get("config_hash") == chash))


def _stale(ckpt_dir: Path) -> list[Path]:
    """The stale-* folders, newest first."""
    return sorted((p for p in ckpt_dir.glob("stale-*") if p.is_dir()), key=lambda p: p.stat().st_mtime_ns,
                  reverse=True)


def find_resumable(ckpt_dir: str | Path, chash: str) -> Path | None:
    """The folder holding an interrupted run's last.ckpt under config hash `chash`: `ckpt_dir` itself, else the
    newest such stale-* folder; None when there is none."""
    ckpt_dir = Path(ckpt_dir)
    return next((f for f in [ckpt_dir, *_stale(ckpt_dir)] if _interrupted(f, chash)), None)


def resume_run_id(out_dir: str | Path, config_hash: str) -> str | None:
    """The MLflow run id to reopen: that of a resumable checkpoint under the same config hash, else None."""
    found = find_resumable(Path(out_dir) / "ckpt", config_hash)
    return run_json(found).get("run_id") if found else None


def _move_aside(ckpt_dir: Path) -> Path:
    """Move the folder's current checkpoint (every entry but the stale-* folders) to stale-<its config hash>."""
    name = f"stale-{run_json(ckpt_dir).get('config_hash', 'unknown')}"
    stale, n = ckpt_dir / name, 1
    while stale.exists():  # the same old config moved aside before: keep both
        n += 1
        stale = ckpt_dir / f"{name}-{n}"
    stale.mkdir()
    for p in ckpt_dir.iterdir():
        if not p.name.startswith("stale-"):
            p.rename(stale / p.name)
    return stale


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def prune_stale(ckpt_dir: Path, keep: int) -> tuple[int, int]:
    """Delete the stale checkpoints of completed runs beyond the newest `keep`; interrupted (resumable) ones are
    never deleted. Returns (folders removed, bytes freed)."""
    completed = [p for p in _stale(ckpt_dir) if not _interrupted(p)]
    removed = freed = 0
    for folder in completed[keep:]:
        freed += _size(folder)
        shutil.rmtree(folder)
        removed += 1
    return removed, freed


def claim_ckpt_dir(ckpt_dir: Path, chash: str, run_id: str | None, keep_stale: int) -> Path | None:
    """Settle the folder for a run under `chash`; return the checkpoint to resume (or None).

    An interrupted checkpoint of `chash` is resumed where it is, or moved back from its stale-* folder; any other
    current checkpoint moves aside; completed stale ones are pruned to `keep_stale`; run.json records the new run.
    Runs on rank 0 before the DDP launcher starts the other ranks, which then find the folder settled.
    """
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    found = find_resumable(ckpt_dir, chash)
    if found != ckpt_dir and (ckpt_dir / "last.ckpt").is_file():
        _move_aside(ckpt_dir)
    if found is not None and found != ckpt_dir:
        for p in found.iterdir():
            p.rename(ckpt_dir / p.name)
        found.rmdir()
    write_json_atomic(ckpt_dir / "run.json", {"run_id": run_id, "config_hash": chash})
    removed, freed = prune_stale(ckpt_dir, keep_stale)
    if removed:
        print(f"pretrain: removed {removed} stale checkpoint{'s' if removed > 1 else ''} of completed runs in "
              f"{ckpt_dir}, freed {freed / 2**20:.1f} MB (pretrain.keep_stale: {keep_stale})", file=sys.stderr)
    return ckpt_dir / "last.ckpt" if found is not None else None
