"""What every method and kept fraction share: the calibration of one model on one set of windows.

The statistics of a map's inputs (C = Σ x xᵀ, Σ|x|), FWSVD's Fisher rows, SVD-LLM's whitened spectrum (the layer-wise
optimum every method is compared with, at any rank) and the sensitivity table of the rank allocation depend on the
model and the calibration windows only, never on the method or ρ: `Calibration` computes each once, on the
uncompressed model, and every cell of a seed reads them. The sensitivity table, the costliest of them, is also kept
in a store (store.py) when one is given, so another process with the same model and windows reads it.

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

from scalelab.compress import keys, sensitivity
from scalelab.compress.calibrate import Batch, Stats, collect, decoder_linears, eta, fisher_rows
from scalelab.compress.store import Store
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
                s_white, eps = stats[name].whitening()
                w = model.get_submodule(name).weight.detach().double()
                self.whitened[name] = torch.linalg.svdvals(w @ s_white).cpu()
                self.spectrum[name] = torch.linalg.svdvals(w.float()).double().cpu()  # W's own precision
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
        self.sensitivity_info: dict[tuple, dict] = {}  # (ratios, samples) -> probe seconds, read from a store?
        self._identity: dict | None = None

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

    def identity(self, model: nn.Module) -> dict:
        """What this calibration's results depend on: the uncompressed model's weights and the calibration windows
        (keys.py digests; the model is hashed once, on the first call, and `model` must still be uncompressed)."""
        if self._identity is None:
            self._identity = {"model": keys.model_fingerprint(model), "tokens": keys.tokens_fingerprint(self.batches)}
        return self._identity

    def sensitivity(self, model: nn.Module, ratios: Sequence[float], samples: int,
                    store: Store | None = None) -> dict[str, dict[float, float]]:
        """The allocation's sensitivity table (sensitivity.py) on the first `samples` calibration windows, once per
        (ratios, samples): from memory, else from `store` (a file another process wrote for the same model, windows
        and candidates), else probed on `model` (uncompressed) and written to `store`. One table serves every
        method and kept fraction of this calibration, so all of them get the same ranks."""
        mem = (tuple(ratios), samples)
        if mem not in self._sensitivity:
            windows = sensitivity.probe_windows(self.batches, samples)
            key = {"kind": "sensitivity", "version": keys.VERSION, "probe": "svd", "ratios": list(mem[0]),
                   "model": self.identity(model)["model"], "windows": keys.tokens_fingerprint(windows)} \
                if store is not None else None
            stored = store.get_sensitivity(key) if store is not None else None
            if stored is None:
                t0 = time.perf_counter()
                _, table = sensitivity.probe(model, windows, mem[0])
                seconds = time.perf_counter() - t0
                log.info("sensitivity table: %d maps × %d candidates in %.0f s", len(table), len(mem[0]) - 1, seconds)
                if store is not None:
                    store.put_sensitivity(key, table, seconds=seconds,
                                          tokens=sum(x.numel() for x, _ in windows))
                self.sensitivity_info[mem] = {"seconds": seconds, "stored": False}
            else:
                table, seconds = stored
                self.sensitivity_info[mem] = {"seconds": seconds, "stored": True}
            self._sensitivity[mem] = table
        return self._sensitivity[mem]
