"""``use_sde``: state-dependent exploration (gSDE) in PPO, A2C and TRPO, refused where it
cannot apply, kept by checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gymnasium import spaces

from rlfleet.algos import get_algorithm, list_algorithms
from rlfleet.errors import ConfigError

SDE = ["ppo", "a2c", "trpo"]
OBS = spaces.Box(-1.0, 1.0, (3,))
ACT = spaces.Box(-2.0, 2.0, (2,))


def _log_std(algo: Any) -> torch.Tensor:
    """The policy's learned log std parameter."""
    policy = algo.actor if algo.name == "trpo" else algo.net
    assert policy.log_std is not None
    return policy.log_std  # type: ignore[no-any-return]


def _log_probs(algo: Any, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """What the loss recomputes for stored actions."""
    if algo.name == "trpo":
        out, log_std, _ = algo.actor.distribution(obs)
        return algo.head.log_prob(out, actions, log_std=log_std)  # type: ignore[no-any-return]
    return algo.net.evaluate_actions(obs, actions)[0]  # type: ignore[no-any-return]


def test_exactly_these_algorithms_have_the_setting() -> None:
    having = {n for n in list_algorithms() if hasattr(get_algorithm(n).config_class(), "use_sde")}
    assert having == set(SDE)


@pytest.mark.parametrize("name", SDE)
def test_the_noise_follows_the_state_and_is_held_for_the_sample_period(name: str) -> None:
    cls = get_algorithm(name)
    algo = cls(OBS, ACT, seed=0, config=cls.config_class(use_sde=True, sde_sample_freq=3))
    obs = torch.rand(4, 3, generator=torch.Generator().manual_seed(0)) * 2 - 1
    greedy = algo.act(obs, deterministic=True).actions
    steps = [algo.act(obs) for _ in range(4)]
    assert algo.exploration is not None
    assert algo.exploration.step == 4  # greedy acting uses no step
    # One draw of matrices: the same state gets the same action, other states other ones.
    assert torch.equal(steps[0].actions, steps[2].actions)
    assert not torch.equal(steps[2].actions, steps[3].actions)
    assert not torch.equal(steps[0].actions, greedy)
    # The stored log-probability is the one the loss recomputes.
    assert steps[0].log_probs is not None
    log_probs = _log_probs(algo, obs, steps[0].actions)
    assert torch.allclose(log_probs, steps[0].log_probs, atol=1e-5)


@pytest.mark.parametrize("name", SDE)
def test_once_per_rollout_by_default(name: str) -> None:
    cls = get_algorithm(name)
    algo = cls(OBS, ACT, seed=0, config=cls.config_class(use_sde=True, num_steps=8))
    assert algo.exploration is not None
    assert algo.exploration.period == 8
    assert _log_std(algo).shape == (64, 2)  # [last hidden width, action dims]


@pytest.mark.parametrize("name", SDE)
@pytest.mark.parametrize(
    ("space", "settings", "match"),
    [
        (spaces.Discrete(2), {}, r"use_sde explores Box actions.*got action space Discrete"),
        (ACT, {"action_noise_color": 1.0}, r"use_sde and action_noise_color.*got both"),
        (ACT, {"sde_sample_freq": 0}, r"sde_sample_freq is a positive number.*got 0"),
        (ACT, {"sde_sample_freq": -2}, r"sde_sample_freq is a positive number.*got -2"),
    ],
)
def test_settings_it_cannot_use_are_refused_at_construction(
    name: str, space: spaces.Space[object], settings: dict[str, float], match: str
) -> None:
    cls = get_algorithm(name)
    with pytest.raises(ConfigError, match=match):
        cls(OBS, space, config=cls.config_class(use_sde=True, **settings))


@pytest.mark.parametrize("name", SDE)
def test_a_loaded_checkpoint_acts_and_explores_as_the_saved_model(
    name: str, tmp_path: Path
) -> None:
    from rlfleet import load

    cls = get_algorithm(name)
    algo = cls(OBS, ACT, seed=5, config=cls.config_class(use_sde=True, sde_sample_freq=2))
    obs = torch.rand(2, 3, generator=torch.Generator().manual_seed(1))
    algo.act(obs)
    algo.save(tmp_path / "model")
    loaded = load(tmp_path / "model")
    assert torch.equal(
        loaded.act(obs, deterministic=True).actions, algo.act(obs, deterministic=True).actions
    )
    for _ in range(3):
        assert torch.equal(loaded.act(obs).actions, algo.act(obs).actions)
