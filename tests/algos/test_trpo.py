"""TRPO: learning at a fixed seed and budget; every policy step stays in the trust region."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.algos import TRPO, TRPOConfig
from rlfleet.data.rollout import RolloutStorage
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer

QUIET = {"show_progress": False, "verbose": False}


def _cfg(env_id: str, **overrides: Any) -> Any:
    trainer = {**QUIET, **overrides.pop("trainer", {})}
    return default_run_config("trpo", env_id, {"trainer": trainer, **overrides})


@pytest.mark.slow
def test_trpo_solves_cartpole() -> None:
    result = make_trainer(_cfg("CartPole-v1", seed=0), None).run()
    assert result.best_score >= 475, result


@pytest.mark.slow
def test_trpo_improves_on_pendulum() -> None:
    # A random policy scores about -1200; the preset goes on to -200, the test stops at its
    # own bar.
    result = make_trainer(_cfg("Pendulum-v1", seed=0, trainer={"target_reward": -400}), None).run()
    assert result.best_score >= -400, result


@pytest.mark.parametrize(
    ("action_space", "use_sde"),
    [
        (spaces.Discrete(3), False),
        (spaces.Box(-1, 1, (2,)), False),
        (spaces.Box(-1, 1, (2,)), True),
    ],
)
def test_policy_step_respects_the_kl_constraint(
    action_space: spaces.Space[Any], use_sde: bool
) -> None:
    """Also with gSDE, whose per-state Gaussians (and their KL) depend on the features."""
    config = TRPOConfig(target_kl=0.005, use_sde=use_sde)
    algo = TRPO(spaces.Box(-1, 1, (4,), np.float32), action_space, config)
    storage = _rollout(algo)
    before = [p.detach().clone() for p in algo.actor.parameters()]
    metrics = algo.update(storage)
    assert metrics["train/step_accepted"] == 1.0
    assert 0 < metrics["train/kl"] <= 0.005
    assert any(not torch.equal(b, p) for b, p in zip(before, algo.actor.parameters(), strict=True))


def test_linear_kl_schedule_shrinks_the_trust_region_to_nothing() -> None:
    """``target_kl_schedule: linear``: each step's KL stays within the bound at its progress,
    and at the end of the budget the policy no longer moves (the critic still learns)."""
    config = TRPOConfig(target_kl=0.02, target_kl_schedule="linear")
    algo = TRPO(spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(3), config)
    storage = _rollout(algo)
    for progress, bound in ((0.0, 0.02), (0.75, 0.005)):
        algo.set_progress(progress)
        metrics = algo.update(storage)
        assert metrics["train/target_kl"] == pytest.approx(bound)
        assert metrics["train/step_accepted"] == 1.0
        assert 0 < metrics["train/kl"] <= bound
    algo.set_progress(1.0)
    actor = [p.detach().clone() for p in algo.actor.parameters()]
    critic = [p.detach().clone() for p in algo.critic.parameters()]
    metrics = algo.update(storage)
    assert metrics["train/target_kl"] == 0.0
    assert metrics["train/step_accepted"] == 0.0
    assert all(torch.equal(b, p) for b, p in zip(actor, algo.actor.parameters(), strict=True))
    assert any(not torch.equal(b, p) for b, p in zip(critic, algo.critic.parameters(), strict=True))


def _rollout(algo: TRPO) -> RolloutStorage:
    """32 steps of 4 envs with random observations and rewards, actions from ``algo``."""
    storage = RolloutStorage(32, 4, (4,), algo.action_shape, action_dtype=algo.action_dtype)
    generator = torch.Generator().manual_seed(0)
    storage.obs.uniform_(-1, 1, generator=generator)
    storage.rewards.uniform_(-1, 1, generator=generator)
    storage.valid.fill_(1)
    step = algo.act(storage.obs.reshape(128, 4))
    storage.actions.copy_(step.actions.reshape(storage.actions.shape))
    assert step.values is not None
    storage.values.copy_(step.values.reshape(32, 4))
    return storage
