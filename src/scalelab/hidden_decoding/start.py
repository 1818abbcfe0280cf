"""How far an n-stream model starts from its backbone, and how that gap moves in training.

The start: the step-0 validation loss gap of each forward-only cell (`forward_only: true`, the hd-cpt-start study,
configs/studies/hd-cpt-start.yaml) to the one-stream cell of the same seed, paired by validation window. The
recovery: each trained n > 1 cell's gap to n = 1 at every validation of their curves, from step 0 (the hd-cpt study),
paired by seed (scalelab.hidden_decoding.premises.gap_curve).

Each forward-only cell scores its model at step 0 on the fixed validation windows and keeps the loss of every window
(scalelab.hidden_decoding.train); the gap of a window is loss(cell) − loss(n = 1) on it, so the table reads the gap's
mean, its standard deviation over windows, and whether every window's gap is exactly 0 (a function-preserving
start, such as the gated one, is the backbone bit for bit).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from scalelab.hidden_decoding import premises as hdp
from scalelab.hidden_decoding import ledger as hdr
from scalelab.ledger.studies import cell_files
from scalelab.config import HiddenDecodingConfig


def rows(hd: HiddenDecodingConfig, metrics: dict[str, Path]) -> list[dict]:
    """One row per forward-only n > 1 cell and seed: its settings and its gap to the forward-only n = 1 cell of the
    seed (`metrics`: the cells' metrics files by name, <cell>-<seed>.json)."""
    read = {name: json.loads(Path(p).read_text()) for name, p in metrics.items()}
    starts = {(m["cell"], m["seed"]): m for m in read.values()
              if m.get("cell") in hd.cells and hd.cells[m["cell"]].forward_only}
    base = {seed: m for (cell, seed), m in starts.items() if hd.cells[cell].n_streams == 1}
    out = []
    for (cell, seed), m in sorted(starts.items()):
        c, ref = hd.cells[cell], base.get(seed)
        if c.n_streams == 1:
            continue
        if ref is None:
            raise ValueError(f"{cell}-{seed}: no forward-only n = 1 cell of seed {seed} to measure its gap against")
        gaps = [a - b for a, b in zip(m["val_window_losses"], ref["val_window_losses"], strict=True)]
        model = hd.model(cell)
        out.append({"cell": cell, "seed": seed, "n_streams": c.n_streams, "start": c.start,
                    "positions": model.positions, "attention": c.attention, "mixing_layers": m["mixing_layers"],
                    "embed_noise": model.embed_noise, "gap": statistics.fmean(gaps),
                    "gap_sd": statistics.stdev(gaps) if len(gaps) > 1 else None,
                    "exact": all(g == 0 for g in gaps), "windows": len(gaps), "n1_loss": ref["val_loss"]})
    return out


def study_rows(folder: Path) -> list[dict]:
    """`rows` of a study's committed cells, under the params.yaml it ran with."""
    from scalelab.config import load_params

    hd = load_params(Path(folder) / "params.yaml").hidden_decoding
    return rows(hd, cell_files(Path(folder), "metrics/hidden_decoding", ".json"))


def start_table(cells_dir: Path) -> str:
    """The step-0 gap of every forward-only cell of a study (`cells_dir`: its cells/ folder, as a README's generated
    block names it)."""
    lines = ["| start | positions | attention (mixing layers) | embed_noise | seed | loss(n) − loss(n = 1) at step 0 "
             "| sd over windows |", "|---|---|---|---|---|---|---|"]
    for r in study_rows(Path(cells_dir).parent):
        mixing = f"{r['attention']} ({len(r['mixing_layers'])})"
        gap = "0 exactly (every window)" if r["exact"] else f"{r['gap']:+.4f}"
        sd = "–" if r["gap_sd"] is None else f"{r['gap_sd']:.4f}"
        lines.append(f"| {r['start']} | {r['positions']} | {mixing} | {r['embed_noise']:g} | {r['seed']} | {gap} | "
                     f"{sd} |")
    return "\n".join(lines)


def gap_table(cells_dir: Path) -> str:
    """Each trained n > 1 cell's gap to n = 1 (mean over seeds, and its range) at every validation, from a study's
    committed curves (`cells_dir`: its cells/ folder): the trend the recovery premise reads its last two points of."""
    from scalelab.config import load_params

    folder = Path(cells_dir).parent
    hd = load_params(folder / "params.yaml").hidden_decoding
    plots = cell_files(folder, "plots/hidden_decoding", ".csv")
    curves = {c: {s: hdr.read_curve(plots[f"{c}-{s}.csv"]) for s in hd.seeds if f"{c}-{s}.csv" in plots}
              for c in hdr.trained(hd)}
    base = hdr.roles(hd)["base"].get(1)
    lines = ["| cell | tokens | loss(cell) − loss(n = 1), mean over seeds | lowest, highest seed | seeds |",
             "|---|---|---|---|---|"]
    for cell in hdr.trained(hd):
        if cell == base or hd.cells[cell].n_streams == 1:
            continue
        for tokens, gaps in hdp.gap_curve(curves.get(cell, {}), curves.get(base, {})):
            lines.append(f"| {cell} | {tokens:.0f} | {statistics.fmean(gaps):+.4f} | {min(gaps):+.4f}, "
                         f"{max(gaps):+.4f} | {len(gaps)} |")
    return "\n".join(lines)
