"""params section `compress`: SigmaScale and its SVD baselines on a causal LM (METHODS §D).

    compress:
      source: {cell: unified-m-base-0}          # or {path: <HF Llama/Qwen3 folder or hub id>, dtype: bfloat16}
      source_dep: data/pretrain/unified-m-base-0/model/hf   # what DVC tracks for `source` (checked to match)
      methods: {svd: {kind: svd}, sigmascale: {kind: sigmascale}, sigmascale_w: {kind: sigmascale, init: svd_llm}}
      grid: {methods: [svd, sigmascale], keep: [0.9, 0.75, 0.5], seeds: [0]}   # dvc.yaml's matrix
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from scalelab.config.base import Fraction, NonNegFloat, NonNegInt, PosFloat, PosInt, Strict
from scalelab.config.source import NAME, ModelSource

Keep = Annotated[float, Field(gt=0, le=1)]


class MethodConfig(Strict):
    """One named compression method: a METHODS §D kind and its choices."""

    kind: Literal["svd", "asvd", "fwsvd", "svd_llm", "sigmascale"]
    alpha: NonNegFloat = 0.5  # asvd: S = diag(mean|x|)^α
    # sigmascale: `random` is the paper's d ~ N(0, (0.1·std W)²) on W; `svd_llm` learns the scalings on top of
    # SVD-LLM's whitening (W·S), starting at SVD-LLM's exact solution (beyond the paper).
    init: Literal["random", "svd_llm"] = "random"
    # beyond the paper: after compression, fit the factors end to end to the uncompressed model on calibration data
    refine: Literal["none", "logits", "blocks"] = "none"

    @model_validator(mode="after")
    def _check(self) -> "MethodConfig":
        if self.init != "random" and self.kind != "sigmascale":
            raise ValueError(f"init {self.init!r} is a sigmascale option (kind is {self.kind!r})")
        return self


class SigmaScaleConfig(Strict):
    """SigmaScale's optimiser (METHODS §D): AdamW on the log-scales, full batch, step cap and plateau stop."""

    lr: PosFloat = 5e-3
    weight_decay: NonNegFloat = 0.0  # the regulariser is λ in the loss; AdamW's own decay is off
    lam: NonNegFloat = 1e-6  # λ(‖d_r‖² + ‖d_c‖²)
    init_std: NonNegFloat = 0.1  # d ~ N(0, (init_std · std W)²)
    max_steps: PosInt = 1000
    patience: PosInt = 50  # plateau: stop when the best loss improved by less than `tol` (relative) in this many steps
    tol: NonNegFloat = 1e-3


class CalibrationConfig(Strict):
    """Calibration windows from the train split (never the validation split)."""

    samples: PosInt = 32  # windows
    seq_len: PosInt = 64
    batch_size: PosInt = 8
    # decoder blocks whose statistics one forward pass collects (memory ∝ these blocks' Gram matrices); 0: all
    blocks_per_pass: NonNegInt = 0
    max_text_tokens: PosInt = 2_000_000  # models with their own tokenizer: tokens read per split of data/prepared


class AllocationConfig(Strict):
    """Per-layer ranks: `uniform` (k = ⌊ρ·m·n/(m+n)⌋ everywhere) or ASVD-style `sensitivity`."""

    kind: Literal["uniform", "sensitivity"] = "uniform"
    ratios: list[Keep] = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]  # candidate kept fractions per layer
    samples: PosInt = 8  # calibration windows the sensitivity is measured on (a subset of the calibration set)

    @model_validator(mode="after")
    def _check(self) -> "AllocationConfig":
        if 1.0 not in self.ratios:
            raise ValueError("compress.allocation.ratios must contain 1.0 (a layer left dense)")
        return self


class RefineConfig(Strict):
    """End-to-end refinement of the low-rank factors (beyond the paper), calibration data only."""

    steps: PosInt = 100
    lr: PosFloat = 1e-4  # small: the factors start near the optimum, and calibration sets are small
    batch_size: PosInt = 8


class EvalConfig(Strict):
    """Perplexity on the fixed validation windows (scalelab.data.loader.val_batches)."""

    seq_len: PosInt = 64
    val_tokens: PosInt = 8192
    batch_size: PosInt = 16


class CompressGrid(Strict):
    """The matrix dvc.yaml expands: method × kept fraction × calibration seed."""

    methods: list[str]
    keep: list[Keep] = [0.9, 0.75, 0.5]
    seeds: list[NonNegInt] = [0]


class CompressConfig(Strict):
    source: ModelSource = ModelSource(cell="unified-m-base-0")
    # dvc.yaml cannot branch on cell/path, so the folder DVC tracks is spelled out; must be source's own folder.
    source_dep: str = "data/pretrain/unified-m-base-0/model/hf"
    device: Literal["cpu", "cuda", "auto"] = "cpu"  # machine setting (config/machine.py): machine.yaml, not a param
    threads: NonNegInt = 0  # machine setting: torch intra-op threads on CPU; 0 leaves torch's default
    methods: dict[str, MethodConfig]
    sigmascale: SigmaScaleConfig = SigmaScaleConfig()
    calibration: CalibrationConfig = CalibrationConfig()
    allocation: AllocationConfig = AllocationConfig()
    refine: RefineConfig = RefineConfig()
    eval: EvalConfig = EvalConfig()
    claims_level: Fraction = 0.95  # of the t interval behind every verdict
    grid: CompressGrid

    @model_validator(mode="after")
    def _check(self) -> "CompressConfig":
        location = self.source.location()
        if (self.source.cell is not None or Path(location).exists()) and Path(self.source_dep) != Path(location):
            raise ValueError(f"compress.source_dep {self.source_dep!r} must be the source's folder {location!r} "
                             "(the dependency DVC tracks)")
        for name in self.methods:
            if not NAME.match(name):
                raise ValueError(f"compress.methods: name {name!r}: only letters, digits, '_', '.', '-'")
        if unknown := [m for m in self.grid.methods if m not in self.methods]:
            raise ValueError(f"compress.grid.methods: unknown methods {unknown}; known: {sorted(self.methods)}")
        if not self.grid.methods or not self.grid.keep or not self.grid.seeds:
            raise ValueError("compress.grid: methods, keep and seeds each need at least one entry")
        if self.allocation.samples > self.calibration.samples:
            raise ValueError("compress.allocation.samples must not exceed compress.calibration.samples")
        return self

    def cell(self, method: str, keep: str, seed: int) -> str:
        """The name of one matrix cell (its folder and metrics file): `<method>-<keep>-<seed>`, with `keep` spelled
        as dvc.yaml's matrix spells it (the grid's value as a string)."""
        if method not in self.methods:
            raise ValueError(f"compress.methods: unknown method {method!r}; known: {sorted(self.methods)}")
        try:
            value = float(keep)
        except ValueError:
            raise ValueError(f"kept fraction {keep!r} is not a number") from None
        if not 0 < value <= 1:
            raise ValueError(f"kept fraction {keep} must be in (0, 1]")
        return f"{method}-{keep}-{seed}"
