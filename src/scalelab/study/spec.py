"""A study's spec, configs/studies/<name>.yaml: what the study runs and where its results live.

    profile: configs/cpu-study.yaml        # the base params file
    params:                                # optional: dotted keys set on top of it (what the cells ran under)
      optim.galore.kwargs.update_proj_gap: 200
    grid:                                  # DVC stage cells: every cell the profile's matrix expands to ...
      - stage: pretrain
      - stage: pretrain_recipe
        cells: ["*-xs-*"]                  # ... or those whose cell name matches one of these patterns
    seeds: [0, 1, 2]                       # cells with a `seed` axis: only these seeds
    generator: scalelab.scale_vectors.claims:cpu_study   # fn(results folder) -> ledger entries
    ledger: metrics/claims_a.json          # where the ledger goes, relative to the results folder
    results: results/cpu-study             # default results/<name>
    estimate_s: {pretrain: 60}             # optional: a cell's cost before any cell of its stage was measured
    store:                                 # optional: partial results that cells longer than a slice write as they go
      param: compress.store                #   the params key naming the folder: set to results/<name>/store
      stages: [compress]                   #   the cells that resume from it (a slice stops them at its deadline)

Validated on load: unknown keys, wrong types and a missing profile fail with one line naming the key.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator, model_validator

from scalelab.runtime import yamlio

SPECS = Path("configs") / "studies"
NAME = r"^[A-Za-z0-9_.-]+$"
GENERATOR = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
Name = Annotated[str, StringConstraints(pattern=NAME)]


class SpecError(ValueError):
    """A bad study spec: one line naming the file and the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class GridEntry(_Strict):
    stage: Name                                    # a stage of dvc.yaml (a matrix/foreach group or a plain stage)
    cells: tuple[str, ...] | None = None           # fnmatch patterns on the cell name (after '@'); None: all

    @field_validator("cells")
    @classmethod
    def _some(cls, v):
        if v is not None and not v:
            raise ValueError("an empty list selects nothing; leave `cells` out to take every cell")
        return v


class StoreEntry(_Strict):
    """A folder of partial results (compress/store.py) committed with the cells: a cell of `stages` writes each piece
    (a converged map) the moment it has it and reads back what is there, so a slice may stop it mid-cell."""
    param: str = Field(pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)+$")
    stages: tuple[Name, ...] = Field(min_length=1)


class StudySpec(_Strict):
    profile: Path
    params: dict[str, Any] = Field(default_factory=dict)
    grid: tuple[GridEntry, ...] = Field(min_length=1)
    seeds: tuple[int, ...] = Field(min_length=1)
    generator: str | None = None
    ledger: str | None = None
    results: Path | None = None
    estimate_s: dict[Name, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    store: StoreEntry | None = None
    name: Name = ""                                # set from the file name by `load`

    @field_validator("generator")
    @classmethod
    def _generator(cls, v):
        if v is not None and not GENERATOR.fullmatch(v):
            raise ValueError(f"{v!r} is not 'package.module:function'")
        return v

    @field_validator("params")
    @classmethod
    def _dotted(cls, v):
        for key in v:
            if not re.fullmatch(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*", str(key)):
                raise ValueError(f"{key!r} is not a dotted params key (section.key...)")
        return v

    @model_validator(mode="after")
    def _ledger_with_generator(self):
        if (self.generator is None) != (self.ledger is None):
            raise ValueError("generator and ledger go together (the generator's entries are written to the ledger)")
        if self.store is not None and self.store.param in self.params:
            raise ValueError(f"params.{self.store.param}: set by store.param (to the study's store folder)")
        if self.store is not None and (stray := set(self.store.stages) - {g.stage for g in self.grid}):
            raise ValueError(f"store.stages: {', '.join(sorted(stray))} not in the grid")
        return self

    def resumable(self, stage: str) -> bool:
        """Whether `stage`'s cells keep their progress in the store: a slice may stop them at its deadline."""
        return self.store is not None and stage in self.store.stages

    def folder(self, root: Path) -> Path:
        """The results folder, results/<name> unless the spec names another."""
        return root / (self.results or Path("results") / self.name)

    def store_folder(self) -> Path | None:
        """The store, relative to the project root (the value store.param is set to): <results folder>/store."""
        return None if self.store is None else (self.results or Path("results") / self.name) / "store"


def spec_path(root: Path, name: str) -> Path:
    return root / SPECS / f"{name}.yaml"


def known(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / SPECS).glob("*.yaml"))


def load(root: Path, name: str) -> StudySpec:
    """The spec of study `name` (configs/studies/<name>.yaml), validated; SpecError in one line otherwise."""
    path = spec_path(root, name)
    rel = path.relative_to(root)
    if not re.fullmatch(NAME, name) or not path.is_file():
        have = ", ".join(known(root)) or "none"
        raise SpecError(f"no study {name!r}: {rel} not found (studies: {have})")
    try:
        raw = yamlio.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise SpecError(f"{rel}{where}: YAML syntax error: {' '.join(str(getattr(err, 'problem', err)).split())}")
    if not isinstance(raw, dict):
        raise SpecError(f"{rel}: top level must be a mapping")
    if "name" in raw:
        raise SpecError(f"{rel}: name: unknown key (the study's name is its file name)")
    try:
        spec = StudySpec.model_validate({**raw, "name": name})
    except ValidationError as err:
        raise SpecError(f"{rel}: {_format(err)}") from None
    if not (root / spec.profile).is_file():
        raise SpecError(f"{rel}: profile: {spec.profile} not found")
    return spec


def _format(err: ValidationError) -> str:
    problems = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            problems.append(f"{key}: unknown key (allowed: {', '.join(_fields(e['loc']))})")
        elif e["type"] == "missing":
            problems.append(f"{key}: required")
        else:
            got = e.get("input")
            shown = f" (got {got!r})" if not isinstance(got, dict | list) and len(repr(got)) <= 60 else ""
            problems.append(f"{key}: {e['msg'].removeprefix('Value error, ')}{shown}")
    return "; ".join(problems)


def _fields(loc: tuple) -> list[str]:
    model = GridEntry if loc and loc[0] == "grid" else StoreEntry if loc and loc[0] == "store" else StudySpec
    return [f for f in model.model_fields if f != "name"]
