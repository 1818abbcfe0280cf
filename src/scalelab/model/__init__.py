"""The models: a Llama-style decoder whose scale vectors are composable variants (docs/scale-vectors.md), exports."""

from scalelab.model.export import export_hf, fold_scales, load_exported, plain_config, save_model
from scalelab.model.norm import INPUT_SCALE, OUTPUT_SCALE, Projection, RMSNorm, Scale
from scalelab.model.transformer import ModelOutput, Transformer

__all__ = [
    "INPUT_SCALE", "OUTPUT_SCALE", "ModelOutput", "Projection", "RMSNorm", "Scale", "Transformer",
    "export_hf", "fold_scales", "load_exported", "plain_config", "save_model",
]
