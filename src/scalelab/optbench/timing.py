"""What one optimizer step costs in time and memory, measured in the sweep cell's process.

The timed step is the trained step: LitLM.training_step itself (scalelab.train.module), the code every run of the
benchmark trains with (Schedule-Free's training iterate, micro-batches, the gradient norm and its clipping at
pretrain.grad_clip, the LR schedule, Sophia's Hessian estimate when due, every optimizer's step), driven here without
a Lightning Trainer: `Solo` stands in for the one-process strategy's part of the trainer that the step calls (a mean
over one rank is the tensor itself, backward is the tensor's), so the timing adds no Lightning loop around the step
and both arms are stepped in turn on the same batches.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from scalelab.config import Params
from scalelab.optim import hooks
from scalelab.train.module import LitLM
from scalelab.optbench.runs import RECIPE, run_params


class _Strategy:
    """The single-device strategy's calls in LitLM.training_step: reduce over one rank, backward."""

    @staticmethod
    def reduce(tensor: torch.Tensor, reduce_op: str | None = None) -> torch.Tensor:
        return tensor

    @staticmethod
    def backward(loss: torch.Tensor, optimizer: object = None, *args, **kwargs) -> None:
        loss.backward(*args, **kwargs)


class _Optimizer:
    """What LightningOptimizer gives training_step: the optimizer itself, its groups, step and zero_grad."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer, self.param_groups = optimizer, optimizer.param_groups

    def step(self, **kwargs) -> None:
        self.optimizer.step(**kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)


class Solo:
    """The trainer a LitLM's training_step sees when driven by hand: its strategy and its optimizers."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self.strategy = _Strategy()
        self.strategy._lightning_optimizers = [_Optimizer(o) for o in optimizers]
        self.optimizers = optimizers


def trained_step(lit: LitLM, optimizers: list[torch.optim.Optimizer]) -> LitLM:
    """`lit` set up to run its training_step outside Lightning over `optimizers` (its configure_optimizers')."""
    lit.trainer = Solo(optimizers)
    return lit


def _lit(params: Params, optimizer: str, size: str, vocab: int, device: torch.device, hp: dict | None = None,
         pinned_lr: float | None = None) -> tuple[LitLM, list[torch.optim.Optimizer]]:
    """The LitLM a benchmark run of `optimizer` trains (run_params at `hp`, default its centre LR: the schedule,
    clipping, accumulation of that run), on a fresh model of the first sweep seed, with its optimizers."""
    from scalelab.model import Transformer

    sub = run_params(params, optimizer, hp or {"lr": params.optim[optimizer].lr}, pinned_lr=pinned_lr)
    pre, recipe = sub.pretrain, sub.pretrain.recipes[RECIPE]
    torch.manual_seed(params.optimizers.sweep_seeds[0])
    model = Transformer(sub.resolve_model(size, params.optimizers.variant, vocab, recipe=RECIPE)).to(device)
    if pre.precision == "bf16-true":
        model = model.to(torch.bfloat16)
    lit = LitLM(model, optimizer=sub.optim[RECIPE], scale=model.cfg.scale, schedule=recipe.schedule,
                total_steps=pre.total_steps(), accumulate=pre.accumulate, grad_clip=pre.grad_clip).to(device)
    opts = lit.configure_optimizers()
    return trained_step(lit, opts), opts


def train_step(model: torch.nn.Module, opts: list[torch.optim.Optimizer], x: torch.Tensor, y: torch.Tensor,
               seed: int = 0, grad_clip: float = 0.0) -> float:
    """One training step of LitLM (module doc) on `model` with the optimizers `opts` (the registry's: each group has
    its base_lr) at a constant LR and gradient clipping at `grad_clip` (0: none); the training loss. For loops outside
    the trainer (tests, the how-to), each call its own step 0 of a constant schedule. `seed` is kept for callers'
    symmetry with the trainer (Sophia's labels come from torch's seed and the step)."""
    from scalelab.config import ScheduleConfig

    lit = LitLM(model, optimizer=None, scale=None, schedule=ScheduleConfig(name="constant", warmup=0.0),
                total_steps=1, grad_clip=grad_clip)
    trained_step(lit, opts).training_step((x, y), 0)
    return lit.step_metrics["train/loss"]


def _device(params: Params) -> torch.device:
    return torch.device("cuda") if params.pretrain.accelerator in ("gpu", "cuda") else torch.device("cpu")


def step_time_ratio(params: Params, optimizer: str, size: str, shards: Path, hp: dict | None = None,
                    pinned_lr: float | None = None) -> dict:
    """The optimizer's training step against the baseline's, timed in this process and interleaved step by step (one
    of each in turn, on the same batches, each on its own copy of the same model), so both see the same load: the
    median over pairs of their ratio, after two warm-up pairs. The pair's order alternates: the second step of a
    pair ran ~8% slower (AdamW timed against itself read 1.08-1.09). Each arm's step is the trained one (module doc)
    at its run's settings (`hp`, `pinned_lr`: the optimizer's choice; the baseline at its centre LR)."""
    from scalelab.data import open_shards
    from scalelab.data.loader import train_batch

    ob, pre = params.optimizers, params.pretrain
    data, device = open_shards(shards), _device(params)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=pre.precision == "bf16-mixed")
    arms = [(_lit(params, ob.baseline, size, data.vocab_size, device)[0], []),
            (_lit(params, optimizer, size, data.vocab_size, device, hp, pinned_lr)[0], [])]
    for step in range(ob.timing_steps + 2):
        x, y = (t.to(device) for t in train_batch(data.train, seed=ob.sweep_seeds[0], step=step,
                                                  batch_size=pre.batch_size, seq_len=pre.seq_len))
        for lit, times in arms if step % 2 == 0 else arms[::-1]:
            sync()
            start = time.perf_counter()
            with autocast:
                lit.training_step((x, y), step)
            sync()
            times.append(time.perf_counter() - start)
    base, mine = (times[2:] for _, times in arms)
    return {"timing_step_s": statistics.median(mine), "baseline_step_time_s": statistics.median(base),
            "step_time_ratio": statistics.median([m / b for m, b in zip(mine, base)])}


def step_memory(params: Params, optimizer: str, size: str, shards: Path, hp: dict | None = None,
                pinned_lr: float | None = None) -> dict:
    """The optimizer step's own peak memory (hooks.step_peak_bytes): the first step of a fresh model and optimizer,
    after its forward and backward (and Sophia's Hessian estimate) so only the update is measured. The first step is
    the one that allocates the state, so the peak holds the state plus the step's temporaries; per parameter of the
    model (all optimizers of the run, the AdamW side included, as state_bytes_per_param)."""
    from scalelab.data import open_shards
    from scalelab.data.loader import train_batch

    ob, pre = params.optimizers, params.pretrain
    data, device = open_shards(shards), _device(params)
    lit, opts = _lit(params, optimizer, size, data.vocab_size, device, hp, pinned_lr)
    model = lit.model
    x, y = (t.to(device) for t in train_batch(data.train, seed=ob.sweep_seeds[0], step=0,
                                              batch_size=pre.batch_size, seq_len=pre.seq_len))
    hooks.train_weights(opts)
    model(x, y).loss.backward()
    hessians = {id(o): hooks.gnb_hessian(model, x, hooks.params_of(o), seed=0) for o in opts if hooks.hessian_due(o)}

    def step() -> None:
        for opt in opts:
            opt.step(hessian=hessians[id(opt)]) if id(opt) in hessians else opt.step()

    peak = hooks.step_peak_bytes(step, device)
    return {"step_peak_mb": peak / 2**20, "step_peak_bytes_per_param": peak / model.num_params()}
