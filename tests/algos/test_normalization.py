"""Observation and reward normalisation: learned in training, saved in checkpoints, frozen in
evaluation and play."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlfleet.algos import get_algorithm, list_algorithms
from rlfleet.collect.evaluator import Evaluator
from rlfleet.errors import ConfigError
from rlfleet.nn.normalize import RewardScaler
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import load_algorithm, make_trainer, train

# Every on-policy algorithm has both switches (docs/spaces.md, "Normalisation").
ALGOS = [name for name in list_algorithms() if get_algorithm(name).kind == "on_policy"]


def _cfg(name: str) -> object:
    short = {
        "ppo": {"num_steps": 16, "batch_size": 64, "num_epochs": 1},
        "a2c": {"num_steps": 8},
        "trpo": {"num_steps": 32, "batch_size": 64, "num_epochs": 1},
        "acer": {"num_steps": 16, "replay_start": 1},
    }[name]
    return default_run_config(
        name,
        "CartPole-v1",
        {
            "env": {"num_envs": 4, "num_test_envs": 2},
            "hyperparameters": {**short, "normalize_obs": True, "normalize_reward": True},
            "trainer": {
                "max_steps": 512,
                "epoch_num_steps": 512,
                "test_step_num_episodes": 2,
                "target_reward": None,
                "show_progress": False,
                "verbose": False,
            },
        },
    )


@pytest.mark.parametrize("name", ALGOS)
def test_statistics_learn_in_training_are_frozen_in_evaluation_and_saved(
    name: str, tmp_path: Path
) -> None:
    cfg = _cfg(name)
    train(cfg, tmp_path / "run")  # type: ignore[arg-type]
    algo, _ = load_algorithm(tmp_path / "run", which="latest")
    obs_stats, reward_stats = algo.obs_normalizer, algo.reward_scaler  # type: ignore[attr-defined]
    # The checkpoint holds the statistics of the whole run.
    assert float(obs_stats.count) >= 512
    assert float(reward_stats.return_stats.count) > 100
    assert float(reward_stats.return_stats.var) != 1.0
    before = (
        obs_stats.mean.clone(),
        obs_stats.count.clone(),
        reward_stats.return_stats.var.clone(),
    )
    trainer = make_trainer(cfg, None)  # type: ignore[arg-type]
    Evaluator(trainer.test_envs, algo, seed=0).run(3)
    after = (obs_stats.mean, obs_stats.count, reward_stats.return_stats.var)
    for old, new in zip(before, after, strict=True):
        assert torch.equal(old, new)


def test_reward_scaler_divides_by_the_std_of_discounted_returns() -> None:
    scaler = RewardScaler(gamma=0.5)
    rewards = torch.tensor([[1.0], [1.0], [1.0], [1.0]])
    done = torch.tensor([[0.0], [1.0], [0.0], [0.0]])
    valid = torch.tensor([[1.0], [1.0], [0.0], [1.0]])
    scaled = scaler(rewards, done, valid, update=True)
    # Returns 1, 1.5 | 1 (reset step, no sample), 1.5: samples 1, 1.5, 1.5.
    samples = torch.tensor([1.0, 1.5, 1.5], dtype=torch.float64)
    stats = scaler.return_stats
    expected_var = (samples.var(unbiased=False) * 3 + 1e-4 * samples.mean().pow(2)) / (3 + 1e-4)
    torch.testing.assert_close(stats.var, expected_var, rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(scaled, rewards / torch.sqrt(stats.var.float() + 1e-8))
    frozen = scaler(rewards, done, valid, update=False)
    torch.testing.assert_close(frozen, scaled)


def test_observation_normalisation_of_images_is_refused() -> None:
    import numpy as np
    from gymnasium import spaces

    from rlfleet.algos import PPO, PPOConfig

    image = spaces.Box(0, 255, (36, 36, 3), np.uint8)
    with pytest.raises(ConfigError, match="normalize_obs"):
        PPO(image, spaces.Discrete(2), PPOConfig(normalize_obs=True))
