"""Hidden Decoding study, part (a): a compute-bound synthetic probe (METHODS §C), run with the pipeline's own code.

Task (known optimum): blocks `d1 ... dK = s` of K (--digits) uniform digits 0..base-1, a separator, then their sum s,
modulo --mod (v1, v2: base 7, mod 7) or plain (--mod 0, v3; the sum tokens follow the separator). Digits are
unpredictable (ln base each), the separator and the sum are determined, so the lowest reachable mean next-token loss
is `Task.floor` = K·ln base / (K + 2); a model blind to the sum pays the entropy of its distribution on top
(`Task.sum_blind`). The hard token is s: at the separator the model must add K digits in one pass of a small Llama.
Hidden streams give every token more computation in the within-stream layers, read by the mixing layers; if the
mechanism works, n > 1 must close part of the gap to the floor that n = 1 cannot.

v1 and v2 (modular sums) had backbones that learned no sum at all; v3's plain sum is learned in part, and the
premise is now checked in code (PREMISE) on the backbone alone, before any HD cell runs.

Steps: (1) a random 2-layer Llama is trained at n = 1 to its plateau (`--pre-steps`), and must close PREMISE of the
gap (`--backbone-only` stops here); (2) that backbone is continued
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
from dataclasses import dataclass
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

V = 16  # vocabulary: digits 0..base-1, the separator `base`, then (plain sums) the sum tokens; the rest unused
# The backbone must close at least 10% and at most 90% of the sum-blind -> floor gap before any HD cell runs: it
# computes part of the sum (the task is learnable by this backbone) and leaves room extra computation could close.
PREMISE = (0.1, 0.9)
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


@dataclass(frozen=True)
class Task:
    """Blocks `d1 ... dK = s` of K uniform digits 0..base-1 and their sum s, modulo `mod` (0: the plain sum, whose
    tokens follow the separator)."""

    K: int
    base: int = 7
    mod: int = 7

    def __post_init__(self) -> None:
        if self.base + 1 + (0 if self.mod else self.K * (self.base - 1) + 1) > V or (self.mod > self.base + 1):
            raise SystemExit(f"the task K={self.K} base={self.base} mod={self.mod} needs more than {V} tokens")

    def sum_probs(self) -> np.ndarray:
        """The distribution of s (convolution of K uniform digits, folded modulo `mod`)."""
        p = np.ones(1)
        for _ in range(self.K):
            p = np.convolve(p, np.full(self.base, 1 / self.base))
        return np.bincount(np.arange(len(p)) % self.mod, p) if self.mod else p

    def floor(self) -> float:
        """The lowest reachable mean next-token loss: K unpredictable digits, a determined separator and sum."""
        return self.K * math.log(self.base) / (self.K + 2)

    def sum_blind(self) -> float:
        """The loss of a model that predicts all but the sum, for which it knows only its distribution."""
        p = self.sum_probs()
        return self.floor() - float(np.sum(p[p > 0] * np.log(p[p > 0]))) / (self.K + 2)

    def gap_closed(self, loss: float) -> float:
        """The fraction of the sum-blind -> floor gap a validation loss closes (0: no sum learned, 1: optimal)."""
        return (self.sum_blind() - loss) / (self.sum_blind() - self.floor())

    def tokens(self, rng: np.random.Generator, n: int) -> np.ndarray:
        digits = rng.integers(0, self.base, (n // (self.K + 2), self.K))
        s = digits.sum(1, keepdims=True)
        s = s % self.mod if self.mod else self.base + 1 + s
        return np.concatenate([digits, np.full((len(digits), 1), self.base), s], axis=1).reshape(-1)


def write_task(folder: Path, tokens: int, seed: int, task: Task) -> None:
    """Token shards of the sum task in the loader's format (train and val from different generators)."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f"sum-k{task.K}-base{task.base}-mod{task.mod}"
    meta = {"dtype": "uint16", "vocab_size": V, "eot_id": task.base, "tokenizer_sha256": name, "shards": {}}
    for split, n, s in (("train", tokens, seed), ("val", tokens // 10, seed + 1)):
        path = folder / f"{split}.bin"
        task.tokens(np.random.default_rng(s), n).astype(np.uint16).tofile(path)
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
    ap.add_argument("--base", type=int, default=7, help="digits are 0..base-1")
    ap.add_argument("--mod", type=int, default=7, help="the sum modulo this (0: the plain sum)")
    ap.add_argument("--backbone-only", action="store_true", help="stop after the backbone and its premise check")
    ap.add_argument("--cells", nargs="+", default=list(CELLS), choices=list(CELLS))
    args = ap.parse_args()
    cells_run = {c: CELLS[c] for c in args.cells}
    torch.set_num_threads(1)
    start = time.perf_counter()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()  # the code run
    shards, metrics_dir = args.work / "tokens", args.out / "metrics"
    metrics_dir.mkdir(parents=True, exist_ok=True)
    task = Task(args.digits, args.base, args.mod)
    write_task(shards, 400_000, seed=0, task=task)

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
    closed = task.gap_closed(pre_metrics["val_loss"])
    print(f"backbone: val loss {pre_metrics['val_loss']:.4f} (floor {task.floor():.4f}, sum-blind "
          f"{task.sum_blind():.4f}: {closed:.0%} of the gap closed)", flush=True)
    if args.backbone_only:
        return
    if not PREMISE[0] <= closed <= PREMISE[1]:
        raise SystemExit(f"the backbone closes {closed:.0%} of the sum-blind -> floor gap, outside {PREMISE}: this "
                         "probe cannot show what extra per-token computation does (change the task or backbone)")

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
    summary = {"digits": args.digits, "base": args.base, "mod": args.mod, "floor": task.floor(),
               "sum_blind": task.sum_blind(), "backbone_gap_closed": closed,
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
           "params": hd.model_dump(mode="json"), "backbone_pretrain": pre.train.model_dump(mode="json")}
    (args.out / "run.json").write_text(json.dumps(run, indent=1))


if __name__ == "__main__":
    main()
