"""Compress every decoder linear map of a causal LM with one method at one kept fraction (docs/compression.md).

    1. ranks: uniform k = ⌊ρ·m·n/(m+n)⌋, or ASVD's sensitivity allocation measured on calibration windows (one
       table per calibration, shared by every method and ρ, kept in the store when there is one)
    2. pass by pass over the shared calibration (shared.py: statistics of the *uncompressed* model, computed once),
       factor each map, record its layer loss next to SVD-LLM's optimum and the effective rank before/after scaling
    3. swap the maps for `LowRankLinear` factors; optionally refine them end to end (refine.py)

SigmaScale's maps: each starts from its own random stream (keys.map_generator(name, seed)), so its start and its
converged scalings depend on the map, its rank, the seed and the settings only; with a store (store.py), a map already
optimised at that rank in the same context is read back instead of optimised again. A `stop: fixed` run also stores
what `stop: plateau` would have returned (the best up to where the rule fires on the same trajectory), so the other
rule's cells cost no optimisation.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields

import torch
from torch import nn

from scalelab.compress import keys, methods, rank
from scalelab.compress.calibrate import Batch, Stats, decoder_linears, eta
from scalelab.compress.erank import effective_rank, participation_ratio
from scalelab.compress.lowrank import apply_factors
from scalelab.compress.refine import refine
from scalelab.compress.shared import Calibration
from scalelab.compress.sigmascale import factors_of, initial_scalings, optimise, plateau_answer
from scalelab.compress.store import MissingScalings, Store
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

    @classmethod
    def from_json(cls, row: dict) -> "LayerRecord":
        """The record `to_json` wrote (the method's own numbers back in `info`)."""
        own = {f.name for f in fields(cls)} - {"info"}
        return cls(**{k: row[k] for k in own}, info={k: v for k, v in row.items() if k not in own})

    def to_json(self) -> dict:
        """Flat: the method's own numbers (SigmaScale's steps and stop, SVD-LLM's jitter) beside the common fields."""
        record = asdict(self)
        info = record.pop("info")
        return {**record, **info}


def sigmascale_context(calib: Calibration, model: nn.Module, method: MethodConfig, sigma_cfg: SigmaScaleConfig,
                       seed: int) -> dict:
    """Everything a SigmaScale map's result depends on besides the map and its rank (store.py's context)."""
    ident = calib.identity(model)
    return {"kind": "sigmascale", "version": keys.VERSION, "model": ident["model"], "tokens": ident["tokens"],
            "seed": seed, "init": method.init, "alpha": method.alpha if method.init == "asvd" else None,
            "settings": sigma_cfg.model_dump(mode="json")}


def sigmascale_map(name: str, weight: torch.Tensor, k: int, stats: Stats, method: MethodConfig,
                   sigma_cfg: SigmaScaleConfig, seed: int, store: Store | None = None,
                   context: dict | None = None) -> methods.Factors:
    """One SigmaScale map: read back from `store` under (`context`, name, k), else (MissingScalings from a frozen
    store) initialised from the map's own stream, optimised, and written to `store`. `info["cache"]`: 'hit', 'miss'
    or None (no store)."""
    if store is not None and (hit := store.get_scalings(context, name, k)) is not None:
        d_r, d_c, info = hit
        return factors_of(weight, k, d_r, d_c, {**info, "cache": "hit"})
    if store is not None and store.frozen:
        raise MissingScalings(f"{name} at rank {k}: not in the store {store.folder} under this context (a frozen "
                              "store answers from what it holds; this map would have to be optimised)")
    d_r, d_c = initial_scalings(weight, init=method.init, init_std=sigma_cfg.init_std,
                                generator=keys.map_generator(name, seed), gram=stats.gram, abs_mean=stats.abs_mean,
                                alpha=method.alpha)
    t0 = time.perf_counter()
    run = optimise(weight, k, stats.gram, d_r, d_c, **sigma_cfg.model_dump(exclude={"init_std"}))
    f = factors_of(weight, k, run.d_r, run.d_c, run.info)
    f.info.update(seconds_optimise=time.perf_counter() - t0,
                  layer_loss=methods.layer_loss(weight, f.left, f.right, stats.gram))
    if store is not None:
        store.put_scalings(context, name, k, run.d_r, run.d_c, f.info)
        if sigma_cfg.stop == "fixed":  # the plateau rule's answer lies on this trajectory: kept for a plateau run
            d_r, d_c, info = plateau_answer(run, sigma_cfg.max_steps)
            twin = factors_of(weight, k, d_r, d_c)
            info.update(layer_loss=methods.layer_loss(weight, twin.left, twin.right, stats.gram),
                        derived="from the stop: fixed run")
            store.put_scalings({**context, "settings": {**context["settings"], "stop": "plateau"}}, name, k, d_r, d_c,
                               info)
    f.info["cache"] = "miss" if store is not None else None
    return f


def factorize(name: str, method: MethodConfig, weight: torch.Tensor, k: int, stats: Stats,
              fisher: torch.Tensor | None, sigma_cfg: SigmaScaleConfig, seed: int, store: Store | None = None,
              context: dict | None = None) -> methods.Factors:
    """One map's factors by `method`."""
    if method.kind == "svd":
        return methods.plain_svd(weight, k)
    if method.kind == "asvd":
        return methods.asvd(weight, k, stats.abs_mean, method.alpha)
    if method.kind == "svd_llm":
        return methods.svd_llm(weight, k, stats.gram, root=stats.whitening())
    if method.kind == "fwsvd":
        return methods.fwsvd(weight, k, fisher)
    return sigmascale_map(name, weight, k, stats, method, sigma_cfg, seed, store, context)


def allocate(model: nn.Module, calib: Calibration, keep: float, allocation: AllocationConfig,
             kind: str | None = None, store: Store | None = None) -> dict[str, int | None]:
    """Ranks per map: `kind` (default: the section's) `uniform`, `sensitivity` (one table per calibration and
    candidate set, from `store` when it holds it: every method gets the same ranks at the same ρ) or `whitened` (the
    same threshold on SVD-LLM's whitened truncation loss, rank.whitened_table)."""
    kind = kind or allocation.kind
    if kind == "uniform" or keep == 1:
        return rank.uniform(calib.shapes, keep)
    if kind == "whitened":  # the spectra SVD-LLM's optimum is read from: no probe (rank.py)
        table = rank.whitened_table(calib.whitened, calib.shapes, allocation.ratios)
    else:
        table = calib.sensitivity(model, allocation.ratios, allocation.samples, store)
    return rank.sensitivity(calib.shapes, table, keep)


def compress_model(model: nn.Module, calib: Calibration | Sequence[Batch], method: MethodConfig, keep: float, *,
                   sigma_cfg: SigmaScaleConfig = SigmaScaleConfig(), allocation: AllocationConfig = AllocationConfig(),
                   refine_cfg: RefineConfig = RefineConfig(), blocks_per_pass: int = 0, seed: int = 0,
                   ranks: dict[str, int | None] | None = None, store: Store | None = None,
                   held: Sequence[Batch] = (),
                   log_line: Callable[[str], None] | None = None) -> tuple[list[LayerRecord], dict]:
    """Compress `model` in place; returns one record per decoder linear map and the refinement's objective before
    and after (empty without refinement). `calib`: the shared calibration of this (uncompressed) model, or batches
    to calibrate on here. `ranks` overrides the allocation (None per map: leave it dense). `store`: where sensitivity
    tables and SigmaScale scalings are read from and written to (None: computed here, kept nowhere). `held`: windows
    the refinement's objective is also read on, never fitted (the evaluation windows)."""
    model.eval()
    if not isinstance(calib, Calibration):
        import tempfile

        with tempfile.TemporaryDirectory() as spill:
            shared = Calibration(model, calib, blocks_per_pass=blocks_per_pass, fisher=method.kind == "fwsvd",
                                 spill=spill if blocks_per_pass else None)
            return compress_model(model, shared, method, keep, sigma_cfg=sigma_cfg, allocation=allocation,
                                  refine_cfg=refine_cfg, seed=seed, ranks=ranks, store=store, held=held,
                                  log_line=log_line)
    say = log_line or log.info
    ranks = ranks if ranks is not None else allocate(model, calib, keep, allocation, method.allocation, store)
    if method.blocks is not None:  # a smoke run: the blocks past the first `blocks` stay dense
        kept = {n for block in decoder_linears(model)[: method.blocks] for n in block}
        ranks = {name: k if name in kept else None for name, k in ranks.items()}
    if method.kind == "fwsvd" and not calib.fisher:
        raise ValueError("fwsvd needs the calibration's Fisher rows (Calibration(..., fisher=True))")
    dev = next(model.parameters()).device
    context = sigmascale_context(calib, model, method, sigma_cfg, seed) \
        if method.kind == "sigmascale" and store is not None else None
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
            f = factorize(name, method, weight, k, stats[name], calib.fisher.get(name), sigma_cfg, seed, store, context)
            seconds = time.perf_counter() - t0
            loss = f.info.get("layer_loss")  # SigmaScale's own record has it (the same function, the same factors)
            if loss is None:
                loss = methods.layer_loss(weight, f.left, f.right, stats[name].gram)
            best = calib.best_loss(name, k)
            records.append(LayerRecord(name, m, n, k, loss, best, loss / best if best > 0 else None, before[0],
                                       effective_rank(f.sigma), before[1], participation_ratio(f.sigma), seconds,
                                       f.info))
            factors[name] = f
            if every():
                say(f"factorize: map {eta(len(records), total, time.perf_counter() - start)}")
        del stats
    teacher = copy.deepcopy(model) if method.refine != "none" and factors else None
    apply_factors(model, factors)
    refined = refine(model, teacher, calib.batches, target=method.refine, cfg=refine_cfg, held=held, log=say) \
        if teacher is not None else {}
    return records, refined
