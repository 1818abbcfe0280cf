"""DVC stage `scaling`: fit L(N) = E + A·N^-α per scale-vector variant and write the claims ledger.

Outs: data/scaling/{cells.csv, summary.csv, fits.csv, paired.csv, claims_a.md, claims_a_by_recipe.md, scaling.png,
mlflow_run.json}, metrics/scaling.json, metrics/claims_a.json, plots/scaling.csv.
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
    import polars as pl

    from scalelab import tracking
    from scalelab.data import atomic_dir, write_json_atomic
    from scalelab.ledger import claims
    from scalelab.scale_vectors import claims as claims_a, scaling

    out = Path("data/scaling")
    logged = {"scaling": params.scaling.model_dump(mode="json"), "grid": params.pretrain.grid.model_dump(mode="json")}
    with tracking.stage_run("scaling", params=logged, experiment=params.tracking.experiment,
                            deps=["metrics/pretrain"]) as run:
        cells = scaling.collect(Path("metrics/pretrain"), scaling.grid_cells(params.pretrain.grid))
        summary = scaling.summarize(cells)
        fits = scaling.fit_all(cells, params.scaling)
        entries = claims_a.ledger(cells, fits, params)
        base = summary.filter(pl.col("recipe") == "base")
        with atomic_dir(out) as tmp:
            cells.write_csv(tmp / "cells.csv")
            summary.write_csv(tmp / "summary.csv")
            scaling.fits_table(fits).write_csv(tmp / "fits.csv")
            claims_a.paired_table(cells).write_csv(tmp / "paired.csv")
            (tmp / "claims_a.md").write_text(claims.markdown(entries) + "\n")
            (tmp / "claims_a_by_recipe.md").write_text(claims_a.recipe_table(entries) + "\n")
            scaling.plot(summary, fits, tmp / "scaling.png")
        Path("plots").mkdir(exist_ok=True)
        base.select("variant", "size", "params", "non_embedding_params", "val_loss", "val_loss_std").write_csv(
            "plots/scaling.csv.tmp")
        os.replace("plots/scaling.csv.tmp", "plots/scaling.csv")  # atomic
        # The scaling curves with the parameter count as the step; the plot in the pipeline's parent run too.
        for row in base.iter_rows(named=True):
            run.log_metrics({f"scaling.{row['variant']}.val_loss": row["val_loss"]}, step=row["non_embedding_params"])
        run.log_metrics({f"fit.{v}.{k}": float(x) for v, f in fits.items() for k, x in f.row().items()
                         if isinstance(x, (int, float)) and x is not None})
        run.log_artifact(out / "scaling.png")
        run.log_artifact(out / "scaling.png", parent=True)
        run.log_artifact(out / "claims_a.md")
        run.record(out)
        # outs and metrics inside the run: FINISHED only once they are written
        claims.write_claims("metrics/claims_a.json", entries)
        write_json_atomic("metrics/scaling.json",
                          {"cells": cells.height, "fits": {v: f.row() for v, f in fits.items()}})


if __name__ == "__main__":
    sys.exit(stage_main(main, name="scaling"))
