"""Params section `evaluate`: which models are evaluated, and how (docs/workflow.md "Evaluation").

Two kinds of cells, one stage script:
- pretrain cells: every base-recipe variant × seed of `pretrain.grid` at each size in `sizes`, through the cell's
  folded Hugging Face export (`data/pretrain/<cell>/model/hf`);
- `models`: any other model folder by name, e.g. a Hidden Decoding or compressed model (a DVC out of its stage) or a
  Hugging Face causal LM on disk. One entry = one `evaluate_model@<name>` cell.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, field_validator

from scalelab.config.base import NonNegInt, PosInt, Strict
from scalelab.config.source import NAME

ModelName = Annotated[str, StringConstraints(pattern=NAME.pattern)]  # reaches DVC cmd lines and paths


class EvalModelConfig(Strict):
    """A model folder to evaluate: `config.json` + safetensors (transformers, no remote code) or scalelab's own
    export (`scalelab_config.json`), with its tokenizer beside the weights."""

    path: str
    dtype: Literal["float32", "bfloat16"] = "float32"

    @field_validator("path")
    @classmethod
    def _local(cls, v: str) -> str:
        if not v or v.startswith("-") or any(c in v for c in "\n;|&$`"):
            raise ValueError(f"{v!r}: give a local folder (a DVC out or a Hugging Face model on disk)")
        return v


class ZeroShotConfig(Strict):
    """Multiple-choice tasks built offline from the validation split (evaluate/zeroshot.py)."""

    items: PosInt = 200  # per task
    choices: Annotated[int, Field(ge=2)] = 4  # chance rate = 1 / choices
    context_chars: PosInt = 400  # raw text before the line in question
    seed: NonNegInt = 0


class LmEvalConfig(Strict):
    """lm-evaluation-harness on Hugging Face exports: optional (`pip install 'scalelab[eval]'`), needs its task
    data (downloaded beforehand: nothing downloads at run time); skipped with a message otherwise."""

    tasks: list[ModelName] = []  # e.g. [hellaswag, arc_easy]; empty: off
    limit: PosInt | None = None  # examples per task


class EvaluateConfig(Strict):
    sizes: list[ModelName] = []  # pretrain cells at these sizes (all grid variants and seeds, base recipe)
    models: dict[ModelName, EvalModelConfig] = {}
    seq_len: PosInt | None = None  # None: pretrain.seq_len, the windows of the training-time validation
    val_tokens: PosInt | None = None  # None: pretrain.val_tokens
    batch_size: PosInt = 16
    dtype: Literal["float32", "bfloat16"] = "float32"  # for pretrain cells (models carry their own)
    device: Literal["cpu", "cuda", "auto"] = "auto"  # machine setting (config/machine.py): machine.yaml, not a param
    threads: NonNegInt = 0  # machine setting: torch threads; 0: torch's default
    throughput_batches: PosInt = 4  # timed forward passes (after one warm-up)
    zeroshot: ZeroShotConfig = ZeroShotConfig()
    lm_eval: LmEvalConfig = LmEvalConfig()
