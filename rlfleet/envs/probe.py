"""What an environment says about itself under random play: the env probe.

:func:`probe_env` plays a seeded uniformly random policy for a bounded number of steps (at
most :data:`PROBE_STEPS` steps or :data:`PROBE_EPISODES` episodes, under a second for the
classic-control tasks) on the env as training builds it, time limit included, and returns an
:class:`EnvProfile`: the kind of action space, how the observations are bounded and scaled,
how long episodes last and how they end (a true end of the task, or the time limit), and what
the rewards look like (their scale, how many steps carry a nonzero or an unusual reward, what
an episode returns). For continuous actions under a time limit it then plays
:data:`ZERO_ACTION_EPISODES` episodes of the zero action (no torque or force at all) and records
how they end and what they return: doing nothing, against acting at random. The run layer
turns a profile into defaults (:mod:`rlfleet.runs.adapt`).

:class:`RolloutStats` is the measuring part, shared with the env doctor
(:func:`rlfleet.envs.check.check_env`), which steps the raw env itself to check its API.
The same seed gives the same profile: actions come from the action space's own generator,
seeded once, and the env is reset with the seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from gymnasium import spaces

from rlfleet.envs.make import make_env
from rlfleet.errors import EnvSpecError

PROBE_STEPS = 5000
"""Most env steps one probe plays."""
PROBE_EPISODES = 20
"""Most episodes one probe plays (it stops at whichever bound comes first)."""
ZERO_ACTION_EPISODES = 2
"""Episodes of the zero action after the random ones (continuous actions under a time limit;
at most :data:`PROBE_STEPS` steps in all)."""

ActionKind = Literal["discrete", "continuous", "other"]
ObservationKind = Literal["vector", "image", "other"]


@dataclass
class RolloutStats:
    """Running measurements of a rollout, one :meth:`add` per step."""

    rewards: list[float] = field(default_factory=list)
    obs_count: int = 0
    """Numeric, non-uint8 observations summed into :attr:`obs_sum` and :attr:`obs_sq_sum`."""
    obs_sum: np.ndarray | None = None
    """Sum of the flattened observations, entry by entry (float64)."""
    obs_sq_sum: np.ndarray | None = None
    """Sum of their squares."""
    obs_abs_max: float = 0.0
    """Largest magnitude of a numeric, non-uint8 observation entry."""
    episode_lengths: list[int] = field(default_factory=list)
    truncations: int = 0
    """Episodes that ended by truncation (a time limit) rather than termination."""
    terminations: int = 0
    _length: int = 0

    def add(self, obs: Any, reward: float, terminated: bool, truncated: bool) -> None:
        """Record one step: its observation, reward and how it ended, if it did."""
        numeric = isinstance(obs, np.ndarray) and np.issubdtype(obs.dtype, np.number)
        if numeric and obs.dtype != np.uint8:
            self.obs_abs_max = max(self.obs_abs_max, float(np.abs(obs).max(initial=0.0)))
            self._add_observation(obs.astype(np.float64).ravel())
        self.rewards.append(float(reward))
        self._length += 1
        if terminated or truncated:
            self.episode_lengths.append(self._length)
            self._length = 0
            if terminated:
                self.terminations += 1
            else:
                self.truncations += 1

    def _add_observation(self, flat: np.ndarray) -> None:
        if self.obs_sum is None or self.obs_sq_sum is None:
            self.obs_sum = np.zeros_like(flat)
            self.obs_sq_sum = np.zeros_like(flat)
        if flat.shape != self.obs_sum.shape:
            return  # a shape the space does not declare: the env doctor reports it
        self.obs_sum += flat
        self.obs_sq_sum += flat * flat
        self.obs_count += 1

    @property
    def episodes(self) -> int:
        """Episodes that ended."""
        return len(self.episode_lengths)

    def episode_returns(self) -> list[float]:
        """The return of each episode that ended."""
        if not self.episode_lengths:
            return []
        ends = np.cumsum(np.asarray(self.episode_lengths, dtype=np.int64))
        sums = np.cumsum(np.asarray(self.rewards, dtype=np.float64))
        return [float(total) for total in np.diff(sums[ends - 1], prepend=0.0)]

    def observation_std(self) -> tuple[float, ...]:
        """Standard deviation of each observation entry (empty: none recorded)."""
        if self.obs_sum is None or self.obs_sq_sum is None or not self.obs_count:
            return ()
        mean = self.obs_sum / self.obs_count
        var = np.maximum(self.obs_sq_sum / self.obs_count - mean * mean, 0.0)
        return tuple(float(s) for s in np.sqrt(var))


@dataclass(frozen=True)
class EnvProfile:
    """What a random-policy rollout of an env measured (see :func:`probe_env`)."""

    env_id: str
    action_kind: ActionKind
    """``discrete`` (Discrete), ``continuous`` (Box) or ``other``."""
    observation_kind: ObservationKind
    """``vector`` (a numeric Box that is not an image), ``image`` (a uint8 Box of rank 3) or
    ``other`` (Dict, Discrete, ...)."""
    observation_bounded: bool
    """Every bound of the observation Box is finite (false for other spaces)."""
    observation_std: tuple[float, ...]
    """Standard deviation of each entry of the flattened observation over the rollout
    (vector observations; empty otherwise)."""
    observation_abs_max: float
    """Largest magnitude of an observation entry seen (vector observations)."""
    steps: int
    """Env steps played."""
    episodes: int
    """Episodes that ended."""
    mean_episode_length: float | None
    """Mean length of the episodes that ended (None: none ended)."""
    truncated_share: float
    """Share of the ended episodes that ended by truncation (a time limit), not termination."""
    reached_terminal: bool
    """The random policy reached a terminal state (an episode terminated) at least once."""
    max_episode_steps: int | None
    """The env's time limit (None: it has none)."""
    reward_abs_max: float
    """Largest magnitude of a reward."""
    reward_max: float
    """Largest reward (0.0 when no step was played)."""
    reward_std: float
    """Standard deviation of the per-step reward."""
    reward_nonzero_share: float
    """Share of steps with a nonzero reward."""
    reward_constant_share: float
    """Share of steps whose reward is the rollout's most common value (1.0: the reward never
    varies, as MountainCar's -1 per step)."""
    most_common_reward: float
    """The rollout's most common per-step reward."""
    episode_return_mean: float | None = None
    """Mean return of the random episodes that ended (None: none ended)."""
    episode_return_std: float | None = None
    """Their standard deviation."""
    zero_action_return: float | None = None
    """Mean return of the zero action's episodes (None: none ended, the actions are not
    continuous, or the env has no time limit)."""
    zero_action_truncated: bool = False
    """Every episode of the zero action ran to the time limit (none terminated, none was cut
    short by the probe's step bound): doing nothing does not end the episode. False for an
    env without a time limit (the zero action is not played there)."""

    @property
    def informative_reward_share(self) -> float:
        """Share of steps whose reward tells one step from another: neither zero nor the
        constant per-step value."""
        return min(self.reward_nonzero_share, 1.0 - self.reward_constant_share)


def probe_env(
    env_id: str,
    *,
    env_kwargs: dict[str, Any] | None = None,
    seed: int = 0,
    max_steps: int = PROBE_STEPS,
    max_episodes: int = PROBE_EPISODES,
    check_spaces: Callable[[spaces.Space[Any], spaces.Space[Any]], None] | None = None,
) -> EnvProfile:
    """Play a seeded random policy on ``env_id`` (built as training builds it, with
    ``env_kwargs``) for at most ``max_steps`` steps or ``max_episodes`` episodes, then, for
    Box actions under a time limit, :data:`ZERO_ACTION_EPISODES` episodes of the zero action
    (at most ``max_steps`` steps too), and return what it measured.

    ``check_spaces(observation_space, action_space)``, when given, is called once the env is
    built and before it is played: an algorithm's refusal of the spaces comes before a
    rollout whose profile it would not use.

    Raises:
        EnvSpecError: the env id cannot be resolved or its dependencies are missing, or the
            env failed under random play (reset or step raised, or broke the Gymnasium API).
    """
    env = make_env(env_id, **(env_kwargs or {}))
    try:
        obs_space = env.observation_space
        act_space = env.action_space
        if check_spaces is not None:
            check_spaces(obs_space, act_space)
        act_space.seed(seed)
        stats = _rollout(
            env, env_id, act_space.sample, "random actions", seed, max_steps, max_episodes
        )
        spec = env.spec
        limit = spec.max_episode_steps if spec is not None else None
        zero = _zero_action_rollout(env, env_id, seed, max_steps, limit)
    finally:
        env.close()
    return profile_of(env_id, obs_space, act_space, stats, limit, zero)


def zero_action(space: spaces.Box) -> np.ndarray:
    """The action 0 in every dimension, clipped into the Box's bounds: no torque or force."""
    return np.clip(np.zeros(space.shape), space.low, space.high).astype(space.dtype)


def _zero_action_rollout(
    env: Any, env_id: str, seed: int, max_steps: int, limit: int | None
) -> RolloutStats | None:
    """:data:`ZERO_ACTION_EPISODES` episodes of the zero action, reset from ``seed`` too, in
    at most ``max_steps`` steps. None where the actions are not continuous, or the env has no
    time limit (a rollout of doing nothing might then never end)."""
    if not isinstance(env.action_space, spaces.Box) or limit is None:
        return None
    action = zero_action(env.action_space)
    return _rollout(
        env, env_id, lambda: action, "the zero action", seed, max_steps, ZERO_ACTION_EPISODES
    )


def _rollout(
    env: Any,
    env_id: str,
    policy: Callable[[], Any],
    what: str,
    seed: int,
    max_steps: int,
    max_episodes: int,
) -> RolloutStats:
    """Play ``policy()``'s actions on ``env``, reset from ``seed``, for at most ``max_steps``
    steps or ``max_episodes`` episodes. The env's own failure is an ``EnvSpecError`` that
    says under ``what`` it failed."""
    stats = RolloutStats()
    try:
        env.reset(seed=seed)
        while len(stats.rewards) < max_steps and stats.episodes < max_episodes:
            obs, reward, terminated, truncated, _ = env.step(policy())
            stats.add(obs, float(reward), bool(terminated), bool(truncated))
            if terminated or truncated:
                env.reset()
    except Exception as error:  # the env's own failure: one line, not a traceback
        raise EnvSpecError(
            f"{env_id}: the env failed under {what} after {len(stats.rewards)} steps "
            f"({type(error).__name__}: {error}); `rlfleet check-env {env_id}` checks its API"
        ) from error
    return stats


def profile_of(
    env_id: str,
    obs_space: spaces.Space[Any],
    act_space: spaces.Space[Any],
    stats: RolloutStats,
    max_episode_steps: int | None,
    zero: RolloutStats | None = None,
) -> EnvProfile:
    """The profile of a random rollout measured into ``stats`` and of the zero action's
    episodes measured into ``zero`` (None: not played)."""
    returns = stats.episode_returns()
    zero_returns = zero.episode_returns() if zero is not None else []
    rewards = np.asarray(stats.rewards, dtype=np.float64)
    kind = _observation_kind(obs_space)
    std = stats.observation_std() if kind == "vector" else ()
    if rewards.size:
        values, counts = np.unique(rewards, return_counts=True)
        mode = float(values[int(np.argmax(counts))])
        constant_share = float(counts.max() / rewards.size)
    else:
        mode, constant_share = 0.0, 0.0
    return EnvProfile(
        env_id=env_id,
        action_kind=(
            "discrete"
            if isinstance(act_space, spaces.Discrete)
            else "continuous"
            if isinstance(act_space, spaces.Box)
            else "other"
        ),
        observation_kind=kind,
        observation_bounded=isinstance(obs_space, spaces.Box)
        and bool(np.all(np.isfinite(obs_space.low)) and np.all(np.isfinite(obs_space.high))),
        observation_std=std,
        observation_abs_max=stats.obs_abs_max if kind == "vector" else 0.0,
        steps=int(rewards.size),
        episodes=stats.episodes,
        mean_episode_length=(
            float(np.mean(stats.episode_lengths)) if stats.episode_lengths else None
        ),
        truncated_share=stats.truncations / stats.episodes if stats.episodes else 0.0,
        reached_terminal=stats.terminations > 0,
        max_episode_steps=max_episode_steps,
        reward_abs_max=float(np.abs(rewards).max(initial=0.0)),
        reward_max=float(rewards.max()) if rewards.size else 0.0,
        reward_std=float(rewards.std()) if rewards.size else 0.0,
        reward_nonzero_share=float(np.count_nonzero(rewards) / rewards.size)
        if rewards.size
        else 0.0,
        reward_constant_share=constant_share,
        most_common_reward=mode,
        episode_return_mean=float(np.mean(returns)) if returns else None,
        episode_return_std=float(np.std(returns)) if returns else None,
        zero_action_return=float(np.mean(zero_returns)) if zero_returns else None,
        zero_action_truncated=zero is not None
        and zero.episodes == ZERO_ACTION_EPISODES
        and zero.terminations == 0,
    )


def _observation_kind(space: spaces.Space[Any]) -> ObservationKind:
    if not isinstance(space, spaces.Box) or not np.issubdtype(space.dtype, np.number):
        return "other"
    if space.dtype == np.uint8 and len(space.shape) == 3:
        return "image"
    return "vector"
