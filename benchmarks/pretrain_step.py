"""Pretraining step-time ratios, all measured in this run:

1. Lightning (logging to MLflow, every callback on) against a bare PyTorch loop on the identical model, optimizer,
   batches and data, at every size of the profile's grid (the sizes the committed studies train: xxs, xs, s, m) and
   for the base recipe (AdamW) and Muon, at one thread with a second cell training beside it on another core, as a
   study runs its cells. Each side's number is the median wall time of a whole step (batch, step, callbacks), the
   fastest of `--repeats` interleaved runs: goal ≤ 1.15 at each size. Printed with tokens/s and the fraction of the
   fp32 matmul peak (measured at one thread, alone) each side reaches.
2. `unified` against `standard` step time (bare loop, largest size): goal ≤ 1.03 at 4x the profile's tokens per step;
   at the profile's own batch the ratio is reported (the scales cost a fixed amount per step, amortized by tokens).
3. MFU of the bare step at the largest size (alone, the profile's threads) against the fp32 matmul peak measured in
   the same run: a fixed target, goal ≥ MFU_GOAL (0.1; 0.30 measured on 2 shared cores when it was set).

    python benchmarks/pretrain_step.py [--params params.yaml] [--steps 40] [--sizes xxs xs] [--alone] \
        [--rates benchmarks/rates.json]

With --rates, part 1's Lightning rates (tokens/s by size and recipe) and a fit's fixed cost are written there: the
rates `scalelab study --plan` estimates pretrain cells with (scalelab.study.costs.Rates).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
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
STEP_GOAL = 1.15  # Lightning over the bare loop, at each size


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
    """Wall time from one step's end to the next: the batch, the step and every callback, as the bare loop counts;
    and the main thread's CPU time over the same span (`cpu_times`), which other processes on the cores cannot
    stretch, only slow through shared caches."""

    def __init__(self) -> None:
        self.stamps: list[tuple[float, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.stamps.append((time.perf_counter(), time.thread_time()))

    def step_times(self, clock: int = 0) -> list[float]:
        diffs = [b[clock] - a[clock] for a, b in zip(self.stamps, self.stamps[1:])]
        return diffs[len(diffs) // 5:]  # drop warm-up, as bare_loop does

    def cpu_times(self) -> list[float]:
        return self.step_times(clock=1)


def bare_loop(params, cell: Cell, tokens, vocab: int, steps: int, cpu: list[float] | None = None) -> list[float]:
    """The training step of scalelab.train.LitLM without Lightning: forward, backward, clip, schedule, step; each
    step's wall time (its thread's CPU time into `cpu`, when given). Its heap frozen as fit's is
    (scalelab.train.heap): a bare script would not rescan the benchmark's imports either."""
    pre, recipe = params.pretrain, params.pretrain.recipes[cell.recipe]
    torch.manual_seed(cell.seed)
    model = Transformer(params.resolve_model(cell.size, cell.variant, vocab_size=vocab, recipe=cell.recipe))
    opts = build_optimizers(model, params.optim[recipe.optimizer], model.cfg.scale)
    times = []
    gc.freeze()
    for step in range(steps):
        t0, c0 = time.perf_counter(), time.thread_time()
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
        if cpu is not None and step >= steps // 5:
            cpu.append(time.thread_time() - c0)
    gc.unfreeze()
    return times[steps // 5:]  # drop warm-up


def neighbour_main(params_path: str, shards: str, size: str, recipe: str) -> None:
    """A second cell training beside the measured one (a bare loop of the same size and recipe, one thread), until
    killed: on 2 cores a study runs two cells at once, and they share caches and memory bandwidth."""
    torch.set_num_threads(1)
    params, data = load_params(params_path), open_shards(shards)
    cell = Cell(variant="standard", size=size, recipe=recipe, seed=1)
    while True:
        bare_loop(params, cell, data.train, data.vocab_size, 10_000)


@contextmanager
def neighbour(params_path: str, shards: Path, size: str, recipe: str, alone: bool):
    """The neighbour cell's process for the block, none when `alone`."""
    if alone:
        yield
        return
    proc = subprocess.Popen([sys.executable, __file__, "--params", params_path, "--neighbour", str(shards), size,
                             recipe], stdout=subprocess.DEVNULL)
    try:
        time.sleep(2.0)  # its imports done: training, not starting up, while the measured side runs
        yield
    finally:
        proc.kill()
        proc.wait()


def lightning_vs_bare(bench, cell: Cell, work: Path, sdir: Path, shards, repeats: int,
                      steps: int) -> tuple[float, float, float, float, float]:
    """Each side's fastest median step over `repeats` interleaved runs (seconds): Lightning's fit, the bare loop; the
    fit's fixed cost (its wall less its training loop: setup and export), the median over the runs; and each side's
    fastest median CPU time of a step."""
    from scalelab import tracking

    lit, bare, setup, lit_cpu, bare_cpu = [], [], [], [], []
    for r in range(repeats):
        clock = StepClock()
        name = f"bench-{cell.size}-{cell.recipe}-{r}"
        with tracking.stage_run(name, params={}, experiment="scalelab-bench") as run:
            metrics = fit(bench, cell, work / name, sdir, run, callbacks=[clock])
        lit.append(statistics.median(clock.step_times()))
        lit_cpu.append(statistics.median(clock.cpu_times()))
        setup.append(metrics["wall_s"] - metrics["train_loop_s"])
        cpu: list[float] = []
        bare.append(statistics.median(bare_loop(bench, cell, shards.train, shards.vocab_size, steps, cpu)))
        bare_cpu.append(statistics.median(cpu))
    # Interference on shared cores only adds time, and it moves whole runs: on 2 idle cores the same bare loop's
    # median step was 60.5 ms in one run and 74.4 ms in the next of the same process. The fastest run of each side
    # is the estimate interference cannot inflate.
    return min(lit), min(bare), statistics.median(setup), min(lit_cpu), min(bare_cpu)


def write_rates(path: Path, table: list[tuple], setup_s: float, pre, alone: bool) -> None:
    """The Lightning side's tokens/s by size and recipe, with how they were measured (scalelab.study.costs.Rates)."""
    import datetime
    import platform

    rates: dict[str, dict[str, float]] = {}
    for size, recipe, _, _, tokens_per_s, *_ in table:
        rates.setdefault(size, {})[recipe] = round(tokens_per_s, 1)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    path.write_text(json.dumps({
        "measured": f"{datetime.date.today()} at {commit or 'no commit'} on {platform.machine()} "
                    f"{os.cpu_count()} cores, 1 thread, {'alone' if alone else 'a second cell beside it'}",
        "tokens_per_step": pre.batch_size * pre.seq_len, "setup_s": round(setup_s, 2), "tokens_per_s": rates,
    }, indent=1) + "\n")
    print(f"rates written to {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", nargs="*", help="default: the profile's grid sizes")
    ap.add_argument("--recipes", nargs="*", default=["base", "muon"])
    ap.add_argument("--alone", action="store_true", help="no second cell beside the measured one")
    ap.add_argument("--rates", type=Path, help="write the Lightning rates here (benchmarks/rates.json: what "
                    "`scalelab study --plan` estimates pretrain cells with)")
    ap.add_argument("--neighbour", nargs=3, metavar=("SHARDS", "SIZE", "RECIPE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.neighbour:
        return neighbour_main(args.params, *args.neighbour)
    params = load_params(args.params)
    sizes = args.sizes or params.pretrain.grid.sizes
    largest = params.pretrain.grid.sizes[-1]
    rows, results = [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sdir = shards_dir(params, work)
        shards = open_shards(sdir)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work / 'mlflow.db'}"

        # 1. Lightning vs bare loop at every size and recipe, one thread (as a study's cells), a neighbour beside.
        torch.set_num_threads(1)
        peak1 = peak_flops(torch.float32)
        one = params.pretrain.model_copy(update={"max_steps": args.steps, "threads": 1})
        bench = params.model_copy(update={"pretrain": one})
        tokens = one.batch_size * one.seq_len
        table, setups = [], []
        for size in sizes:
            for recipe in args.recipes:
                cell = Cell(variant="standard", size=size, recipe=recipe, seed=0)
                with neighbour(args.params, sdir, size, recipe, args.alone):
                    lit_s, bare_s, setup_s, lit_c, bare_c = lightning_vs_bare(bench, cell, work, sdir, shards,
                                                                              args.repeats, args.steps)
                setups.append(setup_s)
                fpt = Transformer(params.resolve_model(size, "standard", vocab_size=shards.vocab_size)).flops_per_token(
                    one.seq_len)
                table.append((size, recipe, lit_s, bare_s, tokens / lit_s, tokens / bare_s,
                              fpt * tokens / lit_s / peak1, fpt * tokens / bare_s / peak1, lit_c / bare_c))
                results.append({"benchmark": "pretrain_step", "metric": f"lightning_over_bare_step_time_{size}_{recipe}",
                                "value": round(lit_s / bare_s, 4), "goal": f"<= {STEP_GOAL}",
                                "met": lit_s / bare_s <= STEP_GOAL, "tokens_per_s": round(tokens / lit_s),
                                "bare_tokens_per_s": round(tokens / bare_s),
                                "peak_fraction": round(fpt * tokens / lit_s / peak1, 4),
                                "cpu_time_ratio": round(lit_c / bare_c, 4), "neighbour": not args.alone})
        torch.set_num_threads(params.pretrain.threads or torch.get_num_threads())
        print(f"Lightning over the bare loop, 1 thread, {'alone' if args.alone else 'a second cell beside it'}; "
              f"{tokens} tokens a step; fp32 matmul peak {peak1 / 1e9:.1f} GFLOP/s at one thread")
        print(f"{'size':5s} {'recipe':7s} {'lightning ms':>12s} {'bare ms':>8s} {'ratio':>6s} {'tok/s':>7s} "
              f"{'bare tok/s':>10s} {'of peak':>7s} {'bare':>6s} {'cpu ratio':>9s}  goal (wall ratio)")
        for size, recipe, lit_s, bare_s, tl, tb, fl, fb, cr in table:
            print(f"{size:5s} {recipe:7s} {lit_s * 1e3:12.2f} {bare_s * 1e3:8.2f} {lit_s / bare_s:6.3f} {tl:7.0f} "
                  f"{tb:10.0f} {fl:7.3f} {fb:6.3f} {cr:9.3f}  <= {STEP_GOAL}"
                  f"{'' if lit_s / bare_s <= STEP_GOAL else '  MISSED'}")
        print()
        if args.rates:
            write_rates(args.rates, table, statistics.median(setups), one, args.alone)

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

        # 3. MFU at the largest size, alone, at the profile's threads, against the fp32 matmul peak measured now.
        cell = Cell(variant="standard", size=largest, recipe="base", seed=0)
        bare_s = min(statistics.median(bare_loop(params, cell, shards.train, shards.vocab_size, args.steps))
                     for _ in range(args.repeats))
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
