"""The training loop's Tianshou 2 parameters: ``training_fn`` (and its deprecated name),
no test envs, ``multi_agent_return_reduction``, ``show_progress`` without ``verbose``;
``reset``, ``execute_epoch`` and iteration epoch by epoch; ``logger``; the checkpoint
cadence."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import io
import itertools
import json
import math
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console
from safetensors.numpy import load_file

from rlfleet import errors
from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.checkpoint import CheckpointManager, read_metadata
from rlfleet.cli.main import main as cli_main
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import CheckpointError, ConfigError, RunDirError
from rlfleet.logging.history import History, is_episode_row, read_history
from rlfleet.logging.loggers import HistoryLogger
from rlfleet.logging.progress import ProgressReporter
from rlfleet.runs.run import evaluate
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
    # One score per epoch, each the mean of the last 20 training episodes' returns; stop_fn
    # judges the best of them so far.
    assert len(judged) == 2
    rows = read_history(tmp_path / "history.parquet")
    assert not any(r.get("test/return_mean") is not None for r in rows)
    scores = [r["train/score"] for r in rows if r.get("train/score") is not None]
    assert scores[-1] == pytest.approx(np.mean(trainer.recent_returns))
    assert judged == list(itertools.accumulate(scores, max))
    assert best
    assert result.best_score == max(scores)
    # The latest checkpoint resumes without test envs too.
    resumed = _trainer(test_envs=False, run_dir=tmp_path, resume_from_log=True)
    assert resumed.counters.env_step == 512
    assert list(resumed.recent_returns) == list(trainer.recent_returns)


def test_stop_fn_judges_the_best_score_so_far_as_tianshou_does() -> None:
    """Tianshou 2's test step ends with ``stop_fn(best_score)``: a worse test score after a
    good one still reaches ``stop_fn`` as the good one."""
    scripted = iter([1.0, 3.0, 2.0, 0.5])
    judged: list[float] = []
    config = TrainerConfig(
        max_steps=1024,
        epoch_num_steps=256,
        test_step_num_episodes=1,
        test_in_training=False,
        show_progress=False,
        verbose=False,
    )
    result = _trainer(
        config=config,
        compute_score_fn=lambda stats: next(scripted),
        stop_fn=lambda score: judged.append(score) or False,
    ).run()
    assert judged == [1.0, 3.0, 3.0, 3.0]
    assert result.best_score == 3.0
    # The default stop rule, a threshold, stops where the scores first reach it.
    scripted = iter([1.0, 3.0, 2.0, 0.5])
    stopped = _trainer(
        config=dataclasses.replace(config, target_reward=2.5),
        compute_score_fn=lambda stats: next(scripted),
    ).run()
    assert stopped.stop_reason == "stop_fn"
    assert stopped.env_steps == 512


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


# ------------------------------------------------ reset, execute_epoch, iteration


def _params(trainer: OnPolicyTrainer) -> list[Any]:
    return [
        p.detach().clone()
        for module in trainer.algorithm.modules().values()
        for p in module.parameters()
    ]


def _same_params(a: list[Any], b: list[Any]) -> bool:
    assert a, "no parameters to compare"
    return len(a) == len(b) and all(bool((x == y).all()) for x, y in zip(a, b, strict=True))


def test_execute_epoch_until_a_stop_reason_trains_exactly_as_run() -> None:
    by_run = _trainer()
    result = by_run.run()
    by_epoch = _trainer()
    by_epoch.reset()
    epochs = [by_epoch.execute_epoch()]
    while not epochs[-1].stop_reason:
        epochs.append(by_epoch.execute_epoch())
    assert [s.epoch for s in epochs] == [1, 2]
    assert epochs[-1].stop_reason == result.stop_reason == "max_steps"
    assert by_epoch.result == dataclasses.replace(
        result, wall_time_s=by_epoch.result.wall_time_s, test_time_s=by_epoch.result.test_time_s
    )
    assert _same_params(_params(by_run), _params(by_epoch))


def test_iterating_a_trainer_yields_each_epochs_stats() -> None:
    reference = _trainer()
    reference.run()
    trainer = _trainer()
    stats = list(trainer)
    assert [s.epoch for s in stats] == [1, 2]
    assert [bool(s.stop_reason) for s in stats] == [False, True]
    assert _same_params(_params(reference), _params(trainer))
    first = stats[0]
    assert isinstance(first, loop.EpochStats)
    assert first.train_collect_stat.env_steps == 256
    assert first.train_collect_stat.episodes == len(first.train_collect_stat.episode_returns) > 0
    assert first.test_collect_stat is not None
    assert first.test_collect_stat.returns.shape == (2,)
    assert set(first.training_stat) >= {"loss/policy", "loss/value"}
    info = stats[-1].info_stat
    assert info.train_step == trainer.counters.env_step == 512
    assert info.train_episode == trainer.counters.episode
    assert info.gradient_step == trainer.algorithm.gradient_steps
    assert info.best_score == trainer.counters.best_score
    assert info.timing.total_time == pytest.approx(info.timing.train_time + info.timing.test_time)


def test_leaving_the_loop_early_lets_run_carry_on_from_the_counters() -> None:
    trainer = _trainer()
    for stats in trainer:
        assert stats.epoch == 1
        break
    assert trainer._session is None  # the bar and TensorBoard were closed
    result = trainer.run(reset_collectors=False)
    assert result.epochs == 2
    assert result.env_steps == 512


def test_without_test_envs_an_epoch_has_no_test_episodes() -> None:
    stats = _trainer(test_envs=False).execute_epoch()
    assert stats.test_collect_stat is None
    assert stats.info_stat.best_score == pytest.approx(
        np.mean(stats.train_collect_stat.episode_returns[-20:])
    )


def test_reset_starts_new_episodes_only_in_envs_that_were_stepped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trainer = _trainer()
    assert trainer.collector is not None
    resets: list[int] = []
    real = trainer.collector.reset_envs
    monkeypatch.setattr(
        trainer.collector, "reset_envs", lambda: resets.append(trainer.counters.env_step) or real()
    )
    trainer.reset()  # fresh envs, just reset with the seed: left as they are
    trainer.execute_epoch()
    trainer.reset(reset_collectors=False)
    assert resets == []
    trainer.reset()
    assert resets == [256]
    trainer.reset()  # not stepped since
    assert resets == [256]
    assert trainer.run().epochs == 2


# ---------------------------------------------------------------------- logger


class RecordingLogger:
    """Tianshou's logger methods, recording what they receive."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], int]] = []

    def log_train_data(self, log_data: Mapping[str, Any], step: int) -> None:
        self.calls.append(("train", dict(log_data), step))

    def log_test_data(self, log_data: Mapping[str, Any], step: int) -> None:
        self.calls.append(("test", dict(log_data), step))

    def log_update_data(self, log_data: Mapping[str, Any], step: int) -> None:
        self.calls.append(("update", dict(log_data), step))

    def log_info_data(self, log_data: Mapping[str, Any], step: int) -> None:
        self.calls.append(("info", dict(log_data), step))

    def save_data(
        self,
        epoch: int,
        env_step: int,
        gradient_step: int,
        save_checkpoint_fn: Callable[[int, int, int], str | None] | None = None,
    ) -> None:
        assert save_checkpoint_fn is not None
        path = save_checkpoint_fn(epoch, env_step, gradient_step)
        self.calls.append(("save", {"path": path}, epoch))

    def of(self, kind: str) -> list[tuple[dict[str, Any], int]]:
        return [(data, step) for k, data, step in self.calls if k == kind]


def test_logger_receives_train_update_test_and_save_data(tmp_path: Path) -> None:
    logger = RecordingLogger()
    config = TrainerConfig(
        max_steps=512,
        epoch_num_steps=256,
        test_step_num_episodes=2,
        log_interval_steps=128,
        show_progress=False,
        verbose=False,
    )
    trainer = _trainer(config=config, run_dir=tmp_path, logger=logger)
    trainer.run()
    history = read_history(tmp_path / "history.parquet")

    train = logger.of("train")
    assert [step for _, step in train] == [128, 256, 384, 512]
    assert all(data["env_step"] == step for data, step in train)
    assert all("loss/policy" not in data and "time/steps_per_s" in data for data, _ in train)
    update = logger.of("update")
    # A rollout of 128 steps, one repetition in minibatches of 64: two gradient steps each.
    assert [step for _, step in update] == [2, 4, 6, 8]
    assert all(data["gradient_step"] == step and "loss/policy" in data for data, step in update)
    test = logger.of("test")
    assert [step for _, step in test] == [256, 512]
    assert [data["test/return_mean"] for data, _ in test] == [
        r["test/return_mean"] for r in history if r.get("test/return_mean") is not None
    ]
    saves = logger.of("save")
    assert [epoch for _, epoch in saves] == [1, 2]
    checkpoints = sorted((tmp_path / "checkpoints").iterdir())
    assert [Path(data["path"]).name for data, _ in saves] == [p.name for p in checkpoints][-2:]
    info = logger.of("info")
    assert [step for _, step in info] == [1, 2]
    assert info[-1][0]["info/train_step"] == 512
    # Every interval row of the history reached the logger (the per-episode rows are the
    # history's own, as xagents writes them; a Tianshou logger gets per-collection data).
    intervals = [row for row in history if not is_episode_row(row)]
    assert len(train) + len(test) == len(intervals)


def test_history_logger_writes_a_parquet_history(tmp_path: Path) -> None:
    logger = HistoryLogger(tmp_path / "elsewhere.parquet")
    _trainer(logger=logger).run()
    rows = read_history(tmp_path / "elsewhere.parquet")
    assert [r["test/return_mean"] for r in rows if r.get("test/return_mean") is not None]
    assert any(r.get("loss/policy") is not None for r in rows)
    assert rows[-1]["env_step"] == 512


def test_an_object_that_is_not_a_logger_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"logger: expected an object with log_train_data.*got str"
    ):
        _trainer(logger="tensorboard")


def test_save_checkpoint_fn_is_called_at_the_end_of_every_epoch() -> None:
    saved: list[tuple[int, int, int]] = []

    def save_checkpoint_fn(epoch: int, env_step: int, gradient_step: int) -> str:
        saved.append((epoch, env_step, gradient_step))
        return f"ckpt-{epoch}"

    trainer = _trainer(save_checkpoint_fn=save_checkpoint_fn)
    steps = [(s.epoch, s.info_stat.train_step, s.info_stat.gradient_step) for s in trainer]
    assert saved == steps == [(1, 256, 4), (2, 512, 8)]


def test_test_in_training_never_stops_a_run_on_training_returns_alone() -> None:
    # Every training mean satisfies stop_fn, no test score does (each is -1).
    tested: list[int] = []
    result = _trainer(
        config=_quiet(reward_buffer_size=2),
        stop_fn=lambda score: score >= 0,
        compute_score_fn=lambda stats: -1.0,
        test_result_fn=lambda epoch, step, score: tested.append(step),
    ).run()
    assert result.stop_reason == "max_steps"
    assert result.env_steps == 512
    assert len(tested) > result.epochs  # the training returns triggered test steps


def test_a_stop_rule_mid_interval_still_ends_the_run_with_a_checkpoint() -> None:
    saved: list[int] = []

    def save_checkpoint_fn(epoch: int, env_step: int, gradient_step: int) -> str:
        saved.append(env_step)
        return f"ckpt-{epoch}"

    config = _quiet(
        checkpoint_interval_steps=10_000, target_reward=1.0, target_reward_episodes="training",
        reward_buffer_size=5,
    )  # fmt: skip
    result = _trainer(config=config, save_checkpoint_fn=save_checkpoint_fn).run()
    assert result.stop_reason.startswith("stop_fn")
    assert saved == [result.env_steps] == [128]


def test_test_episodes_act_with_the_mode_and_training_samples() -> None:
    phase = ["training"]
    calls: set[tuple[str, bool]] = set()
    trainer = _trainer(
        test_fn=lambda epoch, step: phase.__setitem__(0, "test"),
        training_fn=lambda epoch, step: phase.__setitem__(0, "training"),
    )
    act = trainer.algorithm.act

    def recording_act(obs: Any, **kwargs: Any) -> Any:
        calls.add((phase[0], kwargs.get("deterministic", False)))
        return act(obs, **kwargs)

    trainer.algorithm.act = recording_act  # type: ignore[method-assign]
    trainer.run()
    assert {mode for phase, mode in calls if phase == "test"} == {True}
    # Training samples its actions (the mode is asked for only to bootstrap the last value).
    assert ("training", False) in calls


def test_the_last_epoch_ends_with_a_checkpoint_off_the_interval() -> None:
    saved: list[int] = []

    def save_checkpoint_fn(epoch: int, env_step: int, gradient_step: int) -> str:
        saved.append(env_step)
        return f"ckpt-{epoch}"

    config = _quiet(max_steps=768, checkpoint_interval_steps=512)
    _trainer(config=config, save_checkpoint_fn=save_checkpoint_fn).run()
    assert saved == [512, 768]  # every 512 steps (two epochs), and the run's last


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
    # The run's last epoch still ends with a test step, at the step it stopped.
    assert result.best_env_step == 128
    assert result.best_score > -math.inf


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


# --------------------------------------------------------------------------- crash consistency

KILLED = 77
"""Exit code of a training child killed at a write boundary."""

CRASH_RUN = [
    "train", "ppo", "--env", "CartPole-v1", "--max-steps", "3840", "--epoch-num-steps", "128",
    "--num-steps", "64", "--num-envs", "2", "--batch-size", "64", "--num-epochs", "1",
    "--seed", "0", "--torch-threads", "1", "--keep-checkpoints", "2", "--deterministic",
    "--no-show-progress", "--no-verbose",
]  # fmt: skip


def _train_in_child(
    argv: list[str], kill_at: str | None, nth: int = 2, counts: Path | None = None
) -> int:
    """Run ``rlfleet train`` in a forked child that dies with no cleanup (``os._exit``) at the
    ``nth`` time it reaches the write boundary ``kill_at`` (``best/`` left out of the count);
    returns the child's exit code. With ``counts``, the child writes there how often it
    reached each boundary."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            reached: dict[str, int] = {}

            def die_at(name: str, path: Path) -> None:
                if "best" in path.parts:
                    return
                reached[name] = reached.get(name, 0) + 1
                if name == kill_at and reached[name] == nth:
                    os._exit(KILLED)

            errors.FAULT_HOOK = die_at
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                # A killed child leaves its lock behind; the next one takes it over.
                warnings.simplefilter("ignore")
                code = cli_main(argv)
            if counts is not None:
                counts.write_text(json.dumps(reached))
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _row_keys(run_dir: Path) -> list[tuple[int, int, tuple[str, ...]]]:
    """Each history row as (env_step, epoch, the metrics it holds), in file order."""
    return [
        (
            int(row["env_step"] or 0),
            int(row["epoch"] or 0),
            tuple(sorted(k for k, v in row.items() if v is not None and not k.startswith("time/"))),
        )
        for row in read_history(run_dir / "history.parquet")
    ]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork to kill a training child")
def test_a_kill_at_any_write_boundary_loses_no_history_row(tmp_path: Path) -> None:
    """A training run killed at each write boundary in turn (history, checkpoint, latest.json,
    rotation), and resumed after each kill, ends with exactly the history of a run never
    killed; after every kill `latest.json` is valid and every row up to its checkpoint is on
    disk once."""
    reference = tmp_path / "reference"
    assert _train_in_child([*CRASH_RUN, "--run-dir", str(reference)], kill_at=None) == 0
    expected = _row_keys(reference)
    run = tmp_path / "killed"
    where = ["--run-dir", str(run)]
    for boundary in errors.WRITE_BOUNDARIES:
        code = _train_in_child([*CRASH_RUN, *where], kill_at=boundary)
        assert code == KILLED, f"{boundary}: the child was not killed there (exit code {code})"
        where = ["--resume", str(run)]
        manager = CheckpointManager(run / "checkpoints", readonly=True)
        assert manager.latest_problem() is None, boundary
        latest = manager.latest()
        assert latest is not None
        pointer = json.loads((run / "checkpoints" / "latest.json").read_text())
        assert pointer == {"name": latest.name}, boundary
        step = read_metadata(latest)["counters"]["env_step"]
        rows = _row_keys(run)
        assert [row for row in rows if row[0] <= step] == [
            row for row in expected if row[0] <= step
        ], f"killed at {boundary}: history rows up to the checkpoint at step {step} differ"
    assert _train_in_child([*CRASH_RUN, *where], kill_at=None) == 0
    assert _row_keys(run) == expected
    stats, _ = evaluate(run, episodes=2)
    assert len(stats.returns) == 2


def _final_checkpoint(run_dir: Path) -> tuple[list[str], str]:
    """The run's checkpoint names, and a hash of every tensor of the latest one."""
    root = run_dir / "checkpoints"
    latest = CheckpointManager(root, readonly=True).latest()
    assert latest is not None
    digest = hashlib.sha256()
    for path in sorted(latest.rglob("*.safetensors")):
        tensors = load_file(str(path))
        for key in sorted(tensors):
            digest.update(key.encode() + tensors[key].tobytes())
    return sorted(p.name for p in root.iterdir() if p.name.startswith("step-")), digest.hexdigest()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork to kill a training child")
@pytest.mark.parametrize("boundary", ["checkpoint.renamed", "latest.renamed", "history.renamed"])
def test_a_run_killed_while_saving_its_last_epoch_resumes_to_the_same_end(
    tmp_path: Path, boundary: str
) -> None:
    """Killed at the last epoch's history flush, before ``latest.json`` names the last
    checkpoint, or after it does (the run had finished and was on its way out): the resume
    ends with the reference run's history, checkpoint names and tensors. It neither trains a
    spare epoch nor keeps a second copy of the last checkpoint beside the first."""
    short = [*CRASH_RUN, "--max-steps", "640"]
    reference = tmp_path / "reference"
    counts = tmp_path / "counts.json"
    assert _train_in_child([*short, "--run-dir", str(reference)], None, counts=counts) == 0
    last = json.loads(counts.read_text())[boundary]
    run = tmp_path / "killed"
    assert _train_in_child([*short, "--run-dir", str(run)], boundary, nth=last) == KILLED
    assert _train_in_child([*short, "--resume", str(run)], kill_at=None) == 0
    assert _row_keys(run) == _row_keys(reference)
    assert _final_checkpoint(run) == _final_checkpoint(reference)
    assert History(run / "history.parquet").stop_reason == "max_steps"


def _full_disk_from(boundary: str, history_too: bool = True) -> Callable[[str, Path], None]:
    """A fault hook: the disk fills up at ``boundary`` (outside ``best/``), and, with
    ``history_too``, every later write of the history fails too."""
    full = False

    def hook(name: str, path: Path) -> None:
        nonlocal full
        if name == boundary and "best" not in path.parts:
            full = True
        if full and (name == boundary or (history_too and name.startswith("history."))):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    return hook


def test_a_history_that_cannot_be_saved_after_a_failure_is_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(errors, "FAULT_HOOK", _full_disk_from("checkpoint.tensors_written"))
    trainer = _trainer(run_dir=tmp_path)
    with (
        pytest.warns(RuntimeWarning, match="could not save the history while stopping on Che"),
        pytest.raises(CheckpointError, match=r"cannot save the checkpoint \(No space left"),
    ):
        trainer.run()


def test_a_session_that_cannot_be_closed_after_a_failure_is_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(self: ProgressReporter) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    hook = _full_disk_from("checkpoint.tensors_written", history_too=False)
    monkeypatch.setattr(errors, "FAULT_HOOK", hook)
    monkeypatch.setattr(ProgressReporter, "close", no_space)
    trainer = _trainer(run_dir=tmp_path)
    with (
        pytest.warns(RuntimeWarning, match="could not close the session while stopping on Che"),
        pytest.raises(CheckpointError, match=r"cannot save the checkpoint \(No space left"),
    ):
        trainer.run()


def test_a_failed_history_flush_propagates_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(errors, "FAULT_HOOK", _full_disk_from("history.tmp_written"))
    trainer = _trainer(run_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RunDirError, match=r"history\.parquet: cannot write .No space left"):
            trainer.run()
    assert not (tmp_path / "checkpoints" / "latest.json").exists()


def test_rows_logged_before_an_error_are_written(tmp_path: Path) -> None:
    def prune_in_epoch_2(epoch: int, env_step: int, score: float) -> None:
        if epoch == 2:
            raise RuntimeError("pruned")

    trainer = _trainer(run_dir=tmp_path, test_result_fn=prune_in_epoch_2)
    with pytest.raises(RuntimeError, match="pruned"):
        trainer.run()
    assert max(row["env_step"] or 0 for row in read_history(tmp_path / "history.parquet")) == 512
    latest = CheckpointManager(tmp_path / "checkpoints", readonly=True).latest()
    assert latest is not None
    assert read_metadata(latest)["counters"]["env_step"] == 256


def test_resuming_a_run_its_stop_rule_ended_trains_nothing_more(tmp_path: Path) -> None:
    """A run that reached its target reward stays finished when resumed (killed on its way
    out, say): no epoch, no test row, no new checkpoint. (A run its step budget ended goes
    on when resumed with a larger one; tests/cli/test_train.py checks that.)"""
    run = tmp_path / "run"
    argv = [*CRASH_RUN, "--target-reward", "5"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli_main([*argv, "--run-dir", str(run)]) == 0
    rows = _row_keys(run)
    checkpoints = _final_checkpoint(run)
    assert History(run / "history.parquet").stop_reason == "stop_fn"
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli_main([*argv, "--resume", str(run)]) == 0
    assert _row_keys(run) == rows
    assert _final_checkpoint(run) == checkpoints
    assert History(run / "history.parquet").stop_reason == "stop_fn"
