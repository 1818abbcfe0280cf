"""DVC stage `hidden_decoding_summary`: last-stream validation loss by n at equal tokens and at equal FLOPs, SFA vs
full attention, and the Hidden Decoding claims ledger: each entry with its regime and its premises, every n > 1 cell's
recovery of its step-0 gap read from the cells' validation curves (plots/hidden_decoding). On the parity corpus: the
largest K each arm solved and the parity probe's ledger (scalelab.hidden_decoding.parity) instead.

Outs: data/hidden_decoding_summary/{cells.csv, gain_vs_n.png, curves.png, mlflow_run.json},
metrics/hidden_decoding.json, metrics/claims_c.json, plots/hidden_decoding_gain.csv.
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

    hd = params.hidden_decoding
    if hd is None:
        raise ParamsError("params has no hidden_decoding section")

    from scalelab import tracking
    from scalelab.data import DataError, atomic_dir, write_json_atomic
    from scalelab.ledger import claims as ledger
    from scalelab.hidden_decoding import ledger as hdr

    out = Path("data/hidden_decoding_summary")
    logged = {"grid": hd.grid, "seeds": hd.seeds, "cells": {c: hd.cells[c].model_dump(mode="json") for c in hd.grid},
              "claims": hd.claims.model_dump(mode="json")}
    if hd.train.corpus == "parity":
        return parity(hd, logged, params.tracking.experiment, out)
    with tracking.stage_run("hidden_decoding_summary", params=logged, experiment=params.tracking.experiment,
                            deps=["metrics/hidden_decoding"]) as run:
        try:
            cells = hdr.collect(Path("metrics/hidden_decoding"), hd)
        except ValueError as err:
            raise DataError(str(err)) from None
        cmp = hdr.comparisons(cells, hd)
        plots = Path("plots/hidden_decoding")
        val = {cell: {seed: hdr.read_curve(plots / f"{cell}-{seed}.csv") for seed in by_seed}
               for cell, by_seed in cells.items()}
        entries = hdr.claims(cmp, hdr.Setting(hd, cells, curves=val), hd.claims.sfa_fraction, hd.claims.level)
        rows, gains = hdr.table(cells, hd), hdr.gain_rows(cmp)
        curves = {f"{cell}-{seed}": (m["flops_per_token"], val[cell][seed])
                  for cell, by_seed in cells.items() for seed, m in by_seed.items()}
        with atomic_dir(out) as tmp:
            hdr.write_csv(tmp / "cells.csv", rows)
            hdr.plot(gains, curves, tmp)
        Path("plots").mkdir(exist_ok=True)
        hdr.write_csv("plots/hidden_decoding_gain.csv", gains)
        for g in gains:  # gain against n as an MLflow curve (n as the step)
            run.log_metrics({k: v for k, v in g.items() if k != "n_streams"}, step=g["n_streams"])
        run.log_metrics({f"{r['cell']}.val_loss": r["val_loss"] for r in rows})
        for png in ("gain_vs_n.png", "curves.png"):
            run.log_artifact(out / png)
        run.log_artifact(out / "gain_vs_n.png", parent=True)
        run.record(out)
        # outs and metrics inside the run: FINISHED only once they are written
        write_json_atomic("metrics/hidden_decoding.json", {"cells": rows, "gain_vs_n": gains})
        ledger.write_claims("metrics/claims_c.json", entries)


def parity(hd, logged: dict, experiment: str, out: Path) -> None:
    """A parity probe's summary: the largest K each arm solved (its table) and its ledger (scalelab.hidden_decoding.parity)."""
    from scalelab import tracking
    from scalelab.ledger import claims as ledger
    from scalelab.hidden_decoding import parity as hd_parity
    from scalelab.hidden_decoding import ledger as hdr
    from scalelab.data import DataError, atomic_dir, write_json_atomic

    metrics = Path("metrics/hidden_decoding")
    files = {f"{c}-{s}.json": metrics / f"{c}-{s}.json" for c in hd.grid for s in hd.seeds}
    if missing := [str(p) for p in files.values() if not p.is_file()]:
        raise DataError(f"{missing[0]}: missing; run the hidden_decoding stage of this cell first")
    with tracking.stage_run("hidden_decoding_summary", params=logged, experiment=experiment,
                            deps=["metrics/hidden_decoding"]) as run:
        try:
            entries, table = hd_parity.entries(hd, files), hd_parity.largest_markdown(hd, files)
        except ValueError as err:
            raise DataError(str(err)) from None
        with atomic_dir(out) as tmp:
            (tmp / "largest_k.md").write_text(table + "\n")
        Path("plots").mkdir(exist_ok=True)
        hdr.write_csv("plots/hidden_decoding_gain.csv", hd_parity.gain_rows(hd, files))
        run.record(out)
        write_json_atomic("metrics/hidden_decoding.json", {"largest_k": table})
        ledger.write_claims("metrics/claims_c.json", entries)


if __name__ == "__main__":
    sys.exit(stage_main(main, name="hidden_decoding_summary"))
