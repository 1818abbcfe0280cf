"""Hidden Decoding study, part (a): a compute-bound synthetic probe (METHODS §C), run with the pipeline's own code.

Task (known optimum): blocks of K (--digits, default 5) uniform digits 0..6, a separator, then their sum mod 7:
    d1 ... dK = s      s = (d1 + ... + dK) mod 7
Digits are unpredictable (ln 7 each), the separator and the sum are determined, so the lowest reachable mean
next-token loss is floor(K) = K·ln 7 / (K + 2) (1.390 nats at K = 5); a model blind to the sum gets
(K + 1)·ln 7 / (K + 2). The hard token is s: at the separator the model must add K digits modulo 7 in one pass of a
2-layer, d = 32 Llama, which it cannot do exactly. Hidden streams give every token
more computation in the first (within-stream) layer, read by the last layer (the mixing layer); if the mechanism
works, n > 1 must close part of the gap to the floor that n = 1 cannot.

Steps: (1) a random 2-layer Llama is trained at n = 1 to its plateau (`--pre-steps`); (2) that backbone is continued
by every cell × seed with scalelab.train.hidden_decoding.fit_cell (the stage's own training code; seeds vary the
batches and the tables' noise); (3) the HD summary's comparisons and claims (scalelab.analysis.hidden_decoding)
are written beside the per-cell metrics.

    PYTHONPATH=src nice -n 15 python results/hidden-decoding/run_probe.py --out results/hidden-decoding/probe
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import time
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scalelab.analysis import claims as ledger
from scalelab.analysis import hidden_decoding as hdr
from scalelab.config import HiddenDecodingConfig
from scalelab.data import file_sha256
from scalelab.model.hidden_decoding_io import load_hidden_decoding
from scalelab.train.hidden_decoding import fit_cell

P, V = 7, 16  # digits mod P, vocabulary (separator P; the rest unused); K digits per block: --digits
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


def floor(K: int) -> float:
    """The lowest reachable mean next-token loss: K unpredictable digits, a determined separator and sum."""
    return K * math.log(P) / (K + 2)


def write_task(folder: Path, tokens: int, seed: int, K: int) -> None:
    """Token shards of the sum task in the loader's format (train and val from different generators)."""
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"dtype": "uint16", "vocab_size": V, "eot_id": P, "tokenizer_sha256": "sum-mod-7", "shards": {}}
    for split, n, s in (("train", tokens, seed), ("val", tokens // 10, seed + 1)):
        digits = np.random.default_rng(s).integers(0, P, (n // (K + 2), K))
        blocks = np.concatenate([digits, np.full((len(digits), 1), P), digits.sum(1, keepdims=True) % P], axis=1)
        path = folder / f"{split}.bin"
        blocks.reshape(-1).astype(np.uint16).tofile(path)
        meta["shards"][split] = {"file": path.name, "bytes": path.stat().st_size, "sha256": file_sha256(path)}
    (folder / "meta.json").write_text(json.dumps(meta))


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
    ap.add_argument("--digits", type=int, default=5, help="K, digits per block")
    ap.add_argument("--cells", nargs="+", default=list(CELLS), choices=list(CELLS))
    args = ap.parse_args()
    cells_run = {c: CELLS[c] for c in args.cells}
    torch.set_num_threads(1)
    start = time.perf_counter()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()  # the code run
    shards, metrics_dir = args.work / "tokens", args.out / "metrics"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    write_task(shards, 400_000, seed=0, K=args.digits)

    # (1) the backbone, trained to its plateau at n = 1
    torch.manual_seed(0)
    init = args.work / "init"
    LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                                 tie_word_embeddings=False)).save_pretrained(init)
    pre = config(init, {"pre": {"n_streams": 1}}, args.pre_steps, 3e-3, [0])
    pre_metrics = fit_cell(pre, "pre", 0, args.work / "pre", shards)
    backbone = args.work / "backbone"
    load_hidden_decoding(args.work / "pre" / "model").backbone.save_pretrained(backbone)
    print(f"backbone: val loss {pre_metrics['val_loss']:.4f} (floor {floor(args.digits):.4f})", flush=True)

    # (2) every cell × seed continues that backbone
    hd = config(backbone, cells_run, args.steps, 1e-3, args.seeds)
    for seed in args.seeds:
        for cell in cells_run:
            m = fit_cell(hd, cell, seed, args.work / "cells" / f"{cell}-{seed}", shards)
            m = {k: v for k, v in m.items() if k != "peak_mem_mb"}
            (metrics_dir / f"{cell}-{seed}.json").write_text(json.dumps({"cell": cell, "seed": seed, **m}, indent=1))
            print(f"{cell}-{seed}: val loss {m['val_loss']:.4f}, {m['steps']} steps, {m['wall_s']:.0f} s", flush=True)

    # (3) the summary's comparisons and claims
    cells = hdr.collect(metrics_dir, hd)
    cmp = hdr.comparisons(cells, hd)
    ledger.write_claims(args.out / "claims.json", hdr.claims(cmp, hd.claims.sfa_fraction, hd.claims.level))
    summary = {"digits": args.digits, "floor": floor(args.digits),
               "sum_blind": (args.digits + 1) * math.log(P) / (args.digits + 2),
               "backbone_val_loss": pre_metrics["val_loss"], "cells": hdr.table(cells, hd),
               "gain_vs_n": hdr.gain_rows(cmp),
               "paired": {k: {str(n): d for n, d in v.items()} for k, v in cmp.items()}}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    run = {"command": "PYTHONPATH=src nice -n 15 python results/hidden-decoding/run_probe.py "
                      f"--out {args.out} --pre-steps {args.pre_steps} --steps {args.steps} "
                      f"--seeds {' '.join(map(str, args.seeds))} --cells {' '.join(args.cells)} "
                      f"--digits {args.digits}",
           "commit": commit, "wall_s": round(time.perf_counter() - start, 1), "threads": 1,
           "host": f"{platform.machine()}, shared 2-core machine (other jobs running)",
           "params": hd.model_dump(mode="json"), "backbone_pretrain": pre.train.model_dump(mode="json")}
    (args.out / "run.json").write_text(json.dumps(run, indent=1))


if __name__ == "__main__":
    main()
