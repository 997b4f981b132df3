"""A learner actor's body, run in this process: it follows the trainer's ``nan_policy``."""

from __future__ import annotations

import torch

from rlfleet.algos import IMPALA
from rlfleet.collect.collector import Collector
from rlfleet.data.rollout import RolloutStorage
from rlfleet.distributed.learner import LearnerSpec, LearnerWorker
from rlfleet.envs.make import make_vec_env
from tests.nan_injection import nan_gradients


def test_a_learner_follows_the_trainers_nan_policy_and_reports_its_skips() -> None:
    envs = make_vec_env("CartPole-v1", 4, seed=0)
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    algo = IMPALA(obs_space, act_space, seed=0)
    fragment = RolloutStorage.for_spaces(16, 4, obs_space, act_space)
    Collector(envs, algo, seed=0).collect_rollout(fragment)
    envs.close()
    spec = LearnerSpec("impala", algo.config, obs_space, act_space, 0, "cpu", False, "skip_batch")
    worker = LearnerWorker(0, 1, spec)
    worker.load_state(algo.state_dict())
    assert worker.algorithm.nan_policy == "skip_batch"
    nan_gradients(worker.algorithm.net.parameters())
    result, _ = worker.update(1, 0.0, fragment)
    assert (result.skipped_batches, result.gradient_steps) == (1, 0)
    assert torch.equal(worker.algorithm.parameters_vector(), algo.parameters_vector())
