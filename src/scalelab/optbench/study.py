"""A committed optimizer-benchmark study (results/<study>/) re-derived by today's code from its committed cells: the
generators its study.json names (`fn(folder) -> ledger entries`), and `write`, which rewrites its ledger and tables.

Two layouts are read:
- `ledger`: today's protocol (params.yaml of the study, metrics/sweep/*.json and metrics/seeds/*.json as
  scalelab.optbench.sweep writes them).
- `ledger_single_seed`: the first protocol's cells (one sweep seed chose the LR on an even grid; no second
  hyperparameters, no data budgets of the baseline, no large-batch reruns; runs named by LR and seed only). Its
  params file no longer validates (an even grid, ratio 4, one choosing seed), so only what the analysis needs is read
  from it. Today's rules then decide its claims: a choice on one seed and an LR at the grid's edge are failed
  premises, and without the baseline's budgets there is no reference curve for a speed-up in data.

    .venv/bin/python -m scalelab.optbench.study results/<study>   # rewrite the ledger and the tables
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from scalelab.ledger import claims
from scalelab.optbench import claims as claims_b, leaderboard
from scalelab.optbench.data import Bench, load_cells
from scalelab.config import OptimizerConfig, load_params
from scalelab.config.params import read_yaml


def read(folder: Path) -> tuple[Bench, dict, list[dict]]:
    """Today's layout: (settings, cells, runs)."""
    bench = Bench.from_params(load_params(Path(folder) / "params.yaml"))
    return (bench, *load_cells(Path(folder) / "metrics", bench))


def read_single_seed(folder: Path) -> tuple[Bench, dict, list[dict]]:
    """The first protocol's layout (module doc), as today's settings, cells and runs: each run's hyperparameters
    are its LR alone, at the benchmark's own budget and batch."""
    folder = Path(folder)
    raw = read_yaml(folder / "params.yaml")
    ob, model = raw["optimizers"], raw["model"]
    if "seed" not in ob or "sweep_seeds" in ob:
        raise ValueError(f"{folder}/params.yaml: not the single-seed protocol (optimizers.seed, no sweep_seeds)")
    tied = 1 if model.get("tie_embeddings") else 2
    vocab = raw["tokenizer"]["vocab_size"]
    bench = Bench(tuple(ob["optimizers"]), tuple(ob["sizes"]), ob.get("baseline", "adamw"), (ob["seed"],),
                  tuple(ob["rerun_seeds"]), (1.0,), (), 1, float(ob["lr_ratio"]),
                  {k: OptimizerConfig(**raw["optim"][k]) for k in ob["optimizers"]},
                  {s: tied * vocab * model["sizes"][s]["d_model"] for s in ob["sizes"]})
    cells, runs = {}, []
    for opt in bench.optimizers:
        for size in bench.sizes:
            sweep, seeds = (json.loads((folder / "metrics" / k / f"{opt}-{size}.json").read_text())
                            for k in ("sweep", "seeds"))
            for cell in (sweep, seeds):
                cell["runs"] = {k: {**r, "hp": {"lr": r["lr"]}, "budget": 1.0, "batch": 1}
                                for k, r in cell["runs"].items()}
            best = sweep["best_lr"]
            cells[opt, size] = {**sweep, "best_hp": None if best is None else {"lr": best}, "second": {},
                                "extra_points": 0}
            runs += [*sweep["runs"].values(), *seeds["runs"].values()]
    return bench, cells, runs


def ledger(folder: Path) -> list[dict]:
    """The ledger of a study in today's layout."""
    return claims_b.ledger(*read(folder))


def ledger_single_seed(folder: Path) -> list[dict]:
    """The ledger of a study of the first (single-seed) protocol, by today's rules."""
    return claims_b.ledger(*read_single_seed(folder))


READERS = {"ledger": read, "ledger_single_seed": read_single_seed}
MODULE = "scalelab.optbench.study"  # as study.json names it (also when this file runs as __main__)


def write(folder: Path) -> list[dict]:
    """Rewrite the study's ledger (study.json's `ledger`) and its tables (beside the ledger's markdown: the
    folder's leaderboard/ when it has one, else the folder) from its committed cells, by its `generator`."""
    folder = Path(folder)
    meta = json.loads((folder / "study.json").read_text())
    module, _, name = meta["generator"].partition(":")
    if module != MODULE or name not in READERS:
        raise ValueError(f"{folder}/study.json: generator {meta['generator']!r} is not one of this module's")
    bench, cells, runs = READERS[name](folder)
    with claims.judging(folder.name):  # as studies.regenerate judges it: a smallest effect declared later is post hoc
        entries = claims_b.ledger(bench, cells, runs)
    claims.write_claims(folder / meta["ledger"], entries)
    out = folder / "leaderboard" if (folder / "leaderboard").is_dir() else folder
    df = leaderboard.table(bench, cells, runs)
    (out / "leaderboard.md").write_text(leaderboard.markdown(df) + "\n")
    df.write_csv(out / "leaderboard.csv")
    (out / "claims_b.md").write_text(claims.markdown(entries) + "\n")
    return entries


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"{arg}: {len(write(Path(arg)))} entries")
