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


CopyStep = tuple[list[AgentReport], list[AgentReport], EpisodeEnd | None]
"""What stepping one copy gives: its exits, its next turns, and the episode that ended."""


class EnvCopy:
    """One copy of a PettingZoo env and what :class:`MultiAgentVecEnv` tracks of it: the
    agents' returns and the turns taken in the current episode.

    Args:
        env_id: the copy's index, written into its reports.
        env: the PettingZoo env (Parallel or AEC).
    """

    def __init__(self, env_id: int, env: Any) -> None:
        self.env_id = env_id
        self.env = env
        self.aec = is_aec_env(env)
        self.returns: dict[str, float] = {}
        self.length = 0
        self._state: np.ndarray | None = None

    def reset(self, seed: int | None) -> list[AgentReport]:
        """Start a new episode; returns the first turns."""
        env = self.env
        self._state = None
        self.returns = {}
        self.length = 0
        if self.aec:
            env.reset(seed=seed)
            turns = self._next_aec_turn([])
            if turns is None:
                raise EnvSpecError(
                    f"{type(env).__name__}: expected a live agent after reset, got none"
                )
            return turns
        observations, infos = env.reset(seed=seed)
        return [
            self._report(agent, obs, 0.0, False, False, infos.get(agent, {}))
            for agent, obs in observations.items()
        ]

    def step(self, actions: dict[str, Any]) -> CopyStep:
        """Apply one action per acting agent; returns the exits, the next turns and the
        episode that ended (then the copy was reset and the turns are the new episode's)."""
        exits: list[AgentReport] = []
        self._state = None
        if self.aec:
            ((_, action),) = actions.items()
            self.env.step(action)
            turns = self._next_aec_turn(exits)
        else:
            turns = self._step_parallel(actions, exits)
        self.length += len(actions)
        if turns is not None:
            return exits, turns, None
        ended = EpisodeEnd(self.env_id, dict(self.returns), self.length)
        return exits, self.reset(None), ended

    def state(self) -> np.ndarray:
        """The global state (for a centralized critic), computed once per step."""
        if self._state is None:
            self._state = np.asarray(self.env.state(), dtype=np.float32).reshape(-1)
        return self._state

    def state_size(self, seed: int | None) -> int:
        """Length of the flattened global state.

        Raises:
            EnvSpecError: the env does not implement ``state()``.
        """
        space = getattr(self.env, "state_space", None)
        if isinstance(space, spaces.Box):
            return flat_size(tuple(space.shape))
        try:
            # PettingZoo refuses state() before the first reset; that reset is redone by
            # MultiAgentVecEnv.reset() before any step, so it changes nothing.
            self.env.reset(seed=seed)
            self._state = None
            return int(self.state().size)
        except (NotImplementedError, AttributeError, AssertionError) as err:
            raise EnvSpecError(
                f"centralized critic: expected {type(self.env).__name__} to implement "
                "state() (the global state the critic sees), got "
                f"{type(err).__name__}: {err}"
            ) from err

    def _step_parallel(
        self, actions: dict[str, Any], exits: list[AgentReport]
    ) -> list[AgentReport] | None:
        env = self.env
        observations, rewards, terminations, truncations, infos = env.step(actions)
        turns: list[AgentReport] = []
        for agent, obs in observations.items():
            report = self._report(
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

    def _next_aec_turn(self, exits: list[AgentReport]) -> list[AgentReport] | None:
        """Retire agents that are done (PettingZoo wants a ``None`` action from each) until a
        live agent's turn comes; None when no agent is left."""
        env = self.env
        while env.agents:
            agent = env.agent_selection
            obs, reward, terminated, truncated, info = env.last()
            report = self._report(
                agent, obs, float(reward), bool(terminated), bool(truncated), info
            )
            if not (terminated or truncated):
                return [report]
            exits.append(report)
            env.step(None)
        return None

    def _report(
        self,
        agent: str,
        obs: Any,
        reward: float,
        terminated: bool,
        truncated: bool,
        info: Mapping[str, Any],
    ) -> AgentReport:
        self.returns[agent] = self.returns.get(agent, 0.0) + reward
        mask = info.get(MASK_KEY) if isinstance(info, Mapping) else None
        if isinstance(obs, Mapping) and MASK_KEY in obs:
            mask = obs[MASK_KEY]
            obs = obs[OBS_KEY]
        return AgentReport(
            env_id=self.env_id,
            agent=agent,
            obs=np.asarray(obs),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            mask=None if mask is None else np.asarray(mask, dtype=bool),
        )


class MultiAgentVecEnv:
    """``num_envs`` copies of one PettingZoo env (Parallel or AEC), stepped in lockstep.

    Args:
        env_fn: builds one env copy (called ``num_envs`` times).
        num_envs: copies.
        seed: copy ``i`` is first reset with ``seed + i``; later resets continue its RNG.

    Raises:
        EnvSpecError: the object built is not a PettingZoo env, or has no agents.

    :class:`rlfleet.marl.workers.WorkerMultiAgentVecEnv` steps each copy in a subprocess
    instead, with the same results.
    """

    def __init__(self, env_fn: EnvFactory, num_envs: int, *, seed: int | None = None) -> None:
        check_num_envs(type(self).__name__, num_envs)
        self.envs = [env_fn() for _ in range(num_envs)]
        self._describe(self.envs[0], num_envs, seed)
        self._copies = [EnvCopy(i, env) for i, env in enumerate(self.envs)]

    def _describe(self, first: Any, num_envs: int, seed: int | None) -> None:
        """Read the agents and spaces from one copy, and set up the bookkeeping."""
        name = type(self).__name__
        if not is_pettingzoo_env(first):
            raise EnvSpecError(
                f"{name}: expected a PettingZoo Parallel or AEC env (with "
                "possible_agents, observation_space(agent), action_space(agent), reset, step), "
                f"got {type(first).__name__}"
            )
        self.num_envs = num_envs
        self.aec = is_aec_env(first)
        self.possible_agents: list[str] = list(first.possible_agents)
        if not self.possible_agents:
            raise EnvSpecError(
                f"{name}: {type(first).__name__}.possible_agents is empty; expected "
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
        self._seed = seed

    # ------------------------------------------------------------------ spaces
    def has_masks(self, agent: str) -> bool:
        """Whether the agent's observations carry an action mask."""
        return self.raw_observation_spaces[agent] is not self.observation_spaces[agent]

    def state(self, env_id: int) -> np.ndarray:
        """The global state of one copy (for a centralized critic), computed once per step:
        every agent of the copy asks for the same state."""
        return self._copies[env_id].state()

    def state_size(self) -> int:
        """Length of the flattened global state.

        Raises:
            EnvSpecError: the env does not implement ``state()``.
        """
        return self._copies[0].state_size(self._seed)

    # ------------------------------------------------------------------ stepping
    def reset(self, seed: int | None = None) -> None:
        """Start a new episode in every copy; copy ``i`` is seeded ``seed + i`` (default: the
        seed given at construction)."""
        base = self._seed if seed is None else seed
        seeds = [None if base is None else base + env_id for env_id in range(self.num_envs)]
        self.acting = self._reset_copies(seeds)

    def step(
        self, actions: Mapping[tuple[int, str], Any]
    ) -> tuple[list[AgentReport], list[EpisodeEnd]]:
        """Apply one action per acting report, keyed by ``(env_id, agent)``.

        Returns the exits (agents that terminated or were truncated, with their final
        observation and last reward) and the episodes that ended. :attr:`acting` then holds
        the next turns, first turns of fresh episodes included.
        """
        by_env: dict[int, dict[str, Any]] = {}
        for report in self.acting:
            by_env.setdefault(report.env_id, {})[report.agent] = actions[
                (report.env_id, report.agent)
            ]
        exits: list[AgentReport] = []
        ended: list[EpisodeEnd] = []
        acting: list[AgentReport] = []
        for copy_exits, turns, end in self._step_copies(by_env):
            exits.extend(copy_exits)
            acting.extend(turns)
            if end is not None:
                ended.append(end)
        self.acting = acting
        return exits, ended

    def close(self) -> None:
        """Close every copy."""
        for env in self.envs:
            env.close()

    # ------------------------------------------------------------------ copies
    def _reset_copies(self, seeds: list[int | None]) -> list[AgentReport]:
        """Reset every copy (copy ``i`` with ``seeds[i]``); their first turns in copy order."""
        return [turn for c, seed in zip(self._copies, seeds, strict=True) for turn in c.reset(seed)]

    def _step_copies(self, by_env: dict[int, dict[str, Any]]) -> list[CopyStep]:
        """Step the copies that have actions: each one's exits, next turns and ended
        episode, in the order of ``by_env``."""
        return [self._copies[env_id].step(actions) for env_id, actions in by_env.items()]


def check_num_envs(name: str, num_envs: int) -> None:
    """Refuse fewer than one env copy."""
    if num_envs < 1:
        raise EnvSpecError(f"{name}: expected num_envs >= 1, got {num_envs}")


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
