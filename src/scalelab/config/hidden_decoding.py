"""params section `hidden_decoding`: continued pretraining of n-stream models (docs/hidden-decoding.md).

    hidden_decoding:
      source: {cell: standard-m-base-0}        # or {path: <HF Llama/Qwen3 folder or hub id>}, or {init: {...}}: a
                                               # random Llama of that shape (a probe trained from scratch)
      source_dep: data/pretrain/standard-m-base-0/model/hf   # what DVC tracks for `source` (checked to match)
                                               # or {per_seed: standard-xs-base}: seed s continues pretrain cell
                                               # standard-xs-base-s (source_dep: data/pretrain, every seed's folder)
      positions: per_layer                     # RoPE position of (i, s): i in within-stream layers, n·i+s in mixing
      mixing_layers: null                      # null: every k-th layer counted back from the last (k = 2..4)
      local_layers: []                         # cross-stream layers over a window of local_window tokens
      embed_noise: 0.1                         # noise on E_2..E_n at init, relative to std(E)
      cells: {n1: {n_streams: 1}, n4full: {n_streams: 4, attention: full},
              n1_flops_n4: {n_streams: 1, flops_of: {n_streams: 4}},
              n2gated: {n_streams: 2, start: gated}, ...}   # start gated: n > 1 at step 0 is the backbone
                                                           # (needs positions: shared)
      # a probe: train.corpus parity (train.parity), each cell its K (`bits`), the control its pause tokens:
      #   cells: {n1-k8: {bits: 8}, pause-k8: {bits: 8, pauses: 8}, n2-k8: {n_streams: 2, bits: 8}}
      grid: [n1, n4full, n1_flops_n4]          # the cells dvc.yaml runs, × seeds
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import model_validator

from scalelab.config.base import Fraction, NonNegFloat, NonNegInt, PosFloat, PosInt, Strict
from scalelab.config.optim import OptimizerConfig, ScheduleConfig
from scalelab.config.source import NAME, ModelSource

Positions = Literal["shared", "interleaved", "per_layer"]


class StreamsConfig(Strict):
    """The axes a cell varies: how many streams, which attention, whether the streams have their own tables
    ("tied": every stream reads E_1, the control that isolates what separate tables add), and how n > 1 starts:
    "open" (the method's: the last stream reads the hidden streams from the first step, so n > 1 starts from a
    perturbed function) or "gated" (it reads them through a gate per mixing layer that starts at 0, so n > 1 at
    step 0 is the backbone exactly; needs token positions in the mixing layers; scalelab.hidden_decoding.gate)."""

    n_streams: PosInt = 1
    attention: Literal["sfa", "full"] = "sfa"  # full: every layer is a mixing layer (the ablation)
    tables: Literal["separate", "tied"] = "separate"
    start: Literal["open", "gated"] = "open"


# RoPE position of (i, s) by layer kind: "token" i, or "interleaved" n·i + s (s counted from 0), which
# is the entry's index in the token-major order a mixing layer runs in.
POSITIONS = {"shared": ("token", "token"), "interleaved": ("interleaved", "interleaved"),
             "per_layer": ("token", "interleaved")}  # (within-stream layers, mixing layers); per_layer: WeLM-HD's


def default_mixing(n_layer: int) -> list[int]:
    """Every k-th layer counted back from the last, k = min(4, max(2, L // 2)): spread through the depth, the last
    layer included (it reads the hidden streams' deepest states), and from L = 3 on never the last layer alone."""
    k = min(4, max(2, n_layer // 2))
    return sorted(range(n_layer - 1, -1, -k))


class HiddenDecodingModelConfig(StreamsConfig):
    """Everything that defines an n-stream model on top of its backbone; saved beside its Hugging Face files."""

    positions: Positions = "per_layer"  # see POSITIONS
    mixing_layers: list[NonNegInt] | None = None  # None: default_mixing
    local_layers: list[NonNegInt] = []  # local cross-stream layers (see `local`); none by default
    local_window: PosInt = 4  # tokens (all their streams) a local layer's query reads, its own included
    embed_noise: NonNegFloat = 0.1  # std of the noise added to the copies E_2..E_n at init (relative to E's std)
    aux_loss_weight: NonNegFloat = 0.0  # weight of the mean CE on streams 1..n-1 (off: only (i, n) predicts)
    # Which stream reads the backbone's own table E (the others read its noisy copies): "copy", stream 1 (the
    # predicting stream n reads a copy), or "backbone", stream n. The sources say only that every table starts as E;
    # with "backbone" and token positions the open start perturbs the backbone's function only through what its
    # mixing layers read from the hidden streams (a gated start always reads E from stream n).
    predictor_table: Literal["copy", "backbone"] = "copy"

    @model_validator(mode="after")
    def _gated_start(self) -> "HiddenDecodingModelConfig":
        if self.start == "gated" and self.position_kind("mixing") != "token":
            raise ValueError(f"hidden_decoding: start gated with positions {self.positions}: the mixing layers' "
                             "interleaved positions change the backbone's function whatever the gate (set positions "
                             "shared)")
        if self.start == "gated" and self.local_layers:
            raise ValueError("hidden_decoding: start gated with local_layers: the gate covers mixing layers only")
        return self

    def position_kind(self, layer_kind: str) -> str:
        """ "token" or "interleaved": the RoPE positions of a "within" layer, or of a cross-stream one ("mixing",
        "local": they run in token-major order)."""
        return POSITIONS[self.positions][layer_kind != "within"]

    def local(self, n_layer: int) -> list[int]:
        """Indices of the local cross-stream layers (scalelab.hidden_decoding.window: (i,s) attends every stream of
        the last `local_window` tokens, its own token's up to s). A layer listed here is taken out of the default
        mixing layers; one listed in both `mixing_layers` and `local_layers` is refused."""
        layers = sorted(set(self.local_layers))
        if layers and self.attention == "full":
            raise ValueError("hidden_decoding.local_layers with attention full: every layer already mixes the whole "
                             "context")
        if bad := [i for i in layers if i >= n_layer]:
            raise ValueError(f"hidden_decoding.local_layers {bad}: the backbone has {n_layer} layers "
                             f"(0..{n_layer - 1})")
        if both := sorted(set(layers) & set(self.mixing_layers or ())):
            raise ValueError(f"hidden_decoding: layers {both} are in both mixing_layers and local_layers")
        return layers

    def mixing(self, n_layer: int) -> list[int]:
        """Indices of the mixing layers of an `n_layer`-layer backbone (all of them under `full`), after refusing
        settings under which the hidden streams provably cannot matter (the symmetry of the streams):
        - n > 1 without a cross-stream (mixing or local) layer: streams 1..n-1 never reach (i, n);
        - n ≥ 3, equal tables (embed_noise 0), token positions in cross-stream layers, and only the last layer
          crossing streams: streams 1..n-1 are computed identically and read only by (i, n)'s attention, which sees
          them as an unordered set of equal keys, so they get identical gradients and stay identical copies."""
        local = self.local(n_layer)
        if self.attention == "full":
            return list(range(n_layer))
        listed = self.mixing_layers if self.mixing_layers is not None else default_mixing(n_layer)
        layers = sorted(set(listed) - set(local))
        if bad := [i for i in layers if i >= n_layer]:
            raise ValueError(f"hidden_decoding.mixing_layers {bad}: the backbone has {n_layer} layers "
                             f"(0..{n_layer - 1})")
        n, crossing = self.n_streams, sorted({*layers, *local})
        if n > 1 and not crossing:
            raise ValueError(f"hidden_decoding: n_streams {n} with no mixing layer: the hidden streams never reach "
                             "the prediction (set mixing_layers)")
        if (n >= 3 and (self.embed_noise == 0 or self.tables == "tied") and crossing == [n_layer - 1]
                and self.position_kind("mixing") == "token"):
            raise ValueError(f"hidden_decoding: n_streams {n}, equal tables, shared positions and only the last "
                             f"layer ({n_layer - 1}) mixing: the hidden streams are interchangeable copies (set "
                             "embed_noise > 0, an earlier mixing layer, or positions per_layer)")
        return layers


class CellConfig(StreamsConfig):
    """One matrix cell. `flops_of`: train on as many tokens as make this cell's training FLOPs equal those of a
    model with those streams on the base budget (the equal-FLOPs control; counted analytically).

    On the parity corpus (`train.corpus: parity`) every cell names its task: `bits` (K) and `pauses`, the pause tokens
    before the answer (the positive control's kind: one stream with extra positions at the answer), and `hints`: the
    pauses trained on threshold targets (scalelab.hidden_decoding.parity_task).
    `positions` and `embed_noise` set the section's for this cell alone; `forward_only` trains nothing: the cell is
    its model at step 0 scored on the validation windows (how far a start is from its backbone). `table_warmup`: the
    first steps train only what Hidden Decoding adds (the extra tables, a gated start's gates), the backbone frozen,
    so it keeps its function while the hidden streams find a use (beyond the sources; n > 1). `table_lr`, `gate_lr`:
    base learning rates of what Hidden Decoding adds, the extra tables and a gated start's gates, the backbone keeping
    `train.optimizer`'s; the schedule scales every one (n > 1). A gate is one scalar that AdamW moves by about its
    learning rate a step, so at the backbone's CPT rate it cannot open within a short run.
    `backbone_steps` (a probe's n > 1 cell): continued from a trained one-stream backbone. The cell first trains
    n = 1 on its own task from the seed's random backbone for that many steps, then adds its streams to it and trains
    the rest of `train.max_steps`, so it spends the same steps as a cell trained from scratch
    (scalelab.hidden_decoding.continued)."""

    flops_of: StreamsConfig | None = None
    bits: PosInt | None = None
    pauses: NonNegInt = 0
    hints: bool = False
    positions: Positions | None = None
    embed_noise: NonNegFloat | None = None
    predictor_table: Literal["copy", "backbone"] = "copy"  # HiddenDecodingModelConfig's, for this cell
    forward_only: bool = False
    table_warmup: NonNegInt = 0
    table_lr: PosFloat | None = None
    gate_lr: PosFloat | None = None
    backbone_steps: NonNegInt = 0
    # a `flops_of` control's tokens capped at this many passes over the training stream: past a few passes repeated
    # tokens are worth less than new ones, so extra FLOPs spent as more epochs stop being a like-for-like control
    max_passes: PosFloat | None = None

    @model_validator(mode="after")
    def _check(self) -> "CellConfig":
        if self.backbone_steps and self.n_streams == 1:
            raise ValueError(f"backbone_steps {self.backbone_steps} with n_streams 1: a cell continued from a "
                             "one-stream backbone adds streams to it")
        if self.backbone_steps and (self.forward_only or self.flops_of is not None):
            raise ValueError(f"backbone_steps {self.backbone_steps} with forward_only or flops_of: a continued cell "
                             "spends the base budget, part of it on its backbone")
        if self.pauses and self.n_streams > 1:
            raise ValueError(f"pauses {self.pauses} with n_streams {self.n_streams}: pause tokens are the one-stream "
                             "control")
        if self.pauses and self.bits is None:
            raise ValueError("pauses without bits: pause tokens belong to the parity task")
        if self.hints and self.pauses < 2:
            raise ValueError(f"hints with pauses {self.pauses}: the hints are the targets of every pause but the last "
                             "(it predicts the answer), so they need pauses ≥ 2")
        if self.forward_only and self.flops_of is not None:
            raise ValueError("forward_only with flops_of: a cell that trains nothing has no budget to match")
        if self.table_warmup and self.n_streams == 1:
            raise ValueError(f"table_warmup {self.table_warmup} with n_streams 1: one stream adds no table to warm up")
        if (self.table_lr or self.gate_lr) and self.n_streams == 1:
            raise ValueError("table_lr/gate_lr with n_streams 1: one stream adds no table or gate to train at them")
        if self.max_passes is not None and self.flops_of is None:
            raise ValueError(f"max_passes {self.max_passes} without flops_of: only a FLOP-matched control's budget "
                             "is capped (the base budget is the section's)")
        if self.gate_lr and self.start != "gated":
            raise ValueError(f"gate_lr {self.gate_lr} with start {self.start!r}: only a gated start has gates")
        return self


class ParityConfig(Strict):
    """The parity corpus (`corpus: parity`): token streams of whole blocks `b1 … bK | P… a`, the training windows
    drawn at block boundaries and the validation windows cut there, so every answer in a window follows its K
    bits (scalelab.hidden_decoding.parity_task)."""

    blocks: PosInt = 1  # whole blocks per window: a cell's seq_len is blocks × its block length (K + 2 + pauses)
    val_windows: PosInt = 256  # fixed validation windows (val_tokens = val_windows × seq_len)
    tokens: PosInt = 1_000_000  # of the train stream (the validation stream: a tenth, from another generator)


class HDTrainConfig(Strict):
    """The continued-pretraining run of every cell (same data, same base token budget). Field names follow
    `pretrain`'s, so the training layer's data module reads either.

    `corpus`: the token streams cells train on. "shards": the pipeline's token shards (their vocabulary must be the
    backbone's); "text": the prepared corpus encoded with the backbone's own tokenizer, `text_tokens` tokens of each
    split (scalelab.data.streams.from_text); "auto": shards for a pretrain cell, text for any other model;
    "parity": the parity task (scalelab.hidden_decoding.parity_task) of each cell's `bits` and `pauses`, its windows whole blocks
    (`parity`), seq_len and val_tokens then following from them."""

    corpus: Literal["auto", "shards", "text", "parity"] = "auto"
    text_tokens: PosInt = 1_000_000
    parity: ParityConfig = ParityConfig()

    seq_len: PosInt = 64  # tokens per window (each becomes n_streams positions)
    batch_size: PosInt = 8
    max_steps: PosInt = 60  # the base budget: n = 1, 2, 4 all see batch_size·seq_len·max_steps tokens
    val_every: PosInt = 30
    val_tokens: PosInt = 8192
    ckpt_every: PosInt = 30
    keep_stale: NonNegInt = 2  # stale checkpoints of completed runs kept (scalelab.train.resume)
    log_every: PosInt = 10  # the tracker's cadence, as pretrain.log_every (not in the config hash)
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
        if self.corpus == "parity" and (given := sorted({"seq_len", "val_tokens"} & self.model_fields_set)):
            raise ValueError(f"hidden_decoding.train.{given[0]} with corpus parity: a cell's windows are "
                             "parity.blocks whole blocks of its task (set parity.blocks, parity.val_windows)")
        if self.batch_size % (self.accumulate * self.devices):
            raise ValueError(f"hidden_decoding.train.batch_size ({self.batch_size}) must split evenly into "
                             f"accumulate ({self.accumulate}) micro-batches on each of {self.devices} devices")
        return self

    def total_steps(self) -> int:
        return self.max_steps


class HDClaimsConfig(Strict):
    """The claims' fraction and level, and the bounds of a continued pretraining's setup premises, fixed in the
    profile before its cells run (scalelab.hidden_decoding.premises; None: that premise is not part of the study):
    `start_gap`, the largest |loss(n) − loss(n = 1)| at step 0 in any seed for a start that preserves the backbone's
    function; `budget_factor`, the tokens per parameter of the continued pretraining at least the paper's over this
    factor (the claims are then about the paper's regime); `backbone_plateau`, the backbone's own pretraining counts
    as trained when the last quarter of its tokens gave less than this fraction of its validation-loss drop."""

    sfa_fraction: Fraction = 0.8  # "SFA keeps this fraction of full attention's gain over n = 1 at equal n"
    level: Fraction = 0.95  # of the t interval behind every verdict
    start_gap: PosFloat | None = None
    budget_factor: PosFloat | None = None
    backbone_plateau: Fraction | None = None


class BackboneShape(Strict):
    """A Llama's shape (heads of d_model / n_head dimensions; n_kv_head None: as many as n_head)."""

    n_layer: PosInt = 2
    d_model: PosInt = 32
    n_head: PosInt = 4
    n_kv_head: PosInt | None = None
    d_ff: PosInt = 64
    rope_theta: PosFloat = 10000.0

    @model_validator(mode="after")
    def _check(self) -> "BackboneShape":
        if self.d_model % self.n_head or self.n_head % (self.n_kv_head or self.n_head):
            raise ValueError(f"hidden_decoding.source.init: d_model {self.d_model}, n_head {self.n_head}, n_kv_head "
                             f"{self.n_kv_head}: n_head must divide d_model and n_kv_head divide n_head")
        return self


# What DVC tracks for a random backbone: the code that draws it (its shape is in the tracked params).
INIT_DEP = "src/scalelab/hidden_decoding/io.py"
# What DVC tracks for a backbone per seed: the folder of every pretrain cell (CELL_EXPORT's), one dependency that
# covers each seed's export, since a dvc.yaml dependency cannot name a folder per matrix seed from the params.
PER_SEED_DEP = "data/pretrain"


class SeededSource(Strict):
    """One pipeline-pretrained backbone per seed: seed s continues the pretrain cell `<per_seed>-<s>` (e.g. per_seed
    standard-xs-base: standard-xs-base-0, -1, ...) through its Hugging Face export, so the seeds replicate the
    backbone's pretraining as well as its continuation. The stage resolves it per seed
    (HiddenDecodingConfig.for_seed) before anything reads it."""

    per_seed: str
    dtype: Literal["float32", "bfloat16"] = "float32"

    @model_validator(mode="after")
    def _check(self) -> "SeededSource":
        if not NAME.match(self.per_seed):
            raise ValueError(f"hidden_decoding.source.per_seed {self.per_seed!r}: only letters, digits, '_', '.', '-'")
        return self

    def of(self, seed: int) -> ModelSource:
        return ModelSource(cell=f"{self.per_seed}-{seed}", dtype=self.dtype)

    def location(self) -> str:
        return f"{PER_SEED_DEP}/{self.per_seed}-<seed>/model/hf"


class RandomSource(Strict):
    """A random Llama of shape `init`, drawn from torch's RNG seeded by the cell's seed, so every cell of a seed
    starts from the same weights: a probe trained from scratch. Its vocabulary is its corpus's."""

    init: BackboneShape

    def location(self) -> str:
        return f"a random Llama {self.init.model_dump_json()}"


class HiddenDecodingConfig(Strict):
    source: ModelSource | RandomSource | SeededSource = ModelSource(cell="standard-m-base-0")
    # dvc.yaml cannot branch on cell/path, so the folder DVC tracks is spelled out; must be source's own folder.
    source_dep: str = "data/pretrain/standard-m-base-0/model/hf"
    positions: Positions = "per_layer"
    mixing_layers: list[NonNegInt] | None = None
    local_layers: list[NonNegInt] = []
    local_window: PosInt = 4
    embed_noise: NonNegFloat = 0.1
    aux_loss_weight: NonNegFloat = 0.0
    cells: dict[str, CellConfig]
    grid: list[str]
    seeds: list[NonNegInt] = [0]
    train: HDTrainConfig = HDTrainConfig()
    claims: HDClaimsConfig = HDClaimsConfig()

    @model_validator(mode="after")
    def _check(self) -> "HiddenDecodingConfig":
        if isinstance(self.source, SeededSource):
            if Path(self.source_dep) != Path(PER_SEED_DEP):
                raise ValueError(f"hidden_decoding.source_dep {self.source_dep!r} with a backbone per seed: the "
                                 f"folder of every seed's export, {PER_SEED_DEP!r} (the dependency DVC tracks)")
        elif self.random_init():
            if self.source_dep != INIT_DEP:
                raise ValueError(f"hidden_decoding.source_dep {self.source_dep!r}: a random backbone's is the code "
                                 f"that draws it, {INIT_DEP!r} (the dependency DVC tracks)")
        elif (self.source.cell is not None or Path(self.source.location()).exists()) and \
                Path(self.source_dep) != Path(location := self.source.location()):
            raise ValueError(f"hidden_decoding.source_dep {self.source_dep!r} must be the source's folder "
                             f"{location!r} (the dependency DVC tracks)")
        parity = self.train.corpus == "parity"
        if stray := [c for c, v in self.cells.items() if (v.bits is None) == parity]:
            raise ValueError(f"hidden_decoding.cells {stray}: " + (
                "the parity corpus needs each cell's bits (K)" if parity else
                "bits and pauses belong to the parity corpus (set train.corpus: parity)"))
        if long := [c for c, v in self.cells.items() if v.backbone_steps >= self.train.max_steps]:
            raise ValueError(f"hidden_decoding.cells {long}: backbone_steps must be below train.max_steps "
                             f"({self.train.max_steps}): the backbone's steps are part of the cell's budget")
        if (cont := [c for c, v in self.cells.items() if v.backbone_steps]) and not self.random_init():
            raise ValueError(f"hidden_decoding.cells {cont}: backbone_steps continues a one-stream model this cell "
                             "trains itself from a random backbone (source: {init: {...}}); a trained source is "
                             "continued by every cell already")
        if parity and not self.random_init():
            raise ValueError("hidden_decoding.train.corpus parity: the task has its own vocabulary, so the backbone "
                             "is a random one (source: {init: {...}})")
        for name in self.cells:
            if not NAME.match(name):
                raise ValueError(f"hidden_decoding.cells: name {name!r}: only letters, digits, '_', '.', '-'")
        if unknown := [c for c in self.grid if c not in self.cells]:
            raise ValueError(f"hidden_decoding.grid: unknown cells {unknown}; known: {sorted(self.cells)}")
        if not self.seeds:
            raise ValueError("hidden_decoding.seeds: at least one seed")
        if self.mixing_layers == [] and not self.local_layers and (multi := [c for c in self.cells if self.cells[c].n_streams > 1
                                                   and self.cells[c].attention == "sfa"]):
            raise ValueError(f"hidden_decoding.mixing_layers []: cells {multi} have hidden streams that never reach "
                             "the prediction")
        return self

    def uses_text(self) -> bool:
        """Whether cells train on the prepared corpus in the backbone's own tokens (see `corpus`)."""
        return self.train.corpus == "text" or (self.train.corpus == "auto" and isinstance(self.source, ModelSource)
                                               and self.source.cell is None)

    def for_seed(self, seed: int) -> "HiddenDecodingConfig":
        """The section as seed `seed`'s cells run it: with a backbone per seed its source is that seed's pretrain
        cell and source_dep that cell's export; otherwise the section itself."""
        if not isinstance(self.source, SeededSource):
            return self
        source = self.source.of(seed)
        return self.model_copy(update={"source": source, "source_dep": source.location()})

    def random_init(self) -> bool:
        """Whether the backbone is a random one drawn per seed (`source: {init: ...}`)."""
        return isinstance(self.source, RandomSource)

    def model(self, cell: str) -> HiddenDecodingModelConfig:
        """The n-stream model of one cell."""
        if cell not in self.cells:
            raise ValueError(f"hidden_decoding.cells: unknown cell {cell!r}; known: {sorted(self.cells)}")
        c = self.cells[cell]
        return HiddenDecodingModelConfig(n_streams=c.n_streams, attention=c.attention, tables=c.tables,
                                         start=c.start, positions=c.positions or self.positions,
                                         mixing_layers=self.mixing_layers, local_layers=self.local_layers,
                                         local_window=self.local_window,
                                         embed_noise=self.embed_noise if c.embed_noise is None else c.embed_noise,
                                         aux_loss_weight=self.aux_loss_weight,
                                         predictor_table=c.predictor_table)
