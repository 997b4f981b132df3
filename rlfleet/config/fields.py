"""Constrained field types shared by config dataclasses.

The constraints are ``annotated_types`` markers: plain ``int``/``float`` to mypy and to the
CLI, and checked by pydantic when a config is validated (YAML, CLI or Python API).
"""

from __future__ import annotations

from typing import Annotated

from annotated_types import Ge, Gt, Interval

PositiveInt = Annotated[int, Gt(0)]
NonNegativeInt = Annotated[int, Ge(0)]
PositiveFloat = Annotated[float, Gt(0)]
NonNegativeFloat = Annotated[float, Ge(0)]
UnitFloat = Annotated[float, Interval(ge=0.0, le=1.0)]
"""A float in [0, 1]."""
