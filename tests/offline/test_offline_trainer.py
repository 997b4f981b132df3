"""OfflineTrainer: conservative Q-values, exact resume, refused input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.algos.bc import BC
from rlfleet.algos.cql import CQL, CQLConfig
from rlfleet.data.dataset import OfflineDataset
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import ConfigError, DatasetError
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer
from tests.offline.helpers import save_random_dataset

QUIET = {"show_progress": False, "verbose": False}


def test_discrete_cql_keeps_unseen_actions_below_seen_ones() -> None:
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, (257, 4)).astype(np.float32)
    dataset = OfflineDataset(
        obs[:-1],
        np.zeros(256, np.int64),  # action 1 never appears
        np.ones(256, np.float32),
        np.zeros(256, bool),
        np.zeros(256, bool),
        obs[1:],
        observation_space=spaces.Box(-1, 1, (4,), np.float32),
        action_space=spaces.Discrete(2),
        env_id="Toy-v0",
        source={"kind": "arrays"},
    )
    buffer = dataset.to_replay_buffer()
    config = CQLConfig(
        hidden_sizes=(32,), batch_size=64, learning_rate=1e-3, tau=1.0, target_update_interval=50
    )
    cql = CQL(dataset.observation_space, dataset.action_space, config)
    metrics = cql.update(buffer, num_gradient_steps=150)
    q = cql.q_net(torch.as_tensor(obs))
    assert (q[:, 1] < q[:, 0] - 1.0).all()
    assert {"loss/td", "loss/cql", "train/q_mean"} <= set(metrics)


def _trainer(
    dataset: Path,
    run_dir: Path,
    max_steps: int,
    resume: bool = False,
    target_reward: float | None = None,
) -> object:
    cfg = default_run_config(
        "bc",
        "CartPole-v1",
        {
            "dataset": str(dataset),
            "env": {"num_test_envs": 2},
            "hyperparameters": {"batch_size": 32, "hidden_sizes": [16]},
            "trainer": {
                **QUIET,
                "max_steps": max_steps,
                "epoch_num_steps": 100,
                "test_step_num_episodes": 2,
                "target_reward": target_reward,
            },
        },
    )
    return make_trainer(cfg, run_dir, resume=resume)


def test_resume_continues_the_same_minibatch_sequence(tmp_path: Path) -> None:
    dataset = save_random_dataset("CartPole-v1", tmp_path / "data", 500)
    straight: Any = _trainer(dataset, tmp_path / "straight", 300)
    straight.run()
    first: Any = _trainer(dataset, tmp_path / "resumed", 100)
    first.run()
    resumed: Any = _trainer(dataset, tmp_path / "resumed", 300, resume=True)
    assert resumed.counters.env_step == 100
    result = resumed.run()
    assert result.gradient_steps == 300
    assert torch.equal(
        straight.algorithm.parameters_vector(), resumed.algorithm.parameters_vector()
    )
    for trainer in (straight, first, resumed):
        trainer.close()


def test_offline_trainer_refuses_online_algorithms_and_foreign_datasets(tmp_path: Path) -> None:
    from rlfleet.algos.dqn import DQN
    from rlfleet.train.trainer import OfflineTrainer

    path = save_random_dataset("CartPole-v1", tmp_path / "data", 200)
    dataset = OfflineDataset.load(path)
    envs = make_vec_env("CartPole-v1", 1)
    try:
        dqn = DQN(envs.single_observation_space, envs.single_action_space)
        with pytest.raises(ConfigError, match="needs an offline algorithm"):
            OfflineTrainer(dqn, dataset, envs)
        other = BC(spaces.Box(-1, 1, (3,), np.float32), envs.single_action_space)
        with pytest.raises(DatasetError, match="observation space"):
            OfflineTrainer(other, dataset, envs)
    finally:
        envs.close()


def test_offline_history_counts_gradient_steps_and_its_curve_starts_untrained(
    tmp_path: Path,
) -> None:
    from rlfleet.logging import History

    dataset = save_random_dataset("CartPole-v1", tmp_path / "data", 300)
    # Solved at the first test after training: without the test at step 0, the run's
    # learning curve would be a single point.
    trainer: Any = _trainer(dataset, tmp_path / "run", 300, target_reward=0.0)
    result = trainer.run()
    trainer.close()
    assert result.stop_reason == "stop_fn"
    assert result.step_unit == "gradient steps"
    assert result.env_steps == result.gradient_steps == 100

    history = History(tmp_path / "run" / "history.parquet")
    assert history.step_unit == "gradient steps"
    assert history.stop_reason == "stop_fn"
    steps, _ = history.series("test/return_mean")
    np.testing.assert_array_equal(steps, [0, 100])
    assert (tmp_path / "run" / "plots" / "learning_curve.png").is_file()
