"""Compress every decoder linear map of a causal LM with one method at one kept fraction (METHODS §D).

    1. ranks: uniform k = ⌊ρ·m·n/(m+n)⌋, or ASVD's sensitivity allocation measured on calibration windows
    2. pass by pass over the shared calibration (shared.py: statistics of the *uncompressed* model, computed once),
       factor each map, record its layer loss next to SVD-LLM's optimum and the effective rank before/after scaling
    3. swap the maps for `LowRankLinear` factors; optionally refine them end to end (refine.py)
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
from torch import nn

from scalelab.compress import methods, rank
from scalelab.compress.calibrate import Batch, eta
from scalelab.compress.erank import effective_rank, participation_ratio
from scalelab.compress.lowrank import apply_factors
from scalelab.compress.refine import refine
from scalelab.compress.shared import Calibration
from scalelab.compress.sigmascale import sigmascale
from scalelab.config.compress import AllocationConfig, MethodConfig, RefineConfig, SigmaScaleConfig
from scalelab.runtime.log import Every

log = logging.getLogger(__name__)


@dataclass
class LayerRecord:
    """One compressed map: its layer loss ‖WX − ŴX‖²_F/(m·n) on the calibration inputs, SVD-LLM's at the same rank
    (the optimum), and the spectrum concentration of W before and of the matrix the method truncated after scaling.
    All of the method's own factors, before any end-to-end refinement (which acts on the whole model)."""

    name: str
    m: int
    n: int
    rank: int | None  # None: left dense
    loss: float
    loss_svd_llm: float
    loss_rel_svd_llm: float | None
    erank_before: float
    erank_after: float
    pr_before: float
    pr_after: float
    seconds: float
    info: dict

    def to_json(self) -> dict:
        """Flat: the method's own numbers (SigmaScale's steps and stop, SVD-LLM's jitter) beside the common fields."""
        record = asdict(self)
        info = record.pop("info")
        return {**record, **info}


def factorize(method: MethodConfig, weight: torch.Tensor, k: int, stats, fisher: torch.Tensor | None,
              sigma_cfg: SigmaScaleConfig, generator: torch.Generator) -> methods.Factors:
    """One map's factors by `method` (METHODS §D)."""
    if method.kind == "svd":
        return methods.plain_svd(weight, k)
    if method.kind == "asvd":
        return methods.asvd(weight, k, stats.abs_mean, method.alpha)
    if method.kind == "svd_llm":
        return methods.svd_llm(weight, k, stats.gram)
    if method.kind == "fwsvd":
        return methods.fwsvd(weight, k, fisher)
    return sigmascale(weight, k, stats.gram, init=method.init, generator=generator, **sigma_cfg.model_dump())


def allocate(model: nn.Module, calib: Calibration, keep: float, allocation: AllocationConfig,
             kind: str | None = None) -> dict[str, int | None]:
    """Ranks per map: `kind` (default: the section's) `uniform` or `sensitivity` (one table per calibration)."""
    kind = kind or allocation.kind
    if kind == "uniform" or keep == 1:
        return rank.uniform(calib.shapes, keep)
    return rank.sensitivity(calib.shapes, calib.sensitivity(model, allocation.ratios, allocation.samples), keep)


def compress_model(model: nn.Module, calib: Calibration | Sequence[Batch], method: MethodConfig, keep: float, *,
                   sigma_cfg: SigmaScaleConfig = SigmaScaleConfig(), allocation: AllocationConfig = AllocationConfig(),
                   refine_cfg: RefineConfig = RefineConfig(), blocks_per_pass: int = 0, seed: int = 0,
                   ranks: dict[str, int | None] | None = None,
                   log_line: Callable[[str], None] | None = None) -> tuple[list[LayerRecord], dict]:
    """Compress `model` in place; returns one record per decoder linear map and the refinement's objective before
    and after (empty without refinement). `calib`: the shared calibration of this (uncompressed) model, or batches
    to calibrate on here. `ranks` overrides the allocation (None per map: leave it dense)."""
    model.eval()
    if not isinstance(calib, Calibration):
        import tempfile

        with tempfile.TemporaryDirectory() as spill:
            shared = Calibration(model, calib, blocks_per_pass=blocks_per_pass, fisher=method.kind == "fwsvd",
                                 spill=spill if blocks_per_pass else None)
            return compress_model(model, shared, method, keep, sigma_cfg=sigma_cfg, allocation=allocation,
                                  refine_cfg=refine_cfg, seed=seed, ranks=ranks, log_line=log_line)
    say = log_line or log.info
    ranks = ranks if ranks is not None else allocate(model, calib, keep, allocation, method.allocation)
    if method.kind == "fwsvd" and not calib.fisher:
        raise ValueError("fwsvd needs the calibration's Fisher rows (Calibration(..., fisher=True))")
    dev = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    factors: dict[str, methods.Factors] = {}
    records: list[LayerRecord] = []
    start, every, total = time.perf_counter(), Every(), len(calib.shapes)
    for i, group in enumerate(calib.groups):
        stats = calib.stats(i, dev)
        for name in group:
            weight = model.get_submodule(name).weight.detach()
            m, n = weight.shape
            sigma_w = calib.spectrum[name]  # of the uncompressed map, computed once
            before = (effective_rank(sigma_w), participation_ratio(sigma_w))
            k = ranks.get(name)
            if k is None:
                records.append(LayerRecord(name, m, n, None, 0.0, 0.0, None, before[0], before[0], before[1],
                                           before[1], 0.0, {}))
                continue
            t0 = time.perf_counter()
            f = factorize(method, weight, k, stats[name], calib.fisher.get(name), sigma_cfg, generator)
            seconds = time.perf_counter() - t0
            loss, best = methods.layer_loss(weight, f.left, f.right, stats[name].gram), calib.best_loss(name, k)
            records.append(LayerRecord(name, m, n, k, loss, best, loss / best if best > 0 else None, before[0],
                                       effective_rank(f.sigma), before[1], participation_ratio(f.sigma), seconds,
                                       f.info))
            factors[name] = f
            if every():
                say(f"factorize: map {eta(len(records), total, time.perf_counter() - start)}")
        del stats
    teacher = copy.deepcopy(model) if method.refine != "none" and factors else None
    apply_factors(model, factors)
    refined = refine(model, teacher, calib.batches, target=method.refine, cfg=refine_cfg, log=say) \
        if teacher is not None else {}
    return records, refined
