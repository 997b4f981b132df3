"""Self-play on tic-tac-toe (symmetric): the learner's Elo rises against its past selves."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
from pettingzoo.classic import tictactoe_v3

from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.marl.agents import make_agents
from rlfleet.marl.selfplay import SelfPlay, SelfPlayConfig, elo_expected
from rlfleet.marl.trainer import DecentralizedTrainer, MultiAgentSettings
from rlfleet.train.loop import TrainerConfig


def test_elo_expected_is_symmetric() -> None:
    assert elo_expected(1200, 1200) == pytest.approx(0.5)
    assert elo_expected(1400, 1200) + elo_expected(1200, 1400) == pytest.approx(1.0)
    assert elo_expected(1600, 1200) == pytest.approx(1 / (1 + 10**-1))


@pytest.mark.slow
def test_self_play_elo_rises() -> None:
    self_play = SelfPlayConfig(
        save_steps=500, swap_steps=250, play_against_latest_model_ratio=0.3, window=5
    )
    ppo_config = PPOConfig(learning_rate=1e-3, num_epochs=4, ent_coef=0.01, hidden_sizes=(128, 128))
    agents = make_agents(
        tictactoe_v3.env, lambda o, a, s: PPO(o, a, ppo_config, seed=s), share_parameters=True
    )
    elo: list[float] = []
    trainer = DecentralizedTrainer(
        tictactoe_v3.env,
        agents,
        TrainerConfig(max_episodes=3_000, epoch_num_steps=11_000, test_step_num_episodes=20),
        MultiAgentSettings(batch_size=256, collection_step_num_episodes=100, self_play=self_play),
        num_envs=8,
        training_fn=lambda epoch, step: elo.append(trainer.collector.self_play.elo),  # type: ignore[union-attr]
    )
    trainer.run()
    assert trainer.collector.self_play is not None
    elo.append(trainer.collector.self_play.elo)
    ratings = np.asarray(elo[1:])  # after each collection step
    assert len(ratings) == 3_000 // 100
    # Noisy game by game; the trend over training is what must rise.
    assert ratings[-5:].mean() > self_play.initial_elo + 100, ratings.round()
    assert ratings[-5:].mean() > ratings[:5].mean() + 50, ratings.round()


def test_pool_keeps_a_window_of_snapshots() -> None:
    agents = make_agents(
        tictactoe_v3.env, lambda o, a, s: PPO(o, a, PPOConfig(), seed=s), share_parameters=True
    )
    pool = SelfPlay(agents[0], SelfPlayConfig(save_steps=10, swap_steps=5, window=3))
    for _ in range(10):
        pool.on_learner_steps(10)
    assert len(pool.pool) == 3
    assert len(pool.pool_elo) == 3
