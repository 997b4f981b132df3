"""PettingZoo environments as ``num_envs`` copies stepped together, one report per agent turn.

PettingZoo has two APIs. A Parallel env takes one action from every live agent per step; an
AEC (agent-environment cycle) env takes one action from ``agent_selection`` per step, and
rewards an agent for what happened between two of its turns. :class:`MultiAgentVecEnv`
hides the difference behind one model:

- :attr:`MultiAgentVecEnv.acting` lists the agents that must act now, one
  :class:`AgentReport` per (env copy, agent): its observation, its action mask, and the
  reward it collected since its previous action (0 on its first turn).
- :meth:`MultiAgentVecEnv.step` applies one action per acting report and returns the
  reports of agents that left (terminated or truncated), each with its final observation and
  last reward, and the returns of episodes that ended. An env copy whose agents are all gone
  is reset at once (autoreset), so :attr:`acting` always holds the next turns.

Agents may join or leave mid-episode: an agent acts only while the env lists it. Observations
that are a dict of ``observation`` and ``action_mask`` (the classic board games) are split:
the policy sees ``observation``, the mask restricts its actions; a mask in ``info`` is
honoured too.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from rlfleet.envs.spaces import describe_space
from rlfleet.errors import EnvSpecError, MissingDependencyError
from rlfleet.nn.mlp import flat_size

MASK_KEY = "action_mask"
OBS_KEY = "observation"

EnvFactory = Callable[[], Any]


@dataclass(frozen=True)
class AgentReport:
    """What one agent in one env copy reports: a turn to take, or its exit."""

    env_id: int
    agent: str
    obs: np.ndarray
    """Observation for the policy (the ``observation`` part of a masked dict observation)."""
    reward: float
    """Reward collected since the agent's previous action (0 on its first turn)."""
    terminated: bool = False
    truncated: bool = False
    mask: np.ndarray | None = None
    """Legal actions (bool, one per action) when the env gives a mask."""


@dataclass(frozen=True)
class EpisodeEnd:
    """An episode of one env copy ended: every agent's return over it."""

    env_id: int
    returns: dict[str, float]
    length: int
    """Agent turns taken in the episode (all agents counted)."""


def is_pettingzoo_env(env: Any) -> bool:
    """Duck-typed: PettingZoo envs have ``possible_agents`` and per-agent space methods."""
    return all(
        hasattr(env, name)
        for name in ("possible_agents", "observation_space", "action_space", "reset", "step")
    )


def is_aec_env(env: Any) -> bool:
    """AEC envs step one agent at a time; ``agent_iter`` walks their turns.

    (``agent_selection`` is no test: PettingZoo's wrappers refuse it before a reset.)
    """
    return hasattr(env, "agent_iter")


def load_pettingzoo_factory(target: str) -> EnvFactory:
    """An env factory for ``pettingzoo:<module>`` (``pettingzoo:pettingzoo.classic.tictactoe_v3``).

    The module's ``env`` function (AEC) is used; ``<module>:parallel_env`` picks another.
    """
    name = target.removeprefix("pettingzoo:")
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        if err.name and err.name.split(".")[0] in ("pettingzoo", "mpe2"):
            raise MissingDependencyError(
                f"env {target!r}: expected PettingZoo to be installed, got {err}; "
                "install it with `pip install 'rlfleet[pettingzoo]'`"
            ) from err
        raise EnvSpecError(
            f"env {target!r}: expected an importable PettingZoo env module, got {err}"
        ) from err
    factory = getattr(module, attr or "env", None)
    if not callable(factory):
        raise EnvSpecError(
            f"env {target!r}: expected module {module_name!r} to have a callable "
            f"{attr or 'env'!r} (PettingZoo env modules have env() and parallel_env())"
        )
    return factory  # type: ignore[no-any-return]


def policy_observation_space(space: spaces.Space[Any]) -> spaces.Space[Any]:
    """The space the policy sees: the ``observation`` part of a masked dict observation."""
    if isinstance(space, spaces.Dict) and OBS_KEY in space.spaces and MASK_KEY in space.spaces:
        return space.spaces[OBS_KEY]
    return space


class MultiAgentVecEnv:
    """``num_envs`` copies of one PettingZoo env (Parallel or AEC), stepped in lockstep.

    Args:
        env_fn: builds one env copy (called ``num_envs`` times).
        num_envs: copies.
        seed: copy ``i`` is first reset with ``seed + i``; later resets continue its RNG.

    Raises:
        EnvSpecError: the object built is not a PettingZoo env, or has no agents.
    """

    def __init__(self, env_fn: EnvFactory, num_envs: int, *, seed: int | None = None) -> None:
        if num_envs < 1:
            raise EnvSpecError(f"MultiAgentVecEnv: expected num_envs >= 1, got {num_envs}")
        self.envs = [env_fn() for _ in range(num_envs)]
        first = self.envs[0]
        if not is_pettingzoo_env(first):
            raise EnvSpecError(
                "MultiAgentVecEnv: expected a PettingZoo Parallel or AEC env (with "
                "possible_agents, observation_space(agent), action_space(agent), reset, step), "
                f"got {type(first).__name__}"
            )
        self.num_envs = num_envs
        self.aec = is_aec_env(first)
        self.possible_agents: list[str] = list(first.possible_agents)
        if not self.possible_agents:
            raise EnvSpecError(
                f"MultiAgentVecEnv: {type(first).__name__}.possible_agents is empty; expected "
                "at least one agent"
            )
        self.raw_observation_spaces = {a: first.observation_space(a) for a in self.possible_agents}
        self.observation_spaces = {
            a: policy_observation_space(s) for a, s in self.raw_observation_spaces.items()
        }
        self.action_spaces: dict[str, spaces.Space[Any]] = {
            a: first.action_space(a) for a in self.possible_agents
        }
        self.acting: list[AgentReport] = []
        """Turns to take now, at most one per (env copy, agent)."""
        self._returns: list[dict[str, float]] = [{} for _ in range(num_envs)]
        self._lengths = np.zeros(num_envs, dtype=np.int64)
        self._seed = seed
        self._states: dict[int, np.ndarray] = {}

    # ------------------------------------------------------------------ spaces
    def has_masks(self, agent: str) -> bool:
        """Whether the agent's observations carry an action mask."""
        return self.raw_observation_spaces[agent] is not self.observation_spaces[agent]

    def state(self, env_id: int) -> np.ndarray:
        """The global state of one copy (for a centralized critic), computed once per step:
        every agent of the copy asks for the same state."""
        cached = self._states.get(env_id)
        if cached is None:
            cached = np.asarray(self.envs[env_id].state(), dtype=np.float32).reshape(-1)
            self._states[env_id] = cached
        return cached

    def state_size(self) -> int:
        """Length of the flattened global state.

        Raises:
            EnvSpecError: the env does not implement ``state()``.
        """
        space = getattr(self.envs[0], "state_space", None)
        if isinstance(space, spaces.Box):
            return flat_size(tuple(space.shape))
        try:
            # PettingZoo refuses state() before the first reset; that reset is redone by
            # reset() before any step, so it changes nothing.
            self.envs[0].reset(seed=self._seed)
            return int(self.state(0).size)
        except (NotImplementedError, AttributeError, AssertionError) as err:
            raise EnvSpecError(
                f"centralized critic: expected {type(self.envs[0]).__name__} to implement "
                "state() (the global state the critic sees), got "
                f"{type(err).__name__}: {err}"
            ) from err

    # ------------------------------------------------------------------ stepping
    def reset(self, seed: int | None = None) -> None:
        """Start a new episode in every copy; copy ``i`` is seeded ``seed + i`` (default: the
        seed given at construction)."""
        self.acting = []
        base = self._seed if seed is None else seed
        for env_id in range(self.num_envs):
            seed = None if base is None else base + env_id
            self.acting.extend(self._reset_copy(env_id, seed))

    def step(
        self, actions: Mapping[tuple[int, str], Any]
    ) -> tuple[list[AgentReport], list[EpisodeEnd]]:
        """Apply one action per acting report, keyed by ``(env_id, agent)``.

        Returns the exits (agents that terminated or were truncated, with their final
        observation and last reward) and the episodes that ended. :attr:`acting` then holds
        the next turns, first turns of fresh episodes included.
        """
        exits: list[AgentReport] = []
        ended: list[EpisodeEnd] = []
        self._states.clear()
        by_env: dict[int, dict[str, Any]] = {}
        for report in self.acting:
            by_env.setdefault(report.env_id, {})[report.agent] = actions[
                (report.env_id, report.agent)
            ]
        acting: list[AgentReport] = []
        for env_id, env_actions in by_env.items():
            if self.aec:
                turns = self._step_aec(env_id, env_actions, exits)
            else:
                turns = self._step_parallel(env_id, env_actions, exits)
            self._lengths[env_id] += len(env_actions)
            if turns is None:
                ended.append(
                    EpisodeEnd(env_id, dict(self._returns[env_id]), int(self._lengths[env_id]))
                )
                turns = self._reset_copy(env_id, None)
            acting.extend(turns)
        self.acting = acting
        return exits, ended

    def close(self) -> None:
        """Close every copy."""
        for env in self.envs:
            env.close()

    # ------------------------------------------------------------------ internals
    def _reset_copy(self, env_id: int, seed: int | None) -> list[AgentReport]:
        env = self.envs[env_id]
        self._states.pop(env_id, None)
        self._returns[env_id] = {}
        self._lengths[env_id] = 0
        if self.aec:
            env.reset(seed=seed)
            turns = self._next_aec_turn(env_id, [])
            if turns is None:
                raise EnvSpecError(
                    f"{type(env).__name__}: expected a live agent after reset, got none"
                )
            return turns
        observations, infos = env.reset(seed=seed)
        return [
            self._report(env_id, agent, obs, 0.0, False, False, infos.get(agent, {}))
            for agent, obs in observations.items()
        ]

    def _step_parallel(
        self, env_id: int, actions: dict[str, Any], exits: list[AgentReport]
    ) -> list[AgentReport] | None:
        env = self.envs[env_id]
        observations, rewards, terminations, truncations, infos = env.step(actions)
        turns: list[AgentReport] = []
        for agent, obs in observations.items():
            report = self._report(
                env_id,
                agent,
                obs,
                float(rewards.get(agent, 0.0)),
                bool(terminations.get(agent, False)),
                bool(truncations.get(agent, False)),
                infos.get(agent, {}),
            )
            if report.terminated or report.truncated:
                exits.append(report)
            else:
                turns.append(report)
        return turns if turns and env.agents else None

    def _step_aec(
        self, env_id: int, actions: dict[str, Any], exits: list[AgentReport]
    ) -> list[AgentReport] | None:
        ((_, action),) = actions.items()
        self.envs[env_id].step(action)
        return self._next_aec_turn(env_id, exits)

    def _next_aec_turn(self, env_id: int, exits: list[AgentReport]) -> list[AgentReport] | None:
        """Retire agents that are done (PettingZoo wants a ``None`` action from each) until a
        live agent's turn comes; None when no agent is left."""
        env = self.envs[env_id]
        while env.agents:
            agent = env.agent_selection
            obs, reward, terminated, truncated, info = env.last()
            report = self._report(
                env_id, agent, obs, float(reward), bool(terminated), bool(truncated), info
            )
            if not (terminated or truncated):
                return [report]
            exits.append(report)
            env.step(None)
        return None

    def _report(
        self,
        env_id: int,
        agent: str,
        obs: Any,
        reward: float,
        terminated: bool,
        truncated: bool,
        info: Mapping[str, Any],
    ) -> AgentReport:
        self._returns[env_id][agent] = self._returns[env_id].get(agent, 0.0) + reward
        mask = info.get(MASK_KEY) if isinstance(info, Mapping) else None
        if isinstance(obs, Mapping) and MASK_KEY in obs:
            mask = obs[MASK_KEY]
            obs = obs[OBS_KEY]
        return AgentReport(
            env_id=env_id,
            agent=agent,
            obs=np.asarray(obs),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            mask=None if mask is None else np.asarray(mask, dtype=bool),
        )


def check_agent_spaces(
    env: MultiAgentVecEnv, agent: str, algorithm: Any, obs_space: spaces.Space[Any]
) -> None:
    """Refuse an algorithm that cannot act in the agent's spaces (at construction).

    ``obs_space`` is the space the algorithm must accept (the agent's observation space, with
    the agent-id feature when parameters are shared).
    """
    action_space = env.action_spaces[agent]
    try:
        type(algorithm).check_spaces(obs_space, action_space)
    except EnvSpecError as err:
        raise EnvSpecError(f"agent {agent!r}: {err}") from err
    for label, expected, received in (
        ("observation", obs_space, algorithm.observation_space),
        ("action", action_space, algorithm.action_space),
    ):
        if tuple(expected.shape or ()) != tuple(received.shape or ()) or type(expected) is not type(
            received
        ):
            raise EnvSpecError(
                f"agent {agent!r}: expected its algorithm ({algorithm.name}) to be built for "
                f"{label} space {describe_space(expected)}, got {describe_space(received)}"
            )


def agent_names(names: Sequence[str]) -> str:
    """Agent names for messages."""
    return ", ".join(repr(n) for n in names)
