"""The actor-critic network: one forward pass over a rollout and the observation after it,
Box actions in their space's shape, recurrent state only for a recurrent policy."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from rlfleet.nn.action_head import ActionHead
from rlfleet.nn.actor_critic import ActorCritic
from rlfleet.nn.obs import ObsLayout


def _net(action_space: spaces.Space[Any], lstm_hidden_size: int | None = None) -> ActorCritic:
    torch.manual_seed(0)
    layout = ObsLayout(spaces.Box(-1.0, 1.0, (2, 3), np.float32))
    head = ActionHead(action_space)
    return ActorCritic(layout, head, (8,), "tanh", lstm_hidden_size=lstm_hidden_size)


def test_rollout_evaluation_matches_step_by_step_evaluation() -> None:
    net = _net(spaces.Discrete(3))
    obs, next_obs = torch.randn(5, 4, 2, 3), torch.randn(4, 2, 3)
    actions = torch.randint(3, (5, 4))
    log_probs, entropy, values, next_values = net.evaluate_rollout(obs, actions, next_obs)
    for t in range(5):
        expected = net.evaluate_actions(obs[t], actions[t])
        for got, want in zip((log_probs[t], entropy[t], values[t]), expected, strict=True):
            torch.testing.assert_close(got, want)
    torch.testing.assert_close(next_values[:-1], values[1:])
    torch.testing.assert_close(next_values[-1], net.evaluate_actions(next_obs, actions[0])[2])


def test_box_actions_have_the_shape_of_the_space() -> None:
    net = _net(spaces.Box(-1.0, 1.0, (2, 2), np.float32))
    obs = torch.randn(6, 2, 3)
    generator = torch.Generator().manual_seed(0)
    for deterministic in (False, True):
        step = net.act(obs, generator, deterministic=deterministic)
        assert step.actions.shape == (6, 2, 2)
        assert step.log_probs is not None
        log_probs, _, _ = net.evaluate_actions(obs, step.actions)
        torch.testing.assert_close(log_probs, step.log_probs)


def test_only_a_recurrent_network_has_a_state() -> None:
    assert _net(spaces.Discrete(2)).initial_state(3, torch.device("cpu")) is None
    state = _net(spaces.Discrete(2), lstm_hidden_size=5).initial_state(3, torch.device("cpu"))
    assert state is not None
    assert state.shape == (3, 2, 5)
    assert not state.any()


def test_evaluating_without_entropies_gives_the_same_log_probs_and_values() -> None:
    from rlfleet.types import Minibatch

    spaces_to_try: list[spaces.Space[Any]] = [
        spaces.Discrete(3),
        spaces.MultiDiscrete([3, 2]),
        spaces.MultiBinary(3),
        spaces.Box(-1.0, 1.0, (2,), np.float32),
    ]
    generator = torch.Generator().manual_seed(0)
    for space in spaces_to_try:
        net = _net(space)
        obs = torch.randn(6, 2, 3, generator=generator)
        step = net.act(obs, generator)
        zeros = torch.zeros(6)
        mb = Minibatch(obs, step.actions, zeros, zeros, zeros, zeros, zeros, None)
        log_probs, _, values = net.evaluate(mb)
        lean_log_probs, lean_values = net.evaluate_log_probs(mb)
        assert torch.equal(lean_log_probs, log_probs), space
        assert torch.equal(lean_values, values), space


def test_without_ortho_init_the_layers_start_as_nn_linear_does() -> None:
    """``ortho_init=False`` (Stable-Baselines3's setting of the same name): every weight of
    the actor and critic within nn.Linear's default bound ``1 / sqrt(fan_in)``; the
    orthogonal initialisation (hidden gain sqrt(2)) reaches beyond it."""
    layout = ObsLayout(spaces.Box(-1.0, 1.0, (6,), np.float32))
    head = ActionHead(spaces.Box(-1.0, 1.0, (2,), np.float32))
    for ortho, inside in ((False, True), (True, False)):
        torch.manual_seed(0)
        net = ActorCritic(layout, head, (64, 64), "tanh", ortho_init=ortho)
        within = all(
            bool((weight.abs() <= weight.shape[1] ** -0.5).all()) for weight in net.twin.weights
        )
        assert within is inside


def test_a_gsde_policy_reads_its_last_hidden_features_without_hidden_layers_too() -> None:
    layout = ObsLayout(spaces.Box(-1.0, 1.0, (5,), np.float32))
    head = ActionHead(spaces.Box(-1.0, 1.0, (2,), np.float32))
    for hidden, width in (((16, 8), 8), ((), 5)):
        net = ActorCritic(layout, head, hidden, "tanh", sde=True)
        assert net.latent_dim == width
        assert net.log_std is not None
        assert net.log_std.shape == (width, 2)
        obs = torch.randn(3, 5)
        step = net.act(obs, torch.Generator().manual_seed(0))
        log_probs, _, _ = net.evaluate_actions(obs, step.actions)
        assert step.log_probs is not None
        torch.testing.assert_close(log_probs, step.log_probs)
