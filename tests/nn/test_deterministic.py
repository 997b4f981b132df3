"""The deterministic actor-critic's networks: built in a fixed order from one seed, acting
inside the action bounds, and an actor step that leaves the critic alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.algos.ddpg import DDPGConfig
from rlfleet.algos.td3 import TD3Config
from rlfleet.nn.deterministic import DeterministicActorCritic
from rlfleet.nn.mlp import mlp
from rlfleet.nn.twin import TwinMLP
from tests.nan_injection import Owner

CPU = torch.device("cpu")
BOX = spaces.Box(np.array([-1.0, -3.0], np.float32), np.array([2.0, 1.0], np.float32))


def test_same_seed_gives_the_weights_of_actor_then_critic_built_by_hand() -> None:
    torch.manual_seed(0)
    nets = DeterministicActorCritic(3, BOX, TD3Config(hidden_sizes=(8,)), twin=True, device=CPU)
    torch.manual_seed(0)
    actor = mlp(3, (8,), 2, "relu", ortho_init=False)
    critic = TwinMLP(5, (8,), (1, 1), "relu", ortho_init=False)
    for built, by_hand in ((nets.actor, actor), (nets.critic, critic)):
        for a, b in zip(built.parameters(), by_hand.parameters(), strict=True):
            assert torch.equal(a, b)
    for online, target in ((nets.actor, nets.actor_target), (nets.critic, nets.critic_target)):
        for a, b in zip(online.parameters(), target.parameters(), strict=True):
            assert torch.equal(a, b)
            assert not b.requires_grad


@pytest.mark.parametrize(("twin", "critic_class"), [(False, torch.nn.Sequential), (True, TwinMLP)])
def test_modules_and_optimizers_carry_the_checkpoint_names(
    twin: bool, critic_class: type[torch.nn.Module]
) -> None:
    nets = DeterministicActorCritic(3, BOX, DDPGConfig(hidden_sizes=(8,)), twin=twin, device=CPU)
    assert isinstance(nets.critic, critic_class)
    assert list(nets.modules()) == ["actor", "actor_target", "critic", "critic_target"]
    assert list(nets.optimizers()) == ["actor_optimizer", "critic_optimizer"]


def test_actions_are_the_tanh_policy_scaled_onto_the_bounds() -> None:
    nets = DeterministicActorCritic(3, BOX, TD3Config(hidden_sizes=(8,)), twin=True, device=CPU)
    obs = torch.randn(16, 3)
    generator = torch.Generator().manual_seed(0)
    greedy = nets.act(obs, 0.0, generator)
    assert torch.equal(generator.get_state(), torch.Generator().manual_seed(0).get_state())
    torch.testing.assert_close(nets.to_unit(greedy), nets.policy(obs))
    noisy = nets.act(obs, 10.0, generator)
    assert noisy.shape == (16, 2)
    low, high = torch.as_tensor(BOX.low), torch.as_tensor(BOX.high)
    assert ((noisy >= low) & (noisy <= high)).all()
    assert not torch.equal(noisy, greedy)


def test_actor_step_moves_the_actor_and_computes_no_critic_gradient() -> None:
    nets = DeterministicActorCritic(3, BOX, TD3Config(hidden_sizes=(8,)), twin=True, device=CPU)
    obs = torch.randn(16, 3)
    before = [p.detach().clone() for p in nets.actor.parameters()]
    assert nets.step_actor(Owner(), -nets.critic(torch.cat([obs, nets.policy(obs)], 1))[0].mean())
    assert all(p.grad is None for p in nets.critic.parameters())
    assert any(not torch.equal(b, p) for b, p in zip(before, nets.actor.parameters(), strict=True))
