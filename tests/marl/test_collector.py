"""The multi-agent collector: whole trajectories reach each learner's storage, off-policy
update steps come on schedule, and its state and the test episodes are repeatable."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

pytest.importorskip("pettingzoo")
from pettingzoo import ParallelEnv
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
    counts: list[int] = []
    again = MultiAgentTestEpisodes(envs, collector, seed=10).run(5, on_episode=counts.append)
    np.testing.assert_array_equal(first.returns, again.returns)
    assert counts == sorted(counts)
    assert counts[-1] == 5


class _JoinLeave(ParallelEnv):  # type: ignore[misc]
    """A Parallel game whose agents come and go: ``a`` plays 5 steps (truncated), ``b`` leaves
    after 2 (terminated), ``c`` joins after 3 and leaves with ``a`` (terminated). Each
    observation is the env step and the agent's number; every step rewards 1."""

    def __init__(self) -> None:
        self.metadata = {"name": "join_leave_v0"}
        self.possible_agents = ["a", "b", "c"]
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0.0, 10.0, (2,), np.float32)

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([self.t, self.possible_agents.index(agent)], np.float32)

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[dict, dict]:
        self.t = 0
        self.agents = ["a", "b"]
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        assert set(actions) == set(self.agents), (actions, self.agents)  # only those present
        self.t += 1
        acting = list(self.agents)
        terminated = {a: (a == "b" and self.t == 2) or (a == "c" and self.t == 5) for a in acting}
        truncated = {a: a == "a" and self.t == 5 for a in acting}
        observations = {a: self._obs(a) for a in acting}
        self.agents = [a for a in acting if not (terminated[a] or truncated[a])]
        if self.t == 3:
            self.agents.append("c")  # joins mid-episode: first seen in this step's results
            observations["c"] = self._obs("c")
            terminated["c"] = truncated["c"] = False
        rewards = {a: 1.0 for a in observations}
        return observations, rewards, terminated, truncated, {a: {} for a in observations}


def test_agents_may_join_and_leave_mid_episode() -> None:
    # docs/multi-agent.md: an agent's transitions reach its storage when it leaves, as one
    # whole trajectory; nothing of a dead agent is stored after it died; a copy whose agents
    # are all gone is reset at once.
    envs = MultiAgentVecEnv(_JoinLeave, 1, seed=0)
    obs, act = envs.observation_spaces["a"], envs.action_spaces["a"]
    agents = Agents(envs.possible_agents, [PPO(obs, act, PPOConfig(), seed=i) for i in range(3)])
    learners = learners_of(
        agents, envs, buffer_size=1_000, critic_state_size=None,
        central_critic=CentralCriticConfig(),
    )  # fmt: skip
    collector = MultiAgentCollector(envs, learners, collection_step_num_env_steps=10_000)
    stats, _ = collector.collect(3, dict)
    assert stats.episodes == 3
    by_agent = {agent: collector.seats[0][agent] for agent in "abc"}
    lengths = {a: [len(f.trajectory.steps) for f in by_agent[a].finished] for a in "abc"}
    assert lengths == {"a": [5, 5, 5], "b": [2, 2, 2], "c": [2, 2, 2]}
    ends = {a: {(f.terminated, f.truncated) for f in by_agent[a].finished} for a in "abc"}
    assert ends == {"a": {(False, True)}, "b": {(True, False)}, "c": {(True, False)}}
    # Each trajectory saw its own steps: b's end at env step 2, c's start at 3.
    first_b = by_agent["b"].finished[0]
    assert [float(o[0]) for o in first_b.trajectory.obs] == [0.0, 1.0]
    first_c = by_agent["c"].finished[0]
    assert [float(o[0]) for o in first_c.trajectory.obs] == [3.0, 4.0]
    assert [a for a, _, _ in collector.train_returns] == [5.0, 5.0, 5.0]
