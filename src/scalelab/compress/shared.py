"""What every method and kept fraction share: the calibration of one model on one set of windows (METHODS §D).

The statistics of a map's inputs (C = Σ x xᵀ, Σ|x|), FWSVD's Fisher rows, SVD-LLM's whitened spectrum (the layer-wise
optimum every method is compared with, at any rank) and the sensitivity table of the rank allocation depend on the
model and the calibration windows only, never on the method or ρ: `Calibration` computes each once, on the
uncompressed model, and every cell of a seed reads them.

Where they live: with `blocks_per_pass` 0 every map's statistics stay in memory (SmolLM2-135M: 30 blocks × (3·576² +
1536²) float64 = 0.8 GB). With `blocks_per_pass` b > 0 each pass's statistics are written to `spill` (torch.save,
read back memory-mapped) and only one pass is ever in memory: at 8B (Llama-3.1-8B: 32 blocks × (3·4096² + 14336²)
float64 = 2.1 GB a block) that is 66 GB of scratch on disk for the stage's life, deleted when it ends, against b × 2.1
GB of memory. Nothing of it is a DVC out.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from scalelab.compress import methods
from scalelab.compress.calibrate import Batch, Stats, collect, decoder_linears, eta, fisher_rows
from scalelab.runtime.log import Every

log = logging.getLogger(__name__)


def groups_of(blocks: list[list[str]], per_pass: int) -> list[list[str]]:
    """Map names of `per_pass` consecutive decoder blocks per pass (0: all blocks in one pass)."""
    per_pass = per_pass or len(blocks)
    return [[n for b in blocks[i : i + per_pass] for n in b] for i in range(0, len(blocks), per_pass)]


class Calibration:
    """The shared calibration of `model` (uncompressed) on `batches`; see the module docstring."""

    def __init__(self, model: nn.Module, batches: Sequence[Batch], *, blocks_per_pass: int = 0,
                 fisher: bool = False, spill: str | os.PathLike | None = None) -> None:
        self.batches = list(batches)
        self.groups = groups_of(decoder_linears(model), blocks_per_pass)
        self.shapes = {n: tuple(model.get_submodule(n).weight.shape) for g in self.groups for n in g}
        if len(self.groups) > 1 and spill is None:
            raise ValueError("calibration in several passes needs a spill folder for the statistics")
        self.spill = Path(spill) if spill is not None else None
        self._memory: dict[int, dict[str, Stats]] = {}
        self.whitened: dict[str, torch.Tensor] = {}  # σ(W·S) per map: SVD-LLM's optimum at every rank
        self.spectrum: dict[str, torch.Tensor] = {}  # σ(W) per map: the effective rank before any scaling
        self.jitter: dict[str, float] = {}
        start, every = time.perf_counter(), Every()
        for i, group in enumerate(self.groups):
            stats = collect(model, self.batches, group)
            for name in group:
                s_white, eps = methods.whitening(stats[name].gram)
                w = model.get_submodule(name).weight.detach().double()
                self.whitened[name] = torch.linalg.svdvals(w @ s_white).cpu()
                self.spectrum[name] = torch.linalg.svdvals(w).cpu()
                self.jitter[name] = eps
            if self.spill is None:
                self._memory[i] = stats
            else:
                self.spill.mkdir(parents=True, exist_ok=True)
                torch.save({n: (s.gram.cpu(), s.abs_sum.cpu(), s.tokens) for n, s in stats.items()},
                           self.spill / f"pass-{i}.pt")
            del stats
            if every() or i == len(self.groups) - 1:
                log.info("calibration statistics: pass %s", eta(i + 1, len(self.groups), time.perf_counter() - start))
        names = [n for g in self.groups for n in g]
        self.fisher: dict[str, torch.Tensor] = fisher_rows(model, self.batches, names) if fisher else {}
        self.seconds = time.perf_counter() - start
        self._sensitivity: dict[tuple, dict[str, dict[float, float]]] = {}

    def stats(self, i: int, device: torch.device | str = "cpu") -> dict[str, Stats]:
        """The statistics of pass `i`'s maps (maps reading the same input share one object)."""
        if self.spill is None:
            return self._memory[i]
        raw = torch.load(self.spill / f"pass-{i}.pt", mmap=True)
        return {n: Stats(g.to(device), a.to(device), t) for n, (g, a, t) in raw.items()}

    def best_loss(self, name: str, k: int) -> float:
        """SVD-LLM's layer loss at rank k: Σ_{i>k} σ_i(W·S)² / (m·n), the layer-wise optimum."""
        m, n = self.shapes[name]
        return float((self.whitened[name][k:] ** 2).sum() / (m * n))

    def sensitivity(self, model: nn.Module, ratios: Sequence[float], samples: int) -> dict[str, dict[float, float]]:
        """ASVD's sensitivity table, once per (ratios, samples): calibration NLL on the first `samples` windows
        with only one map truncated to each candidate fraction. The probe is plain SVD for every method, as in the
        SigmaScale code (`SVDLinear.from_linear(..., act_aware=False)`): one allocation per model and ρ, whatever
        the method, so methods are compared at equal ranks."""
        key = (tuple(ratios), samples)
        if key not in self._sensitivity:
            from scalelab.compress.rank import rank_for
            from scalelab.model.hf import mean_nll

            probe, left = [], samples
            for x, y in self.batches:
                if left > 0:
                    probe.append((x[:left], y[:left]))
                    left -= x.shape[0]
            table: dict[str, dict[float, float]] = {}
            with torch.no_grad():
                base = mean_nll(model, probe)
                start, every = time.perf_counter(), Every()
                for j, name in enumerate(self.shapes):
                    layer = model.get_submodule(name)
                    dense = layer.weight.detach().clone()
                    m, n = dense.shape
                    u, s, vh = torch.linalg.svd(dense.double(), full_matrices=False)
                    table[name] = {1.0: base}
                    for r in ratios:
                        if (k := rank_for(m, n, r)) is not None:
                            layer.weight.copy_(((u[:, :k] * s[:k]) @ vh[:k]).to(dense.dtype))
                            table[name][r] = mean_nll(model, probe)
                    layer.weight.copy_(dense)
                    if every():
                        log.info("sensitivity: map %s", eta(j + 1, len(self.shapes), time.perf_counter() - start))
            self._sensitivity[key] = table
        return self._sensitivity[key]
