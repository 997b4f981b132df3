"""DDPG and TD3, the deterministic-policy pair: each learns Pendulum-v1 with its shipped
preset, adds exploration noise only when exploring, and refuses Discrete actions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.algos import DDPG, TD3
from rlfleet.errors import EnvSpecError
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer

QUIET = {"show_progress": False, "verbose": False}
OBS = spaces.Box(-1, 1, (3,), np.float32)
each_algorithm = pytest.mark.parametrize("algo_class", [DDPG, TD3], ids=["ddpg", "td3"])


@pytest.mark.slow
@each_algorithm
def test_learns_pendulum(algo_class: type[DDPG | TD3]) -> None:
    # The threshold (mean test return >= -250 over 10 episodes; a random policy
    # scores about -1200) at a fixed seed and budget; about 15 s of CPU time each.
    cfg = default_run_config(
        algo_class.name,
        "Pendulum-v1",
        {"seed": 0, "trainer": {**QUIET, "max_steps": 8000, "target_reward": -250}},
    )
    result = make_trainer(cfg, None).run()
    assert result.best_score >= -250, result


@each_algorithm
def test_exploration_noise_only_when_exploring(algo_class: type[DDPG | TD3]) -> None:
    algo = algo_class(OBS, spaces.Box(-2, 2, (1,), np.float32))
    obs = torch.rand(64, 3)
    greedy = algo.act(obs, deterministic=True).actions
    assert torch.equal(greedy, algo.act(obs, deterministic=True).actions)
    noisy = algo.act(obs).actions
    assert not torch.equal(greedy, noisy)
    assert (noisy.abs() <= 2).all()


@each_algorithm
def test_refuses_discrete_actions(algo_class: type[DDPG | TD3]) -> None:
    with pytest.raises(
        EnvSpecError,
        match=rf"{algo_class.name} does not support action space Discrete\(2\).*dqn.*ppo.*sac",
    ):
        algo_class(OBS, spaces.Discrete(2))
