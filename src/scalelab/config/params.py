"""The whole params file: its sections, cross-checks between them, and loading with one-line errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError, model_validator

from scalelab.config import machine
from scalelab.config.base import Name, NonNegInt, ParamsError, Strict
from scalelab.config.compress import CompressConfig
from scalelab.config.data import PrepareConfig, TokenizeConfig, TokenizerConfig
from scalelab.config.evaluate import EvaluateConfig
from scalelab.config.hidden_decoding import HiddenDecodingConfig
from scalelab.config.model import ArchConfig, ModelConfig
from scalelab.config.optim import OptimizerConfig
from scalelab.config.optbench import OptBenchConfig
from scalelab.config.pretrain import PretrainConfig, ScalingConfig
from scalelab.runtime import yamlio


class TrackingConfig(Strict):
    experiment: str = "scalelab"


class Params(Strict):
    seed: NonNegInt = 0
    tracking: TrackingConfig = TrackingConfig()
    prepare: PrepareConfig = PrepareConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    tokenize: TokenizeConfig = TokenizeConfig()
    model: ArchConfig
    optim: dict[Name, OptimizerConfig]
    pretrain: PretrainConfig
    scaling: ScalingConfig = ScalingConfig()
    evaluate: EvaluateConfig | None = None  # evaluation cells and the report (config/evaluate.py)
    hidden_decoding: HiddenDecodingConfig | None = None  # docs/hidden-decoding.md
    compress: CompressConfig | None = None  # docs/compression.md
    optimizers: OptBenchConfig | None = None  # the optimizer benchmark (docs/optimizers.md)
    # Packaged pretrained LMs to import offline (stage import_model, one cell each: models/<name>; scalelab.model.gguf)
    import_models: list[Name] = []

    @model_validator(mode="after")
    def _cross_check(self) -> "Params":
        g = self.pretrain.grid
        for name in [*g.variants, *g.recipe_variants]:
            if name not in self.model.variants:
                raise ValueError(f"pretrain.grid: unknown variant {name!r}; known: {sorted(self.model.variants)}")
        for name in [*g.sizes, *g.recipe_sizes]:
            if name not in self.model.sizes:
                raise ValueError(f"pretrain.grid: unknown size {name!r}; known: {sorted(self.model.sizes)}")
        for rname, r in self.pretrain.recipes.items():
            if r.optimizer not in self.optim:
                raise ValueError(
                    f"pretrain.recipes.{rname}.optimizer: unknown {r.optimizer!r}; known: {sorted(self.optim)}"
                )
        if self.evaluate is not None and (bad := sorted(set(self.evaluate.sizes) - set(g.sizes))):
            raise ValueError(f"evaluate.sizes: {bad} not in pretrain.grid.sizes {g.sizes}")
        if (ob := self.optimizers) is not None:
            for axis, names, known in (("optimizers", ob.optimizers, self.optim), ("sizes", ob.sizes, self.model.sizes),
                                       ("variant", [ob.variant], self.model.variants)):
                if bad := sorted(set(names) - set(known)):
                    raise ValueError(f"optimizers.{axis}: unknown {bad}; known: {sorted(known)}")
        return self

    def resolve_model(self, size: str, variant: str, vocab_size: int, moe: bool = False,
                      recipe: str | None = None) -> ModelConfig:
        """Resolve the model of one matrix cell. `recipe` (a key of pretrain.recipes) applies that recipe's
        architecture switches: its MoE MLP and its Peri-LN post-branch norm (`post_norm`, None: model.post_norm)."""
        arch = self.model
        if size not in arch.sizes:
            raise ParamsError(f"model.sizes: unknown size {size!r}; known: {sorted(arch.sizes)}")
        if variant not in arch.variants:
            raise ParamsError(f"model.variants: unknown variant {variant!r}; known: {sorted(arch.variants)}")
        shared = arch.model_dump(exclude={"sizes", "variants", "moe"})
        if recipe is not None:
            if recipe not in self.pretrain.recipes:
                raise ParamsError(f"pretrain.recipes: unknown recipe {recipe!r}; "
                                  f"known: {sorted(self.pretrain.recipes)}")
            r = self.pretrain.recipes[recipe]
            moe = moe or r.moe
            if r.post_norm is not None:
                shared["post_norm"] = r.post_norm
        try:
            return ModelConfig(
                vocab_size=vocab_size,
                max_seq_len=self.pretrain.seq_len,
                scale=arch.variants[variant],
                moe=arch.moe if moe else None,
                **shared,
                **arch.sizes[size].model_dump(),
            )
        except ValidationError as err:
            raise ParamsError(_format(err, f"the model of size {size!r}, variant {variant!r}")) from None


def _format(err: ValidationError, source: str) -> str:
    """One line: every error as `key.path: what is wrong`, the offending value when it is short."""
    problems = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"] if p != "[key]"]  # "[key]": the dict key itself is the bad value
        path = ".".join(loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            problems.append(f"{path}: unknown key (typo?); allowed keys are the fields of its section")
        elif e["type"] == "string_pattern_mismatch":
            problems.append(f"{path}: invalid name {e['input']!r}: only letters, digits, '_', '.', '-' (names reach "
                            "command lines and paths)")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            got = e.get("input")
            shown = f" (got {got!r})" if not isinstance(got, (dict, list)) and len(repr(got)) <= 60 else ""
            problems.append(f"{path}: {msg}{shown}")
    return f"invalid params in {source}: " + "; ".join(problems)


def parse_params(raw: dict[str, Any], source: str = "<dict>", machine_file: dict | None = None) -> Params:
    """Validate a params dict; its `machine:` section and then `machine_file`'s settings are merged into its sections
    first (scalelab.config.machine)."""
    raw = machine.resolve(raw, source, machine_file)
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        raise ParamsError(_format(err, source)) from None


def read_yaml(path: str | os.PathLike, compose: bool = True) -> dict[str, Any]:
    """A params file's mapping, unvalidated, composed over its `base:` when it names one (scalelab.config.profiles;
    `compose=False`: as written); one-line errors for a missing file, YAML syntax, a non-mapping."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"params file not found: {path}")
    try:
        with open(path) as f:
            raw = yamlio.safe_load(f) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        what = " ".join(str(getattr(err, "problem", None) or err).split())
        raise ParamsError(f"{path}{where}: YAML syntax error: {what}") from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: top level must be a mapping")
    if compose:
        from scalelab.config import profiles

        raw = profiles.compose(path, raw)
    return raw


def load_params(path: str | os.PathLike | None = None) -> Params:
    """Load and validate a params file (default: params.yaml in the working directory), with this machine's settings
    merged in (scalelab.config.machine: its `machine:` section, then machine.yaml beside it or $SCALELAB_MACHINE)."""
    path = Path(path or "params.yaml")
    raw = read_yaml(path)
    local, source = machine.file_layer(raw, path, str(path))
    return parse_params(raw, source, local)
