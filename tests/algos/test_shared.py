"""Properties every registered algorithm must have, parametrized over the registry.

A new algorithm is tested here the moment it is registered: it needs an entry in
``REFERENCE`` (its reference task) to learn, and gets the other checks for free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.algos import get_algorithm, list_algorithms
from rlfleet.errors import EnvSpecError
from rlfleet.train.checkpoint import load_checkpoint, save_checkpoint
from rlfleet.train.run import default_run_config, make_trainer

# algorithm -> (env id, overrides for a short run that trains something)
SHORT_RUN: dict[str, tuple[str, dict[str, Any]]] = {
    "ppo": (
        "CartPole-v1",
        {"hyperparameters": {"num_steps": 16, "num_epochs": 2, "batch_size": 64}},
    ),
    "a2c": ("CartPole-v1", {"hyperparameters": {"num_steps": 8}}),
    "trpo": (
        "CartPole-v1",
        {"hyperparameters": {"num_steps": 64, "batch_size": 64, "num_epochs": 2}},
    ),
    "acer": (
        "CartPole-v1",
        {"hyperparameters": {"num_steps": 16, "replay_start": 1, "replay_ratio": 2.0}},
    ),
}
QUIET = {"show_progress": False, "verbose": False}


def _short_trainer(name: str, seed: int, max_steps: int = 1024) -> Any:
    env_id, overrides = SHORT_RUN[name]
    cfg = default_run_config(
        name,
        env_id,
        {
            **overrides,
            "seed": seed,
            "env": {"num_envs": 4, "num_test_envs": 2},
            "trainer": {
                **QUIET,
                "max_steps": max_steps,
                "epoch_num_steps": max_steps,
                "test_step_num_episodes": 2,
                "target_reward": None,
            },
        },
    )
    return make_trainer(cfg, None)


def test_every_algorithm_has_a_short_run() -> None:
    assert set(list_algorithms()) <= set(SHORT_RUN)


@pytest.mark.parametrize("name", list_algorithms())
def test_same_seed_gives_identical_parameters(name: str) -> None:
    first = _short_trainer(name, seed=3)
    first.run()
    second = _short_trainer(name, seed=3)
    second.run()
    other = _short_trainer(name, seed=4)
    other.run()
    assert torch.equal(first.algorithm.parameters_vector(), second.algorithm.parameters_vector())
    assert not torch.equal(first.algorithm.parameters_vector(), other.algorithm.parameters_vector())


@pytest.mark.parametrize("name", list_algorithms())
def test_save_load_round_trip_gives_identical_actions(name: str, tmp_path: Path) -> None:
    trainer = _short_trainer(name, seed=0)
    trainer.run()
    algo = trainer.algorithm
    save_checkpoint(tmp_path / "ckpt", {"algorithm": algo.state_dict()}, {"algorithm": name})
    state, _ = load_checkpoint(tmp_path / "ckpt")
    fresh = get_algorithm(name)(algo.observation_space, algo.action_space, algo.config, seed=99)
    fresh.load_state_dict(state["algorithm"])
    obs = np.stack([algo.observation_space.sample() for _ in range(64)])
    np.testing.assert_array_equal(algo.predict(obs), fresh.predict(obs))
    assert torch.equal(algo.parameters_vector(), fresh.parameters_vector())
    # The sampling RNG continues identically too.
    torch.testing.assert_close(
        algo.act(algo.preprocess(torch.as_tensor(obs))).actions,
        fresh.act(fresh.preprocess(torch.as_tensor(obs))).actions,
    )


@pytest.mark.parametrize("name", list_algorithms())
def test_unsupported_action_space_is_refused_at_construction(name: str) -> None:
    cls = get_algorithm(name)
    obs = spaces.Box(-1, 1, (3,), np.float32)
    unsupported = [
        s
        for s in (
            spaces.MultiBinary(3),
            spaces.MultiDiscrete([2, 3]),
            spaces.Discrete(2),
            spaces.Box(-1, 1, (2,), np.float32),
        )
        if not isinstance(s, cls.action_spaces)
    ]
    for action_space in unsupported:
        with pytest.raises(EnvSpecError, match=type(action_space).__name__):
            cls(obs, action_space)


@pytest.mark.parametrize("name", list_algorithms())
def test_unbounded_box_actions_are_refused(name: str) -> None:
    cls = get_algorithm(name)
    if spaces.Box not in cls.action_spaces:
        pytest.skip(f"{name} has no Box actions")
    with pytest.raises(EnvSpecError, match="infinite"):
        cls(spaces.Box(-1, 1, (3,), np.float32), spaces.Box(-np.inf, np.inf, (2,), np.float32))
