"""MAPPO's central critic: a non-finite loss or gradient never reaches its weights, under the
``nan_policy`` of the PPO learner it serves."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.algos.ppo import PPO
from rlfleet.data.rollout import RolloutStorage
from rlfleet.errors import NonFiniteError
from rlfleet.marl.agents import AgentGroup
from rlfleet.marl.collector import Learner
from rlfleet.marl.mappo import CentralCritic, CentralCriticConfig
from rlfleet.nn.optim import NanPolicy
from tests.nan_injection import assert_unchanged, nan_gradients, optimizer_state

STEPS, ENVS, INPUT = 16, 2, 5


def _rollout(seed: int = 0) -> tuple[torch.Tensor, RolloutStorage]:
    g = torch.Generator().manual_seed(seed)
    rollout = RolloutStorage(STEPS, ENVS, (3,), ())
    rollout.rewards.copy_(torch.randn(STEPS, ENVS, generator=g))
    rollout.values.copy_(torch.randn(STEPS, ENVS, generator=g))
    rollout.valid.fill_(1)
    return torch.randn(STEPS, ENVS, INPUT, generator=g), rollout


@pytest.mark.parametrize("injection", ["loss", "gradient"])
@pytest.mark.parametrize("nan_policy", ["raise", "skip_batch"])
def test_a_non_finite_loss_or_gradient_never_reaches_the_critic(
    nan_policy: NanPolicy, injection: str
) -> None:
    critic = CentralCritic(INPUT, CentralCriticConfig(batch_size=8, num_epochs=2), seed=0)
    critic.update(*_rollout(), 0.99, 0.95)  # optimiser state to compare
    critic.nan_policy = nan_policy
    params = [p.detach().clone() for p in critic.net.parameters()]
    state = optimizer_state([critic.optimizer])
    inputs, rollout = _rollout(seed=1)
    if injection == "loss":
        rollout.rewards[-1] = float("nan")  # every GAE return, so every minibatch loss, is NaN
    else:
        nan_gradients(critic.net.parameters())
    if nan_policy == "raise":
        with pytest.raises(NonFiniteError, match=r"^mappo central critic: non-finite loss"):
            critic.update(inputs, rollout, 0.99, 0.95)
    else:
        critic.update(inputs, rollout, 0.99, 0.95)
        assert critic.skipped_batches == 8  # 32 rows / 8 per minibatch x 2 epochs
    assert_unchanged(params, [p.detach() for p in critic.net.parameters()], "critic weights")
    assert_unchanged(state, optimizer_state([critic.optimizer]), "critic optimizer state")


def test_the_critic_follows_its_learners_policy_and_saves_its_skip_count() -> None:
    algorithm = PPO(spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2))
    algorithm.nan_policy = "skip_batch"
    learner = Learner(AgentGroup("a", ["a"], algorithm, True, True), 1, INPUT)
    assert learner.critic is not None
    assert learner.critic.nan_policy == "skip_batch"
    learner.critic.skipped_batches = 3
    restored = CentralCritic(INPUT, CentralCriticConfig())
    restored.load_state_dict(learner.critic.state_dict())
    assert restored.skipped_batches == 3
