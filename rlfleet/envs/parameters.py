"""Environment parameters: values drawn from samplers and applied to an env at every reset.

The protocol an env follows to take parameters (checked in this order):

1. **``set_parameters(**values)``** — a method of the (unwrapped) env that takes the
   parameter values by name as floats, before the reset that starts the episode. It
   raises ``KeyError``, ``TypeError`` or ``ValueError`` for a name it does not know.
2. **Built-in classic-control support** — the physical constants of Gymnasium's
   classic-control envs (:data:`BUILTIN_PARAMETERS`): e.g. CartPole's ``gravity``,
   ``masscart``, ``masspole``, ``length`` (half the pole), ``force_mag``, ``tau``;
   Pendulum's ``g``, ``m``, ``l``, ``dt``. Constants derived from them (CartPole's total
   mass) are recomputed. Constants that fix an observation or action bound (Pendulum's
   ``max_speed`` and ``max_torque``) are left out: changing them would make the spaces lie.

:class:`EnvParameterWrapper` wraps each sub-env of a vector env and draws new values at
every reset of that sub-env, so under next-step autoreset every episode of every sub-env
gets its own draw. Draws come from a generator seeded by ``(reset seed, episode number)``:
repeatable with a seed, and resumable, since both numbers are saved with the env state.
A native vector env (CartPole's) has no per-sub-env reset to hook into, so a vector env
with parameters is built in ``sync`` mode (:func:`rlfleet.envs.make.make_vec_env` switches
to it automatically when wrappers are given).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from rlfleet.config.fields import NonNegativeFloat
from rlfleet.errors import EnvSpecError


# ------------------------------------------------------------------ samplers
@dataclass
class ConstantSampler:
    """Always the same value."""

    sampler_type: ClassVar[str] = "constant"
    value: float
    """The value."""

    def sample(self, rng: np.random.Generator) -> float:
        return float(self.value)

    def problem(self) -> str | None:
        """Why these parameters cannot be sampled, or None."""
        return None


@dataclass
class UniformSampler:
    """Uniform in ``[min_value, max_value]``."""

    sampler_type: ClassVar[str] = "uniform"
    min_value: float
    """Lower bound."""
    max_value: float
    """Upper bound (at least ``min_value``)."""

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.min_value, self.max_value))

    def problem(self) -> str | None:
        if self.min_value > self.max_value:
            return f"min_value ({self.min_value}) is greater than max_value ({self.max_value})"
        return None


@dataclass
class GaussianSampler:
    """Normal with mean ``mean`` and standard deviation ``st_dev``."""

    sampler_type: ClassVar[str] = "gaussian"
    mean: float
    """Mean."""
    st_dev: NonNegativeFloat
    """Standard deviation."""

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.normal(self.mean, self.st_dev))

    def problem(self) -> str | None:
        return f"st_dev ({self.st_dev}) is negative" if self.st_dev < 0 else None


@dataclass
class MultiRangeUniformSampler:
    """Uniform over a union of intervals: an interval is picked with probability
    proportional to its length, then a value uniformly inside it."""

    sampler_type: ClassVar[str] = "multirange_uniform"
    intervals: list[tuple[float, float]]
    """``[[min, max], ...]``, each with ``min <= max``."""

    def sample(self, rng: np.random.Generator) -> float:
        lengths = np.array([high - low for low, high in self.intervals], dtype=np.float64)
        total = lengths.sum()
        probs = lengths / total if total > 0 else None
        low, high = self.intervals[int(rng.choice(len(self.intervals), p=probs))]
        return float(rng.uniform(low, high))

    def problem(self) -> str | None:
        if not self.intervals:
            return "intervals is empty"
        for i, (low, high) in enumerate(self.intervals):
            if low > high:
                return f"interval {i} has min ({low}) greater than max ({high})"
        return None


Sampler = ConstantSampler | UniformSampler | GaussianSampler | MultiRangeUniformSampler
SAMPLER_CLASSES: dict[str, type[Sampler]] = {
    cls.sampler_type: cls
    for cls in (ConstantSampler, UniformSampler, GaussianSampler, MultiRangeUniformSampler)
}
SAMPLER_ALIASES = {"multirangeuniform": "multirange_uniform"}
"""ML-Agents' spelling of a sampler type, accepted when run options are loaded."""


# ------------------------------------------------------- applying to an env
@dataclass(frozen=True)
class BuiltinParameters:
    """Settable constants of a built-in env, and what to recompute after setting them."""

    names: tuple[str, ...]
    derive: Callable[[Any], None] | None = None


def _cartpole_derived(env: Any) -> None:
    env.total_mass = env.masspole + env.masscart
    env.polemass_length = env.masspole * env.length


_ACROBOT = (
    "LINK_LENGTH_1", "LINK_LENGTH_2", "LINK_MASS_1", "LINK_MASS_2", "LINK_COM_POS_1",
    "LINK_COM_POS_2", "LINK_MOI", "dt",
)  # fmt: skip
BUILTIN_PARAMETERS: dict[str, BuiltinParameters] = {
    "gymnasium.envs.classic_control.cartpole:CartPoleEnv": BuiltinParameters(
        ("gravity", "masscart", "masspole", "length", "force_mag", "tau"), _cartpole_derived
    ),
    "gymnasium.envs.classic_control.pendulum:PendulumEnv": BuiltinParameters(("g", "m", "l", "dt")),
    "gymnasium.envs.classic_control.mountain_car:MountainCarEnv": BuiltinParameters(
        ("force", "gravity")
    ),
    "gymnasium.envs.classic_control.continuous_mountain_car:Continuous_MountainCarEnv": (
        BuiltinParameters(("power",))
    ),
    "gymnasium.envs.classic_control.acrobot:AcrobotEnv": BuiltinParameters(_ACROBOT),
}
"""Entry point of a classic-control env -> the constants rlfleet can set on it."""


def _entry_point(env: Any) -> str:
    cls = type(env)
    return f"{cls.__module__}:{cls.__qualname__}"


def unknown_builtin_parameters(entry_point: str, names: list[str]) -> tuple[list[str], list[str]]:
    """For a built-in env's entry point: (names it does not have, names it has); for any
    other entry point ``([], [])`` — such envs are checked when first reset."""
    builtin = BUILTIN_PARAMETERS.get(entry_point)
    if builtin is None:
        return [], []
    return [n for n in names if n not in builtin.names], list(builtin.names)


def apply_parameters(env: gym.Env[Any, Any], values: Mapping[str, float]) -> None:
    """Set parameter values on an (unwrapped) env by the protocol in the module docstring.

    Raises:
        EnvSpecError: the env takes no parameters, or not one of these names.
    """
    setter = getattr(env, "set_parameters", None)
    if callable(setter):
        try:
            setter(**values)
        except (KeyError, TypeError, ValueError) as err:
            raise EnvSpecError(
                f"{_entry_point(env)}.set_parameters refused {dict(values)}: {err}"
            ) from err
        return
    builtin = BUILTIN_PARAMETERS.get(_entry_point(env))
    if builtin is None:
        raise EnvSpecError(
            f"{_entry_point(env)} takes no environment parameters: give it a "
            "set_parameters(**values) method (see rlfleet.envs.parameters), or use a "
            "classic-control env with built-in support"
        )
    unknown = [name for name in values if name not in builtin.names]
    if unknown:
        raise EnvSpecError(
            f"{_entry_point(env)} has no parameter(s) {unknown}; settable: "
            f"{', '.join(builtin.names)}"
        )
    for name, value in values.items():
        setattr(env, name, float(value))
    if builtin.derive is not None:
        builtin.derive(env)


class EnvParameterWrapper(gym.Wrapper[Any, Any, Any, Any]):
    """Draws parameter values at every reset and applies them before the episode starts.

    Args:
        env: the env to wrap.
        samplers: parameter name -> sampler; replaced with :meth:`set_parameter_samplers`
            (e.g. by a curriculum, through ``VectorEnv.call``).
    """

    def __init__(self, env: gym.Env[Any, Any], samplers: Mapping[str, Sampler]) -> None:
        super().__init__(env)
        self.samplers = dict(samplers)
        # Plain ints so that rlfleet.envs.state saves and restores them with the env.
        self.parameter_seed = int(np.random.SeedSequence().entropy % 2**63)  # type: ignore[operator]
        self.parameter_episode = 0
        self.parameter_values: dict[str, float] = {}
        """The values of the current episode."""

    def set_parameter_samplers(self, samplers: Mapping[str, Sampler]) -> None:
        """Use these samplers from the next reset on."""
        self.samplers = dict(samplers)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if seed is not None:
            self.parameter_seed, self.parameter_episode = int(seed), 0
        rng = np.random.default_rng([self.parameter_seed, self.parameter_episode])
        self.parameter_episode += 1
        values = {name: self.samplers[name].sample(rng) for name in sorted(self.samplers)}
        apply_parameters(self.env.unwrapped, values)
        self.parameter_values = values
        return self.env.reset(seed=seed, options=options)
