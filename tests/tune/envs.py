"""A test env whose return is set by a constructor argument, so a search space can make
trials deterministically good, bad or broken (a NaN reward), whatever PPO learns.

Registered on import; use it as ``tests.tune.envs:TuneScore-v0``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

ENV_ID = "tests.tune.envs:TuneScore-v0"
EPISODE_LENGTH = 5


class ScoreEnv(gym.Env[np.ndarray, np.int64]):
    """Five steps per episode, ``reward`` each, whatever the actions."""

    def __init__(self, reward: float = 1.0, render_mode: str | None = None) -> None:
        self.reward = float(reward)
        self.render_mode = render_mode
        self.observation_space = spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self._t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self._t += 1
        return np.zeros(1, np.float32), self.reward, self._t >= EPISODE_LENGTH, False, {}


if "TuneScore-v0" not in gym.registry:
    gym.register("TuneScore-v0", entry_point=ScoreEnv)
