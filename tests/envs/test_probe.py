"""The env probe: a bounded, seeded random-policy rollout and the profile it measures."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.envs.check import check_env
from rlfleet.envs.probe import RolloutStats, probe_env
from rlfleet.errors import EnvSpecError

HERE = "tests.envs.test_probe"


class PenaltyEnv(gym.Env[np.ndarray, int]):
    """-1 every step, never terminates, truncated after ``length`` steps; observations: a
    position of scale 1 and a velocity of scale 0.001 (badly scaled, as MountainCar's)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, length: int = 50) -> None:
        self.length = length
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return self._obs(), -1.0, False, self.t >= self.length, {}

    def _obs(self) -> np.ndarray:
        x = self.np_random.uniform(-1.0, 1.0)
        return np.array([x, 0.001 * x], dtype=np.float32)


class GoalEnv(gym.Env[np.ndarray, np.ndarray]):
    """Continuous actions; reward 0 except +10 on reaching the goal (action above 0.9), which
    ends the episode."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        goal = bool(action[0] > 0.9)
        obs = self.np_random.normal(0.0, 20.0, 1).astype(np.float32)
        return obs, 10.0 if goal else 0.0, goal, False, {}


class StandEnv(gym.Env[np.ndarray, np.ndarray]):
    """Continuous actions, no terminal state: reward ``1 - 3 * mean(a^2)`` (1 for doing
    nothing, about 0 for uniform random actions), as a stance that effort only disturbs."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward = 1.0 - 3.0 * float(np.mean(np.square(action)))
        return self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32), reward, False, False, {}


def test_penalty_env_profile() -> None:
    profile = probe_env(f"{HERE}:PenaltyEnv", env_kwargs={"length": 50})
    assert profile.action_kind == "discrete"
    assert profile.observation_kind == "vector"
    assert profile.observation_bounded
    assert profile.episodes == 20  # the episode bound comes first: 20 x 50 < 5,000 steps
    assert profile.steps == 1000
    assert profile.mean_episode_length == 50.0
    assert profile.truncated_share == 1.0
    assert not profile.reached_terminal
    assert profile.most_common_reward == profile.reward_max == -1.0
    assert profile.reward_constant_share == 1.0
    assert profile.reward_nonzero_share == 1.0
    assert profile.informative_reward_share == 0.0
    assert profile.reward_std == 0.0
    low, high = sorted(profile.observation_std)
    assert 0.0004 < low < 0.0008
    assert 0.4 < high < 0.8


def test_goal_env_profile() -> None:
    profile = probe_env(f"{HERE}:GoalEnv")
    assert profile.action_kind == "continuous"
    assert not profile.observation_bounded
    assert profile.reached_terminal
    assert profile.truncated_share == 0.0
    assert profile.max_episode_steps is None
    assert profile.reward_abs_max == profile.reward_max == 10.0
    assert profile.most_common_reward == 0.0
    # Uniform actions in [-1, 1] pass 0.9 on about 5% of steps.
    assert 0.02 < profile.reward_nonzero_share < 0.08
    assert profile.informative_reward_share == pytest.approx(profile.reward_nonzero_share)
    assert profile.observation_abs_max > 20.0


def test_doing_nothing_is_played_and_measured_beside_random_play() -> None:
    profile = probe_env(f"{HERE}:StandEnv", env_kwargs={"max_episode_steps": 50})
    assert profile.max_episode_steps == 50
    assert profile.episodes == 20
    # Random actions cost about as much as the stance earns; doing nothing earns 1 a step.
    assert profile.episode_return_mean is not None
    assert profile.episode_return_std is not None
    assert abs(profile.episode_return_mean) < 5.0
    assert 0.0 < profile.episode_return_std < 15.0
    assert profile.zero_action_return == 50.0
    assert profile.zero_action_truncated


def test_the_zero_action_is_played_only_for_continuous_actions_under_a_time_limit() -> None:
    goal = probe_env(f"{HERE}:GoalEnv")  # no time limit: doing nothing might never end
    assert goal.zero_action_return is None
    assert not goal.zero_action_truncated
    assert goal.episode_return_mean == 10.0  # each episode ends at the goal's +10
    penalty = probe_env(f"{HERE}:PenaltyEnv", env_kwargs={"length": 50})  # discrete actions
    assert penalty.zero_action_return is None
    assert not penalty.zero_action_truncated
    assert penalty.episode_return_mean == -50.0
    assert penalty.episode_return_std == 0.0
    pendulum = probe_env("Pendulum-v1")  # doing nothing lets it hang: no better than random
    assert pendulum.zero_action_truncated
    assert pendulum.zero_action_return is not None
    assert pendulum.episode_return_mean is not None
    assert pendulum.zero_action_return < pendulum.episode_return_mean


def test_episode_returns_split_the_rewards_at_each_end() -> None:
    stats = RolloutStats()
    for reward, end in [(1.0, False), (2.0, True), (-1.0, True), (4.0, False)]:
        stats.add(np.zeros(1, np.float32), reward, end, False)
    assert stats.episode_returns() == [3.0, -1.0]  # the unfinished episode does not count
    assert RolloutStats().episode_returns() == []


def test_the_step_bound_holds_and_the_seed_repeats() -> None:
    first = probe_env(f"{HERE}:PenaltyEnv", env_kwargs={"length": 10_000}, max_steps=300)
    assert first.steps == 300
    assert first.episodes == 0
    assert first.mean_episode_length is None
    assert first.truncated_share == 0.0
    assert probe_env(f"{HERE}:PenaltyEnv", env_kwargs={"length": 10_000}, max_steps=300) == first
    other = probe_env(f"{HERE}:PenaltyEnv", env_kwargs={"length": 10_000}, max_steps=300, seed=1)
    assert other.observation_std != first.observation_std


def test_registered_env_with_time_limit() -> None:
    profile = probe_env("MountainCar-v0")
    assert profile.max_episode_steps == 200
    assert profile.mean_episode_length == 200.0
    assert profile.truncated_share == 1.0
    assert not profile.reached_terminal
    assert profile.most_common_reward == -1.0


def test_mountain_car_continuous_shows_nothing_to_gain() -> None:
    """The profile the pink-noise rule reads: no terminal state, and only the action's cost."""
    profile = probe_env("MountainCarContinuous-v0")
    assert profile.action_kind == "continuous"
    assert profile.truncated_share == 1.0
    assert not profile.reached_terminal
    assert profile.reward_max <= 0.0 < profile.reward_std


def test_unknown_env_is_a_typed_error() -> None:
    with pytest.raises(EnvSpecError):
        probe_env(f"{HERE}:NoSuchEnv")


def test_an_env_that_fails_under_random_play_is_a_typed_error() -> None:
    env_id = "tests.envs.toy_envs:FaultyEnv"
    with pytest.raises(EnvSpecError, match=r"failed under random actions after 2 steps"):
        probe_env(env_id, env_kwargs={"fault": "raise", "fail_at": 3})


def test_rollout_stats_skip_images_and_count_endings() -> None:
    stats = RolloutStats()
    stats.add(np.zeros((4, 4, 3), np.uint8), 1.0, False, False)
    stats.add(np.zeros((4, 4, 3), np.uint8), 0.0, True, False)
    stats.add(np.zeros((4, 4, 3), np.uint8), 0.0, False, True)
    assert stats.observation_std() == ()
    assert stats.obs_abs_max == 0.0
    assert stats.episode_lengths == [2, 1]
    assert (stats.terminations, stats.truncations) == (1, 1)


def test_check_env_reports_what_the_stats_measure() -> None:
    report = check_env(f"{HERE}:GoalEnv", num_steps=200)
    assert report.ok
    rollout = next(f.message for f in report.findings if f.check == "rollout")
    assert rollout.startswith("200 random steps, ")
