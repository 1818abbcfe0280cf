"""DVC stage `report`: the markdown report and its static HTML page, with the claims ledger of all four methods.

Reads what the other stages wrote (metrics/claims_*.json, metrics/evaluate, plots/pretrain, the methods' summary
folders; a method not run is said so) and the committed studies in results/ (their ledgers beside this run's). Outs: data/report/{report.md, report.html, *.png, mlflow_run.json},
metrics/report.json, plots/report/val_loss_curves.csv. MLflow: the report's files as artifacts of the pipeline's
parent run (and of its own run); under the Prefect flow, the flow publishes report.md as a markdown artifact.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from scalelab.pipeline.stage import stage_main

if TYPE_CHECKING:  # imported where used: a warm stage's process hands off before it (scalelab.pipeline.stage)
    from scalelab.config import Params

OUT, CURVES = Path("data/report"), Path("plots/report/val_loss_curves.csv")


def main(params: Params) -> None:
    from scalelab import tracking
    from scalelab.data import atomic_dir, write_json_atomic
    from scalelab.ledger import report

    g, ev = params.pretrain.grid, params.evaluate
    cells = [{"name": f"{v}-{s}-base-{seed}", "variant": v, "size": s, "seed": seed}
             for v in g.variants for s in g.sizes for seed in g.seeds]
    evaluated = ([f"{v}-{s}-base-{seed}" for v in g.variants for s in ev.sizes for seed in g.seeds] + list(ev.models)
                 if ev is not None else [])
    logged = {"grid": g.model_dump(mode="json"), "evaluated": evaluated}
    with tracking.stage_run("report", params=logged, experiment=params.tracking.experiment) as run:
        with atomic_dir(OUT) as tmp:
            metrics = report.build(Path("."), tmp, cells=cells, eval_names=evaluated, plots_csv=CURVES,
                                   pretrained=list(params.import_models))
        for path in sorted(p for p in OUT.iterdir() if p.suffix in (".md", ".html", ".png")):
            run.log_artifact(path, "report", parent=True)  # the pipeline's parent run: the report beside its children
            run.log_artifact(path, "report")
        run.log_metrics({f"claims.{v}": n for v, n in metrics["verdicts"].items()}
                        | {"models_evaluated": metrics["models_evaluated"]})
        run.record(OUT)
        # outs and metrics inside the run: FINISHED only once they are written
        write_json_atomic("metrics/report.json", metrics)
    print(f"report: {OUT / 'report.md'}, {OUT / 'report.html'} ({metrics['verdicts'] or 'no claims yet'})")


if __name__ == "__main__":
    sys.exit(stage_main(main, name="report"))
