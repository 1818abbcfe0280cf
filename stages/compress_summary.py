"""DVC stage `compress_summary`: the compression study against the published ordering (METHODS §D).

Reads the current grid's cells (metrics/compress/<cell>.json, plots/compress/<cell>.json).
Outs: data/compress_summary/{cells.csv, summary.csv, ppl.png, erank_loss.png, mlflow_run.json},
metrics/compress.json, metrics/claims_d.json (the claims ledger), plots/compress.csv.
"""

import json
import sys
from pathlib import Path

from scalelab.config import Params, ParamsError
from scalelab.data import DataError
from scalelab.pipeline.stage import stage_main


def main(params: Params) -> None:
    cfg = params.compress
    if cfg is None:
        raise ParamsError("params has no compress section")
    grid = cfg.grid
    names = {(m, float(k), s): cfg.cell(m, str(k), s) for m in grid.methods for k in grid.keep for s in grid.seeds}
    missing = [n for n in names.values() if not (Path("metrics/compress") / f"{n}.json").is_file()]
    if missing:
        raise DataError(f"compress cells not run yet: {missing} (run the compress stage)")

    import polars as pl

    from scalelab import tracking
    from scalelab.compress import summary
    from scalelab.data import atomic_dir, write_json_atomic
    from scalelab.analysis import claims

    cells = [json.loads((Path("metrics/compress") / f"{n}.json").read_text()) for n in names.values()]
    layers = {key: json.loads((Path("plots/compress") / f"{n}.json").read_text()) for key, n in names.items()}
    out = Path("data/compress_summary")
    with tracking.stage_run("compress_summary", params={"grid": grid.model_dump(mode="json")},
                            experiment=params.tracking.experiment, deps=["metrics/compress"]) as run:
        own = summary.distinct(cfg)
        table = summary.cells_table(cells)
        layer_table = summary.layers_table({key: recs for key, recs in layers.items() if key[0] in own})
        by_method = summary.by_method(table)
        dense = table["ppl_dense"].mean()
        entries = [claims.claim(s["id"], s["text"], s["metric"], s["diffs"], s["published"], cfg.claims_level)
                   for s in summary.claim_specs(table, layer_table, cfg)]
        with atomic_dir(out) as tmp:
            table.write_csv(tmp / "cells.csv")
            by_method.write_csv(tmp / "summary.csv")
            summary.plot_ppl(by_method, dense, tmp / "ppl.png")
            rho = summary.plot_erank(layer_table, tmp / "erank_loss.png")
            run.record(tmp)
        claims.write_claims("metrics/claims_d.json", entries)
        Path("plots").mkdir(exist_ok=True)
        by_method.select("method", "keep", "ppl", "loss_rel_svd_llm").write_csv("plots/compress.csv.tmp")
        Path("plots/compress.csv.tmp").replace("plots/compress.csv")
        run.log_metrics({f"ppl.{r['method']}.{r['keep']:g}": r["ppl"] for r in by_method.iter_rows(named=True)})
        for name in ("ppl.png", "erank_loss.png"):
            run.log_artifact(out / name)
            run.log_artifact(out / name, parent=True)
        run.log_artifact("metrics/claims_d.json")
        # outs and metrics inside the run: FINISHED only once they are written (issue 21)
        ppl = {m: {f"{r['keep']:g}": r["ppl"] for r in by_method.filter(pl.col("method") == m).iter_rows(named=True)}
               for m in grid.methods}
        rel = {m: {f"{r['keep']:g}": r["loss_rel_svd_llm"]
                   for r in by_method.filter(pl.col("method") == m).iter_rows(named=True)} for m in grid.methods}
        write_json_atomic("metrics/compress.json", {"ppl_dense": dense, "ppl": ppl, "loss_rel_svd_llm": rel,
                                                    "erank_loss_spearman": rho, "cells": len(cells)})


if __name__ == "__main__":
    sys.exit(stage_main(main, name="compress_summary"))
