"""``action_noise_color``: colored exploration noise in every algorithm with the setting,
refused for actions it cannot color, kept by checkpoints."""

from __future__ import annotations

import pytest
import torch
from gymnasium import spaces

from rlfleet.algos import get_algorithm
from rlfleet.errors import ConfigError

COLORED = ["ppo", "a2c", "trpo", "appo", "impala", "sac", "td3", "ddpg"]
OFF_POLICY = {"learning_starts": 64, "batch_size": 32, "buffer_size": 2000, "hidden_sizes": [32]}
SMALL = {
    "ppo": {"num_steps": 32, "num_epochs": 1, "batch_size": 64},
    "a2c": {"num_steps": 8},
    "trpo": {"num_steps": 64, "batch_size": 64, "num_epochs": 1},
    "sac": OFF_POLICY,
    "td3": OFF_POLICY,
    "ddpg": OFF_POLICY,
}


def test_exactly_these_algorithms_have_the_setting() -> None:
    from rlfleet.algos import list_algorithms

    having = {
        name
        for name in list_algorithms()
        if hasattr(get_algorithm(name).config_class(), "action_noise_color")
    }
    assert having == set(COLORED)


@pytest.mark.parametrize("name", COLORED)
def test_colored_noise_changes_sampled_actions_but_not_greedy_ones(name: str) -> None:
    cls = get_algorithm(name)
    obs_space = spaces.Box(-1.0, 1.0, (3,))
    act_space = spaces.Box(-2.0, 2.0, (2,))
    white = cls(obs_space, act_space, seed=3, config=cls.config_class())
    pink = cls(obs_space, act_space, seed=3, config=cls.config_class(action_noise_color=1.0))
    pink.load_state_dict(white.state_dict() | {"action_noise_step": 0})
    obs = torch.zeros(4, 3)
    assert torch.equal(
        white.act(obs, deterministic=True).actions, pink.act(obs, deterministic=True).actions
    )
    assert pink.action_noise_process is not None
    assert pink.action_noise_process.step == 0
    sampled = [pink.act(obs).actions for _ in range(3)]
    assert pink.action_noise_process.step == 3
    assert not torch.equal(sampled[0], white.act(obs).actions)
    # Consecutive steps of pink noise stay close: the action drifts rather than jumps.
    drift = (sampled[1] - sampled[0]).abs().mean()
    assert drift < (sampled[0] - white.act(obs).actions).abs().mean()


@pytest.mark.parametrize(
    "name", [n for n in COLORED if spaces.Discrete in get_algorithm(n).action_spaces]
)
def test_discrete_actions_are_refused(name: str) -> None:
    cls = get_algorithm(name)
    with pytest.raises(ConfigError, match=r"action_noise_color.*Box actions.*Discrete"):
        cls(
            spaces.Box(-1.0, 1.0, (3,)),
            spaces.Discrete(2),
            config=cls.config_class(action_noise_color=1.0),
        )
