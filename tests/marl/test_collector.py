"""The multi-agent collector: whole trajectories reach each learner's storage, off-policy
update steps come on schedule, and its state and the test episodes are repeatable."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
from pettingzoo.classic import tictactoe_v3

from rlfleet.algos.dqn import DQN, DQNConfig
from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.marl.agents import Agents
from rlfleet.marl.collector import MultiAgentCollector, MultiAgentTestEpisodes, learners_of
from rlfleet.marl.envs import MultiAgentVecEnv
from rlfleet.marl.mappo import CentralCriticConfig

ENVS = MultiAgentVecEnv(tictactoe_v3.env, 1)
OBS, ACT = ENVS.observation_spaces["player_1"], ENVS.action_spaces["player_1"]


def _collector(interval: int = 8) -> tuple[MultiAgentCollector, Agents]:
    agents = Agents(
        ENVS.possible_agents,
        [PPO(OBS, ACT, PPOConfig(), seed=0), DQN(OBS, ACT, DQNConfig(), seed=1)],
    )
    envs = MultiAgentVecEnv(tictactoe_v3.env, 2, seed=3)
    learners = learners_of(
        agents, envs, buffer_size=1_000, critic_state_size=None,
        central_critic=CentralCriticConfig(),
    )  # fmt: skip
    return MultiAgentCollector(envs, learners, collection_step_num_env_steps=interval), agents


def test_a_collection_step_fills_storage_and_calls_updates_on_schedule() -> None:
    collector, _ = _collector(interval=8)
    calls: list[int] = []
    stats, metrics = collector.collect(6, lambda: calls.append(collector.env_steps) or {})
    assert 6 <= stats.episodes <= 7  # the two copies may finish together
    assert stats.env_steps == collector.env_steps
    assert calls == [8 * (i + 1) for i in range(len(calls))]  # every 8 agent steps
    assert len(calls) == stats.env_steps // 8
    ppo, dqn = collector.distinct()
    # Every episode is a finished trajectory per player; DQN's buffer holds its steps plus
    # one final-observation row per trajectory.
    assert len(ppo.finished) == stats.episodes
    assert dqn.buffer is not None
    rows = dqn.buffer.valid[: dqn.buffer.rows_filled, 0]
    assert int((~rows).sum()) == stats.episodes  # one final-observation row per trajectory
    assert rows.any()
    assert "train/return_mean/player_1" in metrics
    np.testing.assert_allclose(np.asarray(collector.train_returns).sum(axis=1), 0.0)


def test_state_round_trip_restores_counters_and_storage() -> None:
    collector, _ = _collector()
    collector.collect(4, dict)
    state = collector.state_dict()
    other, _ = _collector()
    other.load_state_dict(state)
    assert (other.episodes, other.env_steps, other.since_update) == (
        collector.episodes,
        collector.env_steps,
        collector.since_update,
    )
    assert other.train_returns == collector.train_returns
    assert other.distinct()[1].buffer is not None
    assert len(other.distinct()[1].buffer) == len(collector.distinct()[1].buffer)  # type: ignore[arg-type]


def test_test_episodes_are_greedy_per_agent_and_repeatable() -> None:
    collector, _ = _collector()
    envs = MultiAgentVecEnv(tictactoe_v3.env, 2)
    first = MultiAgentTestEpisodes(envs, collector, seed=10).run(5)
    assert first.returns.shape == (5, 2)
    assert first.lengths.shape == (5,)
    again = MultiAgentTestEpisodes(envs, collector, seed=10).run(5)
    np.testing.assert_array_equal(first.returns, again.returns)
