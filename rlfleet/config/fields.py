"""Constrained field types shared by config dataclasses.

The constraints are ``annotated_types`` markers: plain ``int``/``float`` to mypy and to the
CLI, and checked by pydantic when a config is validated (YAML, CLI or Python API).

The upper bounds are sanity limits, far above any run that fits on one machine: a value
beyond them is a typo (an extra zero) that would otherwise end in a crash deep inside torch
or the kernel (a segfault from too many threads, ``MemoryError`` from a 10⁸-wide layer).
"""

from __future__ import annotations

from typing import Annotated

from annotated_types import Ge, Gt, Interval, Le

PositiveInt = Annotated[int, Gt(0)]
NonNegativeInt = Annotated[int, Ge(0)]
PositiveFloat = Annotated[float, Gt(0)]
NonNegativeFloat = Annotated[float, Ge(0)]
UnitFloat = Annotated[float, Interval(ge=0.0, le=1.0)]
"""A float in [0, 1]."""

MAX_SEED = 2**32 - 1
"""The largest seed: every seeded library (numpy, torch, gymnasium, ALE) takes 32-bit seeds."""
Seed = Annotated[int, Interval(ge=0, le=MAX_SEED)]
"""A seed in [0, 2³² - 1]."""

MAX_TORCH_THREADS = 1024
"""The most CPU threads torch is given (far more make its thread pool crash)."""
ThreadCount = Annotated[int, Gt(0), Le(MAX_TORCH_THREADS)]
"""A CPU thread count in [1, :data:`MAX_TORCH_THREADS`]."""

MAX_LAYER_WIDTH = 65_536
"""The widest network layer (hidden units, LSTM size, convolution channels)."""
LayerWidth = Annotated[int, Gt(0), Le(MAX_LAYER_WIDTH)]
"""A layer width in [1, :data:`MAX_LAYER_WIDTH`]."""

MAX_LAYERS = 1_000
"""The most hidden layers of one network."""
LayerCount = Annotated[int, Gt(0), Le(MAX_LAYERS)]
"""A number of hidden layers in [1, :data:`MAX_LAYERS`]."""

MAX_ENVS = 65_536
"""The most envs stepped together in one vector env."""
EnvCount = Annotated[int, Gt(0), Le(MAX_ENVS)]
"""A number of envs in [1, :data:`MAX_ENVS`]."""

OpenUnitFloat = Annotated[float, Interval(gt=0.0, lt=1.0)]
"""A float in (0, 1), such as a factor that reduces something."""
