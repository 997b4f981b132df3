"""rbgame's form of the DecentralizedTrainer: its constructor, ``train`` call, hooks, budget
and plot as rbgame documents them, on the common loop."""

from __future__ import annotations

import functools
import inspect
import itertools
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

pytest.importorskip("pettingzoo")
from pettingzoo.classic import tictactoe_v3

from rlfleet import DecentralizedTrainer
from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.errors import ConfigError
from rlfleet.marl.agents import Agents, RandomAgent
from rlfleet.marl.envs import MultiAgentVecEnv
from rlfleet.marl.rbgame import env_factory
from rlfleet.marl.trainer import MultiAgentSettings, RbgameParameters
from rlfleet.train.loop import TrainerConfig
from rlfleet.types import PolicyStep

TICTACTOE = {"env": "pettingzoo.classic.tictactoe_v3"}
ENVS = MultiAgentVecEnv(tictactoe_v3.env, 1)
OBS, ACT = ENVS.observation_spaces["player_1"], ENVS.action_spaces["player_1"]
DOCUMENTED = {
    "env_args": inspect.Parameter.empty,
    "num_train_envs": 16,
    "num_test_envs": 16,
    "batch_size": 64,
    "update_freq": 100,
    "test_freq": 100,
    "episodes_per_train": 5000,
    "episodes_per_test": 50,
    "train_fn": None,
    "test_fn": None,
    "save_best_fn": None,
    "save_last_fn": None,
    "stop_fn": None,
    "reward_metric": None,
    "shared_memory": True,
}
"""rbgame's documented constructor: its parameters in order, with their defaults."""


class _DeterministicFlags(RandomAgent):
    """A random player that records the ``deterministic`` flag of each of its acts."""

    def __init__(self) -> None:
        super().__init__(OBS, ACT, seed=3)
        self.flags: list[bool] = []

    def act(
        self,
        obs: torch.Tensor,
        *,
        deterministic: bool = False,
        action_mask: torch.Tensor | None = None,
        state: torch.Tensor | None = None,
    ) -> PolicyStep:
        self.flags.append(deterministic)
        return super().act(obs, deterministic=deterministic, action_mask=action_mask)


def _random_pair() -> list[RandomAgent]:
    return [RandomAgent(OBS, ACT, seed=1), RandomAgent(OBS, ACT, seed=2)]


def _small(**changes: Any) -> DecentralizedTrainer:
    """rbgame's form on one training copy (exact episode counts), 7 episodes, tests every 3,
    env copies in this process."""
    parameters: dict[str, Any] = {
        "shared_memory": False,
        "num_train_envs": 1,
        "num_test_envs": 2,
        "test_freq": 3,
        "episodes_per_train": 7,
        "episodes_per_test": 4,
        "update_freq": 8,
        **changes,
    }
    return DecentralizedTrainer(TICTACTOE, **parameters)


def test_the_documented_constructor_with_all_defaults() -> None:
    rbgame_form, _ = typing.get_overloads(DecentralizedTrainer.__init__)
    signature = inspect.signature(rbgame_form).parameters
    documented = {n: p.default for n, p in signature.items() if n != "self"}
    assert list(documented)[: len(DOCUMENTED)] == list(DOCUMENTED)
    assert {n: documented[n] for n in DOCUMENTED} == DOCUMENTED
    trainer = DecentralizedTrainer(TICTACTOE)
    assert trainer._rbgame == RbgameParameters(TICTACTOE)
    positional = DecentralizedTrainer(TICTACTOE, 8, 4, 32, 50, 20, 100, 10)
    assert positional._rbgame is not None
    assert (positional._rbgame.num_train_envs, positional._rbgame.episodes_per_test) == (8, 10)
    assert DecentralizedTrainer(env_args=TICTACTOE, shared_memory=False)._rbgame is not None


@pytest.mark.parametrize(
    "env_args",
    [
        TICTACTOE,
        {"env": "pettingzoo.classic.tictactoe_v3:raw_env", "render_mode": None},
        {"env": tictactoe_v3, "render_mode": None},
        {"env": tictactoe_v3.env, "render_mode": None},
        functools.partial(tictactoe_v3.env, render_mode=None),
        tictactoe_v3.env,
    ],
    ids=["module-path", "module-path-attr", "module", "factory-kwargs", "partial", "factory"],
)
def test_env_args_as_a_dict_or_a_factory(env_args: Any) -> None:
    env = env_factory(env_args)()
    assert env.possible_agents == ["player_1", "player_2"]
    trainer = DecentralizedTrainer(
        env_args, 1, 1, test_freq=2, episodes_per_train=2, shared_memory=False
    )
    result = trainer.train(_random_pair())
    assert result["num_collected_episodes"] == 2


def _game(render_mode: str | None = None) -> Any:
    return tictactoe_v3.env(render_mode=render_mode)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: DecentralizedTrainer(42), "env_args: expected a mapping"),
        (lambda: DecentralizedTrainer({"render_mode": None}), "expected an 'env' key"),
        (lambda: DecentralizedTrainer({"env": 3}), r"env_args\['env'\]: expected"),
        (lambda: DecentralizedTrainer({"env": _game, "board": 4}), "expected keyword arguments"),
        (
            lambda: DecentralizedTrainer(TICTACTOE, episodes=5),
            r"unknown key 'episodes'; did you mean 'episodes_per_test'",
        ),
        (lambda: DecentralizedTrainer(TICTACTOE, update_freq=0), r"update_freq: .*greater than 0"),
        (lambda: DecentralizedTrainer(TICTACTOE, 4, num_train_envs=4), "got \\['num_train_envs'"),
        (lambda: DecentralizedTrainer(num_train_envs=4), "expected env_args"),
        (
            lambda: DecentralizedTrainer(tictactoe_v3.env, config=TrainerConfig()),
            r"\['config'\] belong to rlfleet's form DecentralizedTrainer\(env, agents",
        ),
    ],
    ids=[
        "not-a-factory",
        "no-env",
        "bad-env",
        "bad-kwarg",
        "unknown",
        "range",
        "twice",
        "none",
        "no-agents",
    ],
)
def test_bad_env_args_and_keywords_are_one_line_config_errors(call: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        call()
    assert "\n" not in str(error.value)


def test_train_belongs_to_rbgame_form_and_masks_to_a_list_of_agents() -> None:
    rlfleet_form = DecentralizedTrainer(
        tictactoe_v3.env, _random_pair(), TrainerConfig(max_episodes=1), num_envs=1
    )
    with pytest.raises(ConfigError, match=r"call run\(\)"):
        rlfleet_form.train(_random_pair())
    rlfleet_form.close()
    agents = Agents(["player_1", "player_2"], _random_pair())
    with pytest.raises(ConfigError, match="carries its own masks"):
        _small().train(agents, learning_mask=[True, False])


@pytest.mark.parametrize(("num_train_envs", "exact"), [(1, True), (4, False)])
def test_episodes_per_train_is_the_total(num_train_envs: int, exact: bool) -> None:
    trainer = _small(num_train_envs=num_train_envs, test_freq=5, episodes_per_train=23)
    result = trainer.train(_random_pair())
    played = result["num_collected_episodes"]
    assert played == trainer.counters.episode == len(trainer.train_returns)
    # rbgame stops at the first step at which the count reaches the budget: copies that
    # finish on that step may add up to num_train_envs - 1 more.
    assert played == 23 if exact else 23 <= played < 23 + num_train_envs
    assert len(result["reward_metric_stats"]) == 5  # after 5, 10, 15, 20 and 23 episodes


def test_hooks_get_rbgames_arguments() -> None:
    calls: list[tuple[Any, ...]] = []
    trainer = _small(
        train_fn=lambda episodes, steps: calls.append(("train", episodes, steps)),
        test_fn=lambda episodes, steps: calls.append(("test", episodes, steps)),
        save_best_fn=lambda episodes: calls.append(("best", episodes)),
        save_last_fn=lambda: calls.append(("last",)),
        stop_fn=lambda reward, episodes: bool(calls.append(("stop", reward, episodes))),
        reward_metric=lambda rewards: 10.0 * (rewards.shape == (4, 2)) + rewards[:, 0].mean(),
    )
    result = trainer.train(_random_pair())
    steps = [c[2] for c in calls if c[0] == "test"]
    # train_fn comes before every step of the training copies, as in rbgame.
    train = [c[1:] for c in calls if c[0] == "train"]
    assert train[0] == (0, 0)
    assert all(a[1] < b[1] and a[0] <= b[0] for a, b in itertools.pairwise(train))
    assert (3, steps[0]) in train
    assert (6, steps[1]) in train
    assert train[-1][0] < 7
    assert train[-1][1] < result["num_collected_steps"]
    assert [c[1] for c in calls if c[0] == "test"] == [3, 6, 7]
    assert steps[-1] == result["num_collected_steps"] > steps[0] > 0
    metric = result["reward_metric_stats"]
    assert [c[1:] for c in calls if c[0] == "stop"] == list(zip(metric, [3, 6, 7], strict=True))
    assert all(m >= 9.0 for m in metric)  # reward_metric got [episodes_per_test, agents]
    best = [c[1] for c in calls if c[0] == "best"]
    assert best[0] == 3
    assert best == [
        e for i, e in enumerate([3, 6, 7]) if metric[i] > max(metric[:i], default=-np.inf)
    ]
    assert calls[-1] == ("last",)
    assert result["num_gradient_steps"] == 0  # random players learn nothing
    assert result["training_time"] > 0


def test_stop_fn_gets_the_metric_and_episodes_and_stops() -> None:
    seen: list[tuple[float, int]] = []

    def stop_fn(reward: float, episodes: int) -> bool:
        seen.append((reward, episodes))
        return episodes >= 6

    result = _small(episodes_per_train=100, stop_fn=stop_fn).train(_random_pair())
    assert result["num_collected_episodes"] == 6
    assert [e for _, e in seen] == [3, 6]
    assert [r for r, _ in seen] == result["reward_metric_stats"]


@pytest.mark.parametrize(("exploration_mask", "explores"), [(None, True), ([True, False], False)])
def test_exploration_mask_none_lets_frozen_agents_explore(
    exploration_mask: list[bool] | None, explores: bool
) -> None:
    frozen = _DeterministicFlags()
    trainer = _small(episodes_per_train=3, episodes_per_test=2)
    trainer.train([RandomAgent(OBS, ACT), frozen], [True, False], exploration_mask)
    flags = frozen.flags
    first_greedy = flags.index(True)  # test episodes are greedy
    assert all(flags[first_greedy:])
    assert (first_greedy > 0 and not any(flags[:first_greedy])) if explores else all(flags)


def test_plot_without_a_run_dir_goes_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _small().train(_random_pair(), plot=True)
    assert (tmp_path / "plots" / "results.png").read_bytes()[:4] == b"\x89PNG"
    _small(run_dir="run").train(_random_pair(), plot=True)
    assert (tmp_path / "run" / "plots" / "reward_metric.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["results.png"]
    _small().train(_random_pair())
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["results.png"]


def test_parameters_map_onto_the_loop_settings() -> None:
    settings = MultiAgentSettings(buffer_size=123, batch_size=7)
    trainer = _small(batch_size=32, settings=settings, seed=5, shared_memory=True)
    trainer.train(_random_pair(), learning_mask=[True, False])
    assert trainer.settings.batch_size == 32  # rbgame's parameter replaces the settings'
    assert trainer.settings.buffer_size == 123
    assert (trainer.settings.collection_step_num_env_steps, trainer.settings.shared_memory) == (
        8,
        True,
    )
    assert trainer.settings.collection_step_num_episodes == 3
    config = trainer.config
    assert (config.max_episodes, config.epoch_num_steps, config.test_step_num_episodes) == (7, 1, 4)
    assert (trainer.seed, trainer.agents.learning_columns) == (5, [0])
    in_process = _small()
    in_process.train(_random_pair())
    assert in_process.settings.shared_memory is False


def test_default_metric_and_train_return_are_the_learning_agents(tmp_path: Path) -> None:
    """In a zero-sum game the mean over all agents is 0; the default score,
    ``train/return_mean`` and ``test/return_mean`` are the learning agents' mean, here
    player_1's."""
    trainer = _small(run_dir=tmp_path, episodes_per_train=30, test_freq=10, episodes_per_test=20)
    result = trainer.train(_random_pair(), learning_mask=[True, False])
    history = pq.read_table(tmp_path / "history.parquet").to_pylist()
    tests = [r for r in history if r.get("test/score") is not None]
    assert [r["test/score"] for r in tests] == result["reward_metric_stats"]
    for row in tests:
        assert row["test/score"] == pytest.approx(row["test/return_mean/player_1"])
        assert row["test/return_mean"] == pytest.approx(row["test/return_mean/player_1"])
        assert row["test/return_mean/player_1"] == -row["test/return_mean/player_2"]
    train = [r for r in history if r.get("train/return_mean/player_1") is not None]
    assert train
    for row in train:
        assert row["train/return_mean"] == pytest.approx(row["train/return_mean/player_1"])
    assert np.any(np.asarray(result["reward_metric_stats"]) != 0)


@pytest.mark.slow
def test_learning_player_beats_frozen_random_with_a_rising_metric() -> None:
    ppo = PPO(
        OBS, ACT,
        PPOConfig(learning_rate=1e-3, num_epochs=4, ent_coef=0.01, hidden_sizes=(128, 128)),
        seed=0,
    )  # fmt: skip
    trainer = DecentralizedTrainer(
        TICTACTOE,
        num_train_envs=8,
        num_test_envs=8,
        batch_size=256,
        test_freq=100,
        episodes_per_train=1500,
        episodes_per_test=200,
        shared_memory=False,
    )
    result = trainer.train([ppo, RandomAgent(OBS, ACT, seed=1)], learning_mask=[True, False])
    metric = result["reward_metric_stats"]
    # The learning player's mean return (wins - losses; random play as first player: ~0.3).
    # Seeds 0-2 end at 0.71-0.75 over the last three test steps, from 0.16-0.47 at the first.
    assert np.mean(metric[-3:]) >= 0.6, metric
    assert np.mean(metric[-3:]) > metric[0] + 0.15, metric
