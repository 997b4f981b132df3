"""OffPolicyTrainer: warm-up, update-to-data ratio, checkpoints that keep the replay buffer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlfleet.algos import PPO
from rlfleet.checkpoint import CheckpointManager
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import ConfigError
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer, train
from rlfleet.train.trainer import OffPolicyTrainer

QUIET = {"show_progress": False, "verbose": False}


def _cfg(max_steps: int, trainer: dict[str, Any] | None = None, **hp: Any) -> Any:
    """A small DQN CartPole run config; ``trainer`` adds or overrides trainer settings."""
    return default_run_config(
        "dqn",
        "CartPole-v1",
        {
            "seed": 1,
            "env": {"num_envs": 2, "num_test_envs": 1},
            "hyperparameters": {
                "learning_starts": 100,
                "batch_size": 16,
                "buffer_size": 1000,
                "hidden_sizes": [16],
                "train_freq": 4,
                "gradient_steps": 1,
                **hp,
            },
            "trainer": {
                **QUIET,
                "max_steps": max_steps,
                "epoch_num_steps": 200,
                "test_step_num_episodes": 1,
                "target_reward": None,
                **(trainer or {}),
            },
        },
    )


def test_no_update_before_learning_starts_then_the_update_to_data_ratio_holds() -> None:
    trainer = make_trainer(_cfg(400, gradient_steps=2, train_freq=8), None)
    trainer.run()
    # 400 env steps; updates start once 100 are collected: (400 - 96) * 2 / 8 = 76, where 96
    # is the last collection step (of 8) that ended before learning_starts.
    assert trainer.algorithm.gradient_steps == (400 - 96) * 2 // 8
    assert len(trainer.buffer) > 300


def test_fractional_ratio_carries_over() -> None:
    trainer = make_trainer(_cfg(400, train_freq=2), None)
    trainer.update_step_num_gradient_steps_per_sample = 0.3
    trainer.run()
    # 4 env steps per collection step (2 envs); 0.3 per step: exact over the run.
    assert trainer.algorithm.gradient_steps == int((400 - 100) * 0.3)


def test_collection_rounds_up_to_whole_vector_steps() -> None:
    trainer = make_trainer(_cfg(64, train_freq=3), None)
    assert trainer.collection_step_num_env_steps == 4


def test_collection_by_episodes_collects_until_that_many_have_ended() -> None:
    trainer = make_trainer(_cfg(600), None)
    assert isinstance(trainer, OffPolicyTrainer)
    trainer = OffPolicyTrainer(
        trainer.algorithm,
        trainer.train_envs,
        None,
        trainer.config,
        collection_step_num_episodes=3,
        seed=1,
    )
    steps: list[int] = []
    episodes: list[int] = []
    real = trainer._training_step

    def training_step() -> Any:
        stats, metrics = real()
        steps.append(stats.env_steps)
        episodes.append(stats.episodes)
        return stats, metrics

    trainer._training_step = training_step  # type: ignore[method-assign]
    result = trainer.run()
    assert result.env_steps == sum(steps) >= 600
    assert min(episodes) >= 3
    # A collection step stops at the vector step where its third episode ends.
    assert all(n - 3 < 2 for n in episodes)
    assert len(set(steps)) > 1  # episodes vary in length, and so do collection steps
    # Gradient steps follow the steps collected (ratio 1 / train_freq), from the collection
    # step that reaches learning_starts on.
    first = next(i for i in range(len(steps)) if sum(steps[: i + 1]) >= 100)
    assert trainer.algorithm.gradient_steps == sum(steps[first:]) // 4


def test_collection_by_steps_and_by_episodes_together_is_refused() -> None:
    trainer = make_trainer(_cfg(64), None)
    with pytest.raises(ConfigError, match="not both"):
        OffPolicyTrainer(
            trainer.algorithm,
            trainer.train_envs,
            None,
            collection_step_num_env_steps=8,
            collection_step_num_episodes=2,
        )
    with pytest.raises(ConfigError, match="collection_step_num_episodes must be >= 1, got 0"):
        OffPolicyTrainer(
            trainer.algorithm, trainer.train_envs, None, collection_step_num_episodes=0
        )


def test_reset_collector_buffers_empties_the_replay_buffer() -> None:
    trainer = make_trainer(_cfg(400), None)
    assert isinstance(trainer, OffPolicyTrainer)
    trainer.execute_epoch()
    assert len(trainer.buffer) > 0
    trainer.reset(reset_collectors=False, reset_collector_buffers=True)
    assert len(trainer.buffer) > 0  # buffers are only emptied along with the collectors
    trainer.reset(reset_collector_buffers=True)
    assert len(trainer.buffer) == 0
    assert trainer.run(reset_collectors=False).env_steps == 400
    assert trainer.buffer.rows_filled == 100  # the 200 env steps since the reset, 2 envs


def test_checkpoint_keeps_the_replay_buffer_and_resume_restores_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(_cfg(400), run_dir)
    state, _ = CheckpointManager(run_dir / "checkpoints", readonly=True).load_latest()
    saved = state["replay_buffer"]
    assert saved["rows_filled"] == 200  # 400 env steps over 2 envs

    trainer = make_trainer(_cfg(600), run_dir, resume=True)
    assert trainer.counters.env_step == 400
    np.testing.assert_array_equal(trainer.buffer.obs["obs"][:200], saved["arrays"]["obs/obs"])
    assert len(trainer.buffer) == int(saved["arrays"]["valid"][:-1].sum())
    result = trainer.run()
    assert result.env_steps == 600
    assert trainer.buffer.rows_filled == 300


def test_checkpoint_without_the_buffer_when_asked(tmp_path: Path) -> None:
    cfg = _cfg(200)
    cfg.trainer.save_replay_buffer = False
    train(cfg, tmp_path / "run")
    state, _ = CheckpointManager(tmp_path / "run" / "checkpoints", readonly=True).load_latest()
    assert "replay_buffer" not in state
    # Resuming without data waits for the buffer to fill again instead of failing.
    trainer = make_trainer(_cfg(300), tmp_path / "run", resume=True)
    trainer.run()


def test_on_policy_algorithm_is_refused() -> None:
    envs = make_vec_env("CartPole-v1", 1)
    with pytest.raises(ConfigError, match="needs an off-policy algorithm"):
        OffPolicyTrainer(PPO(envs.single_observation_space, envs.single_action_space), envs, envs)
