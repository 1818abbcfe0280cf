"""Typed schema of params.yaml: the one source of truth for every stage, one module per section.

Every section forbids unknown keys, so a typo fails at load time with the key path named, before any compute.
Stages call `load_params()` first thing and write nothing when it raises.
"""

from scalelab.config.base import NAME, Fraction, Name, NonNegFloat, NonNegInt, ParamsError, PosFloat, PosInt, Strict
from scalelab.config.compress import (
    AllocationConfig, CalibrationConfig, CompressConfig, CompressGrid, EvalConfig, MethodConfig, RefineConfig,
    SigmaScaleConfig,
)
from scalelab.config.data import CorpusConfig, PrepareConfig, TokenizeConfig, TokenizerConfig
from scalelab.config.evaluate import EvalModelConfig, EvaluateConfig, LmEvalConfig, ZeroShotConfig
from scalelab.config.hidden_decoding import (
    CellConfig, HDClaimsConfig, HDTrainConfig, HiddenDecodingConfig, HiddenDecodingModelConfig, StreamsConfig,
)
from scalelab.config.model import ArchConfig, ModelConfig, MoEConfig, ScaleConfig, SizeConfig
from scalelab.config.optim import OptimizerConfig, ScheduleConfig
from scalelab.config.optbench import OptBenchConfig
from scalelab.config.params import Params, TrackingConfig, load_params, parse_params
from scalelab.config.source import CELL_EXPORT, ModelSource
from scalelab.config.pretrain import GridConfig, PretrainConfig, RecipeConfig, ScalingConfig, SharpnessConfig

__all__ = [
    "ArchConfig", "CELL_EXPORT", "NAME", "Name", "CorpusConfig", "Fraction", "GridConfig", "ModelConfig", "ModelSource", "MoEConfig", "NonNegFloat", "NonNegInt",
    "OptimizerConfig", "Params", "ParamsError", "PosFloat", "PosInt", "PrepareConfig", "PretrainConfig",
    "RecipeConfig", "ScaleConfig", "ScalingConfig", "ScheduleConfig", "SharpnessConfig", "SizeConfig", "Strict",
    "TokenizeConfig", "TokenizerConfig", "TrackingConfig", "load_params", "parse_params",
    "OptBenchConfig",
    "EvalModelConfig", "EvaluateConfig", "LmEvalConfig", "ZeroShotConfig",
    "AllocationConfig", "CalibrationConfig", "CompressConfig", "CompressGrid", "EvalConfig", "MethodConfig",
    "RefineConfig", "SigmaScaleConfig",
    "CellConfig", "HDClaimsConfig", "HDTrainConfig", "HiddenDecodingConfig", "HiddenDecodingModelConfig",
    "StreamsConfig",
]
