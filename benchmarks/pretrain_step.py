"""Pretraining step-time ratios, all measured in this run:

1. Lightning (logging to MLflow, every callback on) against a bare PyTorch loop on the identical model, optimizer,
   batches and data, both as the median wall time of a whole step (batch, step, callbacks), each side's fastest of
   `--repeats` interleaved runs: goal ≤ 1.05.
2. `unified` against `standard` step time (bare loop, same size): goal ≤ 1.03 at 4x the profile's tokens per step;
   at the profile's own batch the ratio is reported (the scales cost a fixed amount per step, amortized by tokens).
3. MFU of the bare step at the largest default size against the fp32 matmul peak measured in the same run: a fixed
   target, goal ≥ MFU_GOAL (0.1; 0.30 measured on 2 shared cores when it was set): a step 3x slower than that misses.

    python benchmarks/pretrain_step.py [--params params.yaml] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from scalelab.config import load_params
from scalelab.data.corpus import prepare_corpus, read_prepared
from scalelab.data.tokenizer import build_tokenizer, eot_id
from scalelab.data.loader import open_shards, train_batch
from scalelab.data.shards import tokenize_splits
from scalelab.model import Transformer
from scalelab.optim import apply_lr, build_optimizers, lr_factor
from scalelab.train import Cell, fit, peak_flops

MFU_GOAL = 0.1


def shards_dir(params, work: Path) -> Path:
    """The pipeline's shards when built, else the same corpus tokenized into `work`."""
    if Path("data/tokens/meta.json").is_file():
        return Path("data/tokens")
    prepare_corpus(params.prepare, work / "prepared")
    train, val = (read_prepared(work / "prepared", split) for split in ("train", "val"))
    tok = build_tokenizer(params.tokenizer, train)
    tokenize_splits(tok, {"train": train, "val": val}, work / "tokens", eot_id=eot_id(tok, params.tokenizer.eot_token),
                    batch_size=params.tokenize.batch_size, tokenizer_sha256="bench")
    return work / "tokens"


class StepClock(Callback):
    """Wall time from one step's end to the next: the batch, the step and every callback, as the bare loop counts."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.stamps.append(time.perf_counter())

    def step_times(self) -> list[float]:
        diffs = [b - a for a, b in zip(self.stamps, self.stamps[1:])]
        return diffs[len(diffs) // 5:]  # drop warm-up, as bare_loop does


def bare_loop(params, cell: Cell, tokens, vocab: int, steps: int) -> list[float]:
    """The training step of scalelab.train.LitLM without Lightning: forward, backward, clip, schedule, step."""
    pre, recipe = params.pretrain, params.pretrain.recipes[cell.recipe]
    torch.manual_seed(cell.seed)
    model = Transformer(params.resolve_model(cell.size, cell.variant, vocab_size=vocab, recipe=cell.recipe))
    opts = build_optimizers(model, params.optim[recipe.optimizer], model.cfg.scale)
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        x, y = train_batch(tokens, seed=cell.seed, step=step, batch_size=pre.batch_size, seq_len=pre.seq_len)
        loss = model(x, y).loss
        loss.backward()
        params_with_grad = [p for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params_with_grad])
        torch.nn.utils.clip_grads_with_norm_(params_with_grad, pre.grad_clip, norm)
        apply_lr(opts, lr_factor(recipe.schedule, step, steps))
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
        loss.item(), norm.item()  # the Lightning module logs both: the same host syncs
        times.append(time.perf_counter() - t0)
    return times[steps // 5:]  # drop warm-up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    params = load_params(args.params)
    if params.pretrain.threads:
        torch.set_num_threads(params.pretrain.threads)
    largest = params.pretrain.grid.sizes[-1]
    rows, results = [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sdir = shards_dir(params, work)
        shards = open_shards(sdir)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'mlflow.db'}"
        from scalelab import tracking

        # 1. Lightning vs bare loop, interleaved, the median step of each run; each side's fastest run. Interference on
        # shared cores only adds time, and it moves whole runs: on 2 idle cores the same bare loop's median step was
        # 60.5 ms in one run and 74.4 ms in the next of the same process, and the ratio of medians over 3 repeats read
        # 1.25 where a rerun of the comparison read 0.95. The fastest run of each side is the estimate interference
        # cannot inflate.
        bench = params.model_copy(update={"pretrain": params.pretrain.model_copy(update={"max_steps": args.steps})})
        cell = Cell(variant="standard", size=largest, recipe="base", seed=0)
        lit, bare = [], []
        for r in range(args.repeats):
            clock = StepClock()
            with tracking.stage_run(f"bench-lightning-{r}", params={}, experiment="scalelab-bench") as run:
                fit(bench, cell, work / f"fit{r}", sdir, run, callbacks=[clock])
            lit.append(statistics.median(clock.step_times()))
            bare.append(statistics.median(bare_loop(params, cell, shards.train, shards.vocab_size, args.steps)))
        lit_s, bare_s = min(lit), min(bare)
        rows.append(("Lightning step (size %s)" % largest, lit_s, bare_s, lit_s / bare_s, "<= 1.05"))
        results.append({"benchmark": "pretrain_step", "metric": "lightning_over_bare_step_time",
                        "value": round(lit_s / bare_s, 4), "goal": "<= 1.05"})

        # 2. unified vs standard, bare loop, interleaved; at the profile's batch and at 4x its tokens per step, since
        # the scales are applied to the weights (Projection): their cost is fixed per step and amortizes with tokens.
        for mult, steps in ((1, args.steps), (4, max(10, args.steps // 2))):
            big = params.model_copy(update={"pretrain": params.pretrain.model_copy(
                update={"batch_size": params.pretrain.batch_size * mult})})
            std, uni = [], []
            for _ in range(args.repeats):
                for variant, acc in (("standard", std), ("unified", uni)):
                    c = Cell(variant=variant, size=largest, recipe="base", seed=0)
                    acc.append(statistics.median(bare_loop(big, c, shards.train, shards.vocab_size, steps)))
            std_s, uni_s = statistics.median(std), statistics.median(uni)
            tokens = big.pretrain.batch_size * big.pretrain.seq_len
            # the goal at 4x tokens: at the profile's small batch the fixed cost is reported (measured 1.17-1.20,
            # against 0.98 at 4x), since a goal there would price the weights' scaling, not the variant's compute
            goal = "<= 1.03" if mult > 1 else "report (fixed per-step cost; goal at 4x tokens)"
            rows.append((f"unified vs standard step, {tokens} tokens", uni_s, std_s, uni_s / std_s, goal))
            results.append({"benchmark": "pretrain_step", "metric": f"unified_over_standard_step_time_{tokens}_tokens",
                            "value": round(uni_s / std_s, 4), "goal": goal})

        # 3. MFU at the largest size against the fp32 matmul peak measured now.
        model = Transformer(params.resolve_model(largest, "standard", vocab_size=shards.vocab_size))
        peak = peak_flops(torch.float32)
        tokens_per_s = params.pretrain.batch_size * params.pretrain.seq_len / bare_s
        mfu = model.flops_per_token(params.pretrain.seq_len) * tokens_per_s / peak
        rows.append((f"MFU size {largest} (peak {peak / 1e9:.0f} GFLOP/s)", mfu, 1.0, mfu, f">= {MFU_GOAL}"))
        results.append({"benchmark": "pretrain_step", "metric": f"mfu_{largest}_vs_measured_matmul_peak",
                        "value": round(mfu, 4), "goal": f">= {MFU_GOAL}"})

    print(f"{'measure':44s} {'value':>12s} {'baseline':>12s} {'ratio':>8s}  goal")
    for name, v, b, ratio, goal in rows:
        print(f"{name:44s} {v:12.5f} {b:12.5f} {ratio:8.3f}  {goal}")
    for r in results:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
