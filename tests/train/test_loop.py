"""The training loop's Tianshou 2 parameters: ``training_fn`` (and its deprecated name),
no test envs, ``multi_agent_return_reduction``, ``show_progress`` without ``verbose``."""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.checkpoint import CheckpointManager
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import ConfigError
from rlfleet.logging.history import read_history
from rlfleet.train import loop
from rlfleet.train.loop import TrainerConfig
from rlfleet.train.trainer import OnPolicyTrainer
from rlfleet.types import EvalStats


def _trainer(test_envs: bool = True, **kwargs: Any) -> OnPolicyTrainer:
    envs = make_vec_env("CartPole-v1", 2, seed=0)
    algo = PPO(
        envs.single_observation_space,
        envs.single_action_space,
        PPOConfig(num_steps=64, batch_size=64, num_epochs=1),
        seed=0,
    )
    config = kwargs.pop(
        "config",
        TrainerConfig(
            max_steps=512,
            epoch_num_steps=256,
            test_step_num_episodes=2,
            show_progress=False,
            verbose=False,
        ),
    )
    return OnPolicyTrainer(
        algo,
        envs,
        make_vec_env("CartPole-v1", 2) if test_envs else None,
        config,
        seed=0,
        **kwargs,
    )


def test_training_fn_is_called_before_every_training_step() -> None:
    calls: list[tuple[int, int]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        trainer = _trainer(training_fn=lambda epoch, step: calls.append((epoch, step)))
    trainer.run()
    assert calls == [(1, 0), (1, 128), (2, 256), (2, 384)]


def test_train_fn_still_works_and_warns() -> None:
    calls: list[tuple[int, int]] = []
    with pytest.warns(DeprecationWarning, match="training_fn"):
        trainer = _trainer(train_fn=lambda epoch, step: calls.append((epoch, step)))
    trainer.run()
    assert calls[:2] == [(1, 0), (1, 128)]


def test_training_fn_and_train_fn_together_are_refused() -> None:
    with pytest.raises(ConfigError, match="not both"):
        _trainer(training_fn=lambda e, s: None, train_fn=lambda e, s: None)


def test_without_test_envs_the_stop_rule_judges_training_returns(tmp_path: Path) -> None:
    judged: list[float] = []
    best: list[str] = []
    config = TrainerConfig(
        max_steps=512,
        epoch_num_steps=256,
        test_in_training=False,
        show_progress=False,
        verbose=False,
    )
    trainer = _trainer(
        test_envs=False,
        config=config,
        run_dir=tmp_path,
        stop_fn=lambda score: judged.append(score) or False,
        save_best_fn=lambda algo: best.append(algo.name),
    )
    assert trainer.evaluator is None
    result = trainer.run()
    assert result.stop_reason == "max_steps"
    assert result.epochs == 2
    # One score per epoch, each the mean of the last 20 training episodes' returns.
    assert len(judged) == 2
    assert judged[-1] == pytest.approx(np.mean(trainer.recent_returns))
    assert best
    assert result.best_score == max(judged)
    rows = read_history(tmp_path / "history.parquet")
    assert not any(r.get("test/return_mean") is not None for r in rows)
    assert [r["train/score"] for r in rows if r.get("train/score") is not None] == judged
    # The latest checkpoint resumes without test envs too.
    resumed = _trainer(test_envs=False, run_dir=tmp_path, resume_from_log=True)
    assert resumed.counters.env_step == 512
    assert list(resumed.recent_returns) == list(trainer.recent_returns)


def test_without_test_envs_target_reward_stops_on_training_returns() -> None:
    config = TrainerConfig(
        max_steps=10_000,
        epoch_num_steps=256,
        target_reward=0.0,
        test_in_training=False,
        show_progress=False,
        verbose=False,
    )
    result = _trainer(test_envs=False, config=config).run()
    assert result.stop_reason == "stop_fn"
    assert result.env_steps == 256
    assert result.best_score > 0


def test_without_test_envs_save_best_follows_the_training_score(tmp_path: Path) -> None:
    trainer = _trainer(test_envs=False, run_dir=tmp_path)
    result = trainer.run()
    _, metadata = CheckpointManager(tmp_path / "best", keep=1).load_latest()
    assert metadata["counters"]["env_step"] == result.best_env_step


def test_test_fn_without_test_envs_is_refused() -> None:
    with pytest.raises(ConfigError, match="test_fn"):
        _trainer(test_envs=False, test_fn=lambda e, s: None)


def test_multi_agent_return_reduction_reduces_test_returns_before_the_score(
    tmp_path: Path,
) -> None:
    seen: list[tuple[int, ...]] = []
    scores: list[float] = []

    def reduction(returns: np.ndarray) -> np.ndarray:
        seen.append(returns.shape)
        return np.asarray(returns) * 0.0 - 1.0

    def compute_score_fn(stats: EvalStats) -> float:
        scores.append(stats.mean)
        return stats.mean

    _trainer(
        run_dir=tmp_path,
        multi_agent_return_reduction=reduction,
        compute_score_fn=compute_score_fn,
    ).run()
    assert seen == [(2,), (2,)]
    assert scores == [-1.0, -1.0]
    rows = read_history(tmp_path / "history.parquet")
    assert [r["test/return_mean"] for r in rows if r.get("test/return_mean") is not None] == [
        -1.0,
        -1.0,
    ]


def test_show_progress_draws_the_bar_without_verbose(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    real = loop.ProgressReporter

    def reporter(*args: Any, **kwargs: Any) -> Any:
        kwargs["console"] = Console(file=io.StringIO(), force_terminal=True)
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(loop, "ProgressReporter", reporter)
    config = TrainerConfig(max_steps=256, epoch_num_steps=256, show_progress=True, verbose=False)
    _trainer(config=config).run()
    assert made[0].show_bar
    output = made[0].console.file.getvalue()
    assert "epoch 1" not in output  # no summary line without verbose
