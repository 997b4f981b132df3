"""Pieces the policy-gradient algorithms share: rollout advantages, the normalisers'
checkpoint keys, and V-trace targets of a learner batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet import functional as F
from rlfleet.algos import APPO, IMPALA, APPOConfig, IMPALAConfig
from rlfleet.algos.policy_gradient import (
    LearnerBatch,
    check_sequence_length,
    make_normalizers,
    normalizer_modules,
    rollout_advantages,
    vtrace_targets,
)
from rlfleet.collect.collector import Collector
from rlfleet.data.rollout import RolloutStorage
from rlfleet.distributed.actors import fragment_storage
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import ConfigError
from rlfleet.nn.action_head import ActionHead
from rlfleet.nn.actor_critic import ActorCritic
from rlfleet.nn.normalize import RewardScaler
from rlfleet.nn.obs import ObsLayout


@dataclass
class _Settings:
    gamma: float = 0.9
    gae_lambda: float = 0.8
    normalize_advantage: bool = True
    time_horizon: int | None = None
    normalize_obs: bool = True
    normalize_reward: bool = True
    rho_bar: float = 1.0
    c_bar: float = 0.9
    vtrace_lambda: float = 1.0
    sequence_length: int | None = None


def _rollout(seed: int = 0) -> RolloutStorage:
    generator = torch.Generator().manual_seed(seed)
    storage = RolloutStorage(6, 3, (2,), (), action_dtype=torch.int64)
    storage.obs.copy_(torch.randn(6, 3, 2, generator=generator))
    storage.actions.copy_(torch.randint(2, (6, 3), generator=generator))
    storage.log_probs.copy_(-torch.rand(6, 3, generator=generator))
    storage.values.copy_(torch.randn(6, 3, generator=generator))
    storage.rewards.copy_(torch.randn(6, 3, generator=generator))
    storage.terminated[2, 0] = 1.0
    storage.truncated[4, 1] = 1.0
    storage.valid.fill_(1.0)
    storage.valid[3, 0] = 0.0
    storage.next_obs.copy_(torch.randn(3, 2, generator=generator))
    storage.next_value.copy_(torch.randn(3, generator=generator))
    return storage


def test_rollout_advantages_are_standardised_gae_of_the_scaled_rewards() -> None:
    batch, settings = _rollout(), _Settings()
    scaler = RewardScaler(settings.gamma)
    advantages, returns = rollout_advantages(batch, scaler, settings)
    assert float(scaler.return_stats.count) > 1.0  # the rollout's returns were folded in
    scaled = RewardScaler(settings.gamma)
    rewards = scaled(
        batch.rewards, torch.maximum(batch.terminated, batch.truncated), batch.valid, update=True
    )
    raw, expected_returns = F.gae(
        rewards, batch.values, batch.next_values(), batch.terminated, batch.truncated, 0.9, 0.8
    )
    torch.testing.assert_close(returns, expected_returns)
    torch.testing.assert_close(advantages, F.standardize(raw, batch.valid))
    plain, _ = rollout_advantages(batch, None, _Settings(normalize_advantage=False))
    unscaled, _ = F.gae(
        batch.rewards,
        batch.values,
        batch.next_values(),
        batch.terminated,
        batch.truncated,
        0.9,
        0.8,
    )
    torch.testing.assert_close(plain, unscaled)


def test_a_time_horizon_cuts_the_advantages_and_none_leaves_them_bitwise_unchanged() -> None:
    batch = _rollout()
    plain = _Settings(normalize_advantage=False)
    today = F.gae(
        batch.rewards, batch.values, batch.next_values(), batch.terminated, batch.truncated,
        0.9, 0.8,
    )  # fmt: skip
    for time_horizon in (None, 6, 100):  # None, or no shorter than the 6-step rollout
        settings = _Settings(normalize_advantage=False, time_horizon=time_horizon)
        advantages, returns = rollout_advantages(batch, None, settings)
        assert torch.equal(advantages, today[0])
        assert torch.equal(returns, today[1])
    cut, _ = rollout_advantages(batch, None, _Settings(normalize_advantage=False, time_horizon=2))
    cuts = F.horizon_cuts(batch.terminated, batch.truncated, batch.valid, 2)
    assert cuts.sum() > 0
    expected, _ = F.gae(
        batch.rewards, batch.values, batch.next_values(), batch.terminated,
        torch.maximum(batch.truncated, cuts), 0.9, 0.8,
    )  # fmt: skip
    torch.testing.assert_close(cut, expected)
    assert not torch.equal(cut, rollout_advantages(batch, None, plain)[0])


def test_normalisers_are_saved_under_their_own_keys_when_on() -> None:
    layout = ObsLayout(spaces.Box(-1.0, 1.0, (2,), np.float32))
    on = make_normalizers(layout, _Settings(), "test", torch.device("cpu"))
    assert set(normalizer_modules(*on)) == {"obs_normalizer", "reward_scaler"}
    off = make_normalizers(
        layout, _Settings(normalize_obs=False, normalize_reward=False), "test", torch.device("cpu")
    )
    assert off == (None, None)
    assert normalizer_modules(*off) == {}


def test_vtrace_targets_come_from_one_evaluation_and_carry_no_gradient() -> None:
    torch.manual_seed(0)
    layout = ObsLayout(spaces.Box(-1.0, 1.0, (2,), np.float32))
    net = ActorCritic(layout, ActionHead(spaces.Discrete(2)), (8,), "tanh")
    batch = LearnerBatch.of(_rollout(), torch.device("cpu"))
    log_probs, _, values, vs, advantages = vtrace_targets(net, batch, _Settings())
    assert log_probs.requires_grad
    assert values.requires_grad
    assert not vs.requires_grad
    assert not advantages.requires_grad
    shorter = vtrace_targets(net, batch, _Settings(vtrace_lambda=0.5))[3]
    assert not torch.allclose(shorter, vs)  # the lambda reaches the trace
    with torch.no_grad():
        target_log_probs, _, expected_values, next_values = net.evaluate_rollout(
            batch.obs, batch.actions, batch.next_obs
        )
        expected = F.vtrace(
            batch.behaviour_log_probs,
            target_log_probs,
            batch.rewards,
            expected_values,
            next_values,
            batch.terminated,
            batch.truncated,
            0.9,
            1.0,
            0.9,
        )
    torch.testing.assert_close(vs, expected[0])
    torch.testing.assert_close(advantages, expected[1])


@pytest.mark.parametrize(("cls", "config_class"), [(IMPALA, IMPALAConfig), (APPO, APPOConfig)])
@pytest.mark.parametrize("sequence_length", [None, 4])
def test_learner_unroll_matches_the_actors_per_step_outputs(
    cls: type, config_class: type, sequence_length: int | None
) -> None:
    """Unrolled from the stored states, with the actor's weights, the learner sees the
    log-probabilities and values the actor acted with, step by step, across episode ends and
    fragment boundaries (the state goes on from one fragment to the next)."""
    envs = make_vec_env("CartPole-v1", 3, seed=1)
    config = config_class(num_steps=16, lstm_hidden_size=8, sequence_length=sequence_length)
    algo = cls(envs.single_observation_space, envs.single_action_space, config, seed=1)
    with torch.no_grad():  # a policy far from uniform, so log-probabilities tell steps apart
        for param in algo.net.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(2)))
    storage = fragment_storage(algo, 16, 3)
    collector = Collector(envs, algo, seed=1)
    carried_over = 0
    for fragment in range(4):
        carried = collector.runner.state
        assert carried is not None
        # the state is zeroed only for an env whose previous step was a reset step
        keep = storage.valid[-1].clone().view(-1, 1, 1) if fragment else torch.zeros(3, 1, 1)
        collector.collect_rollout(storage)
        assert storage.states is not None
        torch.testing.assert_close(storage.states[0], carried * keep)
        carried_over += int((storage.states[0].abs().sum((1, 2)) > 0).sum())
        batch = LearnerBatch.of(storage, algo.device)
        log_probs, _, values, _, _ = vtrace_targets(algo.net, batch, config)
        torch.testing.assert_close(log_probs, storage.log_probs, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(values, storage.values, rtol=1e-5, atol=1e-5)
    envs.close()
    assert carried_over > 0, "some fragment should start from a state carried over"
    assert (storage.valid == 0).any(), "the fragments should contain episode ends"


def test_sequence_length_must_divide_num_steps() -> None:
    with pytest.raises(ConfigError, match=r"impala: sequence_length \(5\) must divide num_steps"):
        check_sequence_length("impala", IMPALAConfig(num_steps=16, sequence_length=5))
    check_sequence_length("impala", IMPALAConfig(num_steps=16, sequence_length=4))
