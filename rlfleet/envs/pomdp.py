"""Partially observed versions of classic tasks, for testing memory (recurrent policies).

``CartPoleNoVelocity-v1`` is CartPole-v1 observing only the cart position and the pole
angle: the velocities must be inferred from how these change, which a feed-forward policy
cannot do from one observation. Importing this module registers the id, so it is usable
anywhere an env id is, as ``rlfleet.envs.pomdp:CartPoleNoVelocity-v1``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

CARTPOLE_NO_VELOCITY = "CartPoleNoVelocity-v1"


class HideObservation(gym.ObservationWrapper[np.ndarray, Any, np.ndarray]):
    """Keep only the observation entries at ``keep`` (a flat Box observation)."""

    def __init__(self, env: gym.Env[np.ndarray, Any], keep: tuple[int, ...]) -> None:
        super().__init__(env)
        box = env.observation_space
        assert isinstance(box, spaces.Box)
        self.keep = np.asarray(keep)
        self.observation_space = spaces.Box(
            box.low[self.keep], box.high[self.keep], dtype=box.dtype
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        kept: np.ndarray = observation[self.keep]
        return kept


def make_cartpole_no_velocity(**kwargs: Any) -> gym.Env[np.ndarray, Any]:
    """CartPole-v1 observing ``[cart position, pole angle]`` only."""
    return HideObservation(gym.make("CartPole-v1", **kwargs), keep=(0, 2))


if CARTPOLE_NO_VELOCITY not in gym.registry:
    gym.register(CARTPOLE_NO_VELOCITY, entry_point=make_cartpole_no_velocity)
