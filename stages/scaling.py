"""DVC stage `scaling`: fit L(N) = E + A·N^-α per scale-vector variant and check the paper's orderings (METHODS §A).

Outs: data/scaling/{cells.csv, summary.csv, fits.csv, scaling.png}, metrics/scaling.json, plots/scaling.csv.
"""

import json
import sys
from pathlib import Path

from scalelab.config import ParamsError, load_params


def main() -> int:
    try:
        params = load_params()
    except ParamsError as err:
        print(err, file=sys.stderr)
        return 2

    from scalelab import tracking
    from scalelab.evaluate import scaling

    out = Path("data/scaling")
    out.mkdir(parents=True, exist_ok=True)
    logged = {"scaling": params.scaling.model_dump(mode="json"), "grid": params.pretrain.grid.model_dump(mode="json")}
    with tracking.stage_run("scaling", params=logged,
                            experiment=params.tracking.experiment, deps=["metrics/pretrain"]) as run:
        cells = scaling.collect(Path("metrics/pretrain"), scaling.grid_cells(params.pretrain.grid))
        summary = scaling.summarize(cells)
        fits = scaling.fit_all(summary, params.scaling.min_sizes)
        cells.write_csv(out / "cells.csv")
        summary.write_csv(out / "summary.csv")
        scaling.fits_table(fits).write_csv(out / "fits.csv")
        scaling.plot(summary, fits, out / "scaling.png")
        Path("plots").mkdir(exist_ok=True)
        summary.filter(summary["recipe"] == "base").select("variant", "size", "params", "non_embedding_params",
                                                            "val_loss", "val_loss_std").write_csv("plots/scaling.csv")
        # Scaling curves with the parameter count as the step (DESIGN: MLflow records everything).
        for row in summary.filter(summary["recipe"] == "base").iter_rows(named=True):
            run.log_metrics({f"scaling.{row['variant']}.val_loss": row["val_loss"]}, step=row["non_embedding_params"])
        metrics = {"fits": {v: vars(f) for v, f in fits.items()}, "claims": scaling.claims(summary),
                   "cells": cells.height}
        run.log_metrics({f"fit.{v}.{k}": x for v, f in fits.items() for k, x in vars(f).items()})
        run.log_artifact(str(out / "scaling.png"))
        run.log_artifact(str(out / "scaling.png"), parent=True)
        run.record(out)
    Path("metrics/scaling.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
