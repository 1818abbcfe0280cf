"""What the optimizer benchmark's analysis reads: its settings (`Bench`), the sweep and rerun cells' metrics, and
per-run lookups (the final loss of one optimizer at one configuration, size, seed, data budget and batch; the
configuration a reference chose at each data budget).

`Bench` holds only what the leaderboard and the ledger use of a params file.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from scalelab.ledger.studies import cell_files
from scalelab.config import OptimizerConfig, Params, load_params
from scalelab.optim import spec
from scalelab.optbench.protocol import embedding_lr, lr_key, side_lr


@dataclass(frozen=True)
class Bench:
    """The benchmark's settings: the grid (every arm's optimizer key, pinned arms included, × sizes), the baseline,
    the seeds that choose and those held out, the references' data budgets, the large-batch reruns, the LR grid's
    ratio, each optimizer key's entry of `optim` (its centre), the token embedding plus LM head parameters of each
    size (vocab × d_model, twice when untied), and the reference arms beyond the baseline (the embedding-LR
    control)."""

    optimizers: tuple[str, ...]
    sizes: tuple[str, ...]
    baseline: str
    sweep_seeds: tuple[int, ...]
    rerun_seeds: tuple[int, ...]
    budgets: tuple[float, ...]
    batch_optimizers: tuple[str, ...]
    batch_factor: int
    lr_ratio: float
    optim: dict[str, OptimizerConfig]
    embedding_params: dict[str, int]
    references: tuple[str, ...] = ()

    @classmethod
    def from_params(cls, params: Params) -> "Bench":
        if params.optimizers is None:
            raise ValueError("params has no `optimizers` section (the optimizer benchmark)")
        ob = params.optimizers
        tied = 1 if params.model.tie_embeddings else 2
        return cls(tuple(ob.arms), tuple(ob.sizes), ob.baseline, tuple(ob.sweep_seeds), tuple(ob.rerun_seeds),
                   tuple(ob.budgets), tuple(ob.batch_optimizers), ob.batch_factor, ob.lr_ratio,
                   {k: params.optim[k] for k in ob.arms},
                   {s: tied * params.tokenizer.vocab_size * params.model.sizes[s].d_model for s in ob.sizes},
                   tuple(ob.references))

    @property
    def reference_arms(self) -> tuple[str, ...]:
        """The arms every speed-up and comparison can be against: the baseline, then each reference."""
        return (self.baseline, *self.references)

    def name(self, opt: str) -> str:
        """The registry name of optimizer key `opt` (the claims are about families, whatever the key)."""
        return self.optim[opt].name

    def embeddings_on_side(self, opt: str) -> bool:
        """Whether `opt` sends the embeddings and LM head to its AdamW side group (the matrix families)."""
        return opt != self.baseline and spec(self.name(opt)).matrices_only

    def side_lr(self, opt: str, hp: dict, cell: dict | None = None) -> float:
        """The side group's LR of `opt`'s run at `hp` (a pinned arm's: its cell's pin)."""
        return side_lr(self.optim[opt], hp["lr"], pin(cell))

    def embedding_lr(self, opt: str, hp: dict, cell: dict | None = None) -> float:
        """The LR `opt`'s embeddings and LM head train at in its run at `hp` (scalelab.optbench.protocol.embedding_lr)."""
        return embedding_lr(self.optim[opt], hp, pin(cell))


def pin(cell: dict | None) -> dict | float | None:
    """A pinned arm's side group as its sweep cell recorded it: the whole pin (`pinned_side`), or the LR alone in a
    cell written before the pin held more (`pinned_lr`)."""
    cell = cell or {}
    return cell.get("pinned_side") or cell.get("pinned_lr")


def load_cells(metrics_dir: Path | dict[tuple[str, str], Path], bench: Bench) -> tuple[dict, list[dict]]:
    """({(optimizer, size): sweep summary, with a reference's LR choices at the other budgets from its rerun cell
    (`budget_tunes`)}, every run of the grid's sweep and seed cells). `metrics_dir`: the stages' metrics folder
    (<dir>/sweep/<optimizer>-<size>.json, <dir>/seeds/…), or {(kind, "<optimizer>-<size>"): file} (`study_files`)."""
    def path(kind: str, name: str) -> Path:
        if isinstance(metrics_dir, dict):
            if (kind, name) not in metrics_dir:
                raise FileNotFoundError(f"no committed cell holds metrics/optimizers/{kind}/{name}.json")
            return metrics_dir[kind, name]
        return Path(metrics_dir) / kind / f"{name}.json"

    cells, runs = {}, []
    for opt in bench.optimizers:
        for size in bench.sizes:
            sweep = json.loads(path("sweep", f"{opt}-{size}").read_text())
            seeds = json.loads(path("seeds", f"{opt}-{size}").read_text())
            cells[opt, size] = {**sweep, **({"budget_tunes": seeds["budget_tunes"]} if seeds.get("budget_tunes")
                                            else {})}
            runs += [*sweep["runs"].values(), *seeds["runs"].values()]
    return cells, runs


def study_files(folder: Path) -> dict[tuple[str, str], Path]:
    """{(kind, "<optimizer>-<size>"): file} of a study's committed stage cells (kind: sweep or seeds), as
    `scalelab study` keeps them (scalelab.ledger.studies.cell_files)."""
    return {(kind, name.removesuffix(".json")): path for kind in ("sweep", "seeds")
            for name, path in cell_files(folder, f"metrics/optimizers/{kind}", ".json").items()}


def read_study(folder: Path) -> tuple[Bench, dict, list[dict]]:
    """A committed study run by `scalelab study` (its params.yaml and its cells): (settings, cells, runs)."""
    bench = Bench.from_params(load_params(Path(folder) / "params.yaml"))
    return (bench, *load_cells(study_files(folder), bench))


def chosen(cell: dict, budget: float = 1.0) -> dict | None:
    """The hyperparameters an arm's cell chose for data budget `budget`: its sweep's at the benchmark's own budget; a
    reference's retuned LR at another (`budget_tunes`); the budget-1 choice where a cell retuned none (a study of
    the protocol before references were retuned per budget)."""
    tune = (cell.get("budget_tunes") or {}).get(lr_key(budget)) if budget != 1.0 else None
    return tune["best_hp"] if tune is not None else cell["best_hp"]


def load_curves(plots_dir: Path, bench: Bench) -> dict[tuple, list[tuple[float, float]]]:
    """{(optimizer, size, seed, run name): [(tokens, val loss), ...]} of the budget-1 runs, from the cells' CSVs."""
    curves: dict[tuple, list] = {}
    for kind in ("sweep", "seeds"):
        for opt in bench.optimizers:
            for size in bench.sizes:
                df = pl.read_csv(plots_dir / kind / f"{opt}-{size}.csv")
                one = df.filter((pl.col("budget") == 1.0) & (pl.col("batch") == 1))
                for row in one.sort("tokens").iter_rows(named=True):
                    key = (row["optimizer"], row["size"], row["seed"], row["run"])
                    curves.setdefault(key, []).append((row["tokens"], row["val_loss"]))
    return curves


def ok(r: dict | None) -> bool:
    """A run that finished with a finite final loss and did not diverge."""
    return r is not None and not r["diverged"] and r["val_loss"] is not None and math.isfinite(r["val_loss"])


def finals(runs: list[dict], opt: str, size: str, hp: dict | None, budget: float = 1.0,
           batch: int = 1) -> dict[int, dict]:
    """{seed: run} of `opt` at `size` with hyperparameters `hp`, data budget `budget` and batch factor `batch`."""
    return {r["seed"]: r for r in runs if r["optimizer"] == opt and r["size"] == size and hp is not None
            and r["hp"] == hp and r["budget"] == budget and r["batch"] == batch}


def sweep_seed_count(cell: dict) -> int:
    """How many seeds the protocol's choice was averaged over (the seeds of the sweep's runs)."""
    return len({r["seed"] for r in cell["runs"].values()})


def size_regime(bench: Bench, runs: list[dict], size: str) -> dict:
    """Parameters (all, and without the embeddings and LM head), tokens and steps of one run of the benchmark's own
    budget at `size` (the baseline's first held-out seed; every optimizer's run at a size has the same)."""
    r = next((r for r in runs if r["optimizer"] == bench.baseline and r["size"] == size and r["budget"] == 1.0
              and r["batch"] == 1 and r.get("params")), None)
    if r is None:
        return {"params": None, "non_embedding_params": None, "tokens": None, "steps": None}
    rest = r.get("non_embedding_params") or r["params"] - bench.embedding_params[size]
    return {"params": r["params"], "non_embedding_params": rest if rest > 0 else None, "tokens": r.get("tokens"),
            "steps": r.get("steps")}


def run_size(bench: Bench, runs: list[dict], opt: str, size: str) -> dict:
    """Parameters (all, without the embeddings and LM head), tokens and tokens per parameter of `opt`'s runs at the
    benchmark's own budget at `size` (the first finished one; a run records them, or they follow from the size)."""
    r = next((r for r in runs if r["optimizer"] == opt and r["size"] == size and r["budget"] == 1.0
              and r["batch"] == 1 and r.get("params") and r.get("tokens")), None)
    if r is None:
        return {"params": None, "non_embedding_params": None, "tokens": None, "tokens_per_param": None}
    rest = r.get("non_embedding_params") or r["params"] - bench.embedding_params[size]
    return {"params": r["params"], "non_embedding_params": rest, "tokens": r["tokens"],
            "tokens_per_param": r["tokens"] / r["params"]}
