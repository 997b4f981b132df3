"""Bad input to the multi-agent trainer fails at construction with typed errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

pytest.importorskip("pettingzoo")
from pettingzoo.classic import tictactoe_v3

from rlfleet.algos import get_algorithm, list_algorithms
from rlfleet.algos.ppo import PPO
from rlfleet.algos.td3 import TD3
from rlfleet.errors import ConfigError, EnvSpecError
from rlfleet.marl.envs import MultiAgentVecEnv
from rlfleet.marl.masks import check_mask
from rlfleet.marl.selfplay import SelfPlayConfig
from rlfleet.marl.trainer import (
    DecentralizedTrainer,
    MultiAgentSettings,
    multi_agent_return_reduction,
    reduced_return_score,
)
from rlfleet.train.loop import TrainerConfig
from rlfleet.types import EvalStats

ENVS = MultiAgentVecEnv(tictactoe_v3.env, 1)
OBS, ACT = ENVS.observation_spaces["player_1"], ENVS.action_spaces["player_1"]


def _ppo(seed: int = 0) -> PPO:
    return PPO(OBS, ACT, seed=seed)


def _trainer(agents: Any, **settings: Any) -> DecentralizedTrainer:
    return DecentralizedTrainer(
        tictactoe_v3.env, agents, None, MultiAgentSettings(**settings), num_envs=1,
        num_test_envs=1,
    )  # fmt: skip


def test_non_pettingzoo_object_is_refused() -> None:
    with pytest.raises(EnvSpecError, match="PettingZoo"):
        DecentralizedTrainer(object(), [_ppo(), _ppo(1)])
    with pytest.raises(EnvSpecError, match="PettingZoo"):
        DecentralizedTrainer(lambda: "not an env", [_ppo(), _ppo(1)])


def test_agents_must_match_the_env() -> None:
    with pytest.raises(ConfigError, match="expected 2 rlfleet algorithms"):
        _trainer([_ppo()])
    with pytest.raises(ConfigError, match="'player_1', 'player_2'"):
        _trainer({"player_1": _ppo(), "bob": _ppo(1)})


def test_masks_of_the_wrong_length() -> None:
    agents = [_ppo(), _ppo(1)]
    with pytest.raises(ConfigError, match="learning_mask: expected 2 flags"):
        _trainer(agents, learning_mask=[True])
    with pytest.raises(ConfigError, match="exploration_mask: expected 2 flags"):
        _trainer(agents, exploration_mask=[True, True, False])
    with pytest.raises(EnvSpecError, match="action mask of length 9"):
        check_mask(np.ones((4, 8), bool), 9, "agent 'player_1'")


def test_shared_algorithm_needs_equal_flags_and_self_play_one_learner() -> None:
    shared = _ppo()
    with pytest.raises(ConfigError, match="share one algorithm, so expected equal"):
        _trainer([shared, shared], learning_mask=[True, False])
    with pytest.raises(ConfigError, match="self_play: expected a two-player game"):
        _trainer([_ppo(), _ppo(1)], self_play=SelfPlayConfig())


def test_algorithm_that_cannot_handle_the_space() -> None:
    # TD3 acts in Box spaces only; tic-tac-toe moves are Discrete(9).
    td3 = TD3(OBS, spaces.Box(-1.0, 1.0, (9,), np.float32))
    with pytest.raises(EnvSpecError, match="agent 'player_1': td3 does not support action"):
        _trainer([td3, _ppo()])
    # An algorithm built for other observations than its agent's is refused too.
    wrong = PPO(spaces.Box(0, 1, (4,), np.float32), ACT)
    with pytest.raises(EnvSpecError, match="agent 'player_2': expected its algorithm"):
        _trainer([_ppo(), wrong])


@pytest.mark.parametrize(
    "name",
    [
        name
        for name in list_algorithms()
        if not get_algorithm(name).supports_masks
        and spaces.Discrete in get_algorithm(name).action_spaces
    ],
)
def test_an_algorithm_that_cannot_honour_masks_is_refused(name: str) -> None:
    algo = get_algorithm(name)(OBS, ACT)
    with pytest.raises(EnvSpecError, match=f"agent 'player_1': the env gives action masks.*{name}"):
        _trainer([algo, _ppo()], learning_mask=[False, True])


def test_reduced_return_score() -> None:
    stats = EvalStats(returns=np.array([[1.0, -1.0], [3.0, 1.0]]), lengths=np.array([5, 7]))
    assert reduced_return_score("mean")(stats) == pytest.approx(1.0)
    assert reduced_return_score("min")(stats) == pytest.approx(0.0)
    assert reduced_return_score(0)(stats) == pytest.approx(2.0)
    one_agent = EvalStats(returns=np.array([2.0, 4.0]), lengths=np.array([1, 1]))
    assert reduced_return_score("sum")(one_agent) == pytest.approx(3.0)
    assert reduced_return_score("learning_mean", [1])(stats) == pytest.approx(0.0)
    assert reduced_return_score("learning_mean")(stats) == pytest.approx(1.0)  # all columns
    with pytest.raises(ConfigError, match="expected learning_mean, mean, sum, min, max"):
        reduced_return_score("median")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="agent index 5 out of range for 2 agents"):
        reduced_return_score(5)(stats)


def test_the_old_name_of_reduced_return_score_warns() -> None:
    with pytest.warns(DeprecationWarning, match="reduced_return_score"):
        score = multi_agent_return_reduction("max")
    assert score(EvalStats(np.array([[1.0, 3.0]]), np.array([5]))) == pytest.approx(3.0)


@pytest.mark.parametrize("name", ["acer", "appo", "impala"])
def test_an_algorithm_the_trainer_cannot_train_is_refused_as_a_learner(name: str) -> None:
    other = get_algorithm(name)(OBS, ACT)
    with pytest.raises(ConfigError, match=f"agent 'player_2': {name} learns"):
        _trainer([_ppo(), other])


def test_a_frozen_acer_agent_plays() -> None:
    acer = get_algorithm("acer")(OBS, ACT)
    config = TrainerConfig(
        max_episodes=4, epoch_num_steps=1_000, test_step_num_episodes=2, show_progress=False,
        verbose=False,
    )  # fmt: skip
    settings = MultiAgentSettings(learning_mask=[True, False], collection_step_num_episodes=2)
    trainer = DecentralizedTrainer(
        tictactoe_v3.env, [_ppo(), acer], config, settings, num_envs=1, num_test_envs=1
    )
    assert trainer.run().episodes == 4
