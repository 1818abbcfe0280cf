"""The sensitivity probe behind the rank allocation (ASVD arXiv 2312.05821 §3.3, as the SigmaScale code runs it).

For every decoder linear map l and candidate kept fraction r < 1: the calibration NLL of the model with only map l
replaced by its plain rank-k SVD, k = ⌊r·m·n/(m+n)⌋ (`SVDLinear.from_linear(..., act_aware=False)` in the official
code: the probe is plain SVD whatever method is allocated for, so every method gets the same ranks). r = 1.0 is the
dense model's own NLL. The official code records perplexity; the allocation (rank.py) only compares values against one
threshold, so NLL, a monotone function of it, gives the same ranks.

Cost: one forward pass over the probe windows per map and candidate (SmolLM2-135M: 210 maps × 8 = 1680). Truncating a
map of block b leaves every block before b unchanged, so each block's input on the probe windows is recorded once and
a probe of a map in block b runs from there (the earlier blocks are swapped for a pass-through for that forward):
the same numbers as a full forward, about a third less work on SmolLM2 (on average half the blocks, always the
head). The recorded inputs take blocks × probe tokens × width (SmolLM2, one window of 256 tokens: 18 MB in float32;
an 8B Llama on 16 × 2048 tokens in bf16: 8.6 GB).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from scalelab.compress.calibrate import Batch, decoder_blocks, decoder_linears, eta
from scalelab.compress.rank import rank_for
from scalelab.runtime.log import Every

log = logging.getLogger(__name__)


class _PassThrough(nn.Module):
    """Stands in for a decoder block before the probed one: returns its hidden-state input as the block would
    return its output (a tensor, or a 1-tuple for architectures whose blocks return tuples)."""

    def __init__(self, as_tuple: bool) -> None:
        super().__init__()
        self.as_tuple = as_tuple

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        return (hidden_states,) if self.as_tuple else hidden_states


def probe_windows(batches: Sequence[Batch], samples: int) -> list[Batch]:
    """The first `samples` calibration windows, in the calibration's batches."""
    out, left = [], samples
    for x, y in batches:
        if left > 0:
            out.append((x[:left], y[:left]))
            left -= x.shape[0]
    return out


class _Resumable:
    """Forward passes of `model` over `batches` that start at a given decoder block, from that block's recorded input
    (the residual stream of the dense model: every map before it is unchanged)."""

    def __init__(self, model: nn.Module, batches: Sequence[Batch]) -> None:
        self.model, self.batches = model, list(batches)
        self.blocks = decoder_blocks(model)
        self.dev = next(model.parameters()).device
        self.inputs: list[list[torch.Tensor]] = [[] for _ in self.batches]  # [batch][block]
        self.as_tuple = False
        self.start: int | None = None
        self._batch = 0

        def record(i: int):
            def fn(module, args, kwargs):
                h = args[0] if args else kwargs["hidden_states"]
                if self.start is None:  # the recording pass
                    self.inputs[self._batch].append(h.detach())
                    return None
                if i != self.start:
                    return None
                h = self.inputs[self._batch][i]
                return ((h, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": h})
            return fn

        def shape(module, args, out) -> None:
            self.as_tuple = isinstance(out, tuple)

        self.hooks = [b.register_forward_pre_hook(record(i), with_kwargs=True) for i, b in enumerate(self.blocks)]
        self.hooks.append(self.blocks[0].register_forward_hook(shape))
        self.baseline = self.nll(None)

    def nll(self, start: int | None) -> float:
        """Mean next-token NLL over the windows, the blocks before `start` skipped (None: a full pass, recording)."""
        self.start = start
        saved = list(self.blocks) if start else []
        for i in range(start or 0):
            self.blocks[i] = _PassThrough(self.as_tuple)
        total, count = 0.0, 0
        try:
            for j, (x, y) in enumerate(self.batches):
                self._batch = j
                logits = self.model(input_ids=x.to(self.dev), use_cache=False).logits
                total += float(F.cross_entropy(logits.float().flatten(0, 1), y.to(self.dev).flatten(),
                                               reduction="sum"))
                count += y.numel()
        finally:
            for i, block in enumerate(saved[: start or 0]):
                self.blocks[i] = block
        return total / count

    def close(self) -> None:
        for h in self.hooks:
            h.remove()
        self.inputs = []


@torch.no_grad()
def probe(model: nn.Module, batches: Sequence[Batch], ratios: Sequence[float]) -> tuple[float, dict]:
    """(dense NLL, {map: {ratio: NLL}}) over `batches` for every decoder linear map (module docstring); the weights
    are restored after each map. `ratios` are the candidates, 1.0 (dense) among them."""
    block_of = {name: b for b, names in enumerate(decoder_linears(model)) for name in names}
    runner = _Resumable(model, batches)
    table: dict[str, dict[float, float]] = {}
    start, every = time.perf_counter(), Every()
    try:
        for j, (name, b) in enumerate(block_of.items()):
            layer = model.get_submodule(name)
            dense = layer.weight.detach().clone()
            m, n = dense.shape
            u, s, vh = torch.linalg.svd(dense.double(), full_matrices=False)
            table[name] = {1.0: runner.baseline}
            try:
                for r in ratios:
                    if (k := rank_for(m, n, r)) is not None:
                        layer.weight.copy_(((u[:, :k] * s[:k]) @ vh[:k]).to(dense.dtype))
                        table[name][r] = runner.nll(b)
            finally:
                layer.weight.copy_(dense)
            if every():
                log.info("sensitivity: map %s", eta(j + 1, len(block_of), time.perf_counter() - start))
    finally:
        runner.close()
    return runner.baseline, table
