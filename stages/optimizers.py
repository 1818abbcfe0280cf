"""DVC stages `optimizers` and `optimizers_seeds` (and for the pinned arms `optimizers_pinned`,
`optimizers_pinned_seeds`): one optimizer at one model size (docs/optimizers.md).

    python stages/optimizers.py --optimizer muon --size xs            # the protocol's sweep (optimizers.sweep_seeds)
    python stages/optimizers.py --optimizer muon --size xs --seeds    # its choice rerun with optimizers.rerun_seeds

The protocol (LR grid and its extension, second hyperparameters, budgets) is scalelab.config.optbench's docstring.
A cell is an optimizer's whole sweep at one size, not a single run: a process costs ~2-9 s before it trains
(imports, DVC, MLflow) against ~2-6 s per run at the default profile, and one process per sweep also times the
optimizer's steps interleaved with the baseline's (scalelab.optbench.timing.step_time_ratio). A pinned arm's
sweep reads its reference's sweep metrics at its size (optimizers.pin_to, default the baseline: its side group takes
that arm's tuned hyperparameters), so it runs after that sweep cell.
Outs (<stage> = sweep or seeds): data/optimizers/<stage>/<optimizer>-<size>/ (persistent: one folder per run with
its checkpoint and result.json, reused or resumed by a rerun), metrics/optimizers/<stage>/<optimizer>-<size>.json,
plots/optimizers/<stage>/<optimizer>-<size>.csv (validation curves).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from scalelab.pipeline.stage import stage_main

if TYPE_CHECKING:  # imported where used: a warm stage's process hands off before it (scalelab.pipeline.stage)
    from scalelab.config import Params


def main(params: Params, args: argparse.Namespace) -> None:
    from scalelab.config import ParamsError

    start = time.perf_counter()
    if params.optimizers is None:
        raise ParamsError("params has no `optimizers` section (the optimizer benchmark, config/optbench.py)")
    params.optimizers.check_cell(args.optimizer, args.size)  # names first, before the trainer's imports
    from scalelab import tracking
    from scalelab.data import DataError, write_json_atomic
    from scalelab.optbench import sweep as optbench

    kind, name = ("seeds" if args.seeds else "sweep"), f"{args.optimizer}-{args.size}"
    pinned = "_pinned" if args.optimizer in params.optimizers.pinned else ""
    stage = f"optimizers{pinned}{'_seeds' if args.seeds else ''}@{name}"  # the DVC stage's name
    out, shards = Path("data/optimizers") / kind / name, Path("data/tokens")
    # One MLflow child run per cell under the pipeline's parent; each training run of the cell nests under it
    logged = {"optimizer": args.optimizer, "size": args.size, "kind": kind,
              "optimizers": params.optimizers.model_dump(mode="json")}
    with tracking.stage_run(stage, params=logged, experiment=params.tracking.experiment,
                            deps=[str(shards / "meta.json")]) as run, tracking.nested_under(run):
        if args.seeds:
            sweep = json.loads((Path("metrics/optimizers/sweep") / f"{name}.json").read_text())  # its choice
            cell = optbench.seeds_cell(params, args.optimizer, args.size, sweep, out, shards, stage)
        else:
            baseline = None
            if ref := params.optimizers.pinned_to(args.optimizer):  # its side group: that reference's choice
                path = Path("metrics/optimizers/sweep") / f"{ref}-{args.size}.json"
                if not path.is_file():
                    raise DataError(f"{path} absent: the pinned arm {args.optimizer} runs after the sweep of {ref} "
                                    f"(stage optimizers@{ref}-{args.size})")
                baseline = json.loads(path.read_text())
            cell = optbench.sweep_cell(params, args.optimizer, args.size, out, shards, stage, baseline=baseline)
        run.log_metrics({k: v for k, v in optbench.cell_metrics(cell).items() if isinstance(v, int | float)})
        # outs and metrics inside the run: FINISHED only once they are written
        plot = Path("plots/optimizers") / kind / f"{name}.csv"
        plot.parent.mkdir(parents=True, exist_ok=True)
        rows = [optbench.CURVE_COLUMNS, *optbench.curve_rows(cell["runs"])]
        plot.with_suffix(".tmp").write_text("".join(",".join(map(str, r)) + "\n" for r in rows))
        os.replace(plot.with_suffix(".tmp"), plot)  # atomic: never half a curve
        # The cell's cost: CPU seconds of the whole process (imports included), wall seconds after the params loaded.
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cost = {"cell_cpu_s": usage.ru_utime + usage.ru_stime, "cell_wall_s": time.perf_counter() - start}
        write_json_atomic(Path("metrics/optimizers") / kind / f"{name}.json", {**optbench.cell_metrics(cell), **cost})


def cli() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--optimizer", required=True)
    ap.add_argument("--size", required=True)
    ap.add_argument("--seeds", action="store_true", help="rerun the sweep's best LR with optimizers.rerun_seeds")
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    return stage_main(lambda params: main(params, args), args.params, name="optimizers")


if __name__ == "__main__":
    sys.exit(cli())
