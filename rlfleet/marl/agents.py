"""The agents of a multi-agent game: :class:`Agents` (which algorithm plays each agent,
whether it learns and explores; the policy a multi-agent run trains and saves),
:func:`make_agents` (one algorithm per agent, or one shared), and the uniformly random player
used as a baseline opponent."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from rlfleet.algos.base import Algorithm
from rlfleet.errors import CheckpointError, ConfigError, EnvSpecError
from rlfleet.marl.envs import EnvFactory, MultiAgentVecEnv, agent_names, is_pettingzoo_env
from rlfleet.nn.masks import masked_uniform
from rlfleet.nn.mlp import flat_size
from rlfleet.nn.optim import NanPolicy
from rlfleet.types import PolicyStep


@dataclass
class RandomAgentConfig:
    """The random agent has no hyperparameters."""


class RandomAgent(Algorithm[RandomAgentConfig]):
    """Uniformly random legal actions, greedy or not (there is nothing to be greedy about).

    Its update learns nothing, so it can sit in a game with ``learning_mask`` true or false.
    """

    name = "random"
    supports_masks = True
    supports_images = True  # it reads no observation, so images need no encoder
    kind = "off_policy"
    config_class = RandomAgentConfig
    action_spaces = (spaces.Discrete, spaces.Box)
    observation_spaces = (spaces.Space,)

    def __init__(
        self,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        config: RandomAgentConfig | None = None,
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__(
            observation_space, action_space, config or RandomAgentConfig(), seed=seed, device=device
        )

    def _build(self) -> None:
        """No networks."""

    def act(
        self,
        obs: torch.Tensor,
        *,
        deterministic: bool = False,
        action_mask: torch.Tensor | None = None,
        state: torch.Tensor | None = None,
    ) -> PolicyStep:
        self.refuse_unsupported_inputs(None, state)
        if action_mask is not None:
            return PolicyStep(actions=masked_uniform(action_mask, self.generator))
        n = obs.shape[0]
        space = self.action_space
        if isinstance(space, spaces.Discrete):
            return PolicyStep(actions=torch.randint(int(space.n), (n,), generator=self.generator))
        low = torch.as_tensor(space.low, dtype=torch.float32)  # type: ignore[attr-defined]
        high = torch.as_tensor(space.high, dtype=torch.float32)  # type: ignore[attr-defined]
        unit = torch.rand((n, *low.shape), generator=self.generator)
        return PolicyStep(actions=low + unit * (high - low))

    def update(self, batch: Any, **_: Any) -> dict[str, float]:
        """Nothing to learn."""
        return {}

    def modules(self) -> dict[str, nn.Module]:
        return {}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {}


class AgentGroup(NamedTuple):
    """One distinct algorithm of a game and the agents it plays for."""

    name: str
    """Its agents' names joined by ``+`` (``player_1``; ``player_1+player_2`` when shared)."""
    agents: list[str]
    algorithm: Algorithm[Any]
    learning: bool
    """Stores what its agents see and is updated (false: frozen, weights never change)."""
    exploring: bool
    """Acts with its exploring policy in training (false: greedy)."""


class Agents:
    """The agents of one multi-agent game as one policy: what a multi-agent training loop
    trains, ``save_best_fn`` receives, a checkpoint saves and
    :func:`rlfleet.runs.run.load_algorithm` returns for a multi-agent run.

    Args:
        names: the env's agents (``possible_agents`` order).
        algorithms: one algorithm per agent, in that order, or a mapping by agent name.
            Agents given the same algorithm object share it (parameter sharing: build them
            with :func:`make_agents`).
        learning_mask: one flag per agent (default: all learn). A frozen agent stores nothing
            and is never updated, so its weights stay bitwise identical.
        exploration_mask: one flag per agent (default: all explore, frozen agents too, as in
            rbgame). A greedy agent acts deterministically in training too; test episodes are
            always greedy.

    Raises:
        ConfigError: the algorithms or masks do not match the agents, or agents sharing an
            algorithm have different flags.
    """

    def __init__(
        self,
        names: Sequence[str],
        algorithms: Sequence[Algorithm[Any]] | Mapping[str, Algorithm[Any]],
        learning_mask: Sequence[bool] | None = None,
        exploration_mask: Sequence[bool] | None = None,
    ) -> None:
        self.names = list(names)
        if isinstance(algorithms, Mapping):
            if set(algorithms) != set(self.names):
                raise ConfigError(
                    f"agents: expected one algorithm for each of the env's agents "
                    f"[{agent_names(self.names)}], got [{agent_names(list(algorithms))}]"
                )
            ordered = [algorithms[a] for a in self.names]
        else:
            ordered = list(algorithms)
        if len(ordered) != len(self.names) or not all(isinstance(a, Algorithm) for a in ordered):
            raise ConfigError(
                f"agents: expected {len(self.names)} rlfleet algorithms, one per env agent "
                f"[{agent_names(self.names)}] in that order, got {len(ordered)} object(s): "
                f"{[type(a).__name__ for a in ordered]}"
            )
        self.algorithms: list[Algorithm[Any]] = ordered
        """One algorithm per agent (a shared one repeated)."""
        learning = (
            [True] * len(self.names)
            if learning_mask is None
            else _flags(learning_mask, self.names, "learning_mask")
        )
        exploring = (
            [True] * len(self.names)
            if exploration_mask is None
            else _flags(exploration_mask, self.names, "exploration_mask")
        )
        members: dict[int, list[str]] = {}
        for agent, algorithm in zip(self.names, ordered, strict=True):
            members.setdefault(id(algorithm), []).append(agent)
        self.groups: list[AgentGroup] = []
        """The distinct algorithms, in order of their first agent."""
        for group in members.values():
            flags = {(learning[self.names.index(a)], exploring[self.names.index(a)]) for a in group}
            if len(flags) > 1:
                raise ConfigError(
                    f"agents {agent_names(group)} share one algorithm, so expected equal "
                    f"learning_mask and exploration_mask entries for them, got {sorted(flags)}"
                )
            ((is_learning, is_exploring),) = flags
            self.groups.append(
                AgentGroup(
                    "+".join(group),
                    group,
                    ordered[self.names.index(group[0])],
                    is_learning,
                    is_exploring,
                )
            )

    def __getitem__(self, agent: str) -> Algorithm[Any]:
        """The algorithm that plays ``agent``."""
        return self.algorithms[self.names.index(agent)]

    @property
    def learning_columns(self) -> list[int]:
        """Indices (in :attr:`names` order) of the learning agents, or of every agent when
        none learns: the columns whose mean is the default score and training return."""
        learning = [i for i, a in enumerate(self.names) if self._group_of(a).learning]
        return learning or list(range(len(self.names)))

    def _group_of(self, agent: str) -> AgentGroup:
        return next(g for g in self.groups if agent in g.agents)

    @property
    def shared(self) -> bool:
        """Whether some agents share an algorithm."""
        return len(self.groups) < len(self.names)

    @property
    def name(self) -> str:
        """The distinct algorithms' names joined by ``+`` (``ppo``; ``ppo+random``)."""
        return "+".join(dict.fromkeys(g.algorithm.name for g in self.groups))

    @property
    def gradient_steps(self) -> int:
        """Gradient steps of all the algorithms together."""
        return sum(g.algorithm.gradient_steps for g in self.groups)

    @property
    def skipped_batches(self) -> int:
        """Skipped optimiser steps of all the algorithms together."""
        return sum(g.algorithm.skipped_batches for g in self.groups)

    @property
    def lr_scale(self) -> float:
        """The learning agents' learning-rate multiplier (reduce-on-plateau lowers it)."""
        return next((g.algorithm.lr_scale for g in self.groups if g.learning), 1.0)

    @lr_scale.setter
    def lr_scale(self, value: float) -> None:
        for group in self.groups:
            if group.learning:
                group.algorithm.lr_scale = value

    @property
    def nan_policy(self) -> NanPolicy:
        """What a non-finite loss or gradient does in any of the algorithms."""
        return self.groups[0].algorithm.nan_policy

    @nan_policy.setter
    def nan_policy(self, value: NanPolicy) -> None:
        for group in self.groups:
            group.algorithm.nan_policy = value

    def set_progress(self, progress: float) -> None:
        """Progress through the training budget, for the learning agents' schedules (a
        frozen agent keeps its own)."""
        for group in self.groups:
            if group.learning:
                group.algorithm.set_progress(progress)

    def state_dict(self) -> dict[str, Any]:
        """Every distinct algorithm's state: ``{"learners": {group: {"algorithm_name",
        "algorithm"}}}`` (checkpoints add each learner's storage to the same entries)."""
        return {
            "learners": {
                g.name: {"algorithm_name": g.algorithm.name, "algorithm": g.algorithm.state_dict()}
                for g in self.groups
            }
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (or a multi-agent checkpoint's learners).

        Raises:
            CheckpointError: the state holds other groups of agents or other algorithms.
        """
        self.check_learners(state)
        for group in self.groups:
            group.algorithm.load_state_dict(state["learners"][group.name]["algorithm"])

    def learner_names(self) -> dict[str, str]:
        """Each group's name -> its algorithm's name."""
        return {g.name: g.algorithm.name for g in self.groups}

    def check_learners(self, state: Mapping[str, Any]) -> None:
        """Refuse a state saved for other groups of agents or other algorithms."""
        saved = {name: entry["algorithm_name"] for name, entry in state["learners"].items()}
        if saved != self.learner_names():
            raise CheckpointError(
                f"the checkpoint holds learners {saved} (agents -> algorithm), this run has "
                f"{self.learner_names()}; use the same agents and parameter sharing"
            )


def shared_observation_space(space: spaces.Space[Any], group_size: int) -> spaces.Box:
    """The observation space of an algorithm shared by ``group_size`` agents: the agent's
    flattened observation followed by a one-hot agent id."""
    size = flat_size(tuple(space.shape or ()))
    return spaces.Box(-np.inf, np.inf, (size + group_size,), np.float32)


def make_agents(
    env: EnvFactory | Any,
    build: Callable[[spaces.Space[Any], spaces.Space[Any], int], Algorithm[Any]],
    *,
    share_parameters: bool = False,
    seed: int = 0,
) -> list[Algorithm[Any]]:
    """One algorithm per agent, or one shared by all (with the agent-id feature).

    ``build(observation_space, action_space, seed)`` constructs an algorithm; ``env`` is a
    PettingZoo env or a factory of one. Agent ``i`` gets ``seed + i``. Shared parameters
    need every agent to have the same observation and action spaces.
    """
    vec = MultiAgentVecEnv(as_factory(env), 1)
    agents = vec.possible_agents
    if not share_parameters:
        vec.close()
        return [
            build(vec.observation_spaces[a], vec.action_spaces[a], seed + i)
            for i, a in enumerate(agents)
        ]
    first = agents[0]
    for agent in agents[1:]:
        for label, table in (
            ("observation", vec.observation_spaces),
            ("action", vec.action_spaces),
        ):
            if table[agent] != table[first]:
                raise EnvSpecError(
                    f"share_parameters: expected every agent to have {first!r}'s {label} space "
                    f"{table[first]}, got {table[agent]} for {agent!r}"
                )
    shared = build(
        shared_observation_space(vec.observation_spaces[first], len(agents)),
        vec.action_spaces[first],
        seed,
    )
    vec.close()
    return [shared] * len(agents)


def as_factory(env: EnvFactory | Any) -> EnvFactory:
    """A factory of env copies: ``env`` itself when it is one, else copies of ``env``."""
    if is_pettingzoo_env(env):
        # One object cannot be stepped as several copies: clone it per copy.
        return lambda: copy.deepcopy(env)
    if callable(env):
        return env  # type: ignore[no-any-return]
    raise EnvSpecError(
        "expected a PettingZoo env (Parallel or AEC) or a callable that builds one, got "
        f"{type(env).__name__}"
    )


def _flags(mask: Sequence[bool], names: list[str], what: str) -> list[bool]:
    values = list(mask)
    if len(values) != len(names):
        raise ConfigError(
            f"{what}: expected {len(names)} flags, one per agent [{agent_names(names)}], "
            f"got {len(values)}"
        )
    return [bool(v) for v in values]
