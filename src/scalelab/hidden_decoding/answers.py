"""The last stream's loss and accuracy on selected targets (a probe's answer tokens), and its loss per window, over
fixed windows.

A probe whose hard token is one of a block (the parity after its bits) reads its effect there, not in the mean over
every token, which the unpredictable bits dominate; two models compared on the same windows (a start against its
backbone) are paired by window. Same forward as training and validation (the model's own `forward`, logits of the
last stream), in eval mode without gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F


@torch.no_grad()
def scored_targets(model: torch.nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                   select: Callable[[torch.Tensor], torch.Tensor]) -> dict:
    """Mean cross-entropy (over the whole vocabulary) and top-1 accuracy of `model`'s logits on the targets
    `select(y)` marks, over `batches` of (x, y); `answers` is how many targets were scored."""
    was_training = model.training
    model.eval()
    total, correct, count = 0.0, 0, 0
    try:
        for x, y in batches:
            keep = select(y)
            if not keep.any():
                continue
            logits = model(x).logits[keep].float()
            target = y[keep]
            total += float(F.cross_entropy(logits, target, reduction="sum"))
            correct += int((logits.argmax(-1) == target).sum())
            count += int(keep.sum())
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("scored_targets: no target selected in the windows (wrong task or windows?)")
    return {"answer_loss": total / count, "answer_acc": correct / count, "answers": count}


@torch.no_grad()
def window_losses(model: torch.nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    """The mean cross-entropy of each window of `batches` (x, y), in order."""
    was_training = model.training
    model.eval()
    try:
        return [loss for x, y in batches
                for loss in F.cross_entropy(model(x).logits.float().transpose(1, 2), y, reduction="none")
                .mean(1).tolist()]
    finally:
        model.train(was_training)
