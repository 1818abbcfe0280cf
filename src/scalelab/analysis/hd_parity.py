"""The parity probe's ledger (results/hidden-decoding/parity/, run_parity.py): does Hidden Decoding's extra width
at the answer solve a parity that one stream cannot, where pause tokens (the positive control) do?

Per cell × K × seed the metrics hold the answer token's loss and accuracy on validation windows aligned to the
blocks (scalelab.data.parity_task; floor 0, blind ln 2). What a seed's cell solves is read two ways:
    largest K solved     the largest K of the grid with answer accuracy ≥ SOLVED (the table; an integer per seed)
    solved score         Σ over the K grid of the fraction of the blind → floor answer gap closed,
                         (ln 2 − loss_K) / ln 2: a continuous count of K's solved, the claims' metric (an integer
                         count ties across seeds, which the ledger's rule cannot read)
Claims (paired by seed, scalelab.analysis.claims): n > 1 solves more than n = 1 (SFA and full attention at each n);
the gain grows from n = 2 to n = 4; SFA keeps ≥ sfa_fraction of full attention's gain. Premises at the K compared
(the grid's largest): the positive control (hd_premises.parity_control: the pause cell solves it, n = 1 stays near
ln 2, every seed) and, for the growth and SFA claims, the gain they are measured against.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from scalelab.analysis import claims as ledger
from scalelab.analysis import hd_premises as hdp
from scalelab.analysis import hidden_decoding as hdr
from scalelab.analysis.window_floor import val_phases
from scalelab.data.parity_task import ParityTask

PAUSE_CELL = "pause"  # one stream on the blocks with K pause tokens before the answer
BLIND = math.log(2)


def aligned(task: ParityTask, seq_len: int, val_tokens: int, n_val: int) -> bool:
    """Every validation window the loader cuts starts at a block boundary (the window-floor machinery's phase count
    of the loader's windows has the one phase 0)."""
    return set(val_phases(n_val, seq_len, val_tokens, task.period)) == {0}


def closed(answer_loss: float) -> float:
    """The fraction of the blind (ln 2) → floor (0) gap of the answer token a loss closes."""
    return (BLIND - answer_loss) / BLIND


def read_metrics(folder: Path) -> dict[str, dict[int, dict[int, dict]]]:
    """cell → K → seed → metrics, from metrics/k<K>/<cell>-<seed>.json."""
    out: dict[str, dict[int, dict[int, dict]]] = {}
    for path in sorted(Path(folder).glob("metrics/k*/*.json")):
        m = json.loads(path.read_text())
        if "answer_loss" not in m:
            raise ValueError(f"{path}: no answer_loss; was it written by run_parity.py?")
        out.setdefault(m["cell"], {}).setdefault(int(m["K"]), {})[int(m["seed"])] = m
    return out


def grid(cells: dict) -> list[int]:
    """The K grid: every K some cell ran."""
    return sorted({K for by_k in cells.values() for K in by_k})


def seeds_of(cells: dict, cell: str, ks: list[int]) -> list[int]:
    """The seeds `cell` ran at every K of the grid."""
    by_k = cells.get(cell, {})
    common = set.intersection(*(set(by_k.get(K, {})) for K in ks)) if ks else set()
    return sorted(common)


def score(cells: dict, cell: str, seed: int, ks: list[int]) -> float:
    """The solved score: Σ over the K grid of the fraction of the answer gap closed."""
    return sum(closed(cells[cell][K][seed]["answer_loss"]) for K in ks)


def largest_solved(cells: dict, cell: str, seed: int, ks: list[int]) -> int | None:
    """The largest K of the grid solved (answer accuracy ≥ SOLVED); None when none is."""
    solved = [K for K in ks if cells[cell][K][seed]["answer_acc"] >= hdp.SOLVED]
    return max(solved) if solved else None


def roles(run: dict) -> dict[str, dict[int, str]]:
    """{"sfa", "full"} → {n: cell} of the run's Hidden Decoding cells (run.json params), the first of each kind."""
    out: dict[str, dict[int, str]] = {"sfa": {}, "full": {}}
    for name in run["params"]["grid"]:
        c = run["params"]["cells"][name]
        if name != PAUSE_CELL and c.get("tables", "separate") == "separate" and c.get("start", "open") == "open":
            out[c.get("attention", "sfa")].setdefault(c["n_streams"], name)
    return out


def gains(cells: dict, run: dict, ks: list[int]) -> dict[str, dict[int, list[float]]]:
    """Per-seed solved(cell) − solved(n = 1), by attention and n, paired by seed."""
    r, out = roles(run), {"sfa": {}, "full": {}}
    n1 = r["sfa"].get(1)
    if n1 is None:
        raise ValueError("the parity probe needs its n = 1 cell")
    for kind, by_n in r.items():
        for n, cell in sorted(by_n.items()):
            if n > 1:
                seeds = [s for s in seeds_of(cells, cell, ks) if s in seeds_of(cells, n1, ks)]
                out[kind][n] = [score(cells, cell, s, ks) - score(cells, n1, s, ks) for s in seeds]
    return out


def premises(cells: dict, run: dict, ks: list[int]) -> list[dict]:
    """Room and the positive control at the K compared (the grid's largest), from the committed cells."""
    K, n1 = max(ks), roles(run)["sfa"][1]
    control = run.get("positive_control")
    pause = [m["answer_acc"] for _, m in sorted(cells.get(control, {}).get(K, {}).items())] if control else []
    return hdp.parity_premises(K, pause, [closed(m["answer_loss"]) for _, m in sorted(cells[n1][K].items())])


def regime(cells: dict, run: dict, n: int) -> dict:
    r = roles(run)
    one = next(iter(cells[r["sfa"][1]][max(grid(cells))].values()))
    return hdp.regime(n, params=one["params"], non_embedding_params=None, tokens=one["tokens"], steps=one["steps"],
                      probe=True)


def entries(folder: Path, run: dict) -> list[dict]:
    """The part's ledger entries (scalelab.analysis.claims): n > 1 solves more of the grid than n = 1, with SFA and
    with full attention; the gain grows with n (SFA); SFA keeps ≥ sfa_fraction of full attention's gain."""
    cells = read_metrics(folder)
    ks = grid(cells)
    level, f = run["params"]["claims"]["level"], run["params"]["claims"]["sfa_fraction"]
    base, g = premises(cells, run, ks), gains(cells, run, ks)
    grid_text = f"K ∈ {{{', '.join(map(str, ks))}}}"
    metric = f"solved(n) − solved(n = 1), solved = Σ over {grid_text} of (ln 2 − answer loss) / ln 2"

    def entry(id, text, metric, diffs, n, extra=(), published=hdr.PUBLISHED):
        return ledger.claim(id, text, metric, diffs, published, level, regime=regime(cells, run, n),
                            premises=[*base, *extra])

    out = []
    for kind, label in (("sfa", "SFA"), ("full", "full attention")):
        for n, diffs in sorted(g[kind].items()):
            tag = "" if kind == "sfa" else "full."
            out.append(entry(f"C.parity.gain.{tag}n{n}", f"n = {n} ({label}) solves a larger K than n = 1", metric,
                             diffs, n, published=hdr.PUBLISHED if kind == "sfa" else hdr.PUBLISHED_SFA))
    ns = sorted(g["sfa"])
    for lo, hi in zip(ns, ns[1:]):
        ref = hdp.shown(f"gain at n = {lo}", g["sfa"][lo], level, f"n = {lo} solves more than n = 1")
        out.append(entry(f"C.parity.grows.n{lo}-n{hi}", f"the gain grows with n: n = {hi} solves more than n = {lo}",
                         f"solved(n = {hi}) − solved(n = {lo})",
                         [b - a for a, b in zip(g["sfa"][lo], g["sfa"][hi])], hi, [ref]))
    for n in sorted(set(g["sfa"]) & set(g["full"])):
        ref = hdp.shown(f"full attention's gain at n = {n}", g["full"][n], level,
                        f"full attention at n = {n} solves more than n = 1")
        out.append(entry(f"C.parity.sfa.n{n}", f"SFA keeps ≥ {f:.0%} of full attention's gain over n = 1 at n = {n}",
                         f"gain(SFA) − {f}·gain(full), gains in solved",
                         [a - f * b for a, b in zip(g["sfa"][n], g["full"][n])], n, [ref], hdr.PUBLISHED_SFA))
    return out


def summary(folder: Path) -> dict:
    """Per cell and seed: the largest K solved, the solved score, the answer loss and accuracy at each K."""
    cells = read_metrics(folder)
    ks = grid(cells)
    rows = []
    for cell in cells:
        for seed in seeds_of(cells, cell, ks):
            by_k = {str(K): cells[cell][K][seed] for K in ks}  # str: the keys JSON keeps
            first = by_k[str(ks[0])]
            rows.append({"cell": cell, "seed": seed, "n_streams": first["n_streams"], "attention": first["attention"],
                         "pauses": {K: m["pauses"] for K, m in by_k.items()},
                         "largest_solved": largest_solved(cells, cell, seed, ks),
                         "solved": score(cells, cell, seed, ks),
                         "answer_loss": {K: m["answer_loss"] for K, m in by_k.items()},
                         "answer_acc": {K: m["answer_acc"] for K, m in by_k.items()},
                         "steps": first["steps"], "cpu_s": sum(m["cpu_s"] for m in by_k.values())})
    return {"ks": ks, "solved_accuracy": hdp.SOLVED, "cells": rows}


def largest_table(summary: dict) -> str:
    """The largest K solved by each cell, per seed, with its answer accuracy and loss at each K (summary.json)."""
    ks = summary["ks"]
    head = " | ".join(f"K = {K}: acc / loss" for K in ks)
    rows = [f"| cell | seed | n | attention | pause tokens | largest K solved (acc ≥ {summary['solved_accuracy']}) | "
            f"solved score | {head} |", "|---" * (7 + len(ks)) + "|"]
    for r in summary["cells"]:
        at = " | ".join(f"{r['answer_acc'][str(K)]:.3f} / {r['answer_loss'][str(K)]:.4f}" for K in ks)
        largest = "none" if r["largest_solved"] is None else str(r["largest_solved"])
        pauses = "K" if any(r["pauses"].values()) else "–"
        rows.append(f"| {r['cell']} | {r['seed']} | {r['n_streams']} | {r['attention']} | {pauses} | {largest} | "
                    f"{r['solved']:+.3f} | {at} |")
    return "\n".join(rows)
