"""APPO's update: deterministic, several clipped steps per batch, compilable."""

from __future__ import annotations

import torch

from rlfleet.algos import APPO, APPOConfig
from rlfleet.collect.collector import Collector
from rlfleet.data.rollout import RolloutStorage
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
