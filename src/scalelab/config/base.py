"""Shared pieces of the params schema: strict sections, constrained number and name types, the params error."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]

NAME = re.compile(r"^[A-Za-z0-9_.-]+$")  # anything that reaches a command line or a path
# A name of a grid axis, a size, a variant, a recipe or an optimizer: DVC pastes these into `cmd` lines and paths,
# so a name like `x;touch pwned;#` must fail at load time instead of running in a shell.
Name = Annotated[str, StringConstraints(pattern=NAME.pattern)]


class Strict(BaseModel):
    """Every section forbids unknown keys, so a typo fails at load time with the key path named; every float is
    finite (YAML's `.inf`/`.nan` parse as floats and would pass `gt=0`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ParamsError(ValueError):
    """Bad params: the message names the key path and what is allowed."""
