"""The networks of the deterministic-policy actor-critics (DDPG, TD3, TD3+BC), and the twin
critics and target copies they share with the stochastic ones (SAC, IQL, CQL).

The policy ``mu(s)`` is an MLP whose output a tanh squashes into [-1, 1]; critics score
``[s, a]`` with ``a`` in those units (:mod:`rlfleet.nn.actions` maps them onto the Box).
Layers keep PyTorch's default init, as Stable-Baselines3's actors and critics do. Target
networks are frozen copies that Polyak averaging moves
(:func:`rlfleet.functional.polyak_update`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch
from gymnasium import spaces
from torch import nn

from rlfleet.nn.actions import box_scale_bias, to_box, to_unit
from rlfleet.nn.mlp import Activation, flat_size, mlp
from rlfleet.nn.optim import NanGuarded, adam, optimizer_step, optimizer_step_captured
from rlfleet.nn.twin import TwinMLP
from rlfleet.types import ReplayBatch

ModuleT = TypeVar("ModuleT", bound=nn.Module)


class NetworkConfig(Protocol):
    """The config fields the networks and their optimisers are built from."""

    @property
    def hidden_sizes(self) -> Sequence[int]:
        """Hidden layer widths of the actor and of each critic."""

    @property
    def activation(self) -> Activation:
        """Hidden-layer activation."""

    @property
    def learning_rate(self) -> float:
        """Adam step size of actor and critic."""

    @property
    def adam_eps(self) -> float:
        """Adam epsilon."""


def with_target(network: ModuleT) -> tuple[ModuleT, ModuleT]:
    """``network`` and a frozen copy of it, its target network."""
    return network, copy.deepcopy(network).requires_grad_(False)


def twin_critic(
    in_features: int, hidden_sizes: Sequence[int], activation: Activation, out_features: int = 1
) -> TwinMLP:
    """Two critics as one :class:`~rlfleet.nn.twin.TwinMLP`: ``Q(s, a)`` of one action
    (``in_features`` spans ``[s, a]``) or, with ``out_features = n``, ``Q(s, .)`` of each of
    ``n`` discrete actions."""
    return TwinMLP(
        in_features, hidden_sizes, (out_features, out_features), activation, ortho_init=False
    )


@dataclass
class BoxBatch:
    """What one gradient step of an actor-critic on Box actions reads (DDPG, TD3, TD3+BC,
    SAC), as :func:`box_batch` makes it from a replay sample."""

    obs: torch.Tensor
    """Observations, preprocessed and flat."""
    next_obs: torch.Tensor
    actions: torch.Tensor
    """Actions in [-1, 1], ``[batch, dim]``."""
    rewards: torch.Tensor
    discounts: torch.Tensor
    noise: torch.Tensor | None = None
    """A standard-normal draw of the actions' shape for ``obs`` (SAC's policy sample there)."""
    next_noise: torch.Tensor | None = None
    """One for ``next_obs``: SAC's policy sample there, TD3's target-policy smoothing."""


def box_batch(
    sample: ReplayBatch[torch.Tensor],
    flat_obs: Callable[[Any], torch.Tensor],
    unit_actions: Callable[[torch.Tensor], torch.Tensor],
    *,
    generator: torch.Generator | None = None,
    noise: bool = False,
    next_noise: bool = False,
) -> BoxBatch:
    """``sample`` as a gradient step reads it: ``flat_obs`` of its observations (the
    algorithm's preprocessing, then flattening), ``unit_actions`` of its actions, and, where
    asked for, standard-normal draws of the actions' shape from ``generator`` on the host,
    ``noise`` before ``next_noise``, moved to the observations' device (the numbers a draw in
    the loss would take: ``torch.randn`` on the CPU generator, then the move). A step
    captured as a CUDA graph reads its draws from the batch this way."""
    obs = flat_obs(sample.obs)
    actions = unit_actions(sample.actions)

    def draw() -> torch.Tensor:
        return torch.randn(actions.shape, generator=generator).to(obs.device)

    drawn = draw() if noise else None
    next_drawn = draw() if next_noise else None
    return BoxBatch(
        obs=obs,
        next_obs=flat_obs(sample.next_obs),
        actions=actions,
        rewards=sample.rewards,
        discounts=sample.discounts,
        noise=drawn,
        next_noise=next_drawn,
    )


class DeterministicActorCritic:
    """A deterministic tanh policy over a Box and its critic, each with a target copy and a
    fused Adam optimiser.

    The critic maps ``[s, a]`` to ``Q(s, a)`` of shape ``[batch, 1]`` (DDPG's), or, with
    ``twin``, to a pair of them (TD3's, one :class:`~rlfleet.nn.twin.TwinMLP`). The actor is
    built before the critic, so a seed gives the same weights as building them by hand in
    that order. :meth:`modules` and :meth:`optimizers` name them as checkpoints store them.
    """

    def __init__(
        self,
        obs_dim: int,
        action_space: spaces.Box,
        config: NetworkConfig,
        *,
        twin: bool,
        device: torch.device,
    ) -> None:
        self.action_shape: tuple[int, ...] = tuple(action_space.shape)
        self.action_scale, self.action_bias = box_scale_bias(action_space, device)
        action_dim = flat_size(self.action_shape)
        hidden_sizes, activation = config.hidden_sizes, config.activation
        actor = mlp(obs_dim, hidden_sizes, action_dim, activation, ortho_init=False)
        self.actor, self.actor_target = with_target(actor.to(device))
        critic: nn.Module = (
            twin_critic(obs_dim + action_dim, hidden_sizes, activation)
            if twin
            else mlp(obs_dim + action_dim, hidden_sizes, 1, activation, ortho_init=False)
        )
        self.critic, self.critic_target = with_target(critic.to(device))
        self.actor_params: list[torch.Tensor] = list(self.actor.parameters())
        self.critic_params: list[torch.Tensor] = list(self.critic.parameters())
        self.online_params = self.actor_params + self.critic_params
        self.target_params: list[torch.Tensor] = [
            *self.actor_target.parameters(),
            *self.critic_target.parameters(),
        ]
        lr, eps = config.learning_rate, config.adam_eps
        self.actor_optimizer = adam(self.actor_params, lr, eps, device)
        self.critic_optimizer = adam(self.critic_params, lr, eps, device)

    def modules(self) -> dict[str, nn.Module]:
        """The networks, under the names checkpoints store them by."""
        return {
            "actor": self.actor,
            "actor_target": self.actor_target,
            "critic": self.critic,
            "critic_target": self.critic_target,
        }

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """The optimisers, under the names checkpoints store them by."""
        return {"actor_optimizer": self.actor_optimizer, "critic_optimizer": self.critic_optimizer}

    # ----------------------------------------------------------------- acting
    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """``mu(s)`` in [-1, 1] for flat observations."""
        return torch.tanh(self.actor(obs))

    def target_policy(self, obs: torch.Tensor) -> torch.Tensor:
        """``mu'(s)`` of the target actor, in [-1, 1]."""
        return torch.tanh(self.actor_target(obs))

    def act(
        self,
        obs: torch.Tensor,
        noise_std: float = 0.0,
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Env actions ``[batch, *action_shape]`` for flat observations: ``mu(s)`` plus, with
        ``noise_std``, Gaussian exploration noise of that std (in units of half the action
        range) clipped back into [-1, 1], then scaled onto the bounds. ``noise``: the
        standard-normal draw to scale (e.g. a step of colored noise), instead of a fresh one
        from ``generator``."""
        unit = self.policy(obs)
        if noise_std > 0:
            if noise is None:
                noise = torch.randn(unit.shape, generator=generator).to(unit.device)
            unit = (unit + noise_std * noise).clamp(-1.0, 1.0)
        return to_box(unit, self.action_scale, self.action_bias, self.action_shape)

    def to_unit(self, actions: torch.Tensor) -> torch.Tensor:
        """Stored ``[batch, *action_shape]`` actions as ``[batch, dim]`` in [-1, 1]."""
        return to_unit(actions, self.action_scale, self.action_bias)

    # --------------------------------------------------------------- training
    def step_critic(self, owner: NanGuarded, loss: torch.Tensor) -> bool:
        """One critic optimiser step on ``loss``; False when ``owner`` skipped the batch
        (see :func:`~rlfleet.nn.optim.optimizer_step`)."""
        return optimizer_step(owner, self.critic_optimizer, loss, self.critic_params) is not None

    def step_actor(self, owner: NanGuarded, loss: torch.Tensor) -> bool:
        """One actor optimiser step on ``loss``, back-propagated into the actor's parameters
        only: no gradient is computed for critic weights the step does not use. False when
        ``owner`` skipped the batch."""
        optimizer, params = self.actor_optimizer, self.actor_params
        return optimizer_step(owner, optimizer, loss, params, inputs=params) is not None

    def critic_step_captured(self, loss: torch.Tensor, checks: list[torch.Tensor]) -> torch.Tensor:
        """:meth:`step_critic` inside a captured step
        (:func:`~rlfleet.nn.optim.optimizer_step_captured`); returns the skip flag."""
        return optimizer_step_captured(self.critic_optimizer, loss, self.critic_params, checks)

    def actor_step_captured(
        self, loss: torch.Tensor, checks: list[torch.Tensor], skip: torch.Tensor
    ) -> None:
        """:meth:`step_actor` inside a captured step, skipped also where ``skip`` is true."""
        params = self.actor_params
        optimizer_step_captured(
            self.actor_optimizer, loss, params, checks, skip=skip, inputs=params
        )
