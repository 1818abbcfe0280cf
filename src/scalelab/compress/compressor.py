"""Compress every decoder linear map of a causal LM with one method at one kept fraction (METHODS §D).

    1. ranks: uniform k = ⌊ρ·m·n/(m+n)⌋, or ASVD's sensitivity allocation measured on calibration windows
    2. FWSVD only: Fisher row weights from one backward pass over the calibration windows
    3. a few decoder blocks at a time: stream their maps' input statistics from the *uncompressed* model, factor
       each map, record its layer loss next to SVD-LLM's optimum and the effective rank before/after scaling
    4. swap the maps for `LowRankLinear` factors; optionally refine them end to end (refine.py)
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
from torch import nn

from scalelab.compress import methods, rank
from scalelab.compress.calibrate import Batch, collect, decoder_linears, fisher_rows
from scalelab.compress.erank import effective_rank, participation_ratio
from scalelab.compress.lowrank import apply_factors
from scalelab.compress.refine import refine
from scalelab.compress.sigmascale import sigmascale
from scalelab.config.compress import AllocationConfig, MethodConfig, RefineConfig, SigmaScaleConfig
from scalelab.model.hf import mean_nll


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
        """Flat: the method's own numbers (SigmaScale's steps, SVD-LLM's jitter) beside the common fields."""
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


def _groups(blocks: list[list[str]], per_pass: int) -> list[list[str]]:
    per_pass = per_pass or len(blocks)
    return [[n for b in blocks[i : i + per_pass] for n in b] for i in range(0, len(blocks), per_pass)]


@torch.no_grad()
def sensitivity_table(model: nn.Module, batches: Sequence[Batch], allocation: AllocationConfig,
                      blocks_per_pass: int) -> dict[str, dict[float, float]]:
    """ASVD's sensitivity: calibration loss with only one map truncated to each candidate fraction. The probe is
    SVD-LLM's truncation (cheap, closed form, the layer-wise optimum), so every method gets the same ranks."""
    probe = _windows(batches, allocation.samples)
    base = mean_nll(model, probe)
    table: dict[str, dict[float, float]] = {}
    for group in _groups(decoder_linears(model), blocks_per_pass):
        stats = collect(model, batches, group)
        for name in group:
            layer = model.get_submodule(name)
            dense = layer.weight.detach().clone()
            m, n = dense.shape
            table[name] = {1.0: base}
            for r in allocation.ratios:
                if (k := rank.rank_for(m, n, r)) is None:
                    continue
                f = methods.svd_llm(dense, k, stats[name].gram)
                layer.weight.copy_((f.left @ f.right).to(dense.dtype))
                table[name][r] = mean_nll(model, probe)
            layer.weight.copy_(dense)
    return table


def _windows(batches: Sequence[Batch], samples: int) -> list[Batch]:
    """The first `samples` calibration windows, in the same batches."""
    out, left = [], samples
    for x, y in batches:
        if left <= 0:
            break
        out.append((x[:left], y[:left]))
        left -= x.shape[0]
    return out


def allocate(model: nn.Module, batches: Sequence[Batch], keep: float, allocation: AllocationConfig,
             blocks_per_pass: int) -> dict[str, int | None]:
    shapes = {name: tuple(model.get_submodule(name).weight.shape) for b in decoder_linears(model) for name in b}
    if allocation.kind == "uniform" or keep == 1:
        return rank.uniform(shapes, keep)
    return rank.sensitivity(shapes, sensitivity_table(model, batches, allocation, blocks_per_pass), keep)


def compress_model(model: nn.Module, batches: Sequence[Batch], method: MethodConfig, keep: float, *,
                   sigma_cfg: SigmaScaleConfig = SigmaScaleConfig(), allocation: AllocationConfig = AllocationConfig(),
                   refine_cfg: RefineConfig = RefineConfig(), blocks_per_pass: int = 0, seed: int = 0,
                   ranks: dict[str, int | None] | None = None,
                   log: Callable[[str], None] = lambda s: None) -> tuple[list[LayerRecord], dict]:
    """Compress `model` in place; returns one record per decoder linear map and the refinement's objective before
    and after (empty without refinement). `ranks` overrides the allocation (None per map: leave it dense)."""
    model.eval()
    ranks = ranks if ranks is not None else allocate(model, batches, keep, allocation, blocks_per_pass)
    todo = [n for n, k in ranks.items() if k is not None]
    fisher = fisher_rows(model, batches, todo) if method.kind == "fwsvd" and todo else {}
    generator = torch.Generator().manual_seed(seed)
    factors: dict[str, methods.Factors] = {}
    records: list[LayerRecord] = []
    for group in _groups(decoder_linears(model), blocks_per_pass):
        stats = collect(model, batches, group)  # the uncompressed model's inputs: factors are swapped in at the end
        for name in group:
            weight = model.get_submodule(name).weight.detach()
            m, n = weight.shape
            sigma_w = torch.linalg.svdvals(weight.double())
            k = ranks.get(name)
            if k is None:
                records.append(LayerRecord(name, m, n, None, 0.0, 0.0, None, effective_rank(sigma_w),
                                           effective_rank(sigma_w), participation_ratio(sigma_w),
                                           participation_ratio(sigma_w), 0.0, {}))
                continue
            start = time.perf_counter()
            f = factorize(method, weight, k, stats[name], fisher.get(name), sigma_cfg, generator)
            seconds = time.perf_counter() - start
            loss = methods.layer_loss(weight, f.left, f.right, stats[name].gram)
            best = methods.svd_llm_loss(weight, k, stats[name].gram)
            records.append(LayerRecord(name, m, n, k, loss, best, loss / best if best > 0 else None,
                                       effective_rank(sigma_w), effective_rank(f.sigma), participation_ratio(sigma_w),
                                       participation_ratio(f.sigma), seconds, f.info))
            factors[name] = f
            log(f"{name}: rank {k} of {min(m, n)}, loss/SVD-LLM {records[-1].loss_rel_svd_llm or 1:.4f}, "
                f"{seconds:.2f} s")
        del stats
    teacher = copy.deepcopy(model) if method.refine != "none" and factors else None
    apply_factors(model, factors)
    refined = refine(model, teacher, batches, target=method.refine, cfg=refine_cfg, log=log) \
        if teacher is not None else {}
    return records, refined
