"""Agents: the policy a multi-agent run trains, saves and loads."""

from __future__ import annotations

import pytest
import torch
from gymnasium import spaces

pytest.importorskip("pettingzoo")
from pettingzoo.classic import tictactoe_v3

from rlfleet.algos.dqn import DQN
from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.errors import CheckpointError, EnvSpecError
from rlfleet.marl.agents import Agents, RandomAgent, make_agents
from rlfleet.marl.envs import MultiAgentVecEnv

NAMES = ["player_1", "player_2"]
ENVS = MultiAgentVecEnv(tictactoe_v3.env, 1)
OBS, ACT = ENVS.observation_spaces["player_1"], ENVS.action_spaces["player_1"]


def test_groups_name_and_counters() -> None:
    ppo, dqn = PPO(OBS, ACT, seed=0), DQN(OBS, ACT, seed=1)
    agents = Agents(NAMES, {"player_2": dqn, "player_1": ppo}, learning_mask=[True, False])
    assert agents["player_1"] is ppo
    assert agents.name == "ppo+dqn"
    assert [(g.name, g.learning, g.exploring) for g in agents.groups] == [
        ("player_1", True, True),
        ("player_2", False, True),  # frozen agents explore unless told not to
    ]
    assert not agents.shared
    ppo.gradient_steps, dqn.gradient_steps = 3, 4
    assert agents.gradient_steps == 7
    agents.set_progress(0.5)
    agents.lr_scale = 0.25
    assert (ppo.progress, ppo.lr_scale) == (0.5, 0.25)
    assert (dqn.progress, dqn.lr_scale) == (0.0, 1.0)  # frozen: its schedules stay
    agents.nan_policy = "skip_batch"
    assert dqn.nan_policy == ppo.nan_policy == "skip_batch"


def test_state_round_trip_and_refusal_of_other_learners() -> None:
    shared = make_agents(
        tictactoe_v3.env, lambda o, a, s: PPO(o, a, PPOConfig(), seed=s), share_parameters=True
    )
    agents = Agents(NAMES, shared)
    assert agents.shared
    assert agents.name == "ppo"
    state = agents.state_dict()
    assert list(state["learners"]) == ["player_1+player_2"]
    fresh = make_agents(
        tictactoe_v3.env,
        lambda o, a, s: PPO(o, a, PPOConfig(), seed=s + 7),
        share_parameters=True,
    )
    restored = Agents(NAMES, fresh)
    restored.load_state_dict(state)
    assert torch.equal(fresh[0].parameters_vector(), shared[0].parameters_vector())
    independent = Agents(NAMES, [RandomAgent(OBS, ACT), RandomAgent(OBS, ACT)])
    with pytest.raises(CheckpointError, match="the checkpoint holds learners"):
        independent.load_state_dict(state)


def test_make_agents_seeds_each_agent_and_refuses_other_objects() -> None:
    first, second = make_agents(tictactoe_v3.env, lambda o, a, s: PPO(o, a, seed=s), seed=5)
    assert (first.seed, second.seed) == (5, 6)
    with pytest.raises(EnvSpecError, match="expected a PettingZoo env"):
        make_agents(object(), lambda o, a, s: PPO(o, a, seed=s))


def test_a_random_agent_takes_image_observations() -> None:
    """It reads no observation, so an image space (which the algorithms without a CNN
    encoder refuse) is as good as any."""
    image = spaces.Box(0, 255, (4, 84, 84), dtype="uint8")
    agent = RandomAgent(image, spaces.Discrete(6), seed=0)
    actions = agent.act(torch.zeros(3, 4, 84, 84, dtype=torch.uint8)).actions
    assert actions.shape == (3,)
    assert bool(((actions >= 0) & (actions < 6)).all())
