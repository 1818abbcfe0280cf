"""Each arm of a continued-pretraining study of Hidden Decoding, read from its committed cells: what a reader checks
before the ledger's verdicts (the hd-cpt-xs study's README).

Per trained cell, over its seeds: the held-out last-stream loss (mean and the half-width of its t interval), the gain
over n = 1 paired by seed (loss(n = 1) − loss(cell), the claims' metric), the gain over n = 1 given the cell's FLOPs as
tokens (the ledger's equal-FLOPs rows are observations: the paper makes no such claim), the step-0 gap to n = 1 (the start premise's
reading: the largest over seeds in absolute value), the loss with the cross-stream mixing switched off minus the
trained model's (the mixing-acts premise's reading), the training FLOPs over n = 1's (measured: each cell's FLOPs per
token × its tokens), the passes over the training stream and the cell's wall time.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from scalelab.hidden_decoding import ledger as hdr
from scalelab.ledger import claims
from scalelab.ledger.studies import cell_files


def _interval(values: list[float], level: float) -> str:
    """mean ± half-width of its t interval at `level` (the mean alone for one value)."""
    if not values:
        return "–"
    t = claims.t_interval(values, level)
    return f"{statistics.fmean(values):+.4f}" if t is None else f"{t[0]:+.4f} ± {t[2] - t[0]:.4f}"


def rows(cells: dict[str, dict[int, dict]], hd) -> list[dict]:
    """One row per trained cell of the grid (`cells`: hidden_decoding.ledger.collect's), in grid order."""
    r = hdr.roles(hd)
    base1 = r["base"].get(1)
    one = cells.get(base1, {})
    control = {cell: r["control"][n] for n, cell in r["base"].items() if n in r["control"]}
    out = []
    for cell in hdr.trained(hd):
        by_seed = cells.get(cell, {})
        if not by_seed:
            continue
        seeds = sorted(by_seed)
        ms = [by_seed[s] for s in seeds]
        c = hd.cells[cell]
        shared = [s for s in seeds if s in one]
        starts = [by_seed[s]["val_loss_start"] - one[s]["val_loss_start"] for s in shared
                  if by_seed[s].get("val_loss_start") is not None and one[s].get("val_loss_start") is not None]
        mixing = [m["val_loss_mixing_off"] - m["val_loss_mixing_on"] for m in ms
                  if m.get("val_loss_mixing_off") is not None and m.get("val_loss_mixing_on") is not None]
        flops = [by_seed[s]["flops"] / one[s]["flops"] for s in shared if one[s].get("flops")]
        out.append({
            "cell": cell, "n_streams": c.n_streams, "attention": c.attention,
            "flops_of": c.flops_of.n_streams if c.flops_of else None, "seeds": len(ms),
            "val_loss": [m["val_loss"] for m in ms],
            "gain": [] if cell == base1 else [one[s]["val_loss"] - by_seed[s]["val_loss"] for s in shared],
            # at equal FLOPs: loss(n = 1 given this cell's FLOPs as tokens) − loss(cell), paired by seed
            "gain_flops": hdr.paired(cells, control[cell], cell) if cell in control and control[cell] in cells else [],
            "start_gap": max(starts, key=abs) if starts and cell != base1 else None,
            "mixing": mixing, "flops_ratio": statistics.fmean(flops) if flops else None,
            "passes": statistics.fmean(m["passes"] for m in ms) if all(m.get("passes") for m in ms) else None,
            "wall_min": statistics.fmean(m["wall_s"] for m in ms) / 60 if all(m.get("wall_s") for m in ms) else None})
    return out


def arm_table(cells_dir: Path) -> str:
    """The arms of a study's committed cells (`cells_dir`: its cells/ folder, as a README's generated block names it)
    at the profile's claims level."""
    from scalelab.config import load_params

    folder = Path(cells_dir).parent
    hd = load_params(folder / "params.yaml").hidden_decoding
    files = cell_files(folder, "metrics/hidden_decoding", ".json")
    # a study in progress: the arms every seed of which has a result so far
    done = [c for c in hdr.trained(hd) if all(f"{c}-{s}.json" in files for s in hd.seeds)]
    hd_done = hd.model_copy(update={"grid": [c for c in hd.grid if c in done or hd.cells[c].forward_only]})
    level = hd.claims.level
    lines = [f"| cell | n | attention | FLOPs of | seeds | held-out loss (± {level:.0%} t) | gain over n = 1 | "
             "at equal FLOPs | step-0 gap (largest) | mixing off − on | FLOPs / n = 1 | passes | min a cell |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows(hdr.collect(files, hd_done), hd_done):
        gap = "–" if r["start_gap"] is None else f"{r['start_gap']:+.4f}"
        fl = "–" if r["flops_ratio"] is None else f"{r['flops_ratio']:.2f}"
        passes = "–" if r["passes"] is None else f"{r['passes']:.2f}"
        wall = "–" if r["wall_min"] is None else f"{r['wall_min']:.1f}"
        attention = r["attention"] if r["n_streams"] > 1 else "–"  # one stream: nothing to attend across
        lines.append(f"| {r['cell']} | {r['n_streams']} | {attention} | "
                     f"{'n = ' + str(r['flops_of']) if r['flops_of'] else '–'} | {r['seeds']} | "
                     f"{_interval(r['val_loss'], level).lstrip('+')} | {_interval(r['gain'], level)} | "
                     f"{_interval(r['gain_flops'], level)} | {gap} | "
                     f"{_interval(r['mixing'], level)} | {fl} | {passes} | {wall} |")
    return "\n".join(lines)
