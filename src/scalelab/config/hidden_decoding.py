"""params section `hidden_decoding`: continued pretraining of n-stream models (METHODS §C).

    hidden_decoding:
      source: {cell: standard-m-base-0}        # or {path: <HF Llama/Qwen3 folder or hub id>}
      source_dep: data/pretrain/standard-m-base-0/model/hf   # what DVC tracks for `source` (checked to match)
      positions: shared                        # RoPE position of (i, s): i, or n·i+s ("interleaved")
      mixing_layers: null                      # null: every 4th layer (3, 7, ...)
      cells: {n1: {n_streams: 1}, n4full: {n_streams: 4, attention: full},
              n1_flops_n4: {n_streams: 1, flops_of: {n_streams: 4}}, ...}
      grid: [n1, n4full, n1_flops_n4]          # the cells dvc.yaml runs, × seeds
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import model_validator

from scalelab.config.base import Fraction, NonNegFloat, NonNegInt, PosFloat, PosInt, Strict
from scalelab.config.optim import OptimizerConfig, ScheduleConfig
from scalelab.config.source import NAME, ModelSource


class StreamsConfig(Strict):
    """The two axes a cell varies: how many streams, and which attention (METHODS §C)."""

    n_streams: PosInt = 1
    attention: Literal["sfa", "full"] = "sfa"  # full: every layer is a mixing layer (the ablation)


class HiddenDecodingModelConfig(StreamsConfig):
    """Everything that defines an n-stream model on top of its backbone; saved beside its Hugging Face files."""

    positions: Literal["shared", "interleaved"] = "shared"  # RoPE position of (i, s): i, or n·i + s
    mixing_layers: list[NonNegInt] | None = None  # None: every 4th layer, counted from 1 (indices 3, 7, ...)
    embed_noise: NonNegFloat = 0.0  # std of the noise added to the copies E_2..E_n at init (relative to E's std)
    aux_loss_weight: NonNegFloat = 0.0  # weight of the mean CE on streams 1..n-1 (off: only (i, n) predicts)

    def mixing(self, n_layer: int) -> list[int]:
        """Indices of the mixing layers of an `n_layer`-layer backbone (all of them under `full`)."""
        if self.attention == "full":
            return list(range(n_layer))
        layers = self.mixing_layers if self.mixing_layers is not None else list(range(3, n_layer, 4))
        if bad := [i for i in layers if i >= n_layer]:
            raise ValueError(f"hidden_decoding.mixing_layers {bad}: the backbone has {n_layer} layers "
                             f"(0..{n_layer - 1})")
        return sorted(set(layers))


class CellConfig(StreamsConfig):
    """One matrix cell. `flops_of`: train on as many tokens as make this cell's training FLOPs equal those of a
    model with those streams on the base budget (the equal-FLOPs control; counted analytically)."""

    flops_of: StreamsConfig | None = None


class HDTrainConfig(Strict):
    """The continued-pretraining run of every cell (same data, same base token budget). Field names follow
    `pretrain`'s, so the training layer's data module reads either."""

    seq_len: PosInt = 64  # tokens per window (each becomes n_streams positions)
    batch_size: PosInt = 8
    max_steps: PosInt = 60  # the base budget: n = 1, 2, 4 all see batch_size·seq_len·max_steps tokens
    val_every: PosInt = 30
    val_tokens: PosInt = 8192
    ckpt_every: PosInt = 30
    keep_stale: NonNegInt = 2  # stale checkpoints of completed runs kept (scalelab.train.resume)
    precision: Literal["32-true", "bf16-mixed", "bf16-true"] = "32-true"
    grad_clip: NonNegFloat = 1.0
    accumulate: PosInt = 1
    accelerator: Literal["auto", "cpu", "gpu", "cuda"] = "cpu"
    threads: NonNegInt = 0
    peak_flops: PosFloat | None = None
    optimizer: OptimizerConfig = OptimizerConfig(lr=1e-3, weight_decay=0.1)
    schedule: ScheduleConfig = ScheduleConfig()

    # One device (the stage process is the trainer, no DDP relaunch): the study's backbones and a 0.6B fit one.
    devices: Literal[1] = 1
    num_nodes: Literal[1] = 1

    @model_validator(mode="after")
    def _check(self) -> "HDTrainConfig":
        if self.batch_size % (self.accumulate * self.devices):
            raise ValueError(f"hidden_decoding.train.batch_size ({self.batch_size}) must split evenly into "
                             f"accumulate ({self.accumulate}) micro-batches on each of {self.devices} devices")
        return self

    def total_steps(self) -> int:
        return self.max_steps


class HDClaimsConfig(Strict):
    sfa_margin: PosFloat = 0.02  # nats: "SFA within noise of full" = SFA's loss exceeds full's by less than this
    level: Fraction = 0.95  # of the t interval behind every verdict


class HiddenDecodingConfig(Strict):
    source: ModelSource = ModelSource(cell="standard-m-base-0")
    # dvc.yaml cannot branch on cell/path, so the folder DVC tracks is spelled out; must be source's own folder.
    source_dep: str = "data/pretrain/standard-m-base-0/model/hf"
    positions: Literal["shared", "interleaved"] = "shared"
    mixing_layers: list[NonNegInt] | None = None
    embed_noise: NonNegFloat = 0.0
    aux_loss_weight: NonNegFloat = 0.0
    cells: dict[str, CellConfig]
    grid: list[str]
    seeds: list[NonNegInt] = [0]
    train: HDTrainConfig = HDTrainConfig()
    claims: HDClaimsConfig = HDClaimsConfig()

    @model_validator(mode="after")
    def _check(self) -> "HiddenDecodingConfig":
        location = self.source.location()
        if (self.source.cell is not None or Path(location).exists()) and Path(self.source_dep) != Path(location):
            raise ValueError(f"hidden_decoding.source_dep {self.source_dep!r} must be the source's folder "
                             f"{location!r} (the dependency DVC tracks)")
        for name in self.cells:
            if not NAME.match(name):
                raise ValueError(f"hidden_decoding.cells: name {name!r}: only letters, digits, '_', '.', '-'")
        if unknown := [c for c in self.grid if c not in self.cells]:
            raise ValueError(f"hidden_decoding.grid: unknown cells {unknown}; known: {sorted(self.cells)}")
        if not self.seeds:
            raise ValueError("hidden_decoding.seeds: at least one seed")
        return self

    def model(self, cell: str) -> HiddenDecodingModelConfig:
        """The n-stream model of one cell."""
        if cell not in self.cells:
            raise ValueError(f"hidden_decoding.cells: unknown cell {cell!r}; known: {sorted(self.cells)}")
        c = self.cells[cell]
        return HiddenDecodingModelConfig(n_streams=c.n_streams, attention=c.attention, positions=self.positions,
                                         mixing_layers=self.mixing_layers, embed_noise=self.embed_noise,
                                         aux_loss_weight=self.aux_loss_weight)
