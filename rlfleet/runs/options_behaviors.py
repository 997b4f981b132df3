"""The ``behaviors`` (and ``default_settings``) of run options: the algorithm, its
hyperparameters and trainer settings, except those a behavior key owns (see
:data:`~rlfleet.runs.run_options.OWNED_HYPERPARAMETERS`), and the behavior's reward signals.
ML-Agents' names are rewritten into rlfleet's first (:mod:`rlfleet.runs.options_mlagents`)."""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from collections.abc import Mapping
from typing import Any, TypeVar

from rlfleet.algos.kinds import ImitationPolicy
from rlfleet.algos.registry import get_algorithm, list_algorithms
from rlfleet.errors import ConfigError
from rlfleet.runs.config import is_multi_agent_env
from rlfleet.runs.options_mlagents import Notes, translate_behavior
from rlfleet.runs.options_reader import KeyPath, OptionsReader, describe, dotted
from rlfleet.runs.options_signals import read_reward_signals
from rlfleet.runs.run_options import (
    OWNED_HYPERPARAMETERS,
    OWNED_TRAINER_SETTINGS,
    BehaviorSettings,
    CheckpointSettings,
    EnvSettings,
)
from rlfleet.train.behavioral_cloning import check_demo_path
from rlfleet.train.loop import TrainerConfig

T = TypeVar("T")


def read_behavior(
    reader: OptionsReader, data: Any, path: KeyPath, env: EnvSettings, notes: Notes
) -> BehaviorSettings:
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
    if algo_cls.kind == "offline":
        raise reader.error(
            (*path, "trainer_type"),
            f"{algo_cls.name} learns from a dataset, which run options do not name; expected "
            f"an on-policy, off-policy or actor-learner algorithm (train {algo_cls.name} with "
            f"`rlfleet train {algo_cls.name} --dataset DIR`)",
        )
    hp_fields = {f.name for f in dataclasses.fields(algo_cls.config_class)}
    data = translate_behavior(reader, data, path, algo_cls.name, hp_fields, env.num_envs, notes)
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


_GYMNASIUM_ONLY = {
    "self_play": (
        "self-play needs a game of several agents, and a Gymnasium env has one; set "
        "self_play: null, or train a PettingZoo game (env_id: pettingzoo:<module>, see "
        "docs/multi-agent.md)"
    ),
    "agents": (
        "names the agents of a PettingZoo game, and a Gymnasium env has one agent; remove it"
    ),
}
"""Behavior keys a Gymnasium run refuses -> why."""


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
    reader: OptionsReader,
    behavior: BehaviorSettings,
    path: KeyPath,
    env: EnvSettings,
    checkpoint: CheckpointSettings,
    notes: Notes,
) -> None:
    hp = behavior.hyperparameters
    hp_fields = {f.name for f in dataclasses.fields(hp)}
    network = behavior.network_settings
    net_path = (*path, "network_settings")
    if network.memory is not None and "lstm_hidden_size" not in hp_fields:
        raise reader.error(
            (*net_path, "memory"),
            f"{behavior.trainer_type} has no recurrent policy in rlfleet (ppo and a2c "
            "have one); set memory: null",
        )
    if network.deterministic:
        notes.add(
            f"{reader.where((*net_path, 'deterministic'))}: network_settings.deterministic "
            "noted: test episodes and exported policies act deterministically, and training "
            "samples actions"
        )
    if not is_multi_agent_env(env.env_id):
        for key, why in _GYMNASIUM_ONLY.items():
            if getattr(behavior, key) is not None:
                raise reader.error((*path, key), why)
    elif behavior.agents is not None and not behavior.agents:
        raise reader.error((*path, "agents"), "expected a list of agent names, got []")
    if behavior.self_play is not None and behavior.self_play.team_change_steps > behavior.max_steps:
        # ML-Agents warns likewise: the other teams would only ever play untrained snapshots.
        notes.add(
            f"{reader.where((*path, 'self_play'))}: self_play.team_change "
            f"({behavior.self_play.team_change_steps} learner steps) exceeds max_steps "
            f"({behavior.max_steps}): the learning team never changes, so the other teams "
            "never learn"
        )
    cloning = behavior.behavioral_cloning
    if cloning is not None:
        cloning_path = (*path, "behavioral_cloning")
        if not issubclass(get_algorithm(behavior.trainer_type), ImitationPolicy):
            raise reader.error(
                cloning_path,
                f"{behavior.trainer_type} has no imitation loss in rlfleet (ppo and sac have "
                "one); set behavioral_cloning: null",
            )
        demo_path = (*cloning_path, "demo_path")
        check_demo_path(cloning.demo_path, f"{reader.where(demo_path)}: {dotted(demo_path)}")
    if behavior.even_checkpoints and behavior.keep_checkpoints == 0:
        raise reader.error(
            (*path, "even_checkpoints"),
            "spaces checkpoints max_steps / keep_checkpoints apart, and keep_checkpoints is 0",
        )
    if behavior.init_path is not None and checkpoint.initialize_from is not None:
        raise reader.error(
            (*path, "init_path"),
            "init_path and checkpoint_settings.initialize_from both name the weights to start "
            "from; keep one",
        )
    batch_size = getattr(hp, "batch_size", None)
    if hasattr(hp, "num_steps") and batch_size is not None:
        # (IMPALA and APPO have no batch_size of their own: a batch is one rollout.)
        rollout = behavior.time_horizon * env.num_envs
        if batch_size > rollout:
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
