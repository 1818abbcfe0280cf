"""What the training loop does for particular families, and optimizer-state accounting.

- Sophia takes a diagonal Hessian estimate every `update_period` steps: `hessian_due` says when, `gnb_hessian`
  computes it (Gauss-Newton-Bartlett), and the loop passes it as `optimizer.step(hessian=...)`.
- Schedule-Free optimizers train at the interpolated iterate y and evaluate at the average x: `eval_weights`
  swaps x in for validation and checkpoints, `train_weights` swaps y back before a training step.
- `state_bytes` reads the optimizer state's size from its tensors; `step_peak_bytes` measures the memory an
  optimizer step itself allocates at its peak (not the process's high-water mark).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import pytorch_optimizer as po
import torch
import torch.nn.functional as F
from torch import nn


def params_of(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for g in opt.param_groups for p in g["params"]]


def hessian_due(opt: torch.optim.Optimizer) -> bool:
    """Sophia refreshes its Hessian EMA at its steps 0, k, 2k, … (k = update_period); on those steps it must get an
    estimate, or it would try its own Hutchinson estimate from a graph the loop did not keep."""
    return isinstance(opt, po.SophiaH) and opt.param_groups[0].get("step", 0) % opt.update_period == 0


def gnb_hessian(model: nn.Module, x: torch.Tensor, params: Sequence[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """Gauss-Newton-Bartlett estimate of diag(H) (Liu et al. 2023, Sophia, Algorithm 2): labels ŷ sampled from the
    model's own predictive distribution, ĝ = ∇ of the mean cross-entropy of the B tokens against ŷ, estimate B·ĝ⊙ĝ
    (in expectation the diagonal of the Gauss-Newton matrix of the per-token loss, whatever B). By autograd.grad, so
    the training gradients in `.grad` stay as they are. The labels come from a generator seeded with `seed` (the
    loop passes run seed + step), so a resumed run draws the same labels as an uninterrupted one."""
    logits = model(x).logits.float()
    with torch.no_grad():
        gen = torch.Generator(logits.device).manual_seed(seed)
        y = torch.multinomial(logits.flatten(0, 1).softmax(-1), 1, generator=gen).squeeze(1)
    loss = F.cross_entropy(logits.flatten(0, 1), y)
    grads = torch.autograd.grad(loss, list(params), allow_unused=True, materialize_grads=True)
    return [y.numel() * g * g for g in grads]


def schedule_free(opt: torch.optim.Optimizer) -> bool:
    return isinstance(opt, torch.optim.Optimizer) and "train_mode" in opt.param_groups[0] and hasattr(opt, "eval")


def train_weights(opts: Sequence[torch.optim.Optimizer]) -> None:
    """Schedule-Free: the training iterate y in the parameters (a no-op when it is there already)."""
    for opt in opts:
        if schedule_free(opt):
            opt.train()


@contextlib.contextmanager
def eval_weights(opts: Sequence[torch.optim.Optimizer]) -> Iterator[None]:
    """Schedule-Free: the averaged weights x in the parameters for the block (validation, checkpoints), then y again.
    Other optimizers evaluate the weights they train."""
    swapped = [o for o in opts if schedule_free(o) and o.param_groups[0]["train_mode"]]
    for opt in swapped:
        opt.eval()
    try:
        yield
    finally:
        for opt in swapped:
            opt.train()


def state_bytes(opts: Sequence[torch.optim.Optimizer]) -> int:
    """Bytes of the optimizers' per-parameter state, read from its tensors (nested in lists, dicts or objects, such as
    SOAP's eigenbases or GaLore's projector). Step counters are bookkeeping, not state per parameter: left out."""

    def size(v: object) -> int:
        if isinstance(v, torch.Tensor):
            return v.numel() * v.element_size()
        if isinstance(v, dict):
            return sum(size(x) for x in v.values())
        if isinstance(v, (list, tuple)):
            return sum(size(x) for x in v)
        if hasattr(v, "__dict__") and not isinstance(v, (nn.Module, type)):
            return size(vars(v))
        return 0

    return sum(size({k: v for k, v in s.items() if k != "step"}) for opt in opts for s in opt.state.values())


def step_peak_bytes(step: Callable[[], object], device: torch.device) -> int:
    """The peak of the bytes allocated while `step()` runs, above what was allocated when it began: the step's own
    cost (its state, if it creates it, and its temporaries), whatever ran before it in the process.

    CUDA: the allocator's peak counter, reset just before. CPU: torch's profiler with memory profiling records every
    allocation and free of torch's CPU allocator as a "[memory]" event with its signed size (tracemalloc sees only
    Python's heap, not tensors); the running sum of those in time order peaks at the step's peak."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - start
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    running = peak = 0
    for e in events:
        running += e.nbytes()
        peak = max(peak, running)
    return peak
