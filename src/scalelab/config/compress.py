"""params section `compress`: SigmaScale and its SVD baselines on a causal LM (docs/compression.md).

    compress:
      source: {cell: unified-m-base-0}          # or {path: <HF Llama/Qwen3 folder or hub id>, dtype: bfloat16}
      source_dep: data/pretrain/unified-m-base-0/model/hf   # what DVC tracks for `source` (checked to match)
      methods: {svd: {kind: svd}, sigmascale: {kind: sigmascale}, svd_llm_uniform: {kind: svd_llm, allocation: uniform}}
      grid: {methods: [svd, sigmascale], keep: [0.9, 0.75, 0.5], seeds: [0]}   # dvc.yaml's matrix
      store: results/<study>/cells/compress      # reusable results (sensitivity tables, SigmaScale scalings); optional
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from scalelab.config.base import Fraction, NonNegFloat, NonNegInt, PosFloat, PosInt, Strict
from scalelab.config.source import NAME, ModelSource

Keep = Annotated[float, Field(gt=0, le=1)]


class MethodConfig(Strict):
    """One named compression method: its kind (the factorization) and its choices."""

    kind: Literal["svd", "asvd", "fwsvd", "svd_llm", "sigmascale"]
    alpha: NonNegFloat = 0.5  # asvd: S = diag(mean|x|)^α
    # sigmascale: `random` is the paper's d ~ N(0, (0.1·std W)²); beyond the paper, `svd_llm` warm-starts the column
    # scalings at the diagonal of SVD-LLM's whitening, d_c = ½·log(diag C / mean diag C), and `asvd` at ASVD's,
    # d_c = α·log(mean|x|) (α = this method's alpha), the rows at 0 for both
    init: Literal["random", "svd_llm", "asvd"] = "random"
    # the rank allocation of this method's cells; None: compress.allocation.kind (a `uniform` twin is the ablation)
    allocation: Literal["uniform", "sensitivity", "whitened"] | None = None
    # beyond the paper: after compression, fit the factors end to end to the uncompressed model on calibration data
    refine: Literal["none", "logits", "blocks"] = "none"
    # the first `blocks` decoder blocks compressed, the rest left dense: a smoke test of the method's code path on the
    # real model at a fraction of its cost, in no claim (CompressConfig.smoke); None: every block
    blocks: PosInt | None = None

    @model_validator(mode="after")
    def _check(self) -> "MethodConfig":
        if self.init != "random" and self.kind != "sigmascale":
            raise ValueError(f"init {self.init!r} is a sigmascale option (kind is {self.kind!r})")
        return self


class SigmaScaleConfig(Strict):
    """SigmaScale's optimiser: AdamW on the log-scales, full batch, and one of two stopping rules
    (sigmascale.py): `plateau`, the official rule (mean loss of the last `patience` steps against the `patience`
    before) keeping the best scalings seen; or `fixed`, as the paper's runs go: `max_steps` steps, the last scalings
    kept (the point where the plateau rule would have stopped is still recorded)."""

    lr: PosFloat = 5e-3
    weight_decay: NonNegFloat = 0.0  # the regulariser is λ in the loss; AdamW's own decay is off
    lam: NonNegFloat = 1e-6  # λ(‖d_r‖² + ‖d_c‖²)
    init_std: NonNegFloat = 0.1  # d ~ N(0, (init_std · std W)²)
    max_steps: PosInt = 1000
    patience: PosInt = 50  # the official window: 50 steps
    tol: NonNegFloat = 1e-3  # relative improvement of the window mean below which the run has plateaued
    stop: Literal["plateau", "fixed"] = "plateau"


class CalibrationConfig(Strict):
    """Calibration windows from the train split (never the validation split)."""

    samples: PosInt = 32  # windows
    seq_len: PosInt = 64
    batch_size: PosInt = 8
    # decoder blocks whose statistics one forward pass collects (memory ∝ these blocks' Gram matrices); 0: all
    blocks_per_pass: NonNegInt = 0
    max_text_tokens: PosInt = 2_000_000  # models with their own tokenizer: tokens read per split of data/prepared


PAPER_RATIOS = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]  # the SigmaScale code's candidates, and dense


class AllocationConfig(Strict):
    """Per-layer ranks: `uniform` (k = ⌊ρ·m·n/(m+n)⌋ everywhere), ASVD-style `sensitivity` (rank.py), measured by
    a plain-SVD probe of every map at every candidate kept fraction on the first `samples` calibration windows, or
    `whitened` (beyond the papers): the same threshold over the share of each map's output energy SVD-LLM's
    truncation discards at each candidate, read off the whitened spectra the calibration already holds (no probe)."""

    kind: Literal["uniform", "sensitivity", "whitened"] = "uniform"
    # candidate kept fractions per layer, increasing, 1.0 (dense) last; default: the paper's 0.2 ... 0.9 and dense
    ratios: list[float] = PAPER_RATIOS
    samples: PosInt = 8  # calibration windows the sensitivity is measured on (a subset of the calibration set)

    @field_validator("ratios")
    @classmethod
    def _ratios(cls, r: list[float]) -> list[float]:
        # the error's location names the key (compress.allocation.ratios); the message says what is wrong
        if bad := [x for x in r if not 0 < x <= 1]:
            raise ValueError(f"every candidate kept fraction must be in (0, 1], got {bad}")
        if any(b <= a for a, b in zip(r, r[1:])):
            raise ValueError(f"candidates must increase strictly (no repeats), got {r}")
        if not r or r[-1] != 1.0:
            raise ValueError(f"must end with 1.0 (a layer left dense), got {r}")
        if len(r) < 2:
            raise ValueError(f"needs at least one candidate below 1.0 to compress anything, got {r}")
        return r


class RefineConfig(Strict):
    """End-to-end refinement of the low-rank factors (beyond the paper), fitted on calibration data only; its
    objective is also read, never fitted, on the evaluation windows (held out)."""

    steps: PosInt = 100
    lr: PosFloat = 1e-4  # small: the factors start near the optimum, and calibration sets are small
    batch_size: PosInt = 8


class HubSplit(Strict):
    """A dataset split on the Hugging Face hub (read with `datasets`, online or from its cache)."""

    hub_id: str
    hub_config: str | None = None
    hub_split: str = "test"
    hub_revision: str | None = None
    text_column: str = "text"


class EvalConfig(Strict):
    """Perplexity on the fixed validation windows (scalelab.data.loader.val_batches): of data/prepared's val split,
    or of `hub` (e.g. WikiText-2 test, where the papers report). A val_tokens the split cannot supply is an error."""

    seq_len: PosInt = 64
    val_tokens: PosInt | None = 8192  # None: the whole split
    batch_size: PosInt = 16
    hub: HubSplit | None = None
    # NLL on the calibration windows too, beside the validation windows' (how far a method fits its calibration
    # rather than the text): one more forward pass per cell, so a study's diagnostic, off in the default DAG
    calib_nll: bool = True


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
    save_models: bool = False  # write every cell's checkpoint to data/compress/seed-<s>/<cell>/model
    # A folder of reusable results (store.py): the sensitivity tables and every converged SigmaScale map's scalings,
    # keyed by model, calibration windows and settings, so a later process, cell, slice or machine reads them instead
    # of recomputing (a study commits it beside its cells). Where results are kept, never what they are: not a DVC
    # param. None: nothing is kept between processes.
    store: str | None = None
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

    def smoke(self) -> set[str]:
        """The grid's SigmaScale methods that cannot reach their plateau by construction: the official rule needs
        more than 2·patience steps (sigmascale.plateaued), and a cap at or below that stops every map first. Such a
        run can never meet the premise "SigmaScale converged", so it is a smoke test of the code path on the model:
        measured and reported, left out of the ledger (compress/ledger.py). So is a method that compresses only its
        first blocks (`blocks`): its model is not the method's compression at the kept fraction."""
        s = self.sigmascale
        capped = s.max_steps <= 2 * s.patience
        return {m for m in self.grid.methods if self.methods[m].blocks is not None
                or (capped and self.methods[m].kind == "sigmascale")}

    def runs_at(self, method: str, seed: int) -> bool:
        """Whether `method`'s cells run at calibration seed `seed`: a smoke method (`smoke`) decides nothing, so a
        second seed would buy no interval; it runs at the grid's first seed only (SmolLM2: about a minute of a core)."""
        return method not in self.smoke() or seed == self.grid.seeds[0]

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
