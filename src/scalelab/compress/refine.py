"""End-to-end refinement of the low-rank factors (beyond the papers: docs/compression.md).

SVD-LLM's factors are the exact optimum of each layer's own loss, taken on the uncompressed model's inputs. They are
not the optimum of what matters downstream: errors compound through the blocks, and a layer's loss weighs every
output direction alike. Here every `LowRankLinear`'s L and R are fitted jointly, with AdamW on calibration windows
only, to the uncompressed model (the teacher):

    logits   KL(p_teacher ‖ p_student) per token, averaged
    blocks   Σ_l ‖h_l − ĥ_l‖² / ‖h_l‖² over the decoder blocks' outputs (student run on its own inputs)

Two things make the fit move at all: the factors are optimised as float32 masters whatever the model's
dtype (a bf16 entry of 0.01 has a resolution of 4e-5: AdamW steps of lr 1e-5 round away), cast back at the end; and
each rank-one component is first balanced, ‖L_:i‖ = ‖R_i:‖ (L_:i·a, R_i:/a, the product unchanged): SVD-LLM's
R·S⁻¹ with an un-normalised Gram leaves R tiny and L huge, so one learning rate fits neither.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from scalelab.compress.calibrate import Batch, decoder_blocks
from scalelab.compress.lowrank import LowRankLinear
from scalelab.config.compress import RefineConfig


def _block_outputs(model: nn.Module) -> tuple[list[torch.Tensor], list]:
    outs: list[torch.Tensor] = []

    def keep(module: nn.Module, args: tuple, out) -> None:
        outs.append(out[0] if isinstance(out, tuple) else out)

    return outs, [b.register_forward_hook(keep) for b in decoder_blocks(model)]


def _loss(student: nn.Module, teacher: nn.Module, x: torch.Tensor, target: str) -> torch.Tensor:
    if target == "logits":
        with torch.no_grad():
            ref = F.log_softmax(teacher(input_ids=x, use_cache=False).logits.float(), -1)
        out = F.log_softmax(student(input_ids=x, use_cache=False).logits.float(), -1)
        return F.kl_div(out.flatten(0, 1), ref.flatten(0, 1), log_target=True, reduction="batchmean")
    ref_outs, ref_hooks = _block_outputs(teacher)
    outs, hooks = _block_outputs(student)
    try:
        with torch.no_grad():
            teacher(input_ids=x, use_cache=False)
        student(input_ids=x, use_cache=False)
    finally:
        for h in ref_hooks + hooks:
            h.remove()
    return sum(((o.float() - r.float()) ** 2).sum() / (r.float() ** 2).sum() for o, r in zip(outs, ref_outs))


@torch.no_grad()
def balance(layer: LowRankLinear) -> None:
    """Rescale each rank-one component so that its column of L and row of R have equal norms (same product)."""
    left, right = layer.left.weight, layer.right.weight
    a = (right.float().norm(dim=1) / left.float().norm(dim=0).clamp_min(1e-30)).clamp_min(1e-30).sqrt()
    left.mul_(a.to(left.dtype)[None, :])
    right.div_(a.to(right.dtype)[:, None])


def refine(student: nn.Module, teacher: nn.Module, batches: Sequence[Batch], *, target: str, cfg: RefineConfig,
           held: Sequence[Batch] = (), log: Callable[[str], None] = lambda s: None) -> dict:
    """Fit the factors of `student`'s low-rank layers to `teacher` for `cfg.steps` AdamW steps; everything else
    stays frozen. Returns the objective before and after on the calibration windows it is fitted on and, when
    `held` is given, on those windows (read, never fitted: a fit that only memorises its windows shows there), the
    steps and their seconds apart from the objective's (the cost of a step, timed on a few)."""
    if target not in ("logits", "blocks"):
        raise ValueError(f"refine target {target!r}: expected 'logits' or 'blocks'")
    dev = next(student.parameters()).device
    layers = [m for m in student.modules() if isinstance(m, LowRankLinear)]
    dtypes = [m.right.weight.dtype for m in layers]
    for m in layers:
        m.float()  # float32 masters for the fit
        balance(m)
    factors = [p for m in layers for p in m.parameters()]
    frozen = [(p, p.requires_grad) for p in student.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    for p in factors:
        p.requires_grad_(True)
    teacher.eval().requires_grad_(False)
    x_all = torch.cat([x for x, _ in batches])
    opt = torch.optim.AdamW(factors, lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)

    def objective(windows: Sequence[Batch]) -> float | None:
        if not windows:
            return None
        with torch.no_grad():
            return sum(float(_loss(student, teacher, x.to(dev), target)) for x, _ in windows) / len(windows)

    t0 = time.perf_counter()
    before, before_held = objective(batches), objective(held)
    t1 = time.perf_counter()
    try:
        for step in range(cfg.steps):
            idx = torch.randperm(len(x_all), generator=gen)[: cfg.batch_size]
            loss = _loss(student, teacher, x_all[idx].to(dev), target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
    t2 = time.perf_counter()
    after, after_held = objective(batches), objective(held)
    t3 = time.perf_counter()
    for m, dtype in zip(layers, dtypes):
        m.to(dtype)
    log(f"refine ({target}): calibration objective {before:.5f} → {after:.5f} in {cfg.steps} steps"
        + (f", held out {before_held:.5f} → {after_held:.5f}" if held else ""))
    return {"objective_before": before, "objective_after": after, "objective_before_held": before_held,
            "objective_after_held": after_held, "refine_steps": cfg.steps, "seconds_refine_steps": t2 - t1,
            "seconds_refine_objective": (t1 - t0) + (t3 - t2)}
