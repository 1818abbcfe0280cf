"""Compression (docs/compression.md): calibration statistics, SVD / ASVD / FWSVD / SVD-LLM / SigmaScale factors,
rank allocation, low-rank layers and checkpoints, effective rank, end-to-end refinement.

Importing it registers the compressed-model classes with transformers' Auto classes (lowrank.py), so
`AutoModelForCausalLM.from_pretrained(<compressed folder>)` works with no remote code.
"""

from scalelab.compress.calibrate import calibration_batches, collect, decoder_linears, fisher_rows
from scalelab.compress.compressor import LayerRecord, compress_model
from scalelab.compress.erank import effective_rank, participation_ratio
from scalelab.compress.lowrank import LowRankLinear, apply_factors, num_params, register_for, save_lowrank
from scalelab.compress.methods import Factors, asvd, fwsvd, layer_loss, plain_svd, svd_llm, svd_llm_loss
from scalelab.compress.rank import rank_for
from scalelab.compress.shared import Calibration
from scalelab.compress.sigmascale import sigmascale
from scalelab.compress.store import Store

__all__ = [
    "Calibration", "Factors", "LayerRecord", "LowRankLinear", "apply_factors", "asvd", "calibration_batches", "collect",
    "compress_model", "decoder_linears", "effective_rank", "fisher_rows", "fwsvd", "layer_loss", "num_params",
    "participation_ratio", "plain_svd", "rank_for", "register_for", "save_lowrank", "sigmascale", "Store", "svd_llm",
    "svd_llm_loss",
]
