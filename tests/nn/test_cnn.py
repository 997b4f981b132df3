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


def test_the_minatar_cnn_takes_small_grids() -> None:
    grid = spaces.Box(0, 1, (10, 10, 4), np.bool_)
    algo = PPO(grid, spaces.Discrete(3), PPOConfig(cnn="minatar", hidden_sizes=()))
    conv = algo.net.encoder.cnn.convs[0]
    assert (conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride) == (
        4,
        16,
        (3, 3),
        (1, 1),
    )
    assert algo.net.encoder.out_features == 128
    assert algo.predict(np.zeros((2, 10, 10, 4), np.bool_)).shape == (2,)
    with pytest.raises(EnvSpecError, match=r"2x2 are too small for the MinAtar CNN"):
        PPO(spaces.Box(0, 1, (2, 2, 4), np.bool_), spaces.Discrete(3), PPOConfig(cnn="minatar"))
