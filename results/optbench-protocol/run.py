"""The committed optimizer-protocol study (issue 19): the `optimizers` section of a params file, every cell in turn in
this one process on one thread, without MLflow, then the leaderboard and the claims, written
beside this script with the command, commit and wall time.

    PYTHONPATH=src python results/optbench-protocol/run.py results/optbench-protocol/params.yaml [SIZE…]

With sizes, only those sizes' cells are trained (sizes are independent: the baseline of each size is its own), and
their wall time goes to partial-<sizes>.json; without, every cell (finished runs are reused by their config hash),
then the leaderboard. The committed study ran one process per size at once, then the leaderboard pass.
The DAG runs the same functions (stages/optimizers.py, stages/leaderboard.py); this script only skips DVC and MLflow
(their per-cell start-up would be most of the time on these shared cores). Runs go to data/optbench-protocol/.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from scalelab.config import load_params
from scalelab.analysis import claims, leaderboard as lb
from scalelab.train import optbench

HERE = Path(__file__).resolve().parent


def main(params_path: str, only: list[str]) -> None:
    torch.set_num_threads(1)
    start, t0 = time.time(), time.perf_counter()
    params = load_params(params_path)
    ob = optbench.bench(params)
    shards, data = Path("data/tokens"), Path("data/optbench-protocol")
    metrics, plots = HERE / "metrics", data / "plots"
    cells_wall = {}
    for kind in ("sweep", "seeds"):
        for opt in ob.optimizers:
            for size in only or ob.sizes:
                c0 = time.perf_counter()
                out = data / kind / f"{opt}-{size}"
                if kind == "sweep":
                    cell = optbench.sweep_cell(params, opt, size, out, shards, None)
                else:
                    sweep = json.loads((metrics / "sweep" / f"{opt}-{size}.json").read_text())
                    cell = optbench.seeds_cell(params, opt, size, sweep, out, shards, None)
                cells_wall[f"{kind}/{opt}-{size}"] = time.perf_counter() - c0
                (metrics / kind).mkdir(parents=True, exist_ok=True)
                (metrics / kind / f"{opt}-{size}.json").write_text(json.dumps(optbench.cell_metrics(cell), indent=1))
                (plots / kind).mkdir(parents=True, exist_ok=True)
                rows = [optbench.CURVE_COLUMNS, *optbench.curve_rows(cell["runs"])]
                (plots / kind / f"{opt}-{size}.csv").write_text("".join(",".join(map(str, r)) + "\n" for r in rows))
                print(f"{kind} {opt}-{size}: {cells_wall[f'{kind}/{opt}-{size}']:.0f} s", flush=True)
    if only:
        (HERE / f"partial-{'-'.join(only)}.json").write_text(json.dumps({
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
            "wall_s": time.perf_counter() - t0, "cells_wall_s": cells_wall, "load_avg_at_end": os.getloadavg()},
            indent=1))
        return
    cells, runs = lb.load_cells(metrics, ob)
    table = lb.table(params, cells, runs)
    entries = lb.claims(params, cells, runs)
    (HERE / "leaderboard.md").write_text(lb.markdown(table) + "\n")
    table.write_csv(HERE / "leaderboard.csv")
    (HERE / "claims_b.md").write_text(claims.markdown(entries) + "\n")
    claims.write_claims(HERE / "claims_b.json", entries)
    lb.plot(cells, lb.load_curves(plots, ob), ob, HERE / "curves.png", HERE / "lr_sensitivity.png")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "src"], capture_output=True, text=True).stdout)
    (HERE / "run.json").write_text(json.dumps({
        "command": "PYTHONPATH=src python " + " ".join(sys.argv),
        "commit": commit, "src_dirty": dirty, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)),
        "wall_s_this_pass": time.perf_counter() - t0, "threads": 1, "n_runs": len(runs), "cells_wall_s": cells_wall,
        "per_size_passes": {p.stem: json.loads(p.read_text()) for p in sorted(HERE.glob("partial-*.json"))},
        "load_avg_at_end": os.getloadavg(),  # the machine's load: wall times are inflated by other jobs' share
        "note": "cells reused from the per-size passes take ~0 s here (their training wall is in per_size_passes)"},
        indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
