"""Curricula: lessons advance when their criteria are met and not before, are logged and
shown, and survive a resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from rlfleet.envs.curriculum import (
    CompletionCriteria,
    EnvironmentParameterSettings,
    EnvParameterManager,
    Lesson,
)
from rlfleet.envs.parameters import ConstantSampler
from rlfleet.errors import ConfigError
from rlfleet.logging.progress import ProgressReporter
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer, train


def _curriculum(*criteria: CompletionCriteria | None, name: str = "p") -> EnvParameterManager:
    lessons = [
        Lesson(f"lesson{i}", ConstantSampler(float(i)), c) for i, c in enumerate([*criteria, None])
    ]
    return EnvParameterManager({name: EnvironmentParameterSettings(lessons)}, ["A"])


def _reward(threshold: float, length: int, smoothing: bool = False) -> CompletionCriteria:
    return CompletionCriteria(
        behavior="A", threshold=threshold, min_lesson_length=length, signal_smoothing=smoothing
    )


def test_reward_lessons_wait_for_min_lesson_length_and_the_threshold() -> None:
    manager = _curriculum(_reward(10.0, 3), _reward(50.0, 2))
    assert not manager.observe([20.0, 20.0], 0.1).changed  # 2 episodes < min_lesson_length
    assert manager.lessons["p"] == 0
    assert manager.observe([20.0], 0.1).changed == ["p"]  # 3 episodes, mean 20 > 10
    assert manager.lessons["p"] == 1
    # The next lesson counts its own episodes: the buffer started empty again.
    assert not manager.observe([60.0], 0.2).changed
    assert manager.observe([60.0], 0.2).changed == ["p"]
    assert manager.lessons["p"] == 2
    assert not manager.observe([1000.0] * 5, 0.3).changed  # the last lesson stays


def test_a_measure_at_the_threshold_does_not_complete_the_lesson() -> None:
    manager = _curriculum(_reward(10.0, 2))
    for _ in range(5):
        assert not manager.observe([10.0, 10.0], 0.5).changed
    # The mean of the last min_lesson_length episodes, not of all of them.
    assert manager.observe([0.0, 30.0, 30.0], 0.5).changed == ["p"]


def test_signal_smoothing_blends_with_the_previous_measure() -> None:
    manager = _curriculum(_reward(10.0, 1, smoothing=True))
    assert not manager.observe([12.0], 0.1).changed  # 0.25 * 0 + 0.75 * 12 = 9
    assert manager.smoothed["p"] == pytest.approx(9.0)
    assert manager.observe([12.0], 0.1).changed  # 0.25 * 9 + 0.75 * 12 = 11.25


def test_progress_lessons_and_require_reset() -> None:
    criteria = CompletionCriteria(behavior="A", measure="progress", threshold=0.5,
                                  require_reset=True)  # fmt: skip
    manager = _curriculum(criteria)
    assert not manager.observe([], 0.5).changed
    change = manager.observe([], 0.51)
    assert change.changed == ["p"]
    assert change.require_reset


def test_a_lesson_moves_at_most_one_lesson_per_check() -> None:
    """docs/reward-signals-and-curricula.md: progress past two thresholds at once moves one
    lesson; the next check moves the next."""
    progress = [
        CompletionCriteria(behavior="A", measure="progress", threshold=t) for t in (0.2, 0.4)
    ]
    manager = _curriculum(*progress)
    assert manager.observe([], 0.9).changed == ["p"]
    assert manager.lessons["p"] == 1
    assert manager.observe([], 0.9).changed == ["p"]
    assert manager.lessons["p"] == 2


def test_require_reset_drops_the_episodes_in_progress() -> None:
    """docs/reward-signals-and-curricula.md: with ``require_reset`` every training env starts
    a new episode at once, and the episodes in progress are dropped, not counted: after 3
    steps of 5-step episodes and a reset, the next 8 steps end one whole 5-step episode per
    env (not one of 2 more steps, nor one of 3 + 5)."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from rlfleet.algos.ppo import PPO
    from rlfleet.collect.collector import Collector
    from rlfleet.data.rollout import RolloutStorage
    from tests.toy_envs import MaskedPick

    envs = SyncVectorEnv([MaskedPick, MaskedPick], autoreset_mode=AutoresetMode.NEXT_STEP)
    algo = PPO(envs.single_observation_space, envs.single_action_space)
    collector = Collector(envs, algo, seed=0)
    partial = collector.collect_rollout(
        RolloutStorage(3, 2, algo.obs_layout.shape, algo.action_shape)
    )
    assert partial.episodes == 0
    collector.reset_envs()
    after = collector.collect_rollout(
        RolloutStorage(8, 2, algo.obs_layout.shape, algo.action_shape)
    )
    assert after.episode_lengths == [5, 5]


def test_criteria_of_another_behavior_ignore_this_one() -> None:
    lessons = [Lesson("a", ConstantSampler(0.0), _reward(1.0, 1)), Lesson("b", ConstantSampler(1))]
    lessons[0].completion_criteria.behavior = "B"  # type: ignore[union-attr]
    manager = EnvParameterManager({"p": EnvironmentParameterSettings(lessons)}, ["A", "B"])
    assert not manager.observe([100.0], 0.5, behavior="A").changed
    assert manager.observe([100.0], 0.5, behavior="B").changed
    with pytest.raises(ConfigError, match="needs a behavior name"):
        manager.observe([1.0], 0.5)


def test_report_and_state_round_trip() -> None:
    manager = _curriculum(_reward(1.0, 1), _reward(1.0, 1), name="length")
    manager.observe([5.0], 0.1)
    assert manager.metrics() == {"train/lesson/length": 1.0}
    assert manager.describe() == "length: lesson1 (2/3)"
    other = _curriculum(_reward(1.0, 1), _reward(1.0, 1), name="length")
    other.load_state_dict(manager.state_dict())
    assert other.lessons == manager.lessons
    assert other.samplers() == {"length": ConstantSampler(1.0)}


def test_settings_that_cannot_run_are_refused() -> None:
    bad = [Lesson("a", ConstantSampler(0.0)), Lesson("b", ConstantSampler(1.0))]
    with pytest.raises(ConfigError, match="needs completion_criteria"):
        EnvParameterManager({"p": EnvironmentParameterSettings(bad)}, ["A"])
    with pytest.raises(ConfigError, match="is not a behavior of this run"):
        _curriculum(CompletionCriteria(behavior="Z"))


# ------------------------------------------------------------ in training
def _cfg(max_steps: int, masspole: dict[str, Any]) -> Any:
    return default_run_config(
        "ppo",
        "CartPole-v1",
        {
            "env": {"num_envs": 4, "num_test_envs": 2},
            "hyperparameters": {"num_steps": 16, "batch_size": 64, "num_epochs": 1},
            "trainer": {"max_steps": max_steps, "epoch_num_steps": 256, "target_reward": None,
                        "log_interval_steps": 64, "test_step_num_episodes": 2,
                        "show_progress": False, "verbose": False},
            "environment_parameters": {"masspole": masspole},
        },
    )  # fmt: skip


def _lessons(
    first: dict[str, Any], *, second_threshold: float = 1e9, require_reset: bool = False
) -> dict[str, Any]:
    return {
        "curriculum": [
            {"name": "light", "value": 0.05,
             "completion_criteria": {"behavior": "CartPole", "require_reset": require_reset,
                                     **first}},
            {"name": "medium", "value": 0.2,
             "completion_criteria": {"behavior": "CartPole", "threshold": second_threshold,
                                     "min_lesson_length": 5}},
            {"name": "heavy", "value": 0.5},
        ]
    }  # fmt: skip


def test_lessons_advance_in_training_and_reach_history_progress_bar_and_envs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown: list[str] = []
    original = ProgressReporter.update

    def record(self: ProgressReporter, *args: Any, extra: str | None = None, **kw: Any) -> None:
        if extra:
            shown.append(extra)
        original(self, *args, extra=extra, **kw)

    monkeypatch.setattr(ProgressReporter, "update", record)
    cfg = _cfg(512, _lessons({"measure": "progress", "threshold": 0.5}, require_reset=True))
    trainer = make_trainer(cfg, tmp_path / "run")
    resets: list[int] = []
    original_reset = trainer.collector.reset_envs
    monkeypatch.setattr(
        trainer.collector, "reset_envs", lambda: (resets.append(1), original_reset())[1]
    )
    trainer.run()
    history = pq.read_table(tmp_path / "run" / "history.parquet").to_pydict()
    rows = [
        (step, lesson)
        for step, lesson in zip(history["env_step"], history["train/lesson/masspole"], strict=True)
        if lesson is not None
    ]
    # The lesson is on every training row (those with the training speed), not on some.
    training = [
        lesson
        for lesson, speed in zip(
            history["train/lesson/masspole"], history["time/steps_per_s"], strict=True
        )
        if speed is not None
    ]
    assert training
    assert None not in training
    # Progress 0.5 is passed after the 256th step: the lesson changes at 320 (5 x 64).
    assert [lesson for step, lesson in rows if step <= 256] == [0.0] * 4
    assert [lesson for step, lesson in rows if step >= 320] == [1.0] * 4
    assert resets == [1]  # require_reset: every env started over once
    assert "masspole: light (1/3)" in shown
    assert "masspole: medium (2/3)" in shown
    for env in trainer.train_envs.envs:  # type: ignore[attr-defined]
        assert env.unwrapped.masspole == 0.2
    # The test envs were sent the same lesson: their next episodes use its value.
    for env in trainer.test_envs.envs:  # type: ignore[union-attr]
        assert env.get_wrapper_attr("samplers") == {"masspole": ConstantSampler(0.2)}


def test_resume_keeps_the_lesson(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    masspole = _lessons({"measure": "reward", "threshold": 5.0, "min_lesson_length": 4})
    train(_cfg(256, masspole), run_dir)
    first = pq.read_table(run_dir / "history.parquet").to_pydict()
    assert [v for v in first["train/lesson/masspole"] if v is not None][-1] == 1.0
    trainer = make_trainer(_cfg(512, masspole), run_dir, resume=True)
    assert trainer.env_parameters is not None
    assert trainer.env_parameters.lessons == {"masspole": 1}
    # The envs were told the resumed lesson: their next episodes use its value.
    for env in trainer.train_envs.envs:  # type: ignore[attr-defined]
        assert env.get_wrapper_attr("samplers") == {"masspole": ConstantSampler(0.2)}
    trainer.run()
    assert trainer.env_parameters.lessons == {"masspole": 1}  # medium's threshold is 1e9


@pytest.mark.parametrize("algo", ["appo", "impala"])
def test_actor_learner_runs_refuse_environment_parameters(algo: str, tmp_path: Path) -> None:
    cfg = default_run_config(algo, "CartPole-v1", {"environment_parameters": {"masspole": 0.2}})
    with pytest.raises(ConfigError, match=f"{algo}: environment parameters are not supported"):
        make_trainer(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
