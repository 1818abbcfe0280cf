"""Convert a study committed before study specs into committed cells (results/<name>/cells/), without rerunning it.

    python -m scalelab.study.port cpu-study --lock results/cpu-study/dvc.lock --commit 951c18e

The study's spec (configs/studies/<name>.yaml) says which cells it has; the dvc.lock the study committed says what
DVC recorded for each (its params, its upstream stages' params, the md5 of every dep and out). Each cell's small
results are taken from the results folder (`--from`, default the study's; at their workspace paths, e.g.
metrics/pretrain/<cell>.json) and must be the files DVC recorded (same md5), else the cell is refused. The files
are copied, never moved: the folder's other readers keep theirs. Each cell records the commit it ran at and its
own wall time as its metrics measured it (`wall_s`), when they hold one. Cells ported from older code are stale
against today's code; `scalelab study NAME` keeps them and says so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from scalelab.study import cells, grid, ledger, spec


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def full_commit(root: Path, rev: str) -> str:
    out = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=root, capture_output=True,
                         text=True)
    if out.returncode:
        raise SystemExit(f"port: {rev!r} is not a commit of {root}")
    return out.stdout.strip()


def port(root: Path, name: str, lock_path: Path, rev: str, source: Path | None = None, log=print) -> dict:
    """Port every grid cell found in `lock_path`; returns counts (ported, absent from the lock, refused)."""
    from dvc.utils.serialize import parse_yaml

    study = spec.load(root, name)
    results = study.folder(root)
    source = source or results
    g = grid.plan_grid(study, root)
    lock = parse_yaml(lock_path.read_text(), str(lock_path)).get("stages") or {}
    commit = full_commit(root, rev)
    origin = f"ported from {lock_path.relative_to(root) if lock_path.is_relative_to(root) else lock_path}"
    cells.cleanup(results)
    counts = {"ported": 0, "absent": 0, "refused": 0}
    for cell in g.cells:
        if cell.address not in lock:
            counts["absent"] += 1
            log(f"absent  {cell.address}: not in {lock_path.name}")
            continue
        recorded = {o["path"]: o.get("md5") for o in lock[cell.address].get("outs") or []}
        sources, files, problem = {}, {}, None
        for rel in cell.files:
            src = source / rel
            if not src.is_file():
                problem = f"{rel} not in {source}"
            elif (md5 := _md5(src)) != recorded.get(rel):
                problem = f"{rel} differs from what {lock_path.name} recorded"
            else:
                sources[rel], files[rel] = src, md5
        if problem:
            counts["refused"] += 1
            log(f"refused {cell.address}: {problem}")
            continue
        meta = cells.record(cell, lock, g.pipeline, files, commit=commit, dirty=None, wall_s=_wall(sources),
                            machine=None, origin=f"{origin} (wall_s: the cell's metrics)")
        cells.persist(results, meta, sources)
        counts["ported"] += 1
    statuses = cells.classify(g, cells.read(results))
    cells.write_index(results, statuses)
    ledger.update_study_json(study, root, statuses, ran=False)
    states = {s: sum(x.state == s for x in statuses) for s in (cells.DONE, cells.STALE, cells.MISSING)}
    log(f"{name}: {counts['ported']} cells ported to {results.relative_to(root) / cells.CELLS} "
        f"({counts['absent']} absent, {counts['refused']} refused); against today's code: "
        + ", ".join(f"{n} {s}" for s, n in states.items()))
    return counts | states


def _wall(sources: dict[str, Path]) -> float | None:
    for rel, path in sources.items():
        if rel.endswith(".json"):
            value = json.loads(path.read_text())
            if isinstance(value, dict) and isinstance(value.get("wall_s"), int | float):
                return float(value["wall_s"])
    return None


def main(argv: list[str] | None = None) -> int:
    from scalelab import project_root

    ap = argparse.ArgumentParser(prog="python -m scalelab.study.port", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", help="the study (configs/studies/<name>.yaml)")
    ap.add_argument("--lock", type=Path, required=True, help="the dvc.lock the study committed")
    ap.add_argument("--commit", required=True, help="the commit its cells ran at")
    ap.add_argument("--from", dest="source", type=Path, help="where its per-cell files are (default: its folder)")
    args = ap.parse_args(argv)
    root = project_root()
    try:
        port(root, args.name, (root / args.lock).resolve(), args.commit,
             (root / args.source).resolve() if args.source else None)
    except spec.SpecError as err:
        print(f"port: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
