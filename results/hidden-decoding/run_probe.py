"""Hidden Decoding study, part (a): a compute-bound synthetic probe, run with the pipeline's own code.

Task (scalelab.data.sum_task): blocks `d1 ... dK = s` of K (--digits) uniform digits 0..base-1, a separator, then
their sum s, modulo --mod (v1, v2: base 7, mod 7) or plain (--mod 0, v3; the sum tokens follow the separator). The
references are those of the validation windows the loss is measured on (scalelab.analysis.window_floor): the exact
Bayes floor of windows cut at multiples of seq_len (the first tokens of a window cannot know where the separator
falls, nor the first sum's unseen digits), and the same for a model blind to the sum. The hard token is s: at the
separator the model must add K digits in one pass of a small Llama. If the mechanism works, n > 1 must close part of
the gap to the floor that n = 1 cannot.

Steps: (1) a random 2-layer Llama is trained at n = 1 to its plateau (`--pre-steps`), and must close between 10% and
90% of the sum-blind -> floor gap (scalelab.analysis.hd_premises LEARNS, ROOM; `--backbone-only` stops here); (2)
that backbone is continued by every cell x seed with scalelab.train.hidden_decoding.fit_cell (the stage's own
training code; seeds vary the batches and the tables' noise); (3) the part's ledger
(scalelab.analysis.hd_study.part_entries: the same premises, measured on the n = 1 cells) is written beside the
per-cell metrics.

    PYTHONPATH=src nice -n 15 python results/hidden-decoding/run_probe.py --out results/hidden-decoding/probe
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scalelab.analysis import claims as ledger
from scalelab.analysis import hd_premises, hd_study
from scalelab.analysis import hidden_decoding as hdr
from scalelab.analysis.window_floor import sum_task_floors
from scalelab.config import HiddenDecodingConfig
from scalelab.data.sum_task import VOCAB, SumTask, write_task
from scalelab.model.hidden_decoding_io import load_hidden_decoding
from scalelab.train.hidden_decoding import fit_cell

CELLS = {
    "n1": {"n_streams": 1},
    "n2": {"n_streams": 2},
    "n4": {"n_streams": 4},
    "n2full": {"n_streams": 2, "attention": "full"},
    "n4full": {"n_streams": 4, "attention": "full"},
    "n4tied": {"n_streams": 4, "tables": "tied"},
    "n1_flops_n2": {"n_streams": 1, "flops_of": {"n_streams": 2}},
    "n1_flops_n4": {"n_streams": 1, "flops_of": {"n_streams": 4}},
}


def config(source: Path, cells: dict, steps: int, lr: float, seeds: list[int]) -> HiddenDecodingConfig:
    return HiddenDecodingConfig(
        source={"path": str(source)}, source_dep=str(source), cells=cells, grid=list(cells), seeds=seeds,
        train={"corpus": "shards", "seq_len": 56, "batch_size": 16, "max_steps": steps, "val_every": steps,
               "ckpt_every": steps, "val_tokens": 8192, "threads": 1,
               "optimizer": {"lr": lr, "weight_decay": 0.0}, "schedule": {"warmup": 0.05}})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("results/hidden-decoding/probe"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/hd-probe"))
    ap.add_argument("--pre-steps", type=int, default=1500)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    task0 = hd_study.DEFAULT_TASK
    ap.add_argument("--digits", type=int, default=task0.K, help="K, digits per block")
    ap.add_argument("--base", type=int, default=task0.base, help="digits are 0..base-1")
    ap.add_argument("--mod", type=int, default=task0.mod, help="the sum modulo this (0: the plain sum)")
    ap.add_argument("--backbone-only", action="store_true", help="stop after the backbone and its premise check")
    ap.add_argument("--cells", nargs="+", default=list(CELLS), choices=list(CELLS))
    args = ap.parse_args()
    cells_run = {c: CELLS[c] for c in args.cells}
    torch.set_num_threads(1)
    start = time.perf_counter()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()  # the code run
    shards, metrics_dir = args.work / "tokens", args.out / "metrics"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    try:
        task = SumTask(args.digits, args.base, args.mod)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    write_task(shards, task)

    # (1) the backbone, trained to its plateau at n = 1
    torch.manual_seed(0)
    init = args.work / "init"
    LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                                 tie_word_embeddings=False)).save_pretrained(init)
    pre = config(init, {"pre": {"n_streams": 1}}, args.pre_steps, 3e-3, [0])
    pre_metrics = fit_cell(pre, "pre", 0, args.work / "pre", shards)
    backbone = args.work / "backbone"
    load_hidden_decoding(args.work / "pre" / "model").backbone.save_pretrained(backbone)
    floors = sum_task_floors(task, pre.train.seq_len, pre.train.val_tokens)
    closed = floors.closed(pre_metrics["val_loss"])
    print(f"backbone: val loss {pre_metrics['val_loss']:.4f} (the validation windows' floor {floors.floor:.4f}, "
          f"sum-blind {floors.sum_blind:.4f}: {closed:.1%} of the gap closed)", flush=True)
    if args.backbone_only:
        return
    if not hd_premises.LEARNS <= closed <= hd_premises.ROOM:
        raise SystemExit(f"the backbone closes {closed:.1%} of the sum-blind -> floor gap, outside "
                         f"[{hd_premises.LEARNS}, {hd_premises.ROOM}]: this probe cannot show what extra per-token "
                         "computation does (change the task or backbone)")

    # (2) every cell × seed continues that backbone
    hd = config(backbone, cells_run, args.steps, 1e-3, args.seeds)
    for seed in args.seeds:
        for cell in cells_run:
            m = fit_cell(hd, cell, seed, args.work / "cells" / f"{cell}-{seed}", shards)
            m = {k: v for k, v in m.items() if k != "peak_mem_mb"}
            (metrics_dir / f"{cell}-{seed}.json").write_text(json.dumps({"cell": cell, "seed": seed, **m}, indent=1))
            print(f"{cell}-{seed}: val loss {m['val_loss']:.4f}, {m['steps']} steps, {m['wall_s']:.0f} s", flush=True)

    # (3) the summary and the part's ledger (its premises measured on the n = 1 cells)
    cells = hdr.collect(metrics_dir, hd)
    cmp = hdr.comparisons(cells, hd)
    summary = {"digits": args.digits, "base": args.base, "mod": args.mod, "floor": floors.floor,
               "sum_blind": floors.sum_blind, "stationary_floor": floors.stationary, "backbone_gap_closed": closed,
               "backbone_val_loss": pre_metrics["val_loss"], "cells": hdr.table(cells, hd),
               "gain_vs_n": hdr.gain_rows(cmp),
               "paired": {k: {str(n): d for n, d in v.items()} for k, v in cmp.items()}}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    run = {"command": "PYTHONPATH=src nice -n 15 python results/hidden-decoding/run_probe.py "
                      f"--out {args.out} --pre-steps {args.pre_steps} --steps {args.steps} "
                      f"--seeds {' '.join(map(str, args.seeds))} --cells {' '.join(args.cells)} "
                      f"--digits {args.digits} --base {args.base} --mod {args.mod}",
           "commit": commit, "wall_s": round(time.perf_counter() - start, 1), "threads": 1,
           "host": f"{platform.machine()}, shared 2-core machine (other jobs running)",
           "task": {"K": task.K, "base": task.base, "mod": task.mod},
           "params": hd.model_dump(mode="json"), "backbone_pretrain": pre.train.model_dump(mode="json")}
    (args.out / "run.json").write_text(json.dumps(run, indent=1))
    ledger.write_claims(args.out / "claims.json", hd_study.part_entries(args.out.parent, args.out.name))


if __name__ == "__main__":
    main()
