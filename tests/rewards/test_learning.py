"""Reward signals that change what PPO learns, at a fixed seed and budget.

- Sparse reward: on MountainCar-v0 a random walk almost never reaches the flag, so plain
  PPO sees nothing but -1 per step; an exploration bonus (RND or curiosity) reaches it
  within the budget. ``bench/reward_signals_mountaincar.py`` runs more seeds and budgets.
- Imitation: PPO rewarded by GAIL alone (no env reward) learns to balance CartPole from
  the demonstrations of a hand-written controller.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import pyarrow.parquet as pq
import pytest

from rlfleet.rewards import record_demonstrations, save_demonstrations
from rlfleet.runs.from_options import train_from_options
from rlfleet.runs.options_parser import parse_run_options

MOUNTAIN_CAR_BUDGET = 20_480
QUIET = {"show_progress": False, "verbose": False, "test_step_num_episodes": 2}


def _mountain_car(tmp_path: Path, signals: dict[str, Any], seed: int) -> dict[str, Any]:
    return {
        "env_settings": {"env_id": "MountainCar-v0", "num_envs": 8, "num_test_envs": 2,
                         "seed": seed},
        "behaviors": {"MountainCar": {
            "hyperparameters": {"learning_rate": 1e-3, "batch_size": 256, "num_epochs": 4},
            # Velocity is 20x smaller than position: without normalisation the policy can
            # hardly condition on it, with or without a bonus.
            "network_settings": {"hidden_units": 64, "num_layers": 2, "normalize": True},
            "time_horizon": 128,
            "max_steps": MOUNTAIN_CAR_BUDGET,
            "summary_freq": 1024,
            "checkpoint_interval": MOUNTAIN_CAR_BUDGET,
            "reward_signals": {"extrinsic": {"gamma": 0.99}, **signals},
            "trainer_settings": QUIET,
        }},
        "checkpoint_settings": {"results_dir": str(tmp_path), "run_id": "run"},
    }  # fmt: skip


def _reached_goal(tmp_path: Path, signals: dict[str, Any], seed: int = 3) -> bool:
    """Did any training episode reach the flag (a return above -200, the time limit)?"""
    train_from_options(parse_run_options(_mountain_car(tmp_path, signals, seed)))
    history = pq.read_table(tmp_path / "run" / "history.parquet").to_pydict()
    return any(r is not None and r > -200 for r in history["train/return_max"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "signal",
    [
        {"rnd": {"strength": 0.5, "gamma": 0.99, "learning_rate": 1e-3}},
        {"curiosity": {"strength": 0.5, "gamma": 0.99, "learning_rate": 1e-3}},
    ],
    ids=["rnd", "curiosity"],
)
def test_exploration_bonus_reaches_the_mountain_car_goal(
    tmp_path: Path, signal: dict[str, Any]
) -> None:
    assert _reached_goal(tmp_path, signal)


@pytest.mark.slow
def test_plain_ppo_does_not_reach_it_in_the_same_budget(tmp_path: Path) -> None:
    assert not _reached_goal(tmp_path, {})


@pytest.mark.slow
def test_gail_alone_learns_cartpole_from_demonstrations(tmp_path: Path) -> None:
    demos, returns = record_demonstrations(
        gym.make("CartPole-v1"), lambda o: int(o[2] + 0.5 * o[3] > 0), num_episodes=10
    )
    assert min(returns) == 500.0
    demo_path = tmp_path / "cartpole-demos.npz"
    save_demonstrations(demo_path, demos)
    options = parse_run_options({
        "env_settings": {"env_id": "CartPole-v1", "num_envs": 8, "num_test_envs": 5},
        "behaviors": {"CartPole": {
            "hyperparameters": {"learning_rate": 2e-3, "batch_size": 256, "gae_lambda": 0.8},
            "network_settings": {"hidden_units": 64, "num_layers": 2},
            "time_horizon": 32,
            "max_steps": 40_960,
            "summary_freq": 2048,
            "checkpoint_interval": 4096,
            # No extrinsic signal: the env's reward is never seen.
            "reward_signals": {"gail": {"demo_path": str(demo_path), "gamma": 0.99,
                                        "network_settings": {"hidden_units": 64}}},
            "trainer_settings": {**QUIET, "test_step_num_episodes": 5, "target_reward": 475},
        }},
        "checkpoint_settings": {"results_dir": str(tmp_path), "run_id": "gail"},
    })  # fmt: skip
    result = train_from_options(options)
    assert result.best_score >= 475, result
    history = pq.read_table(tmp_path / "gail" / "history.parquet").to_pydict()
    expert = [v for v in history["train/gail_expert_estimate"] if v is not None]
    agent = [v for v in history["train/gail_policy_estimate"] if v is not None]
    assert expert[0] > agent[0]  # the discriminator tells them apart early on
