"""Environment parameters: samplers, the set_parameters protocol, built-in classic-control
constants, and the sampled values reaching every sub-env at every episode."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv

from rlfleet.envs.curriculum import EnvironmentParameterSettings, EnvParameterManager
from rlfleet.envs.make import make_vec_env
from rlfleet.envs.parameters import (
    ConstantSampler,
    GaussianSampler,
    MultiRangeUniformSampler,
    UniformSampler,
    apply_parameters,
)
from rlfleet.envs.state import get_env_state
from rlfleet.errors import EnvSpecError
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer

EPISODE_LENGTH = 4


class ParamEnv(gym.Env[np.ndarray, int]):
    """Shows its parameter ``scale`` in every observation; episodes last 4 steps."""

    observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.scale = 0.0
        self.t = 0

    def set_parameters(self, **values: float) -> None:
        for name, value in values.items():
            if name != "scale":
                raise KeyError(name)
            self.scale = value

    def _obs(self) -> np.ndarray:
        return np.array([self.scale, self.t], dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return self._obs(), 1.0, self.t >= EPISODE_LENGTH, False, {}


class _Plain(gym.Env[np.ndarray, int]):
    observation_space = spaces.Box(-1, 1, (1,), np.float32)
    action_space = spaces.Discrete(2)


gym.register("rlfleet-test/Param-v0", entry_point=ParamEnv)


def _manager(**samplers: Any) -> EnvParameterManager:
    return EnvParameterManager(
        {name: EnvironmentParameterSettings.sampled(s) for name, s in samplers.items()},
        ["default"],
    )


def _episode_values(envs: Any, num_steps: int) -> list[list[float]]:
    """The ``scale`` each sub-env showed in each of its episodes."""
    obs, _ = envs.reset(seed=7)
    per_env: list[list[float]] = [[float(v)] for v in obs[:, 0]]
    for _ in range(num_steps):
        obs, _, _terminated, _, _ = envs.step(np.zeros(envs.num_envs, dtype=np.int64))
        for i in range(envs.num_envs):
            if obs[i, 1] == 0:  # the reset step of next-step autoreset: a new episode
                per_env[i].append(float(obs[i, 0]))
            else:
                assert obs[i, 0] == per_env[i][-1], "the value changed within an episode"
    return per_env


def test_sampled_values_reach_every_sub_env_at_every_episode() -> None:
    manager = _manager(scale=UniformSampler(2.0, 3.0))
    envs = make_vec_env("rlfleet-test/Param-v0", 3, wrappers=[manager.wrapper()])
    values = _episode_values(envs, 5 * (EPISODE_LENGTH + 1))
    flat = [v for env in values for v in env]
    assert all(len(env) >= 5 for env in values)
    assert all(2.0 <= v <= 3.0 for v in flat)
    assert len(set(flat)) == len(flat), "every episode of every env draws its own value"
    # What the wrapper says it applied is what the env shows.
    applied = [p["scale"] for p in envs.get_attr("parameter_values")]
    assert applied == pytest.approx([env[-1] for env in values], rel=1e-6)


def test_draws_repeat_with_the_seed_and_follow_lesson_changes() -> None:
    manager = _manager(scale=UniformSampler(0.0, 1.0))
    envs = make_vec_env("rlfleet-test/Param-v0", 2, wrappers=[manager.wrapper()])
    first = _episode_values(envs, 12)
    assert _episode_values(envs, 12) == first
    # What the draws depend on is saved with the env state, so a resume continues them.
    lengths = _manager(length=UniformSampler(0.4, 0.6))
    cartpole = make_vec_env("CartPole-v1", 2, seed=3, wrappers=[lengths.wrapper()])
    state = get_env_state(cartpole)
    assert state is not None
    wrapper = next(w for w in state["envs"][1]["wrappers"] if "parameter_seed" in w)
    assert wrapper | {"parameter_seed": 4, "parameter_episode": 1} == (wrapper)
    envs.call("set_parameter_samplers", {"scale": ConstantSampler(5.0)})
    assert all(v == 5.0 for env in _episode_values(envs, 12) for v in env)


def test_cartpole_constants_are_set_and_derived_ones_recomputed() -> None:
    cfg = default_run_config(
        "ppo",
        "CartPole-v1",
        {
            "env": {"num_envs": 4, "num_test_envs": 2},
            "hyperparameters": {"num_steps": 16, "batch_size": 64},
            "environment_parameters": {
                "length": {"sampler_type": "uniform",
                           "sampler_parameters": {"min_value": 0.2, "max_value": 0.3}},
                "masspole": 0.3,
            },
        },
    )  # fmt: skip
    trainer = make_trainer(cfg, None)
    # CartPole's native vector env cannot take per-episode parameters: sync is chosen.
    assert isinstance(trainer.train_envs, SyncVectorEnv)
    trainer.collector.collect_rollout(trainer.storage)
    lengths = set()
    for env in trainer.train_envs.envs:  # type: ignore[attr-defined]
        core = env.unwrapped
        assert 0.2 <= core.length <= 0.3
        assert core.masspole == 0.3
        assert core.total_mass == pytest.approx(core.masspole + core.masscart)
        assert core.polemass_length == pytest.approx(core.masspole * core.length)
        lengths.add(core.length)
    assert len(lengths) == 4
    trainer.evaluator.run(2)
    for env in trainer.test_envs.envs:  # type: ignore[attr-defined]
        assert env.unwrapped.masspole == 0.3


def test_pendulum_mass_is_settable() -> None:
    env = gym.make("Pendulum-v1").unwrapped
    apply_parameters(env, {"m": 2.5, "g": 9.81})
    assert (env.m, env.g) == (2.5, 9.81)  # type: ignore[attr-defined]


def test_parameters_an_env_does_not_have_are_refused() -> None:
    with pytest.raises(EnvSpecError, match="has no parameter"):
        apply_parameters(gym.make("CartPole-v1").unwrapped, {"mass": 1.0})
    with pytest.raises(EnvSpecError, match="set_parameters refused"):
        apply_parameters(ParamEnv(), {"speed": 1.0})
    with pytest.raises(EnvSpecError, match="takes no environment parameters"):
        apply_parameters(_Plain(), {"x": 1})


def test_samplers() -> None:
    rng = np.random.default_rng(0)
    assert ConstantSampler(1.5).sample(rng) == 1.5
    draws = [UniformSampler(1.0, 2.0).sample(rng) for _ in range(1000)]
    assert min(draws) >= 1.0
    assert max(draws) <= 2.0
    normal = [GaussianSampler(5.0, 0.5).sample(rng) for _ in range(4000)]
    assert np.mean(normal) == pytest.approx(5.0, abs=0.05)
    assert np.std(normal) == pytest.approx(0.5, abs=0.05)
    multi = np.array([MultiRangeUniformSampler([(0.0, 1.0), (10.0, 13.0)]).sample(rng)
                      for _ in range(4000)])  # fmt: skip
    assert np.all(((multi >= 0) & (multi <= 1)) | ((multi >= 10) & (multi <= 13)))
    # An interval is picked in proportion to its length: 3/4 of the draws in [10, 13].
    assert np.mean(multi >= 10) == pytest.approx(0.75, abs=0.03)
    assert UniformSampler(2.0, 1.0).problem() is not None
    assert MultiRangeUniformSampler([(1.0, 0.0)]).problem() is not None
