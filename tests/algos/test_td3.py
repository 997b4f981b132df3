"""TD3: learns Pendulum-v1 with its shipped preset; refuses Discrete actions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.algos import TD3
from rlfleet.errors import EnvSpecError
from rlfleet.train.run import default_run_config, make_trainer

QUIET = {"show_progress": False, "verbose": False}
OBS = spaces.Box(-1, 1, (3,), np.float32)


@pytest.mark.slow
def test_learns_pendulum() -> None:
    # The threshold (mean test return >= -250 over 10 episodes; a random policy
    # scores about -1200) at a fixed seed and budget; about 15 s of CPU time.
    cfg = default_run_config(
        "td3",
        "Pendulum-v1",
        {"seed": 0, "trainer": {**QUIET, "max_steps": 8000, "target_reward": -250}},
    )
    result = make_trainer(cfg, None).run()
    assert result.best_score >= -250, result


def test_exploration_noise_only_when_exploring() -> None:
    algo = TD3(OBS, spaces.Box(-2, 2, (1,), np.float32))
    obs = torch.rand(64, 3)
    greedy = algo.act(obs, deterministic=True).actions
    assert torch.equal(greedy, algo.act(obs, deterministic=True).actions)
    noisy = algo.act(obs).actions
    assert not torch.equal(greedy, noisy)
    assert (noisy.abs() <= 2).all()


def test_refuses_discrete_actions() -> None:
    with pytest.raises(
        EnvSpecError, match=r"td3 does not support action space Discrete\(2\).*dqn.*ppo.*sac"
    ):
        TD3(OBS, spaces.Discrete(2))
