"""Wall time of a pretrain grid: the pipeline flow with 1 and with 2 workers, and plain `dvc repro`, in this run.

A temporary copy of the code builds the data stages once; then each mode runs the same `--cells` pretrain cells
from that state (a fresh copy each): `flows/pipeline.py --workers 2` (cores / workers threads per cell), `--workers 1`
and plain `dvc repro <cells>`, the way DVC alone runs the grid (one cold process after another, each on every
core with the profile's `threads: 0`). The flows share one warmed-up Prefect home; each still starts its temporary
server, as `make repro` does. Cells: the first `--cells` of the grid in its order (variant by variant, every size),
or with `--smallest` the smallest size's first.

    python benchmarks/grid_workers.py [--params params.yaml] [--cells 4] [--smallest]

The default profile's cells take ~9-23 s of training each on 2 quiet cores; `--params tests/micro_params.yaml` gives
overhead-dominated cells of ~1 s. Goals: the flow with 2 workers faster than with 1 (concurrency pays), and at least
0.9x plain `dvc repro`'s speed, its fixed start included (its temporary Prefect server and warm server: seconds that
4 cells of ~10 s do not amortise). Revised from 1.8x, a figure set when plain DVC ran every cell cold: now plain DVC's
cells also start warm from the second one (scalelab.pipeline.repro_warm) and each runs on both cores, so on 2 cores
the two modes do the same compute, and the flow can win only what one cell's single-thread efficiency and the
overlap of the cells' bookkeeping give (measured 0.94x on the default's 4 cells, 1.15x its own 1-worker run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cell_overhead import DVC, ROOT, run, workspace_copy  # noqa: E402  (the same workspace and timing helpers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml", help="the profile (default: params.yaml)")
    ap.add_argument("--cells", type=int, default=4, help="pretrain cells: the grid's first (every size of a variant)")
    ap.add_argument("--smallest", action="store_true", help="the smallest size's cells first")
    ap.add_argument("--keep", action="store_true", help="keep the temporary workspaces")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="grid-workers-"))
    base = tmp / "base"
    try:
        env = {**workspace_copy(base, args.params.resolve()), "PREFECT_HOME": str(tmp / "prefect")}
        env.pop("PREFECT_API_URL", None)

        def ws_env(ws: Path) -> dict[str, str]:
            return {**env, "SCALELAB_ROOT": str(ws), "MLFLOW_TRACKING_URI": f"sqlite:///{ws / 'mlflow.db'}",
                    "PYTHONPATH": str(ws / "src")}

        data_s, _ = run(DVC + ["repro", "tokenize"], base, ws_env(base))
        grid = [s for s in run(DVC + ["stage", "list", "--name-only"], base, ws_env(base))[1].split()
                if s.startswith("pretrain@")]
        sizes = list(dict.fromkeys(s.rsplit("-", 2)[1] for s in grid))  # the grid's sizes, smallest first
        if args.smallest:
            grid = sorted(grid, key=lambda s: sizes.index(s.rsplit("-", 2)[1]))  # size-major
        cells = grid[: args.cells]
        flow = [sys.executable, "flows/pipeline.py"] + [f"--target={c}" for c in cells]
        run(flow[:2] + ["--target=tokenize"], base, ws_env(base))  # warms the Prefect home up: not a mode's cost
        modes = {"flow, 2 workers": flow + ["--workers", "2"], "flow, 1 worker": flow + ["--workers", "1"],
                 "dvc repro": DVC + ["repro", *cells]}
        walls = {}
        for name, cmd in modes.items():
            ws = tmp / name.replace(" ", "").replace(",", "-")
            shutil.copytree(base, ws, symlinks=True)
            walls[name], _ = run(cmd, ws, ws_env(ws))
            assert "up to date" in run(DVC + ["status", *cells], ws, ws_env(ws))[1], f"{name}: dvc status not clean"
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    print(f"profile {args.params}, {len(cells)} cells: {', '.join(cells)} (data stages {data_s:.1f} s, not counted)")
    print(f"{'mode':18s} {'wall s':>8s} {'vs 1 worker':>12s}")
    for name, wall in walls.items():
        print(f"{name:18s} {wall:8.1f} {walls['flow, 1 worker'] / wall:11.2f}x")
    for metric, value, goal in (
            ("dvc_repro_over_flow_2_workers_wall", walls["dvc repro"] / walls["flow, 2 workers"], ">= 0.9"),
            ("flow_1_worker_over_2_workers_wall", walls["flow, 1 worker"] / walls["flow, 2 workers"], "> 1")):
        print(json.dumps({"benchmark": "grid_workers", "metric": metric, "value": round(value, 3), "goal": goal}))


if __name__ == "__main__":
    main()
