"""DVC stages `evaluate` and `evaluate_model`: score one model (perplexity on the fixed validation windows, zero-shot
multiple choice, forward throughput and peak memory, optional lm-eval). Params: section `evaluate`.

    python stages/evaluate.py --variant standard --size m --seed 0    # a pretrain cell, through its HF export
    python stages/evaluate.py --model hd-n2                           # an entry of evaluate.models

Outs: metrics/evaluate/<name>.json, data/evaluate/<name>/mlflow_run.json. MLflow: the metrics (`eval/...`) are
linked to the model's logged model and to the validation split.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from scalelab.pipeline.stage import stage_main

if TYPE_CHECKING:  # imported where used: a warm stage's process hands off before it (scalelab.pipeline.stage)
    from scalelab.config import Params


def target(params: Params, args: argparse.Namespace) -> tuple[str, str, str, dict | None]:
    """(name, model folder, dtype, pretrain-cell identity or None), checked against params before any compute."""
    from scalelab.config import CELL_EXPORT, ParamsError

    cfg = params.evaluate
    if cfg is None:
        raise ParamsError("params has no `evaluate` section")
    if args.model is not None:
        if args.model not in cfg.models:
            raise ParamsError(f"--model {args.model!r}: not in evaluate.models ({sorted(cfg.models)})")
        entry = cfg.models[args.model]
        return args.model, entry.path, entry.dtype, None
    if None in (args.variant, args.size, args.seed):
        raise ParamsError("give --model NAME, or --variant, --size and --seed of a pretrain cell")
    g = params.pretrain.grid
    if args.variant not in g.variants or args.size not in cfg.sizes or args.seed not in g.seeds:
        raise ParamsError(f"pretrain cell {args.variant}/{args.size}/{args.seed}: not an evaluation cell "
                          f"(variants {g.variants}, evaluate.sizes {cfg.sizes}, seeds {g.seeds})")
    cell = f"{args.variant}-{args.size}-base-{args.seed}"
    identity = {"variant": args.variant, "size": args.size, "recipe": "base", "seed": args.seed}
    export = Path(CELL_EXPORT.format(cell=cell))  # the folded HF export; cells it cannot represent: scalelab's own
    return cell, str(export if export.is_dir() else export.parent), cfg.dtype, identity


def run(params: Params, args: argparse.Namespace) -> None:
    name, path, dtype, cell = target(params, args)
    cfg = params.evaluate

    from scalelab.tracking import dashboard
    from scalelab.runtime import placement
    from scalelab import tracking
    from scalelab.data import write_json_atomic
    from scalelab.evaluate import suite
    from scalelab.evaluate.lm import load_lm

    placement.set_torch_threads(cfg.threads)
    stage = f"evaluate@{args.variant}-{args.size}-{args.seed}" if cell else f"evaluate_model@{name}"
    logged = {"evaluate": cfg.model_dump(mode="json", exclude={"models", "sizes"}),
              "model": {"name": name, "path": path, "dtype": dtype}, **({"cell": cell} if cell else {})}
    with tracking.stage_run(stage, params=logged, experiment=params.tracking.experiment,
                            deps=[path, str(suite.VAL_TEXT)]) as run:
        lm = load_lm(path, name, dtype=dtype, device=cfg.device, tokenizer_fallback=suite.TOKENIZER)
        result = suite.evaluate(lm, cfg, seq_len=cfg.seq_len or params.pretrain.seq_len,
                                val_tokens=cfg.val_tokens or params.pretrain.val_tokens)
        result["cell"] = cell
        val = [d for d in dashboard.token_datasets(suite.SHARDS / "meta.json") if d.dataset.name.endswith("/val")]
        model_id = run.find_model(path) or run.log_model(path, name, {"scalelab.registered_by": "evaluate"})
        run.log_inputs(val, [model_id] if model_id else [])
        run.log_metrics(suite.mlflow_metrics(result), model_id=model_id,
                        dataset=val[0].dataset if val and result["windows"] == "shards" else None)
        run.set_tags({"scalelab.model": name, "scalelab.model_path": path,
                      "scalelab.lm_eval": result["lm_eval"].get("skipped", "ran")})
        result["mlflow_run_id"], result["mlflow_model_id"] = run.run_id, model_id
        run.record(Path("data/evaluate") / name)
        # outs and metrics inside the run: FINISHED only once they are written
        write_json_atomic(Path("metrics/evaluate") / f"{name}.json", result)
    if skipped := result["lm_eval"].get("skipped"):
        print(f"evaluate {name}: lm-eval skipped: {skipped}")
    print(f"evaluate {name}: val_loss {result['val_loss']:.4f} (ppl {result['ppl']:.2f}, {result['bpb']:.3f} bpb), "
          f"continuation {result['continuation_acc']:.3f}, cloze {result['cloze_acc']:.3f} "
          f"(chance {result['chance']:.2f}), {result['tokens_per_s']:.0f} tokens/s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a key of evaluate.models")
    ap.add_argument("--variant")
    ap.add_argument("--size")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    return stage_main(lambda params: run(params, args), args.params, name="evaluate")


if __name__ == "__main__":
    sys.exit(main())
