"""Hidden Decoding study, the parity probe: does extra width at the answer help where it must, run with the
pipeline's own training code (scalelab.train.hidden_decoding.fit_cell).

Task (scalelab.data.parity_task): blocks `b1 … bK | a` of K uniform bits, a separator and their parity as one
token; the loss and accuracy are read on the answer tokens of validation windows aligned to the blocks (floor 0,
blind ln 2). Every cell trains a random 2-layer Llama from scratch (one init per seed, shared by the seed's cells;
seeds vary the init, the batches and the tables' noise), all on the same steps and batches:
    n1            one stream, the reference
    pause         one stream on the same blocks with K pause tokens before the answer: the positive control
                  (extra positions at the answer, each reading every bit; London & Kanade, arXiv 2505.21024)
    n2, n4        Hidden Decoding, SFA (the default mixing layer: the last)
    n2full, n4full  Hidden Decoding, full attention (every layer mixing)
A cell already measured (its metrics file exists) is not rerun, so seeds can run as separate processes; a last call
with --write trains nothing and writes the part (run.json, summary, the part's ledger via
scalelab.analysis.hd_study) from the cells measured.

    PYTHONPATH=src nice -n 10 python results/hidden-decoding/run_parity.py --out results/hidden-decoding/parity
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
from scalelab.analysis import hd_parity, hd_study
from scalelab.config import HiddenDecodingConfig
from scalelab.data.loader import val_batches
from scalelab.data.parity_task import VOCAB, ParityTask, write_task
from scalelab.model.hidden_decoding_answers import scored_targets
from scalelab.train.hidden_decoding import fit_cell

CELLS = {
    "n1": {"n_streams": 1},
    "pause": {"n_streams": 1},  # on the pause-token blocks (hd_parity.PAUSE_CELL)
    "n2": {"n_streams": 2},
    "n4": {"n_streams": 4},
    "n2full": {"n_streams": 2, "attention": "full"},
    "n4full": {"n_streams": 4, "attention": "full"},
}
VAL_WINDOWS = 256


def init_backbone(path: Path, seed: int, d: int) -> Path:
    if not (path / "config.json").is_file():
        torch.manual_seed(seed)
        LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=d, intermediate_size=2 * d, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024,
                                     tie_word_embeddings=False)).save_pretrained(path)
    return path


def config(source: Path, cells: dict, seeds: list[int], seq_len: int, args) -> HiddenDecodingConfig:
    return HiddenDecodingConfig(
        source={"path": str(source)}, source_dep=str(source), cells=cells, grid=list(cells), seeds=seeds,
        train={"corpus": "shards", "seq_len": seq_len, "batch_size": args.batch, "max_steps": args.steps,
               "val_every": max(1, args.steps // 4), "ckpt_every": args.steps, "val_tokens": seq_len * VAL_WINDOWS,
               "threads": 1, "optimizer": {"lr": args.lr, "weight_decay": 0.0}, "schedule": {"warmup": 0.05}})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("results/hidden-decoding/parity"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/hd-parity"))
    ap.add_argument("--ks", type=int, nargs="+", default=[6], help="the K grid (bits per block)")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--blocks", type=int, default=4, help="blocks per window (seq_len = blocks × period)")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--d", type=int, default=32, help="the backbone's width")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--cells", nargs="+", default=["n1", "pause", "n2", "n4", "n2full"], choices=list(CELLS))
    ap.add_argument("--write", action="store_true", help="train nothing: write the part from the cells measured")
    args = ap.parse_args()
    torch.set_num_threads(1)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    cells_run = {c: CELLS[c] for c in args.cells}
    hd_cells = {c: v for c, v in cells_run.items() if c != hd_parity.PAUSE_CELL}

    for K in [] if args.write else args.ks:
        tasks = {"plain": ParityTask(K), "pause": ParityTask(K, pauses=K)}
        for kind, task in tasks.items():
            if not (args.work / f"tokens-k{K}-{kind}" / "meta.json").is_file():
                write_task(args.work / f"tokens-k{K}-{kind}", task)
        metrics_dir = args.out / "metrics" / f"k{K}"
        metrics_dir.mkdir(parents=True, exist_ok=True)
        for seed in args.seeds:
            source = init_backbone(args.work / f"init-d{args.d}-s{seed}", seed, args.d)
            for cell in cells_run:
                done = metrics_dir / f"{cell}-{seed}.json"
                if done.is_file():
                    continue
                task = tasks["pause" if cell == hd_parity.PAUSE_CELL else "plain"]
                T = task.seq_len(args.blocks)
                hd = config(source, {cell: cells_run[cell]}, [seed], T, args)
                shards = args.work / f"tokens-k{K}-{'pause' if task.pauses else 'plain'}"

                def answers(model, s, task=task, T=T, hd=hd):
                    if not hd_parity.aligned(task, T, hd.train.val_tokens, len(s.val)):
                        raise SystemExit(f"{task.describe()}: validation windows of {T} tokens are not aligned")
                    return scored_targets(model, val_batches(s.val, seq_len=T, val_tokens=hd.train.val_tokens,
                                                             batch_size=64), task.answer_targets)

                cpu = time.process_time()
                m = fit_cell(hd, cell, seed, args.work / "cells" / f"k{K}-{cell}-{seed}", shards, evaluate=answers)
                m = {k: v for k, v in m.items() if k != "peak_mem_mb"} | {"cpu_s": time.process_time() - cpu}
                done.write_text(json.dumps({"cell": cell, "seed": seed, "K": K, "pauses": task.pauses,
                                            "seq_len": T, **m}, indent=1))
                print(f"K={K} {cell}-{seed}: answer loss {m['answer_loss']:.4f}, accuracy {m['answer_acc']:.3f}, "
                      f"{m['cpu_s']:.0f} s CPU", flush=True)
    if not args.write:
        return
    # --write: the part from the cells measured (run by earlier calls, any subset of cells × seeds)

    plain, paused = ParityTask(args.ks[0]), ParityTask(args.ks[0], pauses=args.ks[0])
    hd = config(Path(args.work / f"init-d{args.d}-s{args.seeds[0]}"), hd_cells, args.seeds,
                plain.seq_len(args.blocks), args)
    every = [json.loads(p.read_text()) for K in args.ks
             for p in sorted((args.out / "metrics" / f"k{K}").glob("*.json"))]
    run = {"command": "PYTHONPATH=src nice -n 10 python results/hidden-decoding/run_parity.py "
                      f"--out {args.out} --ks {' '.join(map(str, args.ks))} --steps {args.steps} --batch {args.batch} "
                      f"--blocks {args.blocks} --lr {args.lr} --d {args.d} --seeds {' '.join(map(str, args.seeds))} "
                      f"--cells {' '.join(args.cells)} --write",
           "commit": commit, "threads": 1, "host": f"{platform.machine()}, shared 2-core machine (other jobs running)",
           "cells_cpu_s": round(sum(m["cpu_s"] for m in every), 1),
           "cells_wall_s": round(sum(m["wall_s"] for m in every), 1),
           "task": {"ks": args.ks, "blocks": args.blocks, "val_windows": VAL_WINDOWS},
           "backbone": {"layers": 2, "d": args.d, "heads": 4, "init": "random, torch seed = the cell's seed"},
           "positive_control": hd_parity.PAUSE_CELL,
           "pause_cells": ({hd_parity.PAUSE_CELL: {"pauses": "K", "cell": CELLS["pause"]}}
                           if "pause" in args.cells else {}),
           "params": hd.model_dump(mode="json"),
           "pause_train": config(hd.source.location(), {"pause": CELLS["pause"]}, args.seeds,
                                 paused.seq_len(args.blocks), args).train.model_dump(mode="json")}
    (args.out / "run.json").write_text(json.dumps(run, indent=1))
    (args.out / "summary.json").write_text(json.dumps(hd_parity.summary(args.out), indent=1))
    ledger.write_claims(args.out / "claims.json", hd_study.part_entries(args.out.parent, args.out.name))


if __name__ == "__main__":
    main()
