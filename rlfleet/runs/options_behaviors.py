"""The ``behaviors`` (and ``default_settings``) of run options: the algorithm, its
hyperparameters and trainer settings, except those a behavior key owns (see
:data:`~rlfleet.runs.run_options.OWNED_HYPERPARAMETERS`), and the behavior's reward signals."""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from collections.abc import Mapping
from typing import Any, TypeVar

from rlfleet.algos.registry import get_algorithm, list_algorithms
from rlfleet.errors import ConfigError
from rlfleet.runs.options_reader import KeyPath, OptionsReader, describe
from rlfleet.runs.options_signals import read_reward_signals
from rlfleet.runs.run_options import (
    OWNED_HYPERPARAMETERS,
    OWNED_TRAINER_SETTINGS,
    BehaviorSettings,
    EnvSettings,
)
from rlfleet.train.loop import TrainerConfig

T = TypeVar("T")


def read_behavior(reader: OptionsReader, data: Any, path: KeyPath) -> BehaviorSettings:
    """One behavior: its algorithm (``trainer_type``) decides what its hyperparameters are."""
    data = reader.mapping(data, path, "behavior settings")
    names = [f.name for f in dataclasses.fields(BehaviorSettings)]
    for key in data:
        if key not in names:
            raise reader.unknown_key(path, key, names)
    trainer_type = data.get("trainer_type", "ppo")
    if not isinstance(trainer_type, str):
        raise reader.error(
            (*path, "trainer_type"), f"expected a string, got {describe(trainer_type)}"
        )
    try:
        algo_cls = get_algorithm(trainer_type)
    except ConfigError:
        close = difflib.get_close_matches(trainer_type.lower(), list_algorithms(), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise reader.error(
            (*path, "trainer_type"),
            f"unknown algorithm {trainer_type!r}{hint} (available: {', '.join(list_algorithms())})",
        ) from None
    hp = read_owned_free(reader,
        algo_cls.config_class, data.get("hyperparameters"), (*path, "hyperparameters"),
        OWNED_HYPERPARAMETERS,
    )  # fmt: skip
    trainer = read_owned_free(reader,
        TrainerConfig, data.get("trainer_settings"), (*path, "trainer_settings"),
        OWNED_TRAINER_SETTINGS,
    )  # fmt: skip
    signals = read_reward_signals(reader, data.get("reward_signals"), (*path, "reward_signals"))
    rest = {
        k: v
        for k, v in data.items()
        if k not in ("hyperparameters", "trainer_settings", "reward_signals")
    }
    return reader.build(
        BehaviorSettings, rest, path,
        trainer_type=algo_cls.name, hyperparameters=hp, trainer_settings=trainer,
        reward_signals=signals,
    )  # fmt: skip


def read_owned_free(
    reader: OptionsReader, cls: type[T], data: Any, path: KeyPath, owned: Mapping[str, str]
) -> T:
    """``cls`` from a section that may not set the fields behavior keys own."""
    data = reader.mapping(data, path, f"{cls.__name__} settings")
    for key in data:
        if key in owned:
            raise reader.error((*path, key), f"set by the behavior key {owned[key]}, not here")
    return reader.build(cls, data, path)


def check_behavior(
    reader: OptionsReader, behavior: BehaviorSettings, path: KeyPath, env: EnvSettings
) -> None:
    if behavior.network_settings.memory is not None:
        raise reader.error(
            (*path, "network_settings", "memory"),
            f"{behavior.trainer_type} has no recurrent policy in rlfleet yet; set memory: null",
        )
    hp = behavior.hyperparameters
    if hasattr(hp, "num_steps") and hasattr(hp, "batch_size"):
        rollout = behavior.time_horizon * env.num_envs
        if hp.batch_size > rollout:
            raise reader.error(
                (*path, "hyperparameters", "batch_size"),
                f"{hp.batch_size} is larger than the rollout (time_horizon x num_envs = "
                f"{behavior.time_horizon} x {env.num_envs} = {rollout})",
            )
    signals = behavior.reward_signals
    gamma = signals.discount()
    differing = [name for name in signals.enabled() if getattr(signals, name).gamma != gamma]
    if differing:
        warnings.warn(
            f"{reader.where((*path, 'reward_signals'))}: reward signal(s) {differing} have a "
            f"gamma other than {gamma}; rlfleet discounts the combined reward with one gamma "
            f"({gamma}) — see docs/reward-signals-and-curricula.md",
            UserWarning,
            stacklevel=3,
        )
