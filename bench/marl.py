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
from rlfleet.marl.agents import RandomAgent, make_agents
from rlfleet.marl.trainer import DecentralizedTrainer, MultiAgentSettings
from rlfleet.train.loop import TrainerConfig


def _scores(trainer: DecentralizedTrainer) -> list[tuple[int, float]]:
    """(episodes, test score) of every test step of a run."""
    scores: list[tuple[int, float]] = []
    trainer.test_result_fn = lambda epoch, step, score: scores.append(
        (trainer.counters.episode, round(score, 3))
    )
    trainer.run()
    return scores


def tictactoe() -> None:
    ppo = PPOConfig(learning_rate=1e-3, num_epochs=4, ent_coef=0.01, hidden_sizes=(128, 128))
    agents = make_agents(tictactoe_v3.env, lambda o, a, s: PPO(o, a, ppo, seed=s))
    agents[1] = RandomAgent(agents[1].observation_space, agents[1].action_space, seed=1)
    trainer = DecentralizedTrainer(
        tictactoe_v3.env,
        agents,
        TrainerConfig(max_episodes=5_000, epoch_num_steps=3_500, test_step_num_episodes=500),
        MultiAgentSettings(
            learning_mask=[True, False], batch_size=256, collection_step_num_episodes=100
        ),
        num_envs=8,
        num_test_envs=8,
        reward_metric=lambda r: float((r[:, 0] > 0).mean()),
    )
    print("tictactoe PPO win rate:", _scores(trainer))


def spread() -> Any:
    return simple_spread_v3.parallel_env(N=3, max_cycles=25, continuous_actions=False)


def simple_spread() -> None:
    def run(agents: list[Any], learning: bool, episodes: int, **options: Any) -> list[float]:
        trainer = DecentralizedTrainer(
            spread,
            agents,
            TrainerConfig(
                max_episodes=episodes, epoch_num_steps=18_750, test_step_num_episodes=100
            ),
            MultiAgentSettings(
                learning_mask=[learning] * 3, batch_size=512, collection_step_num_episodes=50,
                **options,
            ),
            num_envs=8,
            num_test_envs=8,
        )  # fmt: skip
        return [score for _, score in _scores(trainer)]

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
