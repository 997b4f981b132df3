"""The CNN torsos: images too small for the Nature network are bad input, refused with a
typed error when the algorithm is built."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from rlfleet.algos import PPO, PPOConfig
from rlfleet.errors import EnvSpecError


def test_images_too_small_for_the_nature_cnn_are_refused_at_construction() -> None:
    small = spaces.Box(0, 255, (20, 20, 3), np.uint8)
    with pytest.raises(EnvSpecError, match=r"20x20 are too small .* cnn: impala"):
        PPO(small, spaces.Discrete(2))
    algo = PPO(small, spaces.Discrete(2), PPOConfig(cnn="impala"))
    assert algo.predict(np.zeros((2, 20, 20, 3), np.uint8)).shape == (2,)
