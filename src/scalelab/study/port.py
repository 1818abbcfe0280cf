"""Convert a study committed before study specs into committed cells (results/<name>/cells/), without rerunning it.

    python -m scalelab.study.port cpu-study --lock results/cpu-study/dvc.lock --commit 951c18e

The study's spec (configs/studies/<name>.yaml) says which cells it has; the dvc.lock the study committed says what
DVC recorded for each (its params, its upstream stages' params, the md5 of every dep and out). Each cell's small
results are taken from the results folder (`--from`, default the study's; at their workspace paths, e.g.
metrics/pretrain/<cell>.json) and must be the files DVC recorded (same md5), else the cell is refused. The files
are copied, never moved: the folder's other readers keep theirs. Each cell records the commit it ran at and its
own wall time as its metrics measured it (`wall_s`), when they hold one. Cells ported from older code are stale
against today's code; `scalelab study NAME` keeps them and says so.

A study that ran outside DVC (its stage script called by hand, so no dvc.lock) is ported with `--ran-with` instead of
`--lock`: the params file the run used, and the commit it ran at.

    python -m scalelab.study.port compression-smollm2 --ran-with results/compression-smollm2/params.yaml --commit 61706d4

Each cell then records what DVC would have: the params it tracks, read from that file (they must equal what the spec
resolves to, else the cell is refused: the spec would not say what ran), and DVC's md5 of each input in the commit's
tree (`git archive`); its files are the results folder's as committed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
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
    states = _index(study, root, results, g)
    log(f"{name}: {counts['ported']} cells ported to {results.relative_to(root) / cells.CELLS} "
        f"({counts['absent']} absent, {counts['refused']} refused); against today's code: "
        + ", ".join(f"{n} {s}" for s, n in states.items()))
    return counts | states


def _index(study, root: Path, results: Path, g) -> dict[str, int]:
    """The ported cells classified against today's code, indexed and named in study.json; their count per state."""
    statuses = cells.classify(g, cells.read(results))
    cells.write_index(results, statuses)
    ledger.update_study_json(study, root, statuses, ran=False)
    return {s: sum(x.state == s for x in statuses) for s in (cells.DONE, cells.STALE, cells.MISSING)}


def port_run(root: Path, name: str, ran_with: Path, rev: str, source: Path | None = None, log=print) -> dict:
    """Port every grid cell of a study run outside DVC under the params file `ran_with` at commit `rev` (the
    module's docstring); returns counts (ported, refused)."""
    from dvc.utils.serialize import parse_yaml

    study = spec.load(root, name)
    results = study.folder(root)
    source = source or results
    g = grid.plan_grid(study, root)
    ran = parse_yaml(ran_with.read_text(), str(ran_with))
    commit = full_commit(root, rev)
    where = ran_with.relative_to(root) if ran_with.is_relative_to(root) else ran_with
    with tempfile.TemporaryDirectory(prefix="port-") as tmp:  # the commit's tree, hashed as DVC hashes a workspace
        tree = Path(tmp)
        archive = subprocess.run(["git", "archive", commit], cwd=root, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        grid.dvc_workdir(tree, tree / "dvc.yaml")
        hashes = grid.hash_inputs(tree, sorted({p for c in g.cells for p in c.inputs}))
    wall = ledger.read_study_json(results).get("wall_time_s")  # no time per cell was recorded: the run's
    cells.cleanup(results)
    counts = {"ported": 0, "refused": 0}
    for cell in g.cells:
        params = {a: {f: {k: _value(ran, k) for k in keys} for f, keys in g.pipeline.tracked[a].items()}
                  for a in (cell.address, *cell.upstream)}
        differ = sorted(k for a, by in params.items() for f, vals in by.items() for k, v in vals.items()
                        if v != (cell.params if a == cell.address else cell.upstream[a]).get(f, {}).get(k))
        missing = [rel for rel in cell.files if not (source / rel).is_file()]
        if differ or missing:
            counts["refused"] += 1
            log(f"refused {cell.address}: " + (f"{', '.join(differ)} in {where} differ from the spec's"
                                               if differ else f"{', '.join(missing)} not in {source}"))
            continue
        lock = {a: {"params": by} for a, by in params.items()}
        lock[cell.address]["deps"] = [{"path": p, "md5": hashes[p]} for p in cell.inputs]
        sources = {rel: source / rel for rel in cell.files}
        meta = cells.record(cell, lock, g.pipeline, {rel: _md5(src) for rel, src in sources.items()}, commit=commit,
                            dirty=None, wall_s=wall, machine=None,
                            origin=f"ported from a run outside DVC under {where} at {commit[:7]} (its inputs hashed "
                                   "in that commit's tree; wall_s: the whole run's, its cells side by side)")
        cells.persist(results, meta, sources)
        counts["ported"] += 1
    states = _index(study, root, results, g)
    log(f"{name}: {counts['ported']} cells ported to {results.relative_to(root) / cells.CELLS} "
        f"({counts['refused']} refused); against today's code: " + ", ".join(f"{n} {s}" for s, n in states.items()))
    return counts | states


def _value(values: dict, dotted: str):
    """The value at a dotted params key, or None where the file lacks it (then it differs from the spec's)."""
    for part in dotted.split("."):
        if not isinstance(values, dict) or part not in values:
            return None
        values = values[part]
    return values


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
    how = ap.add_mutually_exclusive_group(required=True)
    how.add_argument("--lock", type=Path, help="the dvc.lock the study committed")
    how.add_argument("--ran-with", type=Path, help="a study run outside DVC: the params file it ran under")
    ap.add_argument("--commit", required=True, help="the commit its cells ran at")
    ap.add_argument("--from", dest="source", type=Path, help="where its per-cell files are (default: its folder)")
    args = ap.parse_args(argv)
    root = project_root()
    source = (root / args.source).resolve() if args.source else None
    try:
        if args.lock is not None:
            port(root, args.name, (root / args.lock).resolve(), args.commit, source)
        else:
            port_run(root, args.name, (root / args.ran_with).resolve(), args.commit, source)
    except spec.SpecError as err:
        print(f"port: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
