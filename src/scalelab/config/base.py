"""Shared pieces of the params schema: strict sections, constrained number types, the params error."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]


class Strict(BaseModel):
    """Every section forbids unknown keys, so a typo fails at load time with the key path named."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ParamsError(ValueError):
    """Bad params: the message names the key path and what is allowed."""
