"""Low-rank layers, and compressed models that `transformers` saves and loads with fewer parameters.

A compressed layer is `LowRankLinear`: y = L(Rx), two `nn.Linear` maps holding exactly k(m+n) weights (plus the
original bias, on L). A compressed model is the original Hugging Face architecture with some linear maps swapped.

On disk: `model.safetensors` (sharded for large models) with the factors as
`<layer>.left.weight` / `<layer>.right.weight`, and `config.json`: the base model's config with

    "model_type": "scalelab_lowrank_<base type>",  "scalelab_lowrank": {"<layer>": <rank>, ...}

Loading needs no remote code: importing `scalelab.compress` registers a config and a model class per base type
(`LowRankQwen3ForCausalLM` subclasses `Qwen3ForCausalLM`, swapping the listed layers in `__init__`) with
`AutoConfig`/`AutoModelForCausalLM`, after which `AutoModelForCausalLM.from_pretrained(folder)` returns the
compressed model. Without that import, transformers refuses the unknown model type with a clear error instead of
silently loading random dense weights.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from scalelab.compress.methods import Factors

PREFIX = "scalelab_lowrank_"
RANKS_KEY = "scalelab_lowrank"


class LowRankLinear(nn.Module):
    """y = L(R x): `right` maps in → k, `left` maps k → out; k(m+n) weights."""

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = False,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.right = nn.Linear(in_features, rank, bias=False, device=device, dtype=dtype)
        self.left = nn.Linear(rank, out_features, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # factors held in float32 while refined (refine.py) read bf16 activations: compute in the factors' dtype
        dtype = self.right.weight.dtype
        return self.left(self.right(x.to(dtype))).to(x.dtype) if x.dtype != dtype else self.left(self.right(x))

    @classmethod
    @torch.no_grad()
    def from_factors(cls, factors: Factors, like: nn.Linear) -> "LowRankLinear":
        """The layer computing `factors.left @ factors.right` in place of `like` (its dtype, device and bias)."""
        w = like.weight
        layer = cls(like.in_features, like.out_features, factors.rank, bias=like.bias is not None,
                    device=w.device, dtype=w.dtype)
        layer.left.weight.copy_(factors.left)
        layer.right.weight.copy_(factors.right)
        if like.bias is not None:
            layer.left.bias.copy_(like.bias)
        return layer

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}"


def swap(model: nn.Module, name: str, layer: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, layer)


def apply_factors(model: nn.Module, factors: Mapping[str, Factors]) -> None:
    """Replace each named linear map by its low-rank factorisation, in place."""
    for name, f in factors.items():
        swap(model, name, LowRankLinear.from_factors(f, model.get_submodule(name)))


def ranks_of(model: nn.Module) -> dict[str, int]:
    return {name: m.rank for name, m in model.named_modules() if isinstance(m, LowRankLinear)}


def num_params(model: nn.Module) -> int:
    """Distinct parameters (a tied LM head counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


@lru_cache
def register(base_type: str) -> tuple[type, type]:
    """The config and causal-LM classes for compressed models of `base_type`, registered with transformers' Auto
    classes (idempotent)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if base_type.startswith(PREFIX) or base_type not in CONFIG_MAPPING:
        raise ValueError(f"cannot compress model type {base_type!r}: not a transformers causal LM type")
    base_config = CONFIG_MAPPING[base_type]
    if base_config not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ValueError(f"model type {base_type!r} has no causal LM class in transformers")
    base_model = MODEL_FOR_CAUSAL_LM_MAPPING[base_config]
    config_cls = type(f"LowRank{base_config.__name__}", (base_config,), {"model_type": PREFIX + base_type})

    def __init__(self, config):  # noqa: N807 - the model class's constructor
        base_model.__init__(self, config)
        for name, rank in getattr(config, RANKS_KEY, {}).items():
            like = self.get_submodule(name)
            swap(self, name, LowRankLinear(like.in_features, like.out_features, rank, bias=like.bias is not None,
                                           device=like.weight.device, dtype=like.weight.dtype))

    model_cls = type(f"LowRank{base_model.__name__}", (base_model,), {"config_class": config_cls,
                                                                     "__init__": __init__})
    AutoConfig.register(config_cls.model_type, config_cls, exist_ok=True)
    AutoModelForCausalLM.register(config_cls, model_cls, exist_ok=True)
    return config_cls, model_cls


def save_lowrank(model: nn.Module, out_dir: str | os.PathLike, tokenizer=None) -> None:
    """Save a model whose layers `apply_factors` swapped, as a checkpoint `AutoModelForCausalLM` loads once
    `scalelab.compress` is imported (safetensors; config lists the ranks)."""
    base = model.config
    base_type = base.model_type.removeprefix(PREFIX)
    config_cls, model_cls = register(base_type)
    fields = {k: v for k, v in base.to_dict().items() if k not in ("model_type", "architectures", RANKS_KEY)}
    config = config_cls(**fields, **{RANKS_KEY: ranks_of(model)})
    config.architectures = [model_cls.__name__]
    with torch.device("meta"):
        shell = model_cls(config)
    shell.load_state_dict(model.state_dict(), assign=True, strict=True)  # shares the tensors: no copy
    shell.tie_weights()
    shell.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)


def lowrank_type(folder: str | os.PathLike) -> str | None:
    """The base model type of a compressed checkpoint (None for any other folder)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return None
    model_type = json.loads(path.read_text()).get("model_type", "")
    return model_type.removeprefix(PREFIX) if model_type.startswith(PREFIX) else None


def register_for(folder: str | os.PathLike) -> None:
    """Make a compressed checkpoint of any base type loadable through the Auto classes."""
    if (base_type := lowrank_type(folder)) is not None:
        register(base_type)


for _base in ("llama", "qwen3"):  # the pipeline's own export types load after a bare `import scalelab.compress`
    register(_base)
