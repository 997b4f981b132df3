"""DQN: learns CartPole-v1 with its shipped preset; flags; refuses bad input clearly."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.algos import DQN, DQNConfig
from rlfleet.errors import ConfigError, EnvSpecError, InsufficientMemoryError
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer

QUIET = {"show_progress": False, "verbose": False}
OBS = spaces.Box(-1, 1, (4,), np.float32)


def _trainer(overrides: dict[str, Any]) -> Any:
    return make_trainer(default_run_config("dqn", "CartPole-v1", overrides), None)


@pytest.mark.slow
def test_learns_cartpole() -> None:
    # The shipped preset reaches the threshold at a fixed seed within its 50k-step
    # budget (about 29k steps, 20 s of CPU time).
    trainer = _trainer({"seed": 0, "trainer": {**QUIET, "target_reward": 475}})
    result = trainer.run()
    assert result.best_score >= 475, result


@pytest.mark.parametrize(
    "flags",
    [
        {"double": True},
        {"dueling": True},
        {"n_step": 3},
        {"prioritized": True},
        {"double": True, "dueling": True, "n_step": 3, "prioritized": True},
    ],
)
def test_flags_train_without_error(flags: dict[str, Any]) -> None:
    trainer = _trainer(
        {
            "hyperparameters": {
                **flags,
                "learning_starts": 64,
                "batch_size": 16,
                "hidden_sizes": [16],
                "train_freq": 4,
                "gradient_steps": 1,
            },
            "env": {"num_envs": 2, "num_test_envs": 1},
            "trainer": {
                **QUIET,
                "max_steps": 400,
                "epoch_num_steps": 400,
                "test_step_num_episodes": 1,
            },
        }
    )
    result = trainer.run()
    assert result.gradient_steps > 0
    assert torch.isfinite(trainer.algorithm.parameters_vector()).all()


def test_prioritized_replay_updates_priorities() -> None:
    trainer = _trainer(
        {
            "hyperparameters": {
                "prioritized": True,
                "learning_starts": 64,
                "batch_size": 16,
                "train_freq": 4,
                "gradient_steps": 1,
            },
            "env": {"num_envs": 1, "num_test_envs": 1},
            "trainer": {
                **QUIET,
                "max_steps": 200,
                "epoch_num_steps": 200,
                "test_step_num_episodes": 1,
            },
        }
    )
    trainer.run()
    sampler = trainer.buffer.sampler
    assert sampler.max_priority != 1.0  # TD errors replaced the initial priority


def test_epsilon_falls_linearly_with_progress() -> None:
    algo = DQN(
        OBS, spaces.Discrete(2), DQNConfig(exploration_fraction=0.5, exploration_final_eps=0.1)
    )
    algo.set_progress(0.25)
    assert algo.exploration_rate() == pytest.approx(0.55)
    algo.set_progress(0.9)
    assert algo.exploration_rate() == pytest.approx(0.1)
    # Greedy actions ignore epsilon entirely.
    algo.set_progress(0.0)
    obs = torch.zeros(32, 4)
    greedy = algo.act(obs, deterministic=True).actions
    assert torch.equal(greedy, algo.act(obs, deterministic=True).actions)


def test_refuses_box_actions_naming_the_space_and_alternatives() -> None:
    with pytest.raises(
        EnvSpecError, match=r"dqn does not support action space Box.*ddpg.*sac.*td3"
    ):
        DQN(OBS, spaces.Box(-1, 1, (2,), np.float32))


def test_batch_larger_than_the_buffer_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"batch_size \(512\) is larger than the replay buffer"):
        _trainer({"hyperparameters": {"batch_size": 512, "buffer_size": 100}})


def test_negative_learning_rate_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"learning_rate.*greater than 0.*-0.001"):
        _trainer({"hyperparameters": {"learning_rate": -0.001}})


def test_buffer_that_does_not_fit_in_memory_is_refused() -> None:
    with pytest.raises(InsufficientMemoryError, match=r"needs [\d.]+ GiB, but only [\d.]+ GiB"):
        _trainer({"hyperparameters": {"buffer_size": 10**12}})


def test_discrete_spaces_that_do_not_start_at_zero() -> None:
    """``act`` gives indices; the env gets them shifted by ``start`` once."""
    algo = DQN(OBS, spaces.Discrete(3, start=-1), DQNConfig(exploration_initial_eps=1.0))
    indices = algo.act(torch.zeros(512, 4)).actions
    assert set(indices.tolist()) == {0, 1, 2}
    assert set(algo.env_actions(indices).tolist()) == {-1, 0, 1}
    assert set(algo.predict(np.zeros((8, 4), np.float32)).tolist()) <= {-1, 0, 1}
