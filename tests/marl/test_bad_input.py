"""Bad input to the multi-agent trainer fails at construction with typed errors."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

pytest.importorskip("pettingzoo")
from pettingzoo.classic import tictactoe_v3

from rlfleet.algos import get_algorithm, list_algorithms
from rlfleet.algos.ppo import PPO
from rlfleet.algos.td3 import TD3
from rlfleet.errors import ConfigError, EnvSpecError
from rlfleet.marl.masks import check_mask
from rlfleet.marl.trainer import (
    DecentralizedTrainer,
    DecentralizedTrainerConfig,
    multi_agent_return_reduction,
)
from rlfleet.types import EvalStats

SMALL = DecentralizedTrainerConfig(max_episodes=2, num_train_envs=1, num_test_envs=1)


@pytest.fixture
def trainer() -> DecentralizedTrainer:
    return DecentralizedTrainer(tictactoe_v3.env, SMALL)


def _ppo(trainer: DecentralizedTrainer, seed: int = 0) -> PPO:
    envs = trainer.train_envs
    return PPO(envs.observation_spaces["player_1"], envs.action_spaces["player_1"], seed=seed)


def test_non_pettingzoo_object_is_refused() -> None:
    with pytest.raises(EnvSpecError, match="PettingZoo"):
        DecentralizedTrainer(object(), SMALL)
    with pytest.raises(EnvSpecError, match="PettingZoo"):
        DecentralizedTrainer(lambda: "not an env", SMALL)


def test_agents_must_match_the_env(trainer: DecentralizedTrainer) -> None:
    with pytest.raises(ConfigError, match="expected 2 rlfleet algorithms"):
        trainer.train([_ppo(trainer)], [True])
    with pytest.raises(ConfigError, match="'player_1', 'player_2'"):
        trainer.train({"player_1": _ppo(trainer), "bob": _ppo(trainer, 1)}, [True, True])


def test_masks_of_the_wrong_length(trainer: DecentralizedTrainer) -> None:
    agents = [_ppo(trainer), _ppo(trainer, 1)]
    with pytest.raises(ConfigError, match="learning_mask: expected 2 flags"):
        trainer.train(agents, [True])
    with pytest.raises(ConfigError, match="exploration_mask: expected 2 flags"):
        trainer.train(agents, [True, True], exploration_mask=[True, True, False])
    with pytest.raises(EnvSpecError, match="action mask of length 9"):
        check_mask(np.ones((4, 8), bool), 9, "agent 'player_1'")


def test_algorithm_that_cannot_handle_the_space(trainer: DecentralizedTrainer) -> None:
    envs = trainer.train_envs
    # TD3 acts in Box spaces only; tic-tac-toe moves are Discrete(9).
    td3 = TD3(envs.observation_spaces["player_1"], spaces.Box(-1.0, 1.0, (9,), np.float32))
    with pytest.raises(EnvSpecError, match="agent 'player_1': td3 does not support action"):
        trainer.train([td3, _ppo(trainer)], [True, True])
    # An algorithm built for other observations than its agent's is refused too.
    wrong = PPO(spaces.Box(0, 1, (4,), np.float32), envs.action_spaces["player_2"])
    with pytest.raises(EnvSpecError, match="agent 'player_2': expected its algorithm"):
        trainer.train([_ppo(trainer), wrong], [True, True])


@pytest.mark.parametrize(
    "name",
    [
        name
        for name in list_algorithms()
        if not get_algorithm(name).supports_masks
        and spaces.Discrete in get_algorithm(name).action_spaces
    ],
)
def test_an_algorithm_that_cannot_honour_masks_is_refused(
    trainer: DecentralizedTrainer, name: str
) -> None:
    envs = trainer.train_envs
    algo = get_algorithm(name)(envs.observation_spaces["player_1"], envs.action_spaces["player_1"])
    with pytest.raises(EnvSpecError, match=f"agent 'player_1': the env gives action masks.*{name}"):
        trainer.train([algo, _ppo(trainer)], [False, True])


def test_multi_agent_return_reduction() -> None:
    stats = EvalStats(returns=np.array([[1.0, -1.0], [3.0, 1.0]]), lengths=np.array([5, 7]))
    assert multi_agent_return_reduction("mean")(stats) == pytest.approx(1.0)
    assert multi_agent_return_reduction("min")(stats) == pytest.approx(0.0)
    assert multi_agent_return_reduction(0)(stats) == pytest.approx(2.0)
    one_agent = EvalStats(returns=np.array([2.0, 4.0]), lengths=np.array([1, 1]))
    assert multi_agent_return_reduction("sum")(one_agent) == pytest.approx(3.0)
    with pytest.raises(ConfigError, match="expected mean, sum, min, max"):
        multi_agent_return_reduction("median")  # type: ignore[arg-type]
