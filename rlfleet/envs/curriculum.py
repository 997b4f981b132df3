"""Curricula: environment parameters that move through lessons as the agent improves.

Every environment parameter is a list of lessons (a parameter without a curriculum is one
lesson). A lesson has a value — a constant or a sampler — and, unless it is the last,
``completion_criteria`` that say when to move on (ML-Agents' semantics):

- ``measure: progress`` — the fraction of the behavior's ``max_steps`` done exceeds
  ``threshold``;
- ``measure: reward`` — the mean return of the behavior's last ``min_lesson_length``
  episodes *since the lesson began* exceeds ``threshold``; no decision before that many
  episodes have ended. With ``signal_smoothing`` the measure is blended with its previous
  value, ``0.25 * previous + 0.75 * current`` (starting from 0), so one lucky batch of
  episodes does not end a lesson;
- ``require_reset`` — on moving on, every training env starts a new episode at once
  (otherwise each picks up the new value at its next reset).

Lessons are checked after every training step; a parameter moves at most one lesson per
check. When any parameter moves, the episode buffer starts empty again for all of them.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from rlfleet.config.fields import NonNegativeInt
from rlfleet.envs.parameters import ConstantSampler, EnvParameterWrapper, Sampler
from rlfleet.errors import CheckpointError, ConfigError

SMOOTHING_PREVIOUS_WEIGHT = 0.25
"""Weight of the previous measure under ``signal_smoothing`` (ML-Agents' value)."""


@dataclass
class CompletionCriteria:
    """When a lesson is complete."""

    behavior: str
    """The behavior whose progress or returns are measured."""
    measure: Literal["reward", "progress"] = "reward"
    """``reward``: mean episode return; ``progress``: fraction of ``max_steps`` done."""
    threshold: float = 0.0
    """The lesson is complete once the measure exceeds this (progress: in [0, 1])."""
    min_lesson_length: NonNegativeInt = 0
    """Episodes that must end in the lesson before it can complete; the reward measure
    averages the last this many."""
    signal_smoothing: bool = True
    """Blend the reward measure with its previous value (0.25 previous, 0.75 current)."""
    require_reset: bool = False
    """Start new episodes in every env as soon as the lesson changes."""


@dataclass
class Lesson:
    """One stage of a curriculum."""

    name: str
    """Shown in the progress bar and the logs."""
    value: Sampler
    """The parameter's value: a number, or a sampler drawn from at every episode."""
    completion_criteria: CompletionCriteria | None = None
    """When to move to the next lesson (required on every lesson but the last)."""


@dataclass
class EnvironmentParameterSettings:
    """One environment parameter: its lessons, in order."""

    curriculum: list[Lesson] = field(default_factory=list)
    """At least one lesson; a parameter without a curriculum is one lesson."""

    @staticmethod
    def constant(value: float) -> EnvironmentParameterSettings:
        """A parameter fixed at ``value``."""
        return EnvironmentParameterSettings([Lesson("constant", ConstantSampler(value))])

    @staticmethod
    def sampled(sampler: Sampler) -> EnvironmentParameterSettings:
        """A parameter drawn from ``sampler`` at every episode."""
        return EnvironmentParameterSettings([Lesson(sampler.sampler_type, sampler)])


@dataclass
class LessonChange:
    """What :meth:`EnvParameterManager.observe` found."""

    changed: list[str]
    """Parameters that moved to their next lesson."""
    require_reset: bool
    """One of them asked for every env to start a new episode now."""


class EnvParameterManager:
    """Current lesson of every parameter; pushes their samplers to the envs.

    Args:
        parameters: parameter name -> settings.
        behaviors: names of the behaviors being trained; with one, :meth:`observe` needs no
            behavior name (the Gymnasium case).
    """

    def __init__(
        self, parameters: Mapping[str, EnvironmentParameterSettings], behaviors: Sequence[str]
    ) -> None:
        check_parameters(parameters, behaviors)
        self.parameters = dict(parameters)
        self.behaviors = list(behaviors)
        self.lessons = dict.fromkeys(self.parameters, 0)
        self.smoothed = dict.fromkeys(self.parameters, 0.0)
        # As ML-Agents: one buffer per behavior, as long as the longest min_lesson_length
        # of the lessons that measure it.
        self.returns = {
            b: deque[float](maxlen=max([1, *self._lesson_lengths(b)])) for b in self.behaviors
        }
        self._envs: list[Any] = []

    def _lesson_lengths(self, behavior: str) -> list[int]:
        return [
            lesson.completion_criteria.min_lesson_length
            for settings in self.parameters.values()
            for lesson in settings.curriculum
            if lesson.completion_criteria is not None
            and lesson.completion_criteria.behavior == behavior
        ]

    # ------------------------------------------------------------------ envs
    def samplers(self) -> dict[str, Sampler]:
        """The sampler of every parameter's current lesson."""
        return {
            name: settings.curriculum[self.lessons[name]].value
            for name, settings in self.parameters.items()
        }

    def wrapper(self) -> Callable[[gym.Env[Any, Any]], gym.Env[Any, Any]]:
        """A ``wrappers`` entry for ``make_vec_env``: wraps each sub-env at the current
        lessons (a plain partial, so subprocess workers can unpickle it)."""
        return functools.partial(EnvParameterWrapper, samplers=self.samplers())

    def attach(self, *envs: Any) -> None:
        """Vector envs built with :meth:`wrapper` to keep at the current lessons."""
        self._envs.extend(envs)
        self._push()

    def _push(self) -> None:
        samplers = self.samplers()
        for envs in self._envs:
            envs.call("set_parameter_samplers", samplers)

    # --------------------------------------------------------------- lessons
    def observe(
        self, episode_returns: Sequence[float], progress: float, behavior: str | None = None
    ) -> LessonChange:
        """Record a training step of ``behavior`` (returns of the episodes that ended, and
        the fraction of its ``max_steps`` done) and move lessons whose criteria are met."""
        if behavior is None:
            if len(self.behaviors) != 1:
                raise ConfigError(f"observe() needs a behavior name: this run has {self.behaviors}")
            behavior = self.behaviors[0]
        self.returns[behavior].extend(episode_returns)
        change = LessonChange([], False)
        for name, settings in self.parameters.items():
            index = self.lessons[name]
            criteria = settings.curriculum[index].completion_criteria
            if (
                criteria is None
                or criteria.behavior != behavior
                or index + 1 >= len(settings.curriculum)
            ):
                continue
            if self._complete(name, criteria, self.returns[behavior], progress):
                self.lessons[name] = index + 1
                change.changed.append(name)
                change.require_reset |= criteria.require_reset
        if change.changed:
            for buffer in self.returns.values():
                buffer.clear()
            self._push()
        return change

    def _complete(
        self, name: str, criteria: CompletionCriteria, returns: deque[float], progress: float
    ) -> bool:
        if criteria.measure == "progress":
            return progress > criteria.threshold
        if len(returns) < max(criteria.min_lesson_length, 1):
            return False
        recent = list(returns)[-criteria.min_lesson_length :] if criteria.min_lesson_length else []
        measure = float(np.mean(recent or list(returns)))
        if criteria.signal_smoothing:
            previous = self.smoothed[name]
            measure = (
                SMOOTHING_PREVIOUS_WEIGHT * previous + (1 - SMOOTHING_PREVIOUS_WEIGHT) * measure
            )
            self.smoothed[name] = measure
        return measure > criteria.threshold

    # ------------------------------------------------------------- reporting
    def metrics(self) -> dict[str, float]:
        """``train/lesson/<parameter>``: the current lesson number (from 0) of each
        parameter that has more than one lesson."""
        return {
            f"train/lesson/{name}": float(self.lessons[name])
            for name, settings in self.parameters.items()
            if len(settings.curriculum) > 1
        }

    def describe(self) -> str:
        """Progress-bar text: ``length: long (2/3)`` for each parameter with lessons."""
        parts = [
            f"{name}: {settings.curriculum[self.lessons[name]].name} "
            f"({self.lessons[name] + 1}/{len(settings.curriculum)})"
            for name, settings in self.parameters.items()
            if len(settings.curriculum) > 1
        ]
        return " | ".join(parts)

    # ----------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        return {
            "lessons": dict(self.lessons),
            "smoothed": dict(self.smoothed),
            "returns": {b: list(buffer) for b, buffer in self.returns.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the saved lessons (and push them to the attached envs)."""
        if set(state["lessons"]) != set(self.lessons):
            raise CheckpointError(
                f"checkpoint holds environment parameters {sorted(state['lessons'])}, the "
                f"run has {sorted(self.lessons)}"
            )
        for name, index in state["lessons"].items():
            self.lessons[name] = min(int(index), len(self.parameters[name].curriculum) - 1)
        self.smoothed.update({k: float(v) for k, v in state["smoothed"].items()})
        for behavior, values in state["returns"].items():
            if behavior in self.returns:
                self.returns[behavior].clear()
                self.returns[behavior].extend(float(v) for v in values)
        self._push()


def check_parameters(
    parameters: Mapping[str, EnvironmentParameterSettings], behaviors: Sequence[str]
) -> None:
    """Refuse settings that cannot run: empty curricula, lessons that can never end,
    unknown behaviors, samplers with min > max, progress thresholds outside [0, 1]."""
    for name, settings in parameters.items():
        if not settings.curriculum:
            raise ConfigError(f"environment parameter {name!r}: curriculum has no lessons")
        last = len(settings.curriculum) - 1
        for i, lesson in enumerate(settings.curriculum):
            where = f"environment parameter {name!r}, lesson {i} ({lesson.name!r})"
            problem = lesson.value.problem()
            if problem:
                raise ConfigError(f"{where}: {problem}")
            criteria = lesson.completion_criteria
            if criteria is None:
                if i < last:
                    raise ConfigError(
                        f"{where}: needs completion_criteria (only the last lesson may omit them)"
                    )
                continue
            if criteria.behavior not in behaviors:
                raise ConfigError(
                    f"{where}: completion_criteria.behavior {criteria.behavior!r} is not a "
                    f"behavior of this run (behaviors: {', '.join(behaviors)})"
                )
            if criteria.measure == "progress" and not 0.0 <= criteria.threshold <= 1.0:
                raise ConfigError(
                    f"{where}: threshold {criteria.threshold} for measure 'progress' must be "
                    "in [0, 1] (the fraction of max_steps done)"
                )
