"""DVC stage `compress`: one cell of the compression matrix, method × kept fraction × calibration seed (METHODS §D).

    python stages/compress.py --method sigmascale --keep 0.75 --seed 0

Outs: data/compress/<cell>/{model (low-rank checkpoint + tokenizer; loads with AutoModelForCausalLM once
scalelab.compress is imported), mlflow_run.json}, metrics/compress/<cell>.json, plots/compress/<cell>.json (per
layer: rank, layer loss, loss relative to SVD-LLM, erank before/after, seconds). <cell> = <method>-<keep>-<seed>.
"""

import argparse
import json
import os
import sys
from pathlib import Path

from scalelab.config import Params, ParamsError
from scalelab.pipeline.stage import stage_main


def run(params: Params, args: argparse.Namespace) -> None:
    cfg = params.compress
    if cfg is None:
        raise ParamsError("params has no compress section")
    try:
        name = cfg.cell(args.method, args.keep, args.seed)
    except ValueError as err:
        raise ParamsError(f"compress: {err}") from None

    from scalelab import tracking
    from scalelab.compress.cell import run_cell
    from scalelab.data import atomic_dir, write_json_atomic

    logged = {"cell": {"method": args.method, "keep": args.keep, "seed": args.seed},
              "method": cfg.methods[args.method].model_dump(mode="json"),
              **cfg.model_dump(mode="json", exclude={"methods", "grid"})}
    with tracking.stage_run(f"compress@{name}", params=logged, experiment=params.tracking.experiment,
                            deps=["data/tokens/meta.json", cfg.source_dep]) as run:
        with atomic_dir(Path("data/compress") / name) as tmp:  # a failed cell leaves no half-written model
            metrics, records = run_cell(cfg, args.method, args.keep, args.seed, tmp)
            run.record(tmp)
        run.log_metrics({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
        layers = [r.to_json() for r in records]
        plot = Path("plots/compress") / f"{name}.json"
        plot.parent.mkdir(parents=True, exist_ok=True)
        plot.with_suffix(".tmp").write_text(json.dumps(layers, indent=1) + "\n")
        os.replace(plot.with_suffix(".tmp"), plot)
        run.log_artifact(plot)
        # outs and metrics inside the run: FINISHED only once they are written (issue 21)
        write_json_atomic(Path("metrics/compress") / f"{name}.json", {**metrics, "mlflow_run_id": run.run_id})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", required=True)
    ap.add_argument("--keep", required=True, help="kept fraction, spelled as in compress.grid.keep")
    ap.add_argument("--seed", type=int, required=True, help="calibration seed")
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    return stage_main(lambda params: run(params, args), args.params, name="compress")


if __name__ == "__main__":
    sys.exit(main())
