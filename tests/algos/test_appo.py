"""APPO's update: deterministic, several clipped steps per batch, compilable; recurrent
sequences and learner-owned observation statistics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlfleet.algos import APPO, APPOConfig
from rlfleet.collect.collector import Collector
from rlfleet.data.rollout import RolloutStorage
from rlfleet.distributed.actors import fragment_storage
from rlfleet.envs.make import make_vec_env


def _setup(config: APPOConfig, seed: int) -> tuple[RolloutStorage, APPO]:
    envs = make_vec_env("CartPole-v1", 4, seed=0)
    algo = APPO(envs.single_observation_space, envs.single_action_space, config, seed=seed)
    storage = RolloutStorage.for_spaces(
        32, 4, envs.single_observation_space, envs.single_action_space
    )
    collector_algo = APPO(envs.single_observation_space, envs.single_action_space, seed=0)
    Collector(envs, collector_algo, seed=0).collect_rollout(storage)
    envs.close()
    return storage, algo


def test_same_seed_and_batch_give_identical_parameters() -> None:
    cfg = APPOConfig(batch_size=32, num_epochs=2)
    batch, first = _setup(cfg, 3)
    _, second = _setup(cfg, 3)
    _, other = _setup(cfg, 4)
    for algo in (first, second, other):
        algo.update(batch)
    assert torch.equal(first.parameters_vector(), second.parameters_vector())
    assert not torch.equal(first.parameters_vector(), other.parameters_vector())
    # 128 samples in minibatches of 32, two epochs.
    assert first.gradient_steps == 8


def test_compiled_update_matches_eager() -> None:
    cfg = APPOConfig(batch_size=64, num_epochs=1)
    batch, eager = _setup(cfg, 0)
    _, compiled = _setup(cfg, 0)
    compiled.compile_update()
    eager_metrics = eager.update(batch)
    compiled_metrics = compiled.update(batch)
    torch.testing.assert_close(eager.parameters_vector(), compiled.parameters_vector())
    assert abs(eager_metrics["loss/value"] - compiled_metrics["loss/value"]) < 1e-4


def _recurrent(config: APPOConfig, seed: int) -> tuple[RolloutStorage, APPO]:
    envs = make_vec_env("CartPole-v1", 4, seed=0)
    algo = APPO(envs.single_observation_space, envs.single_action_space, config, seed=seed)
    storage = fragment_storage(algo, config.num_steps, 4)
    Collector(envs, algo, seed=0).collect_rollout(storage)
    envs.close()
    return storage, algo


def test_recurrent_update_steps_on_whole_sequences_from_the_stored_states() -> None:
    cfg = APPOConfig(
        num_steps=32, lstm_hidden_size=16, sequence_length=8, batch_size=32, num_epochs=2
    )
    batch, algo = _recurrent(cfg, 0)
    assert batch.states is not None
    _, again = _recurrent(cfg, 0)
    before = algo.parameters_vector()
    metrics = algo.update(batch)
    again.update(batch)
    # 4 envs x 4 sequences of 8 steps, 4 sequences (32 steps) per minibatch, two epochs
    assert algo.gradient_steps == 8
    assert not torch.equal(before, algo.parameters_vector())
    assert torch.equal(algo.parameters_vector(), again.parameters_vector())
    assert all(np.isfinite(value) for value in metrics.values())


def test_the_first_recurrent_step_is_on_policy() -> None:
    """The ratio's reference is the learner's policy at the start of the update, not the
    actors': with behaviour log-probabilities far off, one minibatch of one epoch still has
    a ratio of 1 everywhere, so nothing is clipped."""
    cfg = APPOConfig(num_steps=16, lstm_hidden_size=8, batch_size=64, num_epochs=1)
    batch, algo = _recurrent(cfg, 0)
    batch.log_probs.fill_(-5.0)
    assert algo.update(batch)["train/clip_fraction"] == 0.0


def test_normalize_obs_folds_each_batch_once() -> None:
    cfg = APPOConfig(num_steps=16, normalize_obs=True, batch_size=32, num_epochs=3)
    batch, algo = _recurrent(cfg, 0)
    assert algo.obs_stats.normalizer is not None
    algo.update(batch)
    assert float(algo.obs_stats.normalizer.count) == pytest.approx(64 + 1e-4)
