"""params section `optim` and the LR schedules: optimizers of the registry (scalelab.optim)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from scalelab.config.base import Fraction, NonNegFloat, PosFloat, Strict

# The library arguments `optim.<name>.kwargs` may set, per registry name (scalelab.optim.families passes them on).
# pytorch-optimizer's classes take **kwargs and ignore what they do not know, so a misspelt key would train silently
# with the default: the schema rejects it here, before any compute. tests/test_optim.py pins every key below against
# the library's signature (or the factory's own keys), so the table cannot drift from the libraries.
KWARGS: dict[str, frozenset[str]] = {k: frozenset(v.split()) for k, v in {
    "adamw": "amsgrad maximize foreach capturable differentiable fused",
    "sgd": "dampening nesterov maximize foreach differentiable fused",
    "adafactor": "beta2_decay d maximize foreach",
    "muon": "nesterov ns_coefficients eps ns_steps adjust_lr_fn",
    "lion": "weight_decouple fixed_decay foreach maximize",
    "signum": "weight_decouple foreach maximize",
    "soap": "shampoo_beta precondition_frequency max_precondition_dim merge_dims precondition_1d correct_bias "
            "normalize_gradient data_format maximize",
    "sophia": "weight_decouple fixed_decay p update_period num_samples hessian_distribution eps maximize foreach",
    "adam_mini": "model_sharding num_embeds num_heads num_query_groups maximize foreach",
    "galore": "maximize foreach rank_ratio update_proj_gap scale projection_type",  # the last four: the factory's
    "ademamix": "weight_decouple fixed_decay alpha t_alpha_beta3 maximize foreach beta3",  # beta3: the factory's
    "mars": "gamma mars_type optimize_1d lr_1d betas_1d weight_decay_1d weight_decouple fixed_decay ams_bound "
            "cautious maximize foreach",
    "sf_adamw": "r weight_lr_power warmup_steps decoupling_c ams_bound maximize foreach",
}.items()}
# Keys the factories take for themselves (not the library class's): what the signature check allows besides it.
FACTORY_KWARGS = {"galore": {"rank_ratio", "update_proj_gap", "scale", "projection_type"}, "ademamix": {"beta3"}}


class OptimizerConfig(Strict):
    """One optimizer of the registry (scalelab.optim). Scale vectors always go to AdamW-style updates (METHODS §A)."""

    name: str = "adamw"
    lr: PosFloat = 3e-3
    weight_decay: NonNegFloat = 0.1
    # Decay on the scale vectors a variant decays (wd_input_scales / wd_output_scales), as a multiple of the
    # matrices' weight_decay: the dose of METHODS §A's γ decay (λ·η·T over a short run is ~0.05 at 1x: too small to
    # move γ, issue 19), so the dose-response study sets 0, 1, 10, 100.
    scale_wd_mult: NonNegFloat = 1.0
    betas: tuple[float, float] = (0.9, 0.95)
    eps: PosFloat = 1e-8
    momentum: Fraction = 0.95  # Muon / SGD
    adamw_lr: PosFloat | None = None  # lr of the AdamW side-group under matrix optimizers (None: lr)
    kwargs: dict[str, Any] = {}  # passed through to the library optimizer (keys: KWARGS[name])

    @model_validator(mode="after")
    def _known_kwargs(self) -> "OptimizerConfig":
        if self.name in KWARGS and (bad := sorted(set(self.kwargs) - KWARGS[self.name])):
            raise ValueError(f"kwargs: unknown key {bad[0]!r} for optimizer {self.name!r}; "
                             f"accepted: {sorted(KWARGS[self.name])}")
        return self


class ScheduleConfig(Strict):
    name: Literal["cosine", "wsd", "linear", "constant"] = "cosine"
    warmup: Fraction = 0.05  # fraction of total steps
    min_lr_ratio: Fraction = 0.1
    decay: Fraction = 0.2  # WSD: fraction of total steps in the final decay
