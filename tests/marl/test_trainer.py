"""The DecentralizedTrainer speaks the single-agent trainers' vocabulary: the same loop,
hooks, settings, checkpoints and result; settings are checked at construction, and torch
threads are set while it trains."""

from __future__ import annotations

import inspect
import typing
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch

pytest.importorskip("pettingzoo")
from pettingzoo.classic import tictactoe_v3

from rlfleet.algos.dqn import DQN, DQNConfig
from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.errors import ConfigError
from rlfleet.logging.history import read_history
from rlfleet.logging.loggers import HistoryLogger
from rlfleet.marl.agents import Agents, RandomAgent, make_agents
from rlfleet.marl.trainer import DecentralizedTrainer, MultiAgentSettings
from rlfleet.train import loop as single
from rlfleet.train.loop import TrainerConfig, TrainingLoop, TrainResult
from rlfleet.train.trainer import Trainer

CALLERS = 3
"""The caller's own torch thread count, restored after training."""
QUIET = TrainerConfig(
    max_steps=10_000, max_episodes=4, epoch_num_steps=10_000, test_step_num_episodes=2,
    show_progress=False, verbose=False,
)  # fmt: skip


def _ppo_vs_random() -> list[Any]:
    ppo, _ = make_agents(tictactoe_v3.env, lambda obs, act, seed: PPO(obs, act, PPOConfig()))
    return [ppo, RandomAgent(ppo.observation_space, ppo.action_space)]


def test_hooks_have_the_single_agent_trainers_names_and_signatures() -> None:
    import rlfleet.marl.trainer as marl

    assert issubclass(DecentralizedTrainer, TrainingLoop)
    assert issubclass(Trainer, TrainingLoop)
    # rlfleet's form is the second overload of __init__ (the first is rbgame's form).
    _, rlfleet_form = typing.get_overloads(DecentralizedTrainer.__init__)
    ours = typing.get_type_hints(rlfleet_form, vars(marl))
    theirs = typing.get_type_hints(TrainingLoop.__init__, vars(single))
    hooks = [
        name for name in inspect.signature(TrainingLoop.__init__).parameters if name.endswith("_fn")
    ]
    assert hooks == [
        name for name in inspect.signature(rlfleet_form).parameters if name.endswith("_fn")
    ]  # fmt: skip
    assert inspect.signature(rlfleet_form).parameters == (
        inspect.signature(DecentralizedTrainer._build).parameters
    )
    for hook in hooks:
        if hook == "save_best_fn":
            # The same alias, for what each trains: an Algorithm, or the game's Agents.
            assert ours[hook] == single.SaveBestFn[Agents] | None
        else:
            assert ours[hook] == theirs[hook], hook
    assert "resume_from_log" in inspect.signature(rlfleet_form).parameters
    assert typing.get_type_hints(DecentralizedTrainer.run)["return"] is TrainResult


@pytest.mark.parametrize("threads", ["default", None, 2])
def test_str_run_dir_and_threads_while_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int | str | None
) -> None:
    monkeypatch.chdir(tmp_path)
    seen: list[tuple[int, int, int]] = []
    best: list[Agents] = []
    trainer = DecentralizedTrainer(
        tictactoe_v3.env,
        _ppo_vs_random(),
        QUIET,
        MultiAgentSettings(learning_mask=[True, False], collection_step_num_episodes=2),
        num_envs=2,
        num_test_envs=2,
        run_dir="runs/ttt",
        training_fn=lambda epoch, step: seen.append((epoch, step, torch.get_num_threads())),
        save_best_fn=best.append,
        **({} if threads == "default" else {"torch_threads": threads}),
    )
    torch.set_num_threads(CALLERS)
    try:
        result = trainer.run()
    finally:
        trainer.close()
    assert isinstance(result, TrainResult)
    assert result.run_dir == Path("runs/ttt")
    assert result.stop_reason == "max_episodes"
    assert 4 <= result.episodes <= 6  # copies finishing together may add one
    assert (tmp_path / "runs/ttt/history.parquet").is_file()
    assert (tmp_path / "runs/ttt/plots/learning_curve.png").is_file()
    expected = {"default": 1, None: CALLERS, 2: 2}[threads]
    assert {threads for _, _, threads in seen} == {expected}
    assert next((epoch, step) for epoch, step, _ in seen) == (1, 0)
    assert best == [trainer.agents]
    assert torch.get_num_threads() == CALLERS


def test_history_holds_per_agent_columns(tmp_path: Path) -> None:
    trainer = DecentralizedTrainer(
        tictactoe_v3.env, _ppo_vs_random(), QUIET,
        MultiAgentSettings(learning_mask=[True, False], collection_step_num_episodes=2),
        num_envs=2, num_test_envs=2, run_dir=tmp_path,
    )  # fmt: skip
    trainer.run()
    history = pq.read_table(tmp_path / "history.parquet").to_pydict()
    for column in ("train/return_mean/player_1", "test/return_mean/player_2", "test/score"):
        assert any(v is not None for v in history[column]), column
    assert any(k.startswith("player_1/") for k in history)  # the learner's update metrics
    assert not any(k.startswith("player_2/") for k in history)  # frozen: never updated


def test_out_of_range_settings_are_refused_at_construction() -> None:
    with pytest.raises(ConfigError, match=r"config\.max_episodes: .*greater than 0.*got 0"):
        DecentralizedTrainer(tictactoe_v3.env, _ppo_vs_random(), TrainerConfig(max_episodes=0))
    with pytest.raises(ConfigError, match=r"settings\.batch_size: .*greater than 0.*got 0"):
        DecentralizedTrainer(
            tictactoe_v3.env, _ppo_vs_random(), None, MultiAgentSettings(batch_size=0)
        )
    with pytest.raises(ConfigError, match="reward_metric or compute_score_fn"):
        DecentralizedTrainer(
            tictactoe_v3.env, _ppo_vs_random(), reward_metric=lambda r: 0.0,
            compute_score_fn=lambda stats: 0.0,
        )  # fmt: skip


@pytest.mark.parametrize(
    "settings", [{"compile": True}, {"cuda_graphs": True}, {"precision": "bf16"}]
)
def test_compile_and_precision_are_refused_with_what_is_expected(settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"not to DecentralizedTrainer; expected compile: false"):
        DecentralizedTrainer(tictactoe_v3.env, _ppo_vs_random(), TrainerConfig(**settings))


def test_iterates_epoch_by_epoch_and_logs_to_a_logger(tmp_path: Path) -> None:
    logger = HistoryLogger(tmp_path / "logged.parquet")
    trainer = DecentralizedTrainer(
        tictactoe_v3.env, _ppo_vs_random(),
        TrainerConfig(
            max_steps=10_000, max_episodes=6, epoch_num_steps=20, test_step_num_episodes=2,
            show_progress=False, verbose=False,
        ),
        MultiAgentSettings(learning_mask=[True, False], collection_step_num_episodes=2),
        num_envs=2, num_test_envs=2, logger=logger,
    )  # fmt: skip
    try:
        epochs = list(trainer)
    finally:
        trainer.close()
    assert len(epochs) >= 2
    assert [s.epoch for s in epochs] == list(range(1, len(epochs) + 1))
    # A multi-agent run tests every epoch, whatever test steps cost (no adaptive cadence).
    assert not trainer.test_steps_independent
    assert all(s.test_collect_stat is not None for s in epochs)
    assert epochs[-1].stop_reason == "max_episodes"
    assert not any(s.stop_reason for s in epochs[:-1])
    assert sum(s.train_collect_stat.episodes for s in epochs) == trainer.counters.episode
    last_test = epochs[-1].test_collect_stat
    assert last_test is not None
    assert last_test.returns.shape == (2, 2)  # [episodes, agents]
    logger.finalize()
    rows = read_history(tmp_path / "logged.parquet")
    assert any(r.get("test/return_mean/player_1") is not None for r in rows)


def test_every_epoch_tests_20_episodes_however_costly_test_steps_are() -> None:
    """docs/user-guide.md: in multi-agent runs every epoch ends with a test step of
    ``test_step_num_episodes`` (20 when unset), as in Tianshou: on a clock where a test
    episode costs 50 s and a training step 10 s, the adaptive cadence would skip most."""
    from tests.train.test_cadence import FakeClock

    clock = FakeClock()
    agents = make_agents(
        tictactoe_v3.env, lambda o, a, s: PPO(o, a, PPOConfig(), seed=s), share_parameters=True
    )
    trainer = DecentralizedTrainer(
        tictactoe_v3.env, agents,
        TrainerConfig(max_episodes=60, epoch_num_steps=60, show_progress=False, verbose=False),
        MultiAgentSettings(batch_size=64, collection_step_num_episodes=10),
        num_envs=2, num_test_envs=2,
        training_fn=lambda epoch, step: setattr(clock, "now", clock.now + 10.0),
    )  # fmt: skip
    trainer.clock = clock
    evaluator = trainer.evaluator
    assert evaluator is not None
    run = evaluator.run

    def costly(num_episodes: int, *args: Any, **kwargs: Any) -> Any:
        clock.now += 50.0 * num_episodes
        return run(num_episodes, *args, **kwargs)

    evaluator.run = costly  # type: ignore[method-assign]
    try:
        epochs = list(trainer)
    finally:
        trainer.close()
    assert len(epochs) >= 3
    assert [len(e.test_collect_stat.returns) for e in epochs if e.test_collect_stat] == [20] * len(
        epochs
    )


def test_reset_collector_buffers_empties_the_off_policy_learners_buffers() -> None:
    dqn, _ = make_agents(
        tictactoe_v3.env, lambda obs, act, seed: DQN(obs, act, DQNConfig(learning_starts=0))
    )
    trainer = DecentralizedTrainer(
        tictactoe_v3.env, [dqn, RandomAgent(dqn.observation_space, dqn.action_space)],
        TrainerConfig(
            max_steps=10_000, max_episodes=8, epoch_num_steps=10, test_step_num_episodes=2,
            show_progress=False, verbose=False,
        ),
        MultiAgentSettings(learning_mask=[True, False], collection_step_num_episodes=2),
        num_envs=2, num_test_envs=2,
    )  # fmt: skip
    try:
        trainer.execute_epoch()
        (learner,) = [learner for learner in trainer.collector.distinct() if learner.learning]
        assert learner.buffer is not None
        assert len(learner.buffer) > 0
        trainer.reset(reset_collector_buffers=True)
        assert len(learner.buffer) == 0
        assert trainer.run().stop_reason == "max_episodes"
        assert len(learner.buffer) > 0
    finally:
        trainer.close()
