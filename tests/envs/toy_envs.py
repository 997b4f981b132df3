"""Small envs for fault tests, importable by subprocess workers (``tests.envs.toy_envs``).

Importing this module registers ``rlfleet-test/FaultyEnv-v0`` so that run configs can name
it as ``tests.envs.toy_envs:rlfleet-test/FaultyEnv-v0``; ``tests.envs.toy_envs:FaultyEnv``
names the same env by its class.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Literal

import gymnasium as gym
import numpy as np

Fault = Literal["raise", "exit", "hang", "segfault"]


class FaultyEnv(gym.Env[np.ndarray, int]):
    """Counts steps; ``fault`` strikes on the ``fail_at``-th step of this env's life.

    Observation: ``[steps in this episode, steps in this env's life]``; reward 1 per step;
    an episode terminates after ``episode_length`` steps. The counter lives in the process,
    so a restarted worker starts counting again from zero.
    """

    observation_space = gym.spaces.Box(0.0, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(
        self,
        fault: Fault = "raise",
        fail_at: int | None = None,
        episode_length: int = 5,
        hang_s: float = 60.0,
    ) -> None:
        self.fault = fault
        self.fail_at = fail_at
        self.episode_length = episode_length
        self.hang_s = hang_s
        self.life_steps = 0
        self.episode_steps = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.episode_steps = 0
        return self._obs(), {"seed": -1 if seed is None else seed}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.life_steps += 1
        self.episode_steps += 1
        if self.life_steps == self.fail_at:
            self._strike()
        terminated = self.episode_steps >= self.episode_length
        return self._obs(), 1.0, terminated, False, {}

    def _obs(self) -> np.ndarray:
        return np.array([self.episode_steps, self.life_steps], np.float32)

    def _strike(self) -> None:
        if self.fault == "raise":
            raise ValueError(f"FaultyEnv broke on purpose at step {self.life_steps}")
        if self.fault == "exit":
            os._exit(3)
        if self.fault == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(self.hang_s)


class DictObsEnv(gym.Env[dict[str, Any], np.ndarray]):
    """Dict observations (Box + Discrete), a Box action, random rewards and an info entry."""

    observation_space = gym.spaces.Dict(
        {
            "position": gym.spaces.Box(-10.0, 10.0, (3,), np.float32),
            "mode": gym.spaces.Discrete(4),
        }
    )
    action_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self.position = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        self.t = 0
        return self._obs(), {"start": float(self.position[0])}

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        self.t += 1
        self.position = np.clip(self.position + action, -10, 10).astype(np.float32)
        reward = float(self.np_random.normal())
        truncated = self.t >= 7
        terminated = bool(np.abs(self.position).max() > 3)
        return self._obs(), reward, terminated, truncated, {"t": self.t, "norm": reward}

    def _obs(self) -> dict[str, Any]:
        return {"position": self.position.copy(), "mode": int(self.t % 4)}


class RaisesOnConstruction(gym.Env[np.ndarray, int]):
    """An env whose constructor fails, as one with a missing asset or licence would."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        raise RuntimeError("RaisesOnConstruction cannot be built, on purpose")


gym.register(id="rlfleet-test/FaultyEnv-v0", entry_point=FaultyEnv, max_episode_steps=200)


Misbehaviour = Literal[
    "string_reward", "none_reward", "wrong_shape_obs", "none_obs", "string_obs",
    "int_terminated", "list_info", "short_step", "reset_obs_only", "exit",
]  # fmt: skip


class MisbehavingEnv(gym.Env[np.ndarray, int]):
    """Breaks the Gymnasium API in one way (``misbehaviour``), from its first call on."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, misbehaviour: Misbehaviour = "string_reward") -> None:
        self.misbehaviour = misbehaviour

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        if self.misbehaviour == "reset_obs_only":
            return np.zeros(3, np.float32)
        return self._obs(), {}

    def step(self, action: int) -> Any:
        m = self.misbehaviour
        if m == "exit":
            raise SystemExit(4)
        if m == "short_step":
            return self._obs(), 1.0, False, {}
        reward: Any = {"string_reward": "1.0", "none_reward": None}.get(m, 1.0)
        terminated: Any = 2 if m == "int_terminated" else False
        info: Any = [] if m == "list_info" else {}
        return self._obs(), reward, terminated, False, info

    def _obs(self) -> Any:
        m = self.misbehaviour
        if m == "wrong_shape_obs":
            return np.zeros(4, np.float32)
        if m == "none_obs":
            return None
        if m == "string_obs":
            return "abc"
        return np.zeros(3, np.float32)
