"""Each SigmaScale cell of a study evaluated at the other stopping rule's answers, from its store alone.

A `stop: fixed` run (the paper's 1000 steps a map) keeps, per map, both its last scalings and what the plateau rule
would have returned on the same trajectory (compressor.sigmascale_map, sigmascale.plateau_answer). Whether a verdict
could change with more or less optimisation is a question about the model, not a map: the perplexity of each cell at
either answer (the ledger's premise "optimisation settled", compress/ledger.py). This runs the study's cells of its
SigmaScale methods again with the other rule, through the compress stage's own code (cells.run_seed), on a frozen
store: every map is read back, none is optimised (a map the store lacks stops the run, store.MissingScalings), and
each evaluated cell lands in the store as a part keyed exactly as the cell's own but for `sigmascale.stop`, where the
ledger finds it.

    python -m scalelab.compress.steps --params results/<study>/params.yaml --store results/<study>/store --seed 0
        [--model <HF folder>] [--prepared <prepared corpus folder>]

`--model` and `--prepared` default to the params' source and data/prepared (the import_model and prepare stages'
outs); naming them runs it on a copy made elsewhere (`scalelab.model.gguf.import_gguf`,
`scalelab.data.corpus.prepare_corpus`): the store's keys hold the model's and the windows' digests, so only the same
model and corpus find its scalings. Cost: the seed's calibration statistics and one evaluation per cell (minutes of
a core for SmolLM2-135M), no optimisation.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from scalelab.config.compress import CompressConfig
from scalelab.config.source import ModelSource

OTHER = {"fixed": "plateau", "plateau": "fixed"}


def other_rule(cfg: CompressConfig, model_dir: str | None = None) -> CompressConfig:
    """`cfg` with the other stopping rule, its grid cut to the SigmaScale methods that enter claims (not the smoke
    runs), and the model read from `model_dir` when named (the part keys do not hold the path, only the weights)."""
    methods = [m for m in cfg.grid.methods if cfg.methods[m].kind == "sigmascale" and m not in cfg.smoke()]
    if not methods:
        raise ValueError("compress.grid.methods has no SigmaScale method in a claim: nothing to evaluate")
    update = {"sigmascale": cfg.sigmascale.model_copy(update={"stop": OTHER[cfg.sigmascale.stop]}),
              "grid": cfg.grid.model_copy(update={"methods": methods}), "save_models": False}
    if model_dir is not None:
        update["source"] = ModelSource(path=str(model_dir), dtype=cfg.source.dtype)
    return cfg.model_copy(update=update)


def run(cfg: CompressConfig, seed: int, store: str, model_dir: str | None = None,
        prepared: str | None = None) -> list[dict]:
    """The SigmaScale cells of `cfg` at `seed` under the other rule, from `store` only; their metrics (each also
    written to the store as a part)."""
    from scalelab.compress.cells import run_seed

    with tempfile.TemporaryDirectory() as out:
        results = run_seed(other_rule(cfg, model_dir), seed, out, store, optimise=False, prepared=prepared)
    return [metrics for metrics, _ in results]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", required=True, help="the study's params.yaml")
    ap.add_argument("--store", required=True, help="the study's store (results/<study>/store)")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--model", help="the model's HF folder (default: the params' compress.source)")
    ap.add_argument("--prepared", help="the prepared corpus folder (default: data/prepared)")
    args = ap.parse_args(argv)

    from scalelab.compress.diagnose import compress_section
    from scalelab.pipeline.stage import reported
    from scalelab.runtime.log import setup

    setup()

    def body() -> None:
        cfg = compress_section(args.params)
        for m in run(cfg, args.seed, args.store, args.model, args.prepared):
            print(f"{m['cell']} at stop {m['sigmascale_stop_rule']}: val NLL {m['val_nll']:.5f} (ppl {m['ppl']:.3f}), "
                  f"{m['sigmascale_reused']} of {m['sigmascale_maps']} maps from the store")

    return reported("compress other-rule evaluation", body)


if __name__ == "__main__":
    sys.exit(main())
