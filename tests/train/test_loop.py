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


# --------------------------------------------------- xagents' stop rules and history rows
def _quiet(**settings: Any) -> TrainerConfig:
    return TrainerConfig(
        epoch_num_steps=256, test_step_num_episodes=2, show_progress=False, verbose=False,
        **{"max_steps": 512, **settings},
    )  # fmt: skip


def test_target_reward_on_training_episodes_stops_after_the_training_step() -> None:
    # Any CartPole return reaches 1: the first training step that ends an episode stops.
    config = _quiet(target_reward=1.0, target_reward_episodes="training", reward_buffer_size=5)
    trainer = _trainer(config=config)
    assert trainer.recent_returns.maxlen == 5
    result = trainer.run()
    assert result.stop_reason == "stop_fn (target_reward on training episodes)"
    assert result.env_steps == 128
    assert result.epochs == 1


def test_target_reward_on_training_episodes_ignores_test_scores() -> None:
    # Test scores reach 1 at once, but only the training mean is judged, and it never does.
    config = _quiet(target_reward=1e9, target_reward_episodes="training")
    assert _trainer(config=config).run().stop_reason == "max_steps"
    assert _trainer(config=_quiet(target_reward=1.0)).run().stop_reason.startswith("stop_fn")


def test_divergence_monitoring_steps_delays_the_patience_rules() -> None:
    def constant(stats: EvalStats) -> float:
        return 1.0  # never a new best after the first test step

    settings = {"max_steps": 2048, "early_stop_patience": 1}
    result = _trainer(config=_quiet(**settings), compute_score_fn=constant).run()
    assert (result.stop_reason, result.env_steps) == ("early_stop_patience", 512)
    config = _quiet(**settings, divergence_monitoring_steps=768)
    result = _trainer(config=config, compute_score_fn=constant).run()
    # The test step at 512 comes before monitoring starts; the one at 768 counts.
    assert (result.stop_reason, result.env_steps) == ("early_stop_patience", 768)


def test_the_history_has_one_row_per_training_episode(tmp_path: Path) -> None:
    trainer = _trainer(config=_quiet(reward_buffer_size=3), run_dir=tmp_path)
    result = trainer.run()
    rows = read_history(tmp_path / "history.parquet")
    episodes = [row for row in rows if row["episode/return"] is not None]
    assert [row["episode"] for row in episodes] == list(range(1, result.episodes + 1))
    returns = [row["episode/return"] for row in episodes]
    assert [row["episode/return_mean"] for row in episodes] == pytest.approx(
        [np.mean(returns[max(0, i - 2) : i + 1]) for i in range(len(returns))]
    )
    assert sum(row["episode/length"] for row in episodes) <= result.env_steps
    # Episode rows hold episode columns only; interval rows none of them.
    for row in rows:
        metrics = {key for key, value in row.items() if value is not None and "/" in key}
        episode_columns = {key for key in metrics if key.startswith("episode/")}
        assert not episode_columns or episode_columns == metrics
    assert any(row["test/return_mean"] is not None for row in rows)


def test_episode_rows_can_be_turned_off(tmp_path: Path) -> None:
    _trainer(config=_quiet(log_episodes=False), run_dir=tmp_path).run()
    rows = read_history(tmp_path / "history.parquet")
    assert not any("episode/return" in row for row in rows)
