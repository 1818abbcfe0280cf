"""DVC stage `pretrain`: train one cell of the scale-vector matrix (docs/scale-vectors.md) and record its final metrics.

    python stages/pretrain.py --variant unified --size s --recipe base --seed 0

Outs: data/pretrain/<cell>/{ckpt (persistent: a rerun resumes), model (weights, curve.csv, gamma.csv, and for
dense Pre-Norm cells hf/: the folded Llama/Qwen3 export with the tokenizer, what method stages load)},
metrics/pretrain/<cell>.json, plots/pretrain/<cell>.csv.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from scalelab.pipeline.stage import stage_main

if TYPE_CHECKING:  # imported where used: a warm stage's process hands off before it (scalelab.pipeline.stage)
    from scalelab.config import Params


def train(params: Params, args: argparse.Namespace) -> None:
    from scalelab.config import ParamsError

    if args.recipe not in params.pretrain.recipes:
        raise ParamsError(f"--recipe {args.recipe!r}: not in pretrain.recipes ({sorted(params.pretrain.recipes)})")
    recipe = params.pretrain.recipes[args.recipe]
    model = params.resolve_model(args.size, args.variant, vocab_size=1, recipe=args.recipe)  # names checked first
    tokenizer = Path("data/tokenizer/tokenizer.json")

    from scalelab import tracking
    from scalelab.data import DataError, write_json_atomic
    from scalelab.model.export import export_cell, hf_exportable
    from scalelab.train import Cell, config_hash, fit, resume_run_id  # first: it imports Lightning lean (train/lean.py)

    from lightning.pytorch.utilities import rank_zero_only  # noqa: I001

    if hf_exportable(model) and not tokenizer.is_file():
        raise DataError(f"{tokenizer}: missing (the Hugging Face export saves it); run the tokenizer stage first")

    cell = Cell(variant=args.variant, size=args.size, recipe=args.recipe, seed=args.seed)
    name = f"{cell.variant}-{cell.size}-{cell.recipe}-{cell.seed}"
    stage = (f"pretrain@{cell.variant}-{cell.size}-{cell.seed}" if cell.recipe == "base"
             else f"pretrain_recipe@{cell.recipe}-{cell.variant}-{cell.size}-{cell.seed}")
    out_dir, shards = Path("data/pretrain") / name, Path("data/tokens")
    identity = {"variant": cell.variant, "size": cell.size, "recipe": cell.recipe, "seed": cell.seed}
    logged = {"cell": identity, "model": model.model_dump(mode="json", exclude={"vocab_size"}),
              "recipe": recipe.model_dump(mode="json"),
              "optim": params.optim[recipe.optimizer].model_dump(mode="json"),
              "pretrain": params.pretrain.model_dump(mode="json", exclude={"grid", "recipes"})}
    run_id = resume_run_id(out_dir, config_hash(params, cell, shards))
    with tracking.stage_run(stage, params=logged, experiment=params.tracking.experiment,
                            deps=[str(shards / "meta.json")], run_id=run_id) as run:
        metrics = fit(params, cell, out_dir, shards, run)
        if rank_zero_only.rank == 0:
            metrics["hf_export"] = export_cell(out_dir / "model", tokenizer, params.tokenizer.eot_token)
        run.record(out_dir / "model")
        # outs and metrics inside the run: FINISHED only once they are written
        if rank_zero_only.rank == 0:  # under DDP, Lightning re-runs this script on every rank
            write_json_atomic(Path("metrics/pretrain") / f"{name}.json",
                              {**identity, **metrics, "mlflow_run_id": run.run_id})
            plot = Path("plots/pretrain") / f"{name}.csv"
            plot.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out_dir / "model" / "curve.csv", plot.with_suffix(".tmp"))
            os.replace(plot.with_suffix(".tmp"), plot)  # atomic: a crash never leaves half a curve


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for axis in ("variant", "size", "recipe"):
        ap.add_argument(f"--{axis}", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    return stage_main(lambda params: train(params, args), args.params, name="pretrain")


if __name__ == "__main__":
    sys.exit(main())
