"""DVC stage `compress_summary`: the compression study against the published ordering.

Reads every seed of the current grid (metrics/compress/seed-<s>.json, plots/compress/seed-<s>.json).
Outs: data/compress_summary/{cells.csv, summary.csv, ppl.png, erank_loss.png, mlflow_run.json},
metrics/compress.json (perplexity, layer loss relative to SVD-LLM, forward tokens/s and weight bytes per method and
kept fraction, SigmaScale's convergence, the SigmaScale methods run as a smoke test: `smoke`), metrics/claims_d.json
(the claims ledger: scalelab.compress.ledger, the same function that rebuilds a committed study's ledger from its
files; a smoke run enters no claim), plots/compress.csv.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from scalelab.pipeline.stage import stage_main

if TYPE_CHECKING:  # imported where used: a warm stage's process hands off before it (scalelab.pipeline.stage)
    from scalelab.config import Params


def main(params: Params) -> None:
    from scalelab.config import ParamsError

    cfg = params.compress
    if cfg is None:
        raise ParamsError("params has no compress section")
    grid = cfg.grid

    import polars as pl

    from scalelab import tracking
    from scalelab.ledger import claims
    from scalelab.compress import ledger, summary
    from scalelab.data import atomic_dir, write_json_atomic

    cells, layers = summary.load(Path("."), cfg)
    out = Path("data/compress_summary")
    with tracking.stage_run("compress_summary", params={"grid": grid.model_dump(mode="json")},
                            experiment=params.tracking.experiment, deps=["metrics/compress"]) as run:
        own = summary.distinct(cfg)
        table = summary.cells_table(cells)
        layer_table = summary.layers_table({key: recs for key, recs in layers.items() if key[0] in own})
        by_method = summary.by_method(table)
        dense = table["ppl_dense"].mean()
        entries = ledger.ledger(cells, layers, cfg, cfg.store)
        with atomic_dir(out) as tmp:
            table.write_csv(tmp / "cells.csv")
            by_method.write_csv(tmp / "summary.csv")
            summary.plot_ppl(by_method, dense, tmp / "ppl.png")
            smoke = sorted(cfg.smoke())  # the spectrum claim leaves a smoke run out: so does its figure
            rho = summary.plot_erank(layer_table.filter(~pl.col("method").is_in(smoke)) if smoke else layer_table,
                                     tmp / "erank_loss.png")
            run.record(tmp)
        claims.write_claims("metrics/claims_d.json", entries)
        Path("plots").mkdir(exist_ok=True)
        by_method.select("method", "keep", "ppl", "loss_rel_svd_llm").write_csv("plots/compress.csv.tmp")
        Path("plots/compress.csv.tmp").replace("plots/compress.csv")
        converged = summary.convergence(layer_table)
        run.log_metrics({**{f"ppl.{r['method']}.{r['keep']:g}": r["ppl"] for r in by_method.iter_rows(named=True)},
                         **{f"tokens_per_s.{r['method']}.{r['keep']:g}": r["tokens_per_s"]
                            for r in by_method.iter_rows(named=True)},
                         "tokens_per_s.dense": table["tokens_per_s_dense"].mean(),
                         **{f"sigmascale.{k}": v for k, v in converged.items()}})
        for name in ("ppl.png", "erank_loss.png"):
            run.log_artifact(out / name)
            run.log_artifact(out / name, parent=True)
        run.log_artifact("metrics/claims_d.json")

        def per(column: str) -> dict:
            return {m: {f"{r['keep']:g}": r[column] for r in by_method.filter(pl.col("method") == m)
                        .iter_rows(named=True)} for m in grid.methods}

        # outs and metrics inside the run: FINISHED only once they are written
        write_json_atomic("metrics/compress.json", {
            "ppl_dense": dense, "ppl": per("ppl"), "loss_rel_svd_llm": per("loss_rel_svd_llm"),
            "tokens_per_s_dense": table["tokens_per_s_dense"].mean(), "tokens_per_s": per("tokens_per_s"),
            "weight_bytes_dense": table["weight_bytes_dense"].mean(), "weight_bytes": per("weight_bytes"),
            "sigmascale_convergence": converged, "erank_loss_spearman": rho, "cells": len(cells),
            # SigmaScale methods that cannot reach their plateau by construction: smoke runs, in no claim
            "smoke": smoke})


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    sys.exit(stage_main(main, ap.parse_args().params, name="compress_summary"))
