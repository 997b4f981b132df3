"""CartPole-v1 seen as pixels: a small image task for the actor-learner benchmark.

:class:`PixelCartPole` wraps ``CartPole-v1`` in a Gymnasium ``ObservationWrapper`` that draws
the cart and the pole into a 36 x 36 uint8 image (the smallest the Nature CNN takes) and
stacks the last two frames as channels, so that velocities can be read from how the picture
moves. Drawing is a few numpy writes, far cheaper than rendering with pygame; the dynamics,
rewards and episode ends are CartPole-v1's. Use it as the env id
``pixel_cartpole:PixelCartPole`` with ``bench/`` on the Python path.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

SIZE = 36
X_LIMIT = 2.4
POLE_PIXELS = 16
ANGLE_GAIN = 3.0
"""The pole is drawn at three times its angle, so that the few degrees that matter move its
tip by several pixels."""


class PixelCartPole(gym.ObservationWrapper[np.ndarray, int, np.ndarray]):
    """``CartPole-v1`` with ``[2, 36, 36]`` uint8 observations: this frame and the last."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(gym.make("CartPole-v1", **kwargs))
        self.observation_space = spaces.Box(0, 255, (2, SIZE, SIZE), np.uint8)
        self._last = np.zeros((SIZE, SIZE), np.uint8)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self._last = _draw(obs)
        return np.stack([self._last, self._last]), info

    def observation(self, observation: np.ndarray) -> np.ndarray:
        frame = _draw(observation)
        stacked = np.stack([frame, self._last])
        self._last = frame
        return stacked


def _draw(state: np.ndarray) -> np.ndarray:
    """The cart (a 6 x 3 block on the bottom rows) and the pole (a line of points from it)."""
    image = np.zeros((SIZE, SIZE), np.uint8)
    x, _, angle, _ = (float(v) for v in state)
    col = int(np.clip((x + X_LIMIT) / (2 * X_LIMIT) * (SIZE - 1), 0, SIZE - 1))
    image[SIZE - 3 :, max(col - 3, 0) : col + 3] = 255
    shown = ANGLE_GAIN * angle
    t = np.arange(1, POLE_PIXELS + 1)
    rows = np.clip(SIZE - 4 - np.round(t * np.cos(shown)).astype(int), 0, SIZE - 1)
    cols = np.clip(col + np.round(t * np.sin(shown)).astype(int), 0, SIZE - 1)
    image[rows, cols] = 255
    return image
