"""Reading a run options file: YAML (plus ``--set`` overrides and flags) into
:class:`~rlfleet.runs.run_options.RunOptions`, everything checked before anything runs.

Checks: unknown keys (closest valid key suggested; ML-Agents keys that rlfleet names
differently get a hint), wrong types, values out of range, sampler bounds, curricula
naming unknown behaviors or lessons that can never end, more behaviors than the env has,
an unregistered env id, parameters a built-in env does not have, a missing demonstration
file, ``resume`` together with ``force``. Errors name file, line and key
(:mod:`rlfleet.runs.options_reader`); the sections are read by
:mod:`rlfleet.runs.options_behaviors`, :mod:`rlfleet.runs.options_signals` and
:mod:`rlfleet.runs.options_parameters` (the last two also read those sections of a run
config).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym

from rlfleet.config.loader import merge
from rlfleet.config.located import LocatedDict, parse_yaml, read_config_text
from rlfleet.errors import ConfigError
from rlfleet.runs.config import is_multi_agent_env
from rlfleet.runs.options_behaviors import check_behavior, read_behavior
from rlfleet.runs.options_mlagents import Notes, translate_root
from rlfleet.runs.options_parameters import check_builtin_parameters, read_environment_parameters
from rlfleet.runs.options_reader import KeyPath, OptionsReader, describe, dotted
from rlfleet.runs.run_options import (
    BehaviorSettings,
    CheckpointSettings,
    EnvSettings,
    RunOptions,
    TorchSettings,
)

_SECTIONS = {f.name for f in dataclasses.fields(RunOptions)}
_OPTIONAL_SECTION_TYPES: dict[str, type[Any]] = {
    "torch_settings": TorchSettings,
    "checkpoint_settings": CheckpointSettings,
}


def parse_run_options(
    data: Any,
    source: str = "<run options>",
    *,
    overrides: Sequence[str] = (),
    flags: Mapping[str, Any] | None = None,
) -> RunOptions:
    """Validate parsed YAML (or a plain dict) into :class:`RunOptions`.

    Args:
        data: the parsed document (:func:`~rlfleet.config.located.parse_yaml` output keeps
            line numbers for the errors).
        source: the file name errors start with.
        overrides: ``--set`` arguments, ``dotted.key=value`` (the value is read as YAML).
        flags: command-line flags for ``checkpoint_settings`` (``run_id``, ``results_dir``,
            ``resume``, ``force``, ``initialize_from``); None values are left alone.
    """
    if data is None:
        data = LocatedDict()
        data.line, data.lines = 1, {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: expected a mapping with sections {', '.join(sorted(_SECTIONS))}, "
            f"got {describe(data)}"
        )
    root: dict[Any, Any] = _copy(data)
    override_where: dict[KeyPath, str] = {}
    for text in overrides:
        path = apply_override(root, text)
        override_where[path] = f"--set {text}"
    for key, value in (flags or {}).items():
        section = root.setdefault("checkpoint_settings", {})
        if value is not None and isinstance(section, dict):  # else validation reports it
            section[key] = value
            override_where[("checkpoint_settings", key)] = f"--{key.replace('_', '-')}"
    reader = OptionsReader(data, source, override_where)
    notes = Notes()
    translate_root(reader, root, notes)
    for key in root:
        if key not in _SECTIONS:
            raise reader.unknown_key((), key, sorted(_SECTIONS))
    if root.get("env_settings") is None:
        raise reader.error(("env_settings",), "required section missing (it names env_id)")
    env = reader.build(EnvSettings, root["env_settings"], ("env_settings",))
    check_env_id(reader, env.env_id)
    sections = {
        name: reader.build(cls, root.get(name), (name,))
        for name, cls in _OPTIONAL_SECTION_TYPES.items()
    }
    checkpoint: CheckpointSettings = sections["checkpoint_settings"]
    check_checkpoint_settings(reader, checkpoint)

    default_raw = reader.mapping(
        root.get("default_settings"), ("default_settings",), "behavior settings"
    )
    default = (
        read_behavior(reader, default_raw, ("default_settings",), env, Notes(emit=False))
        if root.get("default_settings") is not None
        else None
    )
    behaviors_raw = reader.mapping(root.get("behaviors"), ("behaviors",), "behaviors")
    if len(behaviors_raw) > 1 and not is_multi_agent_env(env.env_id):
        second = list(behaviors_raw)[1]
        raise reader.error(
            ("behaviors", second),
            f"a Gymnasium env has one behavior, and behaviors names {len(behaviors_raw)} "
            f"({', '.join(map(str, behaviors_raw))}); multi-behavior runs come with "
            "PettingZoo envs (env_id: pettingzoo:<module>)",
        )
    if not behaviors_raw:
        behaviors_raw = {env.env_id: None}
    behaviors: dict[str, BehaviorSettings] = {}
    for name, raw in behaviors_raw.items():
        if not isinstance(name, str) or not name:
            raise reader.error(("behaviors", name), "a behavior name must be a non-empty string")
        own = reader.mapping(raw, ("behaviors", name), "behavior settings")
        path = ("behaviors", name)
        behaviors[name] = read_behavior(reader, merge(default_raw, own), path, env, notes)
        check_behavior(reader, behaviors[name], path, env, checkpoint, notes)
    parameters = read_environment_parameters(
        reader, root.get("environment_parameters"), ("environment_parameters",), list(behaviors)
    )
    check_builtin_parameters(reader, env.env_id, parameters)
    return RunOptions(
        env_settings=env,
        behaviors=behaviors,
        default_settings=default,
        environment_parameters=parameters,
        torch_settings=sections["torch_settings"],
        checkpoint_settings=checkpoint,
    )


def load_run_options(
    path: str | Path, *, overrides: Sequence[str] = (), flags: Mapping[str, Any] | None = None
) -> RunOptions:
    """Read and validate a run options file (see :func:`parse_run_options`)."""
    path = Path(path)
    text = read_config_text(path, "run options file")
    return parse_run_options(
        parse_yaml(text, str(path)), str(path), overrides=overrides, flags=flags
    )


def check_env_id(reader: OptionsReader, env_id: str) -> None:
    """A plain id must be registered; ``module:EnvId`` is checked when the env is built
    (checking would mean importing the module now)."""
    if ":" in env_id:
        return
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise reader.error(("env_settings", "env_id"), f"unknown Gymnasium env id {env_id!r}{hint}")


def check_checkpoint_settings(reader: OptionsReader, settings: CheckpointSettings) -> None:
    if settings.resume and settings.force:
        raise reader.error(
            ("checkpoint_settings", "force"),
            "resume and force contradict each other (continue the run, or replace it)",
        )
    run_id = settings.run_id
    if run_id is not None and (not run_id.strip() or "/" in run_id or run_id in (".", "..")):
        raise reader.error(
            ("checkpoint_settings", "run_id"),
            f"{run_id!r} is not a directory name (no '/', not empty, not '.' or '..')",
        )


def apply_override(root: dict[Any, Any], text: str) -> KeyPath:
    """Apply ``dotted.key=value`` to ``root`` in place; returns the key path."""
    key, sep, raw = text.partition("=")
    path = tuple(part for part in key.strip().split("."))
    if not sep or not all(path):
        raise ConfigError(
            f"--set {text}: expected dotted.key=value, e.g. "
            "behaviors.CartPole.hyperparameters.learning_rate=3e-4"
        )
    value = parse_yaml(raw, f"--set {text}") if raw.strip() else None
    node = root
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(
                f"--set {text}: {dotted(path[: i + 1])} is {describe(child)}, not a section"
            )
        node = child
    node[path[-1]] = value
    return path


def _copy(data: Any) -> Any:
    """Plain nested dicts/lists (overrides must not touch the located original)."""
    if isinstance(data, Mapping):
        return {k: _copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_copy(v) for v in data]
    return data
