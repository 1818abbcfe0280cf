"""DVC stage `leaderboard`: the optimizer leaderboard and the optimizer benchmark's claims ledger.

Outs: data/optimizers/leaderboard/{leaderboard.md, leaderboard.csv, curves.png, lr_sensitivity.png,
claims_b.md, mlflow_run.json}, metrics/optimizers/leaderboard.json, metrics/claims_b.json,
plots/optimizers/lr_sensitivity.csv.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from scalelab.pipeline.stage import stage_main

if TYPE_CHECKING:  # imported where used: a warm stage's process hands off before it (scalelab.pipeline.stage)
    from scalelab.config import Params


def main(params: Params) -> None:
    from scalelab.optbench import sweep as optbench

    ob = optbench.bench(params)  # the section checked before any work
    from scalelab import tracking
    from scalelab.data import atomic_dir, write_json_atomic
    from scalelab.ledger import claims
    from scalelab.optbench import claims as claims_b, leaderboard as lb
    from scalelab.optbench.data import Bench, load_cells, load_curves

    out, metrics = Path("data/optimizers/leaderboard"), Path("metrics/optimizers")
    with tracking.stage_run("leaderboard", params={"optimizers": ob.model_dump(mode="json")},
                            experiment=params.tracking.experiment, deps=[str(metrics)]) as run:
        bench = Bench.from_params(params)
        cells, runs = load_cells(metrics, bench)
        curves = load_curves(Path("plots/optimizers"), bench)
        table = lb.table(bench, cells, runs)
        entries = claims_b.ledger(bench, cells, runs)  # the same code as a committed study's generator
        with atomic_dir(out) as tmp:
            (tmp / "leaderboard.md").write_text(lb.markdown(table) + "\n")
            table.write_csv(tmp / "leaderboard.csv")
            (tmp / "claims_b.md").write_text(claims.markdown(entries) + "\n")
            lb.plot(cells, curves, bench, tmp / "curves.png", tmp / "lr_sensitivity.png")
        lb.lr_sensitivity(cells).write_csv("plots/optimizers/lr_sensitivity.csv.tmp")
        os.replace("plots/optimizers/lr_sensitivity.csv.tmp", "plots/optimizers/lr_sensitivity.csv")
        numbers = ("params", "non_embedding_params", "tokens_per_param", "best_lr", "val_loss", "val_loss_sd",
                   "speedup", "speedup_low", "speedup_high", "fit_dof", "embedding_lr_ratio",
                   *(f"{k}_vs_{ref}" for ref in bench.references for k in ("speedup", "embedding_lr_ratio")),
                   "step_time_ratio", "state_bytes_per_param", "step_peak_mb", "step_peak_bytes_per_param")
        board = {f"{r['optimizer']}-{r['size']}": {k: r[k] for k in numbers} for r in table.iter_rows(named=True)}
        run.log_metrics({f"{cell}.{k}": v for cell, row in board.items() for k, v in row.items() if v is not None})
        for name in ("leaderboard.md", "leaderboard.csv", "claims_b.md", "curves.png", "lr_sensitivity.png"):
            run.log_artifact(out / name)
        run.log_artifact(out / "leaderboard.md", parent=True)
        run.record(out)
        # outs and metrics inside the run: it ends FINISHED only once they are written
        write_json_atomic(metrics / "leaderboard.json", board)
        claims.write_claims("metrics/claims_b.json", entries)


if __name__ == "__main__":
    sys.exit(stage_main(main, name="leaderboard"))
