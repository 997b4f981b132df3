"""``action_noise_color``: colored exploration noise in every algorithm with the setting,
refused for actions it cannot color, kept by checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gymnasium import spaces

from rlfleet.algos import get_algorithm
from rlfleet.checkpoint import flatten_state
from rlfleet.errors import ConfigError
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer

COLORED = ["ppo", "a2c", "trpo", "sac", "td3", "ddpg"]
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


def _run(name: str, run_dir: Path, *, resume: bool = False, max_epochs: int | None) -> Any:
    cfg = default_run_config(
        name,
        "Pendulum-v1",
        {
            "seed": 5,
            "env": {"num_envs": 2, "num_test_envs": 1},
            "hyperparameters": {**SMALL[name], "action_noise_color": 1.0},
            "trainer": {
                "show_progress": False,
                "verbose": False,
                "max_steps": 512,
                "epoch_num_steps": 256,
                "test_step_num_episodes": 1,
                "target_reward": None,
            },
        },
    )
    if not resume:
        run_dir.mkdir(parents=True)
    trainer = make_trainer(cfg, run_dir, resume=resume)
    trainer.config.max_epochs = max_epochs
    try:
        trainer.run()
    finally:
        trainer.close()
    return trainer


@pytest.mark.parametrize("name", COLORED)
def test_resume_continues_the_noise_bitwise(name: str, tmp_path: Path) -> None:
    straight = _run(name, tmp_path / "straight", max_epochs=None)
    _run(name, tmp_path / "split", max_epochs=1)
    split = _run(name, tmp_path / "split", resume=True, max_epochs=None)
    a_tensors, a_skeleton = flatten_state(straight.algorithm.state_dict())
    b_tensors, b_skeleton = flatten_state(split.algorithm.state_dict())
    assert a_skeleton == b_skeleton
    noise = straight.algorithm.action_noise_process
    # One step per vector step of acting (2 envs): updates and greedy test steps use none.
    assert noise is not None
    assert 0 < noise.step <= straight.counters.env_step // 2
    assert split.algorithm.action_noise_process.step == noise.step
    assert [k for k in a_tensors if not torch.equal(a_tensors[k], b_tensors[k])] == []
