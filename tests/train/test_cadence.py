"""The test cadence: the adaptive rule on given costs, and the loop following it on a fake
clock (no assertion here reads the real one)."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.algos.registry import algorithm_classes
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer
from rlfleet.train.cadence import (
    ADAPTIVE_TEST_EPISODES,
    ALWAYS_TEST_S,
    MeasuredCost,
    adaptive_test_episodes,
)
from rlfleet.train.loop import TrainingLoop
from rlfleet.types import EvalStats

QUIET = {"show_progress": False, "verbose": False}


def _plan(
    elapsed_s: float, test_s: float, last: MeasuredCost | None, *, must: bool = False, **kw: Any
) -> int:
    return adaptive_test_episodes(
        elapsed_s=elapsed_s,
        test_s=test_s,
        last=last,
        choices=kw.get("choices", ADAPTIVE_TEST_EPISODES),
        max_share=kw.get("max_share", 0.1),
        must=must,
    )


def test_nothing_measured_yet_plays_the_smallest_count() -> None:
    assert _plan(0.0, 0.0, None) == 10
    assert _plan(0.0, 0.0, None, choices=(7,)) == 7


def test_the_largest_count_that_keeps_the_share_within_budget() -> None:
    # 0.2 s per episode: 20 episodes cost 4 s, 10 cost 2 s.
    last = MeasuredCost(seconds=2.0, episodes=10)
    # (2 + 4) / (50 + 4) = 11% > 10%; (2 + 2) / (50 + 2) = 7.7%.
    assert _plan(50.0, 2.0, last) == 10
    # (2 + 4) / (60 + 4) = 9.4%.
    assert _plan(60.0, 2.0, last) == 20
    # (2 + 2) / (30 + 2) = 12.5%: none fits.
    assert _plan(30.0, 2.0, last) == 0


def test_a_must_test_plays_the_smallest_count_when_none_fits() -> None:
    last = MeasuredCost(seconds=2.0, episodes=10)
    assert _plan(30.0, 2.0, last, must=True) == 10
    assert _plan(60.0, 2.0, last, must=True) == 20


def test_a_test_step_under_the_floor_always_runs() -> None:
    last = MeasuredCost(seconds=ALWAYS_TEST_S / 40, episodes=20)  # 20 episodes: half the floor
    assert _plan(1.0, 0.9, last) == 20


def test_an_explicit_count_is_the_only_choice() -> None:
    last = MeasuredCost(seconds=4.0, episodes=20)
    assert _plan(100.0, 0.0, last, choices=(20,)) == 20
    assert _plan(10.0, 0.0, last, choices=(20,)) == 0
    assert _plan(10.0, 0.0, last, choices=(20,), must=True) == 20


def test_the_share_bound_holds_after_every_adaptive_test() -> None:
    """Epochs of 3 s training and tests of 0.5 s per episode: every test the rule runs past
    the first keeps the running share within 10%."""
    elapsed = test = 0.0
    last: MeasuredCost | None = None
    tested_epochs = []
    for epoch in range(1, 101):
        elapsed += 3.0
        n = _plan(elapsed, test, last, must=epoch == 1)
        if n:
            cost = 0.5 * n
            elapsed += cost
            test += cost
            last = MeasuredCost(seconds=cost, episodes=n)
            tested_epochs.append(epoch)
            if epoch > 1:
                assert test / elapsed <= 0.1 + 1e-12
    # Sparse but regular: one test of 5 s in about every 15 epochs.
    assert 5 <= len(tested_epochs) <= 10
    assert test / elapsed > 0.08


def test_choices_must_not_be_empty() -> None:
    with pytest.raises(ValueError, match="at least one"):
        _plan(1.0, 0.0, None, choices=())


# --------------------------------------------------------------------- the loop
class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _trainer(
    trainer: dict[str, Any], *, step_s: float, episode_s: float, max_steps: int = 1600
) -> tuple[TrainingLoop[Any, Any], list[int]]:
    """A DQN CartPole trainer on a fake clock: each training step takes ``step_s``, each
    test episode ``episode_s``. Returns it and the episode counts of its test steps. The
    test episodes are not played (the clock says what they cost); each scores 0."""
    cfg = default_run_config(
        "dqn",
        "CartPole-v1",
        {
            "seed": 1,
            "env": {"num_envs": 2, "num_test_envs": 2},
            "hyperparameters": {
                "learning_starts": 100,
                "batch_size": 16,
                "buffer_size": 1000,
                "hidden_sizes": [16],
                "train_freq": 4,
                "gradient_steps": 1,  # the CartPole preset takes 128 every 256 steps
            },
            "trainer": {
                **QUIET,
                "max_steps": max_steps,
                "epoch_num_steps": 100,
                "target_reward": None,
                "test_step_num_episodes": None,  # the CartPole preset sets 10
                **trainer,
            },
        },
    )
    clock = FakeClock()
    played: list[int] = []

    def training_fn(epoch: int, env_step: int) -> None:
        clock.now += step_s

    loop = make_trainer(cfg, None)
    loop.training_fn = training_fn
    loop.clock = clock
    assert loop.evaluator is not None

    def timed_run(num_episodes: int) -> EvalStats:
        played.append(num_episodes)
        clock.now += episode_s * num_episodes
        return EvalStats(np.zeros(num_episodes), np.full(num_episodes, 10))

    loop.evaluator.run = timed_run  # type: ignore[method-assign]
    return loop, played


def test_cheap_test_steps_end_every_epoch_with_20_episodes() -> None:
    loop, played = _trainer({}, step_s=0.01, episode_s=0.001)
    result = loop.run()
    assert result.epochs == 16
    assert played == [10] + [20] * 15


def test_costly_test_steps_are_spaced_out_and_the_last_epoch_still_tests() -> None:
    # 25 training steps (of 4 env steps) of 0.4 s: 10 s per epoch; 10 test episodes cost 5 s.
    loop, played = _trainer({}, step_s=0.4, episode_s=0.5)
    epochs = list(loop)
    tested = [e.epoch for e in epochs if e.test_collect_stat is not None]
    assert tested[0] == 1
    assert tested[-1] == 16
    assert 2 < len(tested) < 8
    assert played == [10] * len(tested)
    for e in epochs:
        if e.epoch in tested[1:-1]:
            assert e.info_stat.timing.test_time / e.info_stat.timing.total_time <= 0.1 + 1e-9
    assert 0.08 < loop.result.test_share < 0.15


def test_the_first_epoch_of_every_session_tests_a_resumed_one_too() -> None:
    """docs/user-guide.md: the first epoch of a session always ends with a test step (10
    episodes: nothing is measured yet); the loop iterated again is a session of its own, as a
    resumed run is, and its first epoch tests as well, however costly test steps are."""
    loop, played = _trainer({}, step_s=0.4, episode_s=0.5)
    first = list(itertools.islice(iter(loop), 6))
    assert [e.epoch for e in first if e.test_collect_stat is not None] == [1]
    played.clear()
    second = list(loop)
    tested = [e.epoch for e in second if e.test_collect_stat is not None]
    assert second[0].epoch == 7
    assert tested[0] == 7
    assert tested[-1] == 16
    assert len(tested) < len(second)
    assert played[0] == 10


def test_an_explicit_cadence_and_count_are_kept_whatever_tests_cost() -> None:
    loop, played = _trainer(
        {"test_interval_steps": 300, "test_step_num_episodes": 3}, step_s=0.4, episode_s=50.0
    )
    epochs = list(loop)
    tested = [e.epoch for e in epochs if e.test_collect_stat is not None]
    # Epochs end at 100, 200, ...: the first at or past each 300 steps, and the last.
    assert tested == [3, 6, 9, 12, 15, 16]
    assert played == [3] * 6


def test_an_explicit_count_is_kept_under_the_adaptive_cadence() -> None:
    loop, played = _trainer({"test_step_num_episodes": 3}, step_s=0.4, episode_s=0.5)
    loop.run()
    assert set(played) == {3}


@pytest.mark.parametrize(
    "trigger",
    [
        "target_reward", "early_stop_patience", "plateau_reduce_patience", "test_fn",
        "test_result_fn",
    ],
)  # fmt: skip
def test_runs_whose_test_scores_steer_training_test_every_epoch(trigger: str) -> None:
    settings: dict[str, Any] = {
        "target_reward": {"target_reward": 10_000.0},
        "early_stop_patience": {"early_stop_patience": 100},
        "plateau_reduce_patience": {"plateau_reduce_patience": 100},
    }.get(trigger, {})
    loop, played = _trainer(settings, step_s=0.4, episode_s=50.0, max_steps=500)
    assert not loop.tests_steer_training or settings
    if not settings:  # a hook that sees test steps
        setattr(loop, trigger, lambda *args: None)
    assert loop.tests_steer_training
    loop.run()
    assert played == [20] * 5


def _params(loop: TrainingLoop[Any, Any]) -> list[torch.Tensor]:
    return _tensors(loop.algorithm.state_dict())


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for k in sorted(value, key=str) for t in _tensors(value[k])]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


SINGLE_PROCESS_ONLINE = [
    name for name, cls in algorithm_classes().items() if cls.kind in ("on_policy", "off_policy")
]


def test_the_online_single_process_algorithms_are_all_here() -> None:
    assert SINGLE_PROCESS_ONLINE == ["a2c", "acer", "ddpg", "dqn", "ppo", "sac", "td3", "trpo"]


@pytest.mark.parametrize("algo", SINGLE_PROCESS_ONLINE)
def test_skipped_test_steps_do_not_change_training(algo: str) -> None:
    """docs/user-guide.md: "Skipped test steps change nothing in training", for every
    algorithm a single-agent trainer runs; with observation statistics on, which a test step
    must not update either."""
    cls = algorithm_classes()[algo]
    env = "CartPole-v1" if spaces.Discrete in cls.action_spaces else "Pendulum-v1"
    # Smaller than the defaults where the algorithm has the setting (ACER's batch_size is
    # fixed by its rollout: None).
    defaults = {f.name: f.default for f in dataclasses.fields(cls.config_class)}
    small = {"learning_starts": 64, "num_steps": 64, "batch_size": 64}
    hyperparameters = {"normalize_obs": True} | {
        k: v for k, v in small.items() if defaults.get(k) is not None
    }

    def run(interval: int) -> TrainingLoop[Any, Any]:
        cfg = default_run_config(
            algo,
            env,
            {
                "seed": 4,
                "env": {"num_envs": 2, "num_test_envs": 2},
                "trainer": {
                    **QUIET,
                    "max_steps": 512,
                    "epoch_num_steps": 128,
                    "target_reward": None,
                    "test_step_num_episodes": 2,
                    "test_interval_steps": interval,
                },
                "hyperparameters": hyperparameters,
            },
        )
        loop = make_trainer(cfg, None)
        loop.run()
        return loop

    every, last_only = run(1), run(10_000)
    a, b = _params(every), _params(last_only)
    assert len(a) == len(b) > 0
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
