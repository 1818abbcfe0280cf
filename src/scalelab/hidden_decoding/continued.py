"""A Hidden Decoding cell continued from a trained one-stream backbone (a probe cell's `backbone_steps`), and the
entry point that runs any cell.

Hidden Decoding is a continued-pretraining method: its streams are added to a model that has already learnt the task
with one stream. On a probe trained from scratch that order is two phases inside one cell:
    1. n = 1 on the cell's own task, from the seed's random backbone, for `backbone_steps` steps
       (<out>/backbone: its own checkpoints and model, so a killed cell resumes in whichever phase it was);
    2. the cell's streams added to that backbone (its Hugging Face export, <out>/backbone/hf: the same construction as
       for any trained source), trained for the rest of `train.max_steps`.
So the cell spends the steps a cell trained from scratch spends, and a claim compares both against n = 1 on equal
steps. Phase 2 draws its batches as any cell of the seed does, from step 0: the same stream order as the scratch arm,
so the two are paired batch for batch. Its curve, checkpoints and MLflow run are phase 2's; phase 1's final answer
metrics are recorded under `backbone`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from scalelab.config import HiddenDecodingConfig, ModelSource
from scalelab.data import atomic_dir
from scalelab.hidden_decoding import train as hdt

if TYPE_CHECKING:
    from scalelab.tracking import StageRun

BACKBONE = "backbone"  # phase 1's folder in the cell's out_dir


def backbone_phase(hd: HiddenDecodingConfig, cell: str) -> HiddenDecodingConfig:
    """Phase 1's section: the cell as one stream of the same task, on `backbone_steps` steps."""
    c = hd.cells[cell]
    one = c.model_copy(update={"n_streams": 1, "attention": "sfa", "tables": "separate", "start": "open",
                               "table_warmup": 0, "table_lr": None, "gate_lr": None, "backbone_steps": 0})
    return hd.model_copy(update={"cells": {**hd.cells, cell: one},
                                 "train": hd.train.model_copy(update={"max_steps": c.backbone_steps})})


def streams_phase(hd: HiddenDecodingConfig, cell: str, out_dir: str | Path) -> HiddenDecodingConfig:
    """Phase 2's section: the cell on the trained backbone's export, for the steps phase 1 left. Built by copy, not
    validation: a trained source on the parity corpus is what the section refuses from a user (the task's vocabulary
    is the random backbone's), and here it is that backbone."""
    c = hd.cells[cell]
    hf = Path(out_dir) / BACKBONE / "hf"
    return hd.model_copy(update={
        "source": ModelSource(path=str(hf)), "source_dep": str(hf),
        "cells": {**hd.cells, cell: c.model_copy(update={"backbone_steps": 0})},
        "train": hd.train.model_copy(update={"max_steps": hd.train.max_steps - c.backbone_steps})})


def fit(hd: HiddenDecodingConfig, cell: str, seed: int, out_dir: str | Path, shards_dir: str | Path,
        run: StageRun | None = None, plot: Path | None = None, corpus: hdt.Corpus | None = None) -> dict:
    """Train `cell` into `out_dir` (scalelab.hidden_decoding.train.fit_cell), in two phases when it is continued
    from a one-stream backbone; its final metrics."""
    if not hd.cells[cell].backbone_steps:
        return hdt.fit_cell(hd, cell, seed, out_dir, shards_dir, run, plot=plot, corpus=corpus)
    out_dir = Path(out_dir)
    first = hdt.fit_cell(backbone_phase(hd, cell), cell, seed, out_dir / BACKBONE, shards_dir, corpus=corpus)
    _export_backbone(out_dir / BACKBONE)
    metrics = hdt.fit_cell(streams_phase(hd, cell, out_dir), cell, seed, out_dir, shards_dir, run, plot=plot,
                           corpus=corpus)
    kept = ("steps", "val_loss", "answer_loss", "answer_acc")
    return metrics | {"backbone_steps": hd.cells[cell].backbone_steps,
                      "backbone": {k: first[k] for k in kept if k in first}}


def _export_backbone(folder: Path) -> None:
    """Phase 1's model as a plain Hugging Face folder (<folder>/hf), the source phase 2 builds its streams on."""
    from scalelab.hidden_decoding.io import load_hidden_decoding

    model = load_hidden_decoding(folder / "model")
    with atomic_dir(folder / "hf") as tmp:
        model.backbone.save_pretrained(tmp, safe_serialization=True)


def resume_run_id(hd: HiddenDecodingConfig, cell: str, seed: int, out_dir: str | Path, corpus: hdt.Corpus,
                  backbone_config) -> str | None:
    """The MLflow run to reopen: a continued cell's is its phase 2's, once its backbone is exported."""
    if not hd.cells[cell].backbone_steps:
        return hdt.resume_run_id(hd, cell, seed, out_dir, corpus, backbone_config)
    if not (Path(out_dir) / BACKBONE / "hf" / "config.json").is_file():
        return None
    second = streams_phase(hd, cell, out_dir)
    return hdt.resume_run_id(second, cell, seed, out_dir, corpus, hdt.cell_backbone_config(second, cell))
