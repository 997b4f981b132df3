"""The ``environment_parameters`` of run options and of a run config: constants, samplers
(uniform, gaussian, multi-range uniform) and curricula of lessons with completion criteria
(see :mod:`rlfleet.envs.parameters` and :mod:`rlfleet.envs.curriculum`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym

from rlfleet.envs.curriculum import CompletionCriteria, EnvironmentParameterSettings, Lesson
from rlfleet.envs.parameters import (
    SAMPLER_ALIASES,
    SAMPLER_CLASSES,
    ConstantSampler,
    Sampler,
    unknown_builtin_parameters,
)
from rlfleet.runs.options_reader import KeyPath, OptionsReader, describe


def read_environment_parameters(
    reader: OptionsReader, data: Any, path: KeyPath, behaviors: Sequence[str] | None
) -> dict[str, EnvironmentParameterSettings]:
    """Parameters by name; ``behaviors`` None accepts any behavior name in criteria."""
    data = reader.mapping(data, path, "environment parameters")
    out: dict[str, EnvironmentParameterSettings] = {}
    for name, value in data.items():
        where = (*path, name)
        if not isinstance(name, str) or not name:
            raise reader.error(where, "a parameter name must be a non-empty string")
        if isinstance(value, Mapping) and "curriculum" in value:
            extra = [k for k in value if k != "curriculum"]
            if extra:
                raise reader.unknown_key(where, extra[0], ["curriculum"])
            out[name] = read_curriculum(
                reader, value["curriculum"], (*where, "curriculum"), behaviors
            )
        else:
            sampler = read_sampler(reader, value, where)
            out[name] = EnvironmentParameterSettings([Lesson(sampler.sampler_type, sampler)])
    return out


def read_sampler(reader: OptionsReader, value: Any, path: KeyPath) -> Sampler:
    """A number (constant) or ``{sampler_type: ..., sampler_parameters: {...}}``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return ConstantSampler(float(value))
    if not isinstance(value, Mapping):
        raise reader.error(
            path,
            "expected a number, a sampler {sampler_type, sampler_parameters} or "
            f"{{curriculum: [lessons]}}, got {describe(value)}",
        )
    for key in value:
        if key not in ("sampler_type", "sampler_parameters"):
            raise reader.unknown_key(path, key, ["sampler_type", "sampler_parameters"])
    kind = value.get("sampler_type")
    kind = SAMPLER_ALIASES.get(kind, kind) if isinstance(kind, str) else kind
    if not isinstance(kind, str) or kind not in SAMPLER_CLASSES:
        raise reader.error(
            (*path, "sampler_type"),
            f"expected one of {', '.join(SAMPLER_CLASSES)}, got {kind!r}",
        )
    params_path = (*path, "sampler_parameters")
    sampler = reader.build(SAMPLER_CLASSES[kind], value.get("sampler_parameters"), params_path)
    problem = sampler.problem()
    if problem:
        first_key = next(
            iter(reader.mapping(value.get("sampler_parameters"), params_path, "")), None
        )
        raise reader.error(params_path if first_key is None else (*params_path, first_key), problem)
    return sampler


def read_curriculum(
    reader: OptionsReader, data: Any, path: KeyPath, behaviors: Sequence[str] | None
) -> EnvironmentParameterSettings:
    if not isinstance(data, list) or not data:
        raise reader.error(path, f"expected a non-empty list of lessons, got {describe(data)}")
    lessons: list[Lesson] = []
    for i, raw in enumerate(data):
        where = (*path, i)
        raw = reader.mapping(raw, where, "lesson settings (name, value, completion_criteria)")
        for key in raw:
            if key not in ("name", "value", "completion_criteria"):
                raise reader.unknown_key(where, key, ["name", "value", "completion_criteria"])
        for key in ("name", "value"):
            if key not in raw:
                raise reader.error((*where, key), "required key missing")
        if not isinstance(raw["name"], str):
            raise reader.error((*where, "name"), f"expected a string, got {describe(raw['name'])}")
        criteria = None
        if raw.get("completion_criteria") is not None:
            criteria = reader.build(
                CompletionCriteria, raw["completion_criteria"], (*where, "completion_criteria")
            )
            check_criteria(reader, criteria, (*where, "completion_criteria"), behaviors)
        elif i < len(data) - 1:
            raise reader.error(
                where, "needs completion_criteria (only the last lesson may omit them)"
            )
        lessons.append(
            Lesson(raw["name"], read_sampler(reader, raw["value"], (*where, "value")), criteria)
        )
    return EnvironmentParameterSettings(lessons)


def check_criteria(
    reader: OptionsReader,
    criteria: CompletionCriteria,
    path: KeyPath,
    behaviors: Sequence[str] | None,
) -> None:
    if behaviors is not None and criteria.behavior not in behaviors:
        raise reader.error(
            (*path, "behavior"),
            f"{criteria.behavior!r} is not a behavior of this run (behaviors: "
            f"{', '.join(behaviors)})",
        )
    if criteria.measure == "progress" and not 0.0 <= criteria.threshold <= 1.0:
        raise reader.error(
            (*path, "threshold"),
            f"{criteria.threshold} is outside [0, 1], the range of measure 'progress' "
            "(the fraction of max_steps done)",
        )


def check_builtin_parameters(
    reader: OptionsReader, env_id: str, parameters: Mapping[str, EnvironmentParameterSettings]
) -> None:
    if not parameters or ":" in env_id:
        return
    entry_point = gym.registry[env_id].entry_point
    if not isinstance(entry_point, str):
        return
    unknown, known = unknown_builtin_parameters(entry_point, list(parameters))
    if unknown:
        raise reader.error(
            ("environment_parameters", unknown[0]),
            f"{env_id} has no settable parameter {unknown[0]!r} (it has: {', '.join(known)})",
        )


def parse_environment_parameters(data: Any, where: str) -> dict[str, EnvironmentParameterSettings]:
    """The ``environment_parameters`` section of a run config; completion criteria may name
    any behavior (a run config trains one)."""
    return read_environment_parameters(OptionsReader(data, where, {}), data, (), None)
