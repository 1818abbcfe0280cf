"""DVC stage `compress`: every cell of the compression matrix at one calibration seed (docs/compression.md).

    python stages/compress.py --seed 0 [--store results/<study>/cells/compress]

One process per seed: the calibration statistics and the dense model's perplexity depend on the model and the
calibration windows only, so they are computed once and shared by every method × kept fraction (compress/shared.py).
Outs: data/compress/seed-<s>/{<cell>/model when compress.save_models, mlflow_run.json},
metrics/compress/seed-<s>.json ({"cells": [one metrics object per cell]}), plots/compress/seed-<s>.json (per cell,
per layer: rank, layer loss, loss relative to SVD-LLM, erank before/after, seconds, SigmaScale's convergence).
<cell> = <method>-<keep>-<seed>.
--store (default compress.store): a folder of reusable results (compress/store.py), read and written: the sensitivity
table and every SigmaScale map's converged scalings, so a rerun, another cell or another machine reuses them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from scalelab.pipeline.stage import stage_main

if TYPE_CHECKING:  # imported where used: a warm stage's process hands off before it (scalelab.pipeline.stage)
    from scalelab.config import Params


def run(params: Params, args: argparse.Namespace) -> None:
    from scalelab.config import ParamsError

    cfg = params.compress
    if cfg is None:
        raise ParamsError("params has no compress section")
    if args.seed not in cfg.grid.seeds:
        raise ParamsError(f"compress: seed {args.seed} is not in compress.grid.seeds {cfg.grid.seeds}")

    from scalelab import tracking
    from scalelab.compress.cells import run_seed
    from scalelab.data import atomic_dir, write_json_atomic

    name = f"seed-{args.seed}"
    logged = {"seed": args.seed, "methods": {m: cfg.methods[m].model_dump(mode="json") for m in cfg.grid.methods},
              **cfg.model_dump(mode="json", exclude={"methods"})}
    with tracking.stage_run(f"compress@{name}", params=logged, experiment=params.tracking.experiment,
                            deps=["data/tokens/meta.json", cfg.source_dep]) as run:
        with atomic_dir(Path("data/compress") / name) as tmp:  # a failed seed leaves no half-written models
            results = run_seed(cfg, args.seed, tmp, store=args.store)
            run.record(tmp)
        cells = [metrics for metrics, _ in results]
        for metrics in cells:  # one MLflow metric per cell and number: ppl.<cell>, tokens_per_s.<cell>, ...
            run.log_metrics({f"{k}.{metrics['cell']}": v for k, v in metrics.items()
                             if isinstance(v, (int, float)) and not isinstance(v, bool)})
        layers = {metrics["cell"]: [r.to_json() for r in records] for metrics, records in results}
        plot = Path("plots/compress") / f"{name}.json"
        plot.parent.mkdir(parents=True, exist_ok=True)
        plot.with_suffix(".tmp").write_text(json.dumps(layers, indent=1) + "\n")
        os.replace(plot.with_suffix(".tmp"), plot)
        run.log_artifact(plot)
        # outs and metrics inside the run: FINISHED only once they are written
        write_json_atomic(Path("metrics/compress") / f"{name}.json", {"cells": cells, "mlflow_run_id": run.run_id})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, required=True, help="calibration seed (one of compress.grid.seeds)")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--store", default=None, help="folder of reusable results (default: compress.store)")
    args = ap.parse_args()
    return stage_main(lambda params: run(params, args), args.params, name="compress")


if __name__ == "__main__":
    sys.exit(main())
