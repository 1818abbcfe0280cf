"""Where a method stage's model comes from: a pretrain cell of this pipeline or a Hugging Face causal LM."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from scalelab.config.base import NAME, Strict

# A pretrain cell's folded Hugging Face export (Llama, or Qwen3 with QK-norm): written by the pretrain stage.
CELL_EXPORT = "data/pretrain/{cell}/model/hf"


class ModelSource(Strict):
    """Exactly one of `cell` (a pretrain cell, `<variant>-<size>-<recipe>-<seed>`, through its Hugging Face export)
    or `path` (a local folder or a hub id of a Llama/Qwen3 causal LM; no remote code is ever run)."""

    cell: str | None = None
    path: str | None = None
    dtype: Literal["float32", "bfloat16"] = "float32"

    @model_validator(mode="after")
    def _check(self) -> "ModelSource":
        if (self.cell is None) == (self.path is None):
            raise ValueError("set exactly one of cell (a pretrain cell) and path (a Hugging Face model)")
        if self.cell is not None and not NAME.match(self.cell):
            raise ValueError(f"cell {self.cell!r}: only letters, digits, '_', '.', '-'")
        return self

    def location(self) -> str:
        """The folder (or hub id) that `transformers` loads."""
        return CELL_EXPORT.format(cell=self.cell) if self.cell is not None else str(self.path)
