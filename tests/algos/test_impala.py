"""IMPALA's update: deterministic, blind to reset steps, and off-policy corrected."""

from __future__ import annotations

from typing import Any

import torch

from rlfleet.algos import IMPALA
from rlfleet.collect.collector import Collector
from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs.make import make_vec_env


def _batch(seed: int = 0) -> tuple[RolloutStorage, IMPALA]:
    envs = make_vec_env("CartPole-v1", 4, seed=seed)
    algo = IMPALA(envs.single_observation_space, envs.single_action_space, seed=seed)
    storage = RolloutStorage.for_spaces(
        64, 4, envs.single_observation_space, envs.single_action_space
    )
    Collector(envs, algo, seed=seed).collect_rollout(storage)
    envs.close()
    return storage, algo


def _updated(batch: RolloutStorage, seed: int) -> IMPALA:
    algo = IMPALA(*_spaces(), seed=seed)
    algo.update(batch)
    return algo


def _spaces() -> tuple[Any, Any]:
    envs = make_vec_env("CartPole-v1", 1)
    found = (envs.single_observation_space, envs.single_action_space)
    envs.close()
    return found


def test_same_seed_and_batch_give_identical_parameters() -> None:
    batch, _ = _batch()
    first, second, other = _updated(batch, 3), _updated(batch, 3), _updated(batch, 4)
    assert torch.equal(first.parameters_vector(), second.parameters_vector())
    assert not torch.equal(first.parameters_vector(), other.parameters_vector())
    assert first.gradient_steps == 1


def test_reset_steps_do_not_change_the_update() -> None:
    batch, _ = _batch()
    invalid = batch.valid == 0
    assert invalid.any(), "the batch should contain episode ends"
    changed = RolloutStorage.for_spaces(64, 4, *_spaces())
    changed.copy_envs_from(batch, 0)
    changed.rewards[invalid] = 100.0
    changed.actions[invalid] = 1 - changed.actions[invalid]
    changed.log_probs[invalid] = -5.0
    a, b = _updated(batch, 0), _updated(changed, 0)
    torch.testing.assert_close(a.parameters_vector(), b.parameters_vector())


def test_stale_behaviour_policy_lowers_the_importance_weight() -> None:
    batch, _ = _batch()
    metrics = _updated(batch, 0).update(batch)
    assert metrics["train/mean_rho"] <= 1.0
    # Behaviour log-probs far above the learner's: pi/mu is tiny and so is the mean rho.
    batch.log_probs.fill_(0.0)
    assert _updated(batch, 0).update(batch)["train/mean_rho"] < 0.9
