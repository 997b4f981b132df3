"""Loggers for a trainer's ``logger=``: the Logger check, HistoryLogger, TensorBoardLogger."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from rlfleet.errors import ConfigError, MissingDependencyError
from rlfleet.logging import HistoryLogger, Logger, TensorBoardLogger, WandbLogger, read_history
from rlfleet.logging.loggers import check_logger
from tests.logging.recorder import Recorder
from tests.wandb_runs import offline_run_records, use_offline_wandb


class _NoSaveData:
    def log_train_data(self, log_data: Any, step: int) -> None: ...

    def log_test_data(self, log_data: Any, step: int) -> None: ...

    def log_update_data(self, log_data: Any, step: int) -> None: ...


def test_check_logger_names_the_missing_methods() -> None:
    with pytest.raises(ConfigError, match=r"got _NoSaveData without save_data$"):
        check_logger(_NoSaveData())
    with pytest.raises(ConfigError, match="got int without log_train_data, log_test_data"):
        check_logger(3)


def test_history_logger_is_a_logger_and_writes_its_rows(tmp_path: Path) -> None:
    logger = HistoryLogger(tmp_path / "h.parquet")
    assert check_logger(logger) is logger
    assert isinstance(logger, Logger)
    logger.log_train_data({"env_step": 10, "epoch": 1, "train/return_mean": 5.0}, 10)
    logger.log_update_data({"env_step": 10, "gradient_step": 3, "loss/policy": 0.5}, 3)
    assert not (tmp_path / "h.parquet").exists()  # written at each checkpoint
    logger.save_data(1, 10, 3, lambda e, s, g: "ckpt")
    logger.log_test_data({"env_step": 20, "test/return_mean": 7.0}, 20)
    logger.finalize()
    rows = read_history(tmp_path / "h.parquet")
    assert [r["env_step"] for r in rows] == [10, 10, 20]
    assert rows[1]["loss/policy"] == 0.5
    assert rows[2]["test/return_mean"] == 7.0


def test_tensorboard_logger_needs_tensorboard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'rlfleet\[tensorboard\]'"):
        TensorBoardLogger(tmp_path / "tb")


def test_tensorboard_logger_writes_scalars(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(tmp_path / "tb")
    assert check_logger(logger) is logger
    logger.log_train_data({"env_step": 64, "epoch": 1, "train/return_mean": 5.0}, 64)
    logger.log_update_data({"env_step": 64, "gradient_step": 8, "loss/policy": 0.25}, 8)
    logger.save_data(1, 64, 8, lambda e, s, g: "ckpt")
    logger.finalize()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {
        "train/return_mean",
        "loss/policy",
        "save/epoch",
        "save/gradient_step",
    }
    assert [(e.step, e.value) for e in events.Scalars("loss/policy")] == [(8, 0.25)]


def test_wandb_logger_logs_a_trainers_rows_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_offline_wandb(monkeypatch)
    from rlfleet import PPO, OnPolicyTrainer, make_vec_env
    from rlfleet.algos.ppo import PPOConfig
    from rlfleet.train.loop import TrainerConfig

    envs = make_vec_env("CartPole-v1", 2, seed=0)
    test_envs = make_vec_env("CartPole-v1", 2, seed=1)
    algo = PPO(envs.single_observation_space, envs.single_action_space, seed=0,
               config=PPOConfig(num_steps=64, batch_size=64))  # fmt: skip
    logger = WandbLogger("tianshou-style", tmp_path)
    assert check_logger(logger) is logger
    config = TrainerConfig(max_steps=256, epoch_num_steps=128, test_step_num_episodes=2,
                           show_progress=False, verbose=False)  # fmt: skip
    OnPolicyTrainer(algo, envs, test_envs, config, logger=logger).run()
    logger.finalize()
    names = [b"tianshou-style", b"train/return_mean", b"test/return_mean", b"loss/policy",
             b"save/epoch"]  # fmt: skip
    records = offline_run_records(tmp_path, names)
    for name in names:
        assert name in records, name


def test_wandb_logger_logs_every_row_at_its_env_step() -> None:
    # docs/coming-from-tianshou.md: WandbLogger logs "every row at its env step, as W&B steps
    # only go forward": update rows too, whose step argument is their gradient step.
    from rlfleet import PPO, OnPolicyTrainer, make_vec_env
    from rlfleet.algos.ppo import PPOConfig
    from rlfleet.train.loop import TrainerConfig

    logger = WandbLogger.__new__(WandbLogger)
    writer = Recorder()
    logger.writer = writer  # type: ignore[assignment]
    envs = make_vec_env("CartPole-v1", 2, seed=0)
    test_envs = make_vec_env("CartPole-v1", 2, seed=1)
    algo = PPO(envs.single_observation_space, envs.single_action_space, seed=0,
               config=PPOConfig(num_steps=64, batch_size=64, num_epochs=2))  # fmt: skip
    config = TrainerConfig(max_steps=512, epoch_num_steps=128, test_step_num_episodes=2,
                           show_progress=False, verbose=False)  # fmt: skip
    OnPolicyTrainer(algo, envs, test_envs, config, logger=logger).run()
    kinds = {k.split("/")[0] for data, _ in writer.rows for k in data}
    assert {"train", "test", "loss", "save"} <= kinds
    for data, step in writer.rows:
        if "env_step" in data:
            assert step == data["env_step"], data
    steps = [step for _, step in writer.rows]
    assert steps == sorted(steps)
    assert steps[-1] == 512
