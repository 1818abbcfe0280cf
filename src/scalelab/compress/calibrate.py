"""Calibration statistics of every decoder linear map, streamed over calibration batches.

What each method needs from the inputs x (rows of X) of a map W, accumulated batch by batch so that memory depends on
the layer widths, never on the token count:
    C = Σ x xᵀ   (float64)   SVD-LLM's whitening, SigmaScale's loss (X enters only through XXᵀ), every layer loss
    Σ |x|                    ASVD's activation scale mean|x|
    Σ_seq (∂ℓ/∂W)² row sums   FWSVD's Fisher row weights (needs one backward pass: `fisher_rows`)

`collect` hooks only the maps it is asked for and stops each forward pass as soon as they have all seen their input,
so statistics can be gathered a few decoder blocks at a time (memory bound: those blocks' Gram matrices), at the
cost of re-running the blocks before them. Maps reading the same tensor (q/k/v, gate/up) share one set of statistics.
Calibration windows come from the train split only; the validation split is never read here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from scalelab.compress.methods import whitening
from scalelab.data.loader import train_batch
from scalelab.runtime.log import Every

log = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor]  # (input ids, next-token targets), [B, T] each


def eta(done: int, total: int, elapsed: float) -> str:
    """'done/total, elapsed s, ETA s' for a progress line."""
    left = elapsed / done * (total - done) if done else float("nan")
    return f"{done}/{total}, {elapsed:.0f} s, ETA {left:.0f} s"


def calibration_batches(train_tokens: np.ndarray, *, samples: int, seq_len: int, batch_size: int,
                        seed: int) -> list[Batch]:
    """`samples` random windows of the train split, drawn from `seed` (the calibration seed), in batches."""
    x, y = train_batch(train_tokens, seed=seed, step=0, batch_size=samples, seq_len=seq_len)
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, samples, batch_size)]


def decoder_blocks(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a Hugging Face causal LM (Llama, Qwen3 and the architectures shaped like them)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__}: no decoder layers found (expected model.model.layers)")
    return layers


def decoder_linears(model: nn.Module) -> list[list[str]]:
    """Names of the linear maps inside each decoder block (q, k, v, o, gate, up, down for Llama/Qwen3), block by
    block, in execution order. Embeddings and the LM head sit outside the blocks and are never listed."""
    blocks = decoder_blocks(model)
    index = {id(b): i for i, b in enumerate(blocks)}
    names: list[list[str]] = [[] for _ in blocks]
    block_of: dict[str, int] = {}
    for name, module in model.named_modules():
        if id(module) in index:
            block_of[name] = index[id(module)]
        elif isinstance(module, nn.Linear):
            owner = next((block_of[p] for p in block_of if name.startswith(p + ".")), None)
            if owner is not None:
                names[owner].append(name)
    return names


@dataclass
class Stats:
    gram: torch.Tensor  # n × n float64, Σ x xᵀ
    abs_sum: torch.Tensor  # n float64, Σ |x|
    tokens: int = 0
    _root: tuple[torch.Tensor, float] | None = field(default=None, repr=False, compare=False)

    @property
    def abs_mean(self) -> torch.Tensor:
        return self.abs_sum / max(self.tokens, 1)

    def whitening(self) -> tuple[torch.Tensor, float]:
        """SVD-LLM's (S, ε) of these inputs (methods.whitening), computed on first use and kept with them: the maps
        that share these statistics (q/k/v, gate/up) and every SVD-LLM cell that reads them get the same one. Kept
        as long as the statistics are: for every cell when they stay in memory, for one pass when they spill."""
        if self._root is None:
            self._root = whitening(self.gram)
        return self._root


class _Done(Exception):
    """Raised from a hook once every requested map has seen this batch's input: the rest of the pass is skipped."""


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def collect(model: nn.Module, batches: Sequence[Batch], names: Sequence[str]) -> dict[str, Stats]:
    """Input statistics of the named linear maps over all calibration batches (one partial forward per batch)."""
    modules = {name: model.get_submodule(name) for name in names}
    dev = _device(model)
    stats: dict[str, Stats] = {}
    owner: dict[str, str] = {}  # a map reading the same tensor as an earlier one shares its statistics
    seen: list[tuple[torch.Tensor, str]] = []  # this batch's inputs; holding them keeps their ids unique
    pending: set[str] = set()
    first = True

    def hook(name: str):
        def fn(module: nn.Module, args: tuple) -> None:
            x = args[0]
            if first:
                match = next((n for t, n in seen if t is x), None)
                owner[name] = match or name
                seen.append((x, name))
                if match is None:
                    n = x.shape[-1]
                    stats[name] = Stats(torch.zeros(n, n, dtype=torch.float64, device=dev),
                                        torch.zeros(n, dtype=torch.float64, device=dev))
            if owner[name] == name:
                rows = x.reshape(-1, x.shape[-1]).double()
                s = stats[name]
                s.gram.addmm_(rows.T, rows)
                s.abs_sum += rows.abs().sum(0)
                s.tokens += rows.shape[0]
            pending.discard(name)
            if not pending:
                raise _Done

        return fn

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in modules.items()]
    start, every = time.perf_counter(), Every()
    try:
        for j, (x, _) in enumerate(batches):
            if every():
                log.info("calibration statistics: batch %s", eta(j, len(batches), time.perf_counter() - start))
            pending.update(names)
            try:
                model(input_ids=x.to(dev), use_cache=False)
            except _Done:
                pass
            if pending:
                raise RuntimeError(f"calibration: maps {sorted(pending)} were never called by the forward pass")
            seen.clear()
            first = False
    finally:
        for h in handles:
            h.remove()
    return {name: stats[owner[name]] for name in names}


def fisher_rows(model: nn.Module, batches: Sequence[Batch], names: Sequence[str]) -> dict[str, torch.Tensor]:
    """FWSVD's row importance I_i = Σ_seq Σ_j (∂ℓ_seq/∂W_ij)² for each named map, ℓ_seq a sequence's mean
    next-token loss. Per-sequence gradients come from one backward pass per batch (sequences are independent in a
    causal LM). A sequence's ∂ℓ/∂W = gᵀx (g: T × m output gradients, x: T × n inputs) is never formed: its squared
    row norms are Σ_j (gᵀx)²_ij = (gᵀ K g)_ii with K = x xᵀ, the T × T Gram of the sequence's inputs, which costs
    T²(m + n) instead of T·m·n (a SmolLM2 block's maps at 128 tokens: about a third), in float64."""
    dev = _device(model)
    modules = {name: model.get_submodule(name) for name in names}
    acc = {name: torch.zeros(m.out_features, dtype=torch.float64, device=dev) for name, m in modules.items()}

    def hook(name: str):
        def fn(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
            x = args[0].detach()

            def on_grad(g: torch.Tensor) -> None:
                for b in range(g.shape[0]):
                    gb, xb = g[b].double(), x[b].double()
                    acc[name] += ((xb @ xb.T) @ gb * gb).sum(0)  # diag(gᵀ K g): row norms² of this sequence's gᵀx

            out.register_hook(on_grad)

        return fn

    frozen = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)  # no weight gradients are kept: the hooks read g and x directly
    embed = model.get_input_embeddings().register_forward_hook(lambda m, a, out: out.requires_grad_(True))
    handles = [m.register_forward_hook(hook(name)) for name, m in modules.items()]
    start, every = time.perf_counter(), Every()
    try:
        with torch.enable_grad():
            for j, (x, y) in enumerate(batches):
                if every():
                    log.info("Fisher rows: batch %s", eta(j, len(batches), time.perf_counter() - start))
                logits = model(input_ids=x.to(dev), use_cache=False).logits
                ce = F.cross_entropy(logits.float().flatten(0, 1), y.to(dev).flatten(), reduction="none")
                ce.view(y.shape).mean(1).sum().backward()  # Σ_seq ℓ_seq: each sequence's own gradient
    finally:
        embed.remove()
        for h in handles:
            h.remove()
        for p, flag in frozen:
            p.requires_grad_(flag)
    return acc
