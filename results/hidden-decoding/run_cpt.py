"""Hidden Decoding study, part (b): continued pretraining of SmolLM2-135M-Instruct (a real pretrained Llama, 30
layers, vocabulary 49152) on the default corpus, at n = 1 and 2 (SFA, default mixing layers 1, 5, ..., 29) and an
n = 1 control at n = 2's training FLOPs, with the pipeline's own code (fit_cell).

The default profile's prepare stage is rerun into --work (same documents, same split), and the cells encode it with
SmolLM2's own tokenizer (hidden_decoding.train.corpus: auto for a path source): the project tokenizer is untouched.
A tiny budget on one CPU thread (a few optimizer steps of 4 × 128 tokens): whatever it shows is labelled as such.
A cell whose metrics file is already in --out is read, not retrained, so seeds can run as separate processes side by
side and a last call with every seed writes the ledger.

    PYTHONPATH=src nice -n 15 python results/hidden-decoding/run_cpt.py --source /tmp/smollm2-hf
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import torch
import yaml

from scalelab.analysis import claims as ledger
from scalelab.analysis import hd_study
from scalelab.analysis import hidden_decoding as hdr
from scalelab.config import HiddenDecodingConfig, parse_params
from scalelab.data import prepare_corpus
from scalelab.train.hidden_decoding import fit_cell, source_digest

CELLS = {"n1": {"n_streams": 1}, "n2": {"n_streams": 2}, "n1_flops_n2": {"n_streams": 1, "flops_of": {"n_streams": 2}}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default="/tmp/smollm2-hf")
    ap.add_argument("--out", type=Path, default=Path("results/hidden-decoding/cpt"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/hd-cpt"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = ap.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()  # the code run
    params = parse_params(yaml.safe_load(Path("params.yaml").read_text()))
    prepared = args.work / "prepared"
    if not (prepared / "train.parquet").is_file():
        prepare_corpus(params.prepare, prepared)
    hd = HiddenDecodingConfig(
        source={"path": args.source}, source_dep=args.source, cells=CELLS, grid=list(CELLS), seeds=args.seeds,
        train={"seq_len": 128, "batch_size": 4, "max_steps": args.steps, "val_every": args.steps,
               "ckpt_every": args.steps, "val_tokens": 4096, "threads": 1, "text_tokens": 1_000_000,
               "optimizer": {"lr": args.lr, "weight_decay": 0.1}, "schedule": {"warmup": 0.1}})
    metrics_dir = args.out / "metrics"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        for cell in CELLS:
            done = metrics_dir / f"{cell}-{seed}.json"
            if done.is_file():
                print(f"{cell}-{seed}: read from {done}", flush=True)
                continue
            m = fit_cell(hd, cell, seed, args.work / "cells" / f"{cell}-{seed}", args.work / "no-shards",
                         prepared_dir=prepared)
            m = {k: v for k, v in m.items() if k != "peak_mem_mb"}
            (metrics_dir / f"{cell}-{seed}.json").write_text(json.dumps({"cell": cell, "seed": seed, **m}, indent=1))
            print(f"{cell}-{seed}: val loss {m['val_loss']:.4f}, {m['steps']} steps, {m['wall_s']:.0f} s", flush=True)
    cells = hdr.collect(metrics_dir, hd)
    cmp = hdr.comparisons(cells, hd)
    summary = {"cells": hdr.table(cells, hd), "gain_vs_n": hdr.gain_rows(cmp),
               "paired": {k: {str(n): d for n, d in v.items()} for k, v in cmp.items()}}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    run = {"command": f"PYTHONPATH=src nice -n 15 python results/hidden-decoding/run_cpt.py --source {args.source} "
                      f"--out {args.out} --steps {args.steps} --lr {args.lr} "
                      f"--seeds {' '.join(map(str, args.seeds))}",
           "commit": commit, "wall_s": round(time.perf_counter() - start, 1), "threads": 1,
           "cells_wall_s": round(sum(json.loads((metrics_dir / f"{c}-{s}.json").read_text())["wall_s"]
                                     for s in args.seeds for c in CELLS), 1),
           "host": f"{platform.machine()}, shared 2-core machine (other jobs running)",
           "source_digest": source_digest(args.source), "params": hd.model_dump(mode="json")}
    (args.out / "run.json").write_text(json.dumps(run, indent=1))
    # the part's ledger: each n > 1 cell's recovery of its step-0 gap read over the committed budgets of this setup
    ledger.write_claims(args.out / "claims.json", hd_study.part_entries(args.out.parent, args.out.name))


if __name__ == "__main__":
    main()
