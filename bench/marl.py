"""Multi-agent learning figures at full budget (the tests use CI-sized budgets).

    PYTHONPATH=$PWD python bench/marl.py

Prints tic-tac-toe win rates of PPO (first player) against a frozen random player, and the
simple_spread team return of random, shared-PPO and MAPPO agents.
"""

from __future__ import annotations

from typing import Any

import torch
from mpe2 import simple_spread_v3
from pettingzoo.classic import tictactoe_v3

from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.marl.agents import RandomAgent
from rlfleet.marl.trainer import DecentralizedTrainer, DecentralizedTrainerConfig, make_agents


def tictactoe() -> None:
    config = DecentralizedTrainerConfig(
        max_episodes=5_000, num_train_envs=8, num_test_envs=8, batch_size=256,
        test_freq=500, episodes_per_train=100, episodes_per_test=500,
    )  # fmt: skip
    trainer = DecentralizedTrainer(
        tictactoe_v3.env, config, reward_metric=lambda r: float((r[:, 0] > 0).mean())
    )
    ppo = PPOConfig(learning_rate=1e-3, num_epochs=4, ent_coef=0.01, hidden_sizes=(128, 128))
    agents = make_agents(tictactoe_v3.env, lambda o, a, s: PPO(o, a, ppo, seed=s))
    agents[1] = RandomAgent(agents[1].observation_space, agents[1].action_space, seed=1)
    result = trainer.train(agents, [True, False], plot=False)
    pairs = zip(result.test_episodes, result.test_scores, strict=True)
    print("tictactoe PPO win rate:", [(e, round(s, 3)) for e, s in pairs])


def spread() -> Any:
    return simple_spread_v3.parallel_env(N=3, max_cycles=25, continuous_actions=False)


def simple_spread() -> None:
    def run(agents: list[Any], learning: bool, episodes: int, **options: Any) -> list[float]:
        config = DecentralizedTrainerConfig(
            max_episodes=episodes, num_train_envs=8, num_test_envs=8, batch_size=512,
            test_freq=250, episodes_per_train=50, episodes_per_test=100, **options,
        )  # fmt: skip
        result = DecentralizedTrainer(spread, config).train(agents, [learning] * 3, plot=False)
        return [round(s, 2) for s in result.test_scores]

    print(
        "simple_spread random:",
        run(make_agents(spread, lambda o, a, s: RandomAgent(o, a, seed=s)), False, 50),
    )
    ppo = PPOConfig(learning_rate=1e-3, num_epochs=4, ent_coef=0.01)
    for share in (False, True):
        for central in (False, True):
            agents = make_agents(
                spread, lambda o, a, s: PPO(o, a, ppo, seed=s), share_parameters=share
            )
            scores = run(agents, True, 2_000, centralized_critic=central)
            print(f"simple_spread shared={share} mappo={central}:", scores)


if __name__ == "__main__":
    torch.set_num_threads(1)
    tictactoe()
    simple_spread()
