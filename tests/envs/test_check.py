"""The env doctor on good envs and on each kind of broken env."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from rlfleet.cli.main import main
from rlfleet.envs.check import check_env


class Good(gym.Env[np.ndarray, int]):
    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return self._obs(), 1.0, False, self.t >= 50, {}

    def _obs(self) -> np.ndarray:
        return self.np_random.uniform(-1, 1, 3).astype(np.float32)


class OldApi(Good):
    def step(self, action: int) -> Any:  # type: ignore[override]
        return self._obs(), 1.0, False, {}


class NoSeedParam(Good):
    def reset(self) -> Any:  # type: ignore[override]
        return super().reset()


class ObsOnlyReset(Good):
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return super().reset(seed=seed)[0]


class Float64Obs(Good):
    def _obs(self) -> np.ndarray:
        return np.zeros(3, dtype=np.float64)


class IgnoresSeed(Good):
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=None)
        self.t = 0
        return np.random.default_rng().uniform(-1, 1, 3).astype(np.float32), {}


class NanOnSecondStep(Good):
    def _obs(self) -> np.ndarray:
        obs = np.zeros(3, dtype=np.float32)
        if self.t == 2:
            obs[0] = np.nan
        return obs


class ArrayReward(Good):
    def step(self, action: int) -> Any:
        return self._obs(), np.array([1.0]), False, False, {}


class InfiniteActions(Good):
    action_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)


class HugeRewards(Good):
    def step(self, action: int) -> Any:
        obs, _, terminated, truncated, info = super().step(action)
        return obs, 5000.0, terminated, truncated, info


class RaisesOnStep(Good):
    def step(self, action: int) -> Any:
        raise RuntimeError("simulator crashed")


def _messages(report: Any, level: str) -> str:
    return " | ".join(f.message for f in report.findings if f.level == level)


def test_registered_env_passes_and_gets_a_recommendation() -> None:
    report = check_env("CartPole-v1", num_steps=300)
    assert report.ok, report.findings
    assert report.recommended_mode == "native"
    assert report.step_time_ms is not None
    assert report.step_time_ms > 0
    pendulum = check_env("Pendulum-v1", num_steps=300)
    assert pendulum.ok
    assert pendulum.recommended_mode == "sync"


def test_good_custom_env_passes() -> None:
    report = check_env(Good(), num_steps=200)
    assert report.ok, report.findings
    assert not report.warnings()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (OldApi(), "old Gym API"),
        (NoSeedParam(), "must accept keyword arguments seed and options"),
        (ObsOnlyReset(), "expects (obs, info)"),
        (Float64Obs(), "dtype float64, declared float32"),
        (IgnoresSeed(), "reset ignores the seed"),
        (NanOnSecondStep(), "NaN or inf"),
        (ArrayReward(), "reward must be a float scalar"),
        (InfiniteActions(), "infinite bounds"),
        (RaisesOnStep(), "RuntimeError: simulator crashed"),
    ],
)
def test_broken_envs_are_reported(env: gym.Env[Any, Any], expected: str) -> None:
    report = check_env(env, num_steps=200)
    assert not report.ok
    assert expected in _messages(report, "error")


def test_scale_warnings() -> None:
    report = check_env(HugeRewards(), num_steps=100)
    assert report.ok
    assert "reward scaling" in _messages(report, "warning")


class TinyParallel:
    """A duck-typed PettingZoo Parallel env: two agents, 5 steps."""

    possible_agents = ("a", "b")

    def __init__(self) -> None:
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> spaces.Space[Any]:
        return spaces.Box(0, 10, (1,), np.float32)

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: Any = None) -> Any:
        self.agents, self.t = list(self.possible_agents), 0
        return {a: np.zeros(1, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]) -> Any:
        self.t += 1
        done = self.t >= 5
        obs = {a: np.full(1, self.t, np.float32) for a in self.agents}
        rewards = {a: float(actions[a]) for a in self.agents}
        flags = {a: done for a in self.agents}
        return obs, rewards, flags, {a: False for a in self.agents}, {a: {} for a in self.agents}


def test_pettingzoo_parallel_env() -> None:
    report = check_env(TinyParallel(), num_steps=20)
    assert report.ok, report.findings
    assert "Parallel" in " ".join(f.message for f in report.findings)


def test_pettingzoo_aec_env() -> None:
    tictactoe = pytest.importorskip("pettingzoo.classic.tictactoe_v3")
    report = check_env(tictactoe.env(), num_steps=50)
    assert report.ok, report.findings
    assert "random AEC turns" in " ".join(f.message for f in report.findings)


def test_cli_exit_code_reflects_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-env", "CartPole-v1", "--steps", "100"]) == 0
    assert main(["check-env", "tests.envs.test_check:OldApi", "--steps", "50"]) == 1
    assert "old Gym API" in capsys.readouterr().out
    # A target that names no env is bad input, like an unknown id anywhere else.
    assert main(["check-env", "NoSuchEnv-v0"]) == 2
    assert "unknown environment id 'NoSuchEnv-v0'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "target", ["tests.envs.toy_envs:rlfleet-test/FaultyEnv-v0", "tests.envs.toy_envs:FaultyEnv"]
)
def test_module_env_id_and_module_class_are_checked_alike(target: str) -> None:
    report = check_env(target, num_steps=100)
    assert report.ok, report.findings
    assert report.recommended_mode == "sync"


def test_an_env_whose_constructor_raises_is_a_finding(capsys: pytest.CaptureFixture[str]) -> None:
    report = check_env("tests.envs.toy_envs:RaisesOnConstruction", num_steps=10)
    assert "creating the env raised RuntimeError" in _messages(report, "error")
    assert main(["check-env", "tests.envs.toy_envs:RaisesOnConstruction"]) == 1
