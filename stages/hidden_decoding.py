"""DVC stage `hidden_decoding`: continue the backbone as one Hidden Decoding cell (or, on the parity corpus, train a
random one from scratch, or first as one stream and then with the cell's streams: `backbone_steps`; or,
`forward_only`, score it at step 0) and record its metrics.

    python stages/hidden_decoding.py --cell n4 --seed 0

Outs: data/hidden_decoding/<cell>-<seed>/{ckpt (persistent: a rerun resumes), model (Hugging Face folder with the
extra embedding tables and hidden_decoding.json, curve.csv, metrics.json)}, metrics/hidden_decoding/<cell>-<seed>.json,
plots/hidden_decoding/<cell>-<seed>.csv.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from scalelab.pipeline.stage import stage_main

if TYPE_CHECKING:  # imported where used: a warm stage's process hands off before it (scalelab.pipeline.stage)
    from scalelab.config import Params


def train(params: Params, args: argparse.Namespace) -> None:
    from scalelab.config import ParamsError

    hd = params.hidden_decoding
    if hd is None:
        raise ParamsError("params has no hidden_decoding section")
    hd = hd.for_seed(args.seed)  # under backbone_per_seed: this seed's pretrain cell
    if args.cell not in hd.cells:
        raise ParamsError(f"--cell {args.cell!r}: not in hidden_decoding.cells ({sorted(hd.cells)})")
    model_cfg = hd.model(args.cell)

    from scalelab.data import DataError, write_json_atomic
    from scalelab.model.hf import ModelLoadError

    name, shards = f"{args.cell}-{args.seed}", Path("data/tokens")
    out_dir = Path("data/hidden_decoding") / name

    from scalelab.hidden_decoding import train as hdt
    from scalelab.hidden_decoding import continued as hdc

    try:
        backbone_config = hdt.cell_backbone_config(hd, args.cell)
    except ModelLoadError as err:
        raise DataError(str(err)) from None
    try:  # streams that cannot differ or cannot matter: refused before any compute
        model_cfg.mixing(backbone_config.num_hidden_layers)
    except ValueError as err:
        raise ParamsError(f"cell {args.cell}: {err}") from None

    from scalelab import tracking
    from scalelab.hidden_decoding.task import cell_train, task_of

    corpus = hdt.load_corpus(hd, args.cell, shards, Path("data/prepared"), hdt.backbone_tokenizer(hd))
    steps = hdt.cell_steps(hd, args.cell, backbone_config, len(corpus.shards.train))
    task = task_of(hd, args.cell)
    logged = {"cell": {"name": args.cell, "seed": args.seed, "steps": steps,
                       **({"task": task.describe()} if task else {})},
              "model": model_cfg.model_dump(mode="json"), "source": hd.source.model_dump(mode="json"),
              "train": cell_train(hd, args.cell).model_dump(mode="json")}
    run_id = hdc.resume_run_id(hd, args.cell, args.seed, out_dir, corpus, backbone_config)
    data_dep = ("src/scalelab/hidden_decoding/parity_task.py" if task else "data/prepared" if hd.uses_text()
                else str(shards / "meta.json"))
    with tracking.stage_run(f"hidden_decoding@{name}", params=logged, experiment=params.tracking.experiment,
                            deps=[data_dep, hd.source_dep], run_id=run_id) as run:
        metrics = hdc.fit(hd, args.cell, args.seed, out_dir, shards, run,
                          plot=Path("plots/hidden_decoding") / f"{name}.csv", corpus=corpus)
        run.record(out_dir / "model")
        # outs and metrics inside the run: FINISHED only once they are written
        write_json_atomic(Path("metrics/hidden_decoding") / f"{name}.json",
                          {"cell": args.cell, "seed": args.seed, **metrics, "mlflow_run_id": run.run_id})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cell", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    return stage_main(lambda params: train(params, args), args.params, name="hidden_decoding")


if __name__ == "__main__":
    sys.exit(main())
