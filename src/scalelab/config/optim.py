"""params section `optim` and the LR schedules: optimizers of the registry (scalelab.optim)."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import (ConfigDict, Field, TypeAdapter, ValidationError, ValidationInfo, field_validator,
                      model_serializer)

from scalelab.config.base import Fraction, NonNegFloat, PosFloat, PosInt, Strict

# The library arguments `optim.<name>.kwargs` may set, per registry name, with their types: the annotations of the
# library class's signature (scalelab.optim.families passes them on), or for the keys a factory takes itself its own.
# pytorch-optimizer's classes take **kwargs and ignore what they do not know, so a misspelt key would train silently
# with the default, and a value of the wrong type (`rank_ratio: not-a-number`) would pass the schema and fail in the
# middle of a stage, after DVC removed its outs: the schema checks both here, without importing the libraries (the
# check runs in DVC's own process, scalelab.pipeline.interpreter). tests/test_config.py pins every type below against
# the library's signature, so the table cannot drift from the libraries; `scalelab check` also builds each optimizer
# (scalelab.pipeline.check), for the values of the right type that a library refuses.
_B, _OB, _F, _I = bool, bool | None, float, int
KWARG_TYPES: dict[str, dict[str, Any]] = {
    "adamw": {"amsgrad": _B, "maximize": _B, "foreach": _OB, "capturable": _B, "differentiable": _B, "fused": _OB},
    "sgd": {"dampening": _F, "nesterov": _B, "maximize": _B, "foreach": _OB, "differentiable": _B, "fused": _OB},
    "adafactor": {"beta2_decay": _F, "d": _F, "maximize": _B, "foreach": _OB},
    "muon": {"nesterov": _B, "ns_coefficients": tuple[float, float, float], "eps": _F, "ns_steps": _I,
             "adjust_lr_fn": str | None},
    "lion": {"weight_decouple": _B, "fixed_decay": _B, "foreach": _OB, "maximize": _B},
    "signum": {"weight_decouple": _B, "foreach": _OB, "maximize": _B},
    "soap": {"shampoo_beta": float | None, "precondition_frequency": _I, "max_precondition_dim": _I, "merge_dims": _B,
             "precondition_1d": _B, "correct_bias": _B, "normalize_gradient": _B,
             "data_format": Literal["channels_first", "channels_last"], "maximize": _B},
    "sophia": {"weight_decouple": _B, "fixed_decay": _B, "p": _F, "update_period": _I, "num_samples": _I,
               "hessian_distribution": Literal["gaussian", "rademacher"], "eps": _F, "maximize": _B, "foreach": _OB},
    "adam_mini": {"model_sharding": _B, "num_embeds": _I, "num_heads": _I, "num_query_groups": int | None,
                  "maximize": _B, "foreach": _OB},
    # rank_ratio .. projection_type: the factory's (rank = ratio × the matrix's smaller side; the rest its projector's)
    "galore": {"maximize": _B, "foreach": _OB, "rank_ratio": Annotated[float, Field(gt=0, le=1)],
               "update_proj_gap": PosInt, "scale": PosFloat,
               "projection_type": Literal["std", "reverse_std", "right", "left", "full", "random"]},
    # beta3: the factory's (the third of AdEMAMix's betas)
    "ademamix": {"weight_decouple": _B, "fixed_decay": _B, "alpha": _F, "t_alpha_beta3": float | None, "maximize": _B,
                 "foreach": _OB, "beta3": Annotated[float, Field(ge=0, lt=1)]},
    "mars": {"gamma": _F, "mars_type": Literal["adamw", "lion", "shampoo"], "optimize_1d": _B, "lr_1d": _F,
             "betas_1d": tuple[float, float] | tuple[float, float, float], "weight_decay_1d": _F,
             "weight_decouple": _B, "fixed_decay": _B, "ams_bound": _B, "cautious": _B, "maximize": _B, "foreach": _OB},
    "sf_adamw": {"r": _F, "weight_lr_power": _F, "warmup_steps": _I, "decoupling_c": _I, "ams_bound": _B,
                 "maximize": _B, "foreach": _OB},
}
KWARGS: dict[str, frozenset[str]] = {name: frozenset(types) for name, types in KWARG_TYPES.items()}
# Keys the factories take for themselves (not the library class's): what the signature check allows besides it.
FACTORY_KWARGS = {"galore": {"rank_ratio", "update_proj_gap", "scale", "projection_type"}, "ademamix": {"beta3"}}
# A kwarg's value has the annotation's type as YAML gives it: no string for a number, no 1 for a bool, no 5.0 for an
# int (a list for a tuple, an int for a float: what YAML writes); finite.
_STRICT = ConfigDict(allow_inf_nan=False)


@lru_cache(maxsize=None)
def _adapter(name: str, key: str) -> TypeAdapter:
    return TypeAdapter(KWARG_TYPES[name][key], config=_STRICT)


def check_kwargs(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` of optimizer `name`, each key known and each value of its type (a list becomes the tuple the library
    takes); raises ValueError naming the first bad key. An optimizer outside the table: passed on as is."""
    if name not in KWARGS:
        return dict(kwargs)
    if bad := sorted(set(kwargs) - KWARGS[name]):
        raise ValueError(f"unknown key {bad[0]!r} for optimizer {name!r}; accepted: {sorted(KWARGS[name])}")
    out = {}
    for key, value in kwargs.items():
        try:
            out[key] = _adapter(name, key).validate_json(json.dumps(value), strict=True)
        except (TypeError, ValueError) as err:  # ValidationError is a ValueError; TypeError: not a YAML scalar/list
            why = err.errors()[0]["msg"] if isinstance(err, ValidationError) else "not a number, bool, string or list"
            hint = ""
            if isinstance(value, str) and re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value):
                hint = f" (YAML reads {value} as a string: write it with a dot, e.g. 1.0e-3)"
            raise ValueError(f"{key}: {why} (type {_describe(KWARG_TYPES[name][key])}; got {value!r}){hint}") from None
    return out


def _describe(annotation: Any) -> str:
    """A kwarg's type as the signature writes it: `float`, `bool | None`, `Literal['std', 'left']`."""
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return re.sub(r"typing\.|<class '(\w+)'>", lambda m: m.group(1) or "", str(annotation))


class OptimizerConfig(Strict):
    """One optimizer of the registry (scalelab.optim). Scale vectors always go to AdamW-style updates."""

    name: str = "adamw"
    lr: PosFloat = 3e-3
    weight_decay: NonNegFloat = 0.1
    # Decay on the scale vectors a variant decays (wd_input_scales / wd_output_scales), as a multiple of the
    # matrices' weight_decay: the dose of the γ decay (λ·η·T over a short run is ~0.05 at 1x: too small to move γ),
    # so the dose-response study sets 0, 1, 10, 100.
    scale_wd_mult: NonNegFloat = 1.0
    betas: tuple[float, float] = (0.9, 0.95)
    eps: PosFloat = 1e-8
    momentum: Fraction = 0.95  # Muon / SGD
    adamw_lr: PosFloat | None = None  # lr of the AdamW side-group under matrix optimizers (None: lr)
    # the side group's decay and betas (None: the optimizer's own): the optimizer benchmark's pinned arms set them with
    # adamw_lr to an AdamW arm's tuned values, so the group is all pinned or all the family's, never mixed
    adamw_weight_decay: NonNegFloat | None = None
    adamw_betas: tuple[float, float] | None = None
    # The token embedding's and LM head's LR over the LR of the optimizer that trains them (the family's own, or the
    # AdamW side group's under a matrix family): the optimizer benchmark's embedding-LR control tunes it for AdamW
    embedding_lr_mult: PosFloat = 1.0
    kwargs: dict[str, Any] = {}  # passed through to the library optimizer (keys and types: KWARG_TYPES[name])

    @model_serializer(mode="wrap")
    def _without_unset_side(self, handler):
        # unset side-group decay and betas are left out of the dump: a config that does not set them hashes (the
        # training cells' config_hash) and writes as it did before they existed
        out = handler(self)
        for key in ("adamw_weight_decay", "adamw_betas"):
            if out.get(key) is None:
                out.pop(key, None)
        return out

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        if name not in KWARGS:  # the registry's names (scalelab.optim; tests/test_optim.py pins them)
            raise ValueError(f"unknown optimizer {name!r}; registered: {sorted(KWARGS)}")
        return name

    @field_validator("kwargs")
    @classmethod
    def _typed_kwargs(cls, kwargs: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        return check_kwargs(info.data["name"], kwargs) if "name" in info.data else kwargs


class ScheduleConfig(Strict):
    name: Literal["cosine", "wsd", "linear", "constant"] = "cosine"
    warmup: Fraction = 0.05  # fraction of total steps
    min_lr_ratio: Fraction = 0.1
    decay: Fraction = 0.2  # WSD: fraction of total steps in the final decay
