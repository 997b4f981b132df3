"""Implicit Q-Learning (Kostrikov et al. 2021, "Offline Reinforcement Learning with Implicit
Q-Learning", arXiv:2110.06169), for Box actions.

IQL never evaluates an action the dataset does not hold. A value network ``V(s)`` is fitted
to an upper ``expectile`` of the target critics' ``Q(s, a)`` over the dataset's actions (an
in-sample estimate of the best action's value); the twin critics regress onto
``r + gamma * V(s')``; the policy is extracted by advantage-weighted regression (AWR):
maximise ``exp(beta * (Q(s, a) - V(s)))``-weighted log-likelihood of the dataset's actions,
the weights clipped at ``max_weight``.

The policy is a Gaussian with a tanh-bounded mean and a state-independent log standard
deviation, as in the paper; its greedy action is the mean. Deviations: a constant actor
learning rate (the paper decays it on a cosine schedule); twin critics are one
:class:`~rlfleet.nn.twin.TwinMLP`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from gymnasium import spaces
from torch import nn

from rlfleet import functional as F
from rlfleet.algos.base import Algorithm
from rlfleet.algos.kinds import OfflineAlgorithm
from rlfleet.algos.registry import register
from rlfleet.config.fields import (
    LayerWidth,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    UnitFloat,
)
from rlfleet.nn import distributions as D
from rlfleet.nn.actions import box_scale_bias, to_box, to_unit
from rlfleet.nn.deterministic import twin_critic, with_target
from rlfleet.nn.mlp import Activation, flat_size, flatten_obs, mlp
from rlfleet.nn.optim import adam, optimizer_step
from rlfleet.types import PolicyStep, ReplayBatch

if TYPE_CHECKING:
    from rlfleet.data.source import TransitionSource


@dataclass
class IQLConfig:
    """IQL hyperparameters (the paper's locomotion settings)."""

    learning_rate: PositiveFloat = 3e-4
    """Adam step size of actor, critics and value network."""
    batch_size: PositiveInt = 256
    """Transitions per gradient step."""
    gamma: UnitFloat = 0.99
    """Discount factor."""
    tau: UnitFloat = 0.005
    """Polyak step of the target critics after each gradient step."""
    expectile: UnitFloat = 0.7
    """Expectile of Q that V fits (0.5: the mean over dataset actions; towards 1: the max)."""
    beta: NonNegativeFloat = 3.0
    """Inverse temperature of the advantage weights (0: behavior cloning)."""
    max_weight: PositiveFloat = 100.0
    """Clip of the advantage weights."""
    hidden_sizes: tuple[LayerWidth, ...] = (256, 256)
    """Hidden layer widths of the actor, the value network and each critic."""
    activation: Activation = "relu"
    """Hidden-layer activation."""
    adam_eps: PositiveFloat = 1e-8
    """Adam epsilon."""


@register
class IQL(Algorithm[IQLConfig], OfflineAlgorithm):
    """Implicit Q-learning for Box actions."""

    name = "iql"
    kind = "offline"
    config_class = IQLConfig
    action_spaces = (spaces.Box,)

    def _setup(self) -> None:
        self.obs_shape: tuple[int, ...] = tuple(self.observation_space.shape or ())
        self.action_shape: tuple[int, ...] = tuple(self.action_space.shape or ())
        self.action_dim = flat_size(self.action_shape)
        assert isinstance(self.action_space, spaces.Box)  # check_spaces accepted only Box
        self.action_scale, self.action_bias = box_scale_bias(self.action_space, self.device)

    def _build(self) -> None:
        cfg = self.config
        obs_dim = flat_size(self.obs_shape)
        self.actor = mlp(obs_dim, cfg.hidden_sizes, self.action_dim, cfg.activation).to(self.device)
        self.log_std = nn.Parameter(torch.zeros(self.action_dim, device=self.device))
        self.value = mlp(obs_dim, cfg.hidden_sizes, 1, cfg.activation).to(self.device)
        self.critic, self.critic_target = with_target(
            twin_critic(obs_dim + self.action_dim, cfg.hidden_sizes, cfg.activation).to(self.device)
        )
        self._critic_params: list[torch.Tensor] = list(self.critic.parameters())
        self._target_params: list[torch.Tensor] = list(self.critic_target.parameters())
        self._actor_params: list[torch.Tensor] = [*self.actor.parameters(), self.log_std]
        self._value_params: list[torch.Tensor] = list(self.value.parameters())
        lr, eps = cfg.learning_rate, cfg.adam_eps
        self.actor_optimizer = adam(self._actor_params, lr, eps, self.device)
        self.value_optimizer = adam(self._value_params, lr, eps, self.device)
        self.critic_optimizer = adam(self._critic_params, lr, eps, self.device)

    def modules(self) -> dict[str, nn.Module]:
        return {
            "actor": self.actor,
            "log_std": nn.ParameterList([self.log_std]),
            "value": self.value,
            "critic": self.critic,
            "critic_target": self.critic_target,
        }

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {
            "actor_optimizer": self.actor_optimizer,
            "value_optimizer": self.value_optimizer,
            "critic_optimizer": self.critic_optimizer,
        }

    # ----------------------------------------------------------------- acting
    @torch.inference_mode()
    def act(
        self,
        obs: torch.Tensor,
        *,
        deterministic: bool = False,
        action_mask: torch.Tensor | None = None,
        state: torch.Tensor | None = None,
    ) -> PolicyStep:
        self.refuse_unsupported_inputs(action_mask, state)
        unit = torch.tanh(self.actor(flatten_obs(obs, len(self.obs_shape))))
        if not deterministic:
            unit = D.gaussian_sample(unit, self.log_std, self.generator).clamp(-1.0, 1.0)
        actions = to_box(unit, self.action_scale, self.action_bias, self.action_shape)
        return PolicyStep(actions=actions)

    # --------------------------------------------------------------- training
    def update(
        self,
        source: TransitionSource,
        *,
        batch_size: int | None = None,
        num_gradient_steps: int = 1,
    ) -> dict[str, float]:
        """``num_gradient_steps`` steps of value, critics and actor, each on a fresh batch."""
        cfg = self.config
        batch_size = batch_size or cfg.batch_size
        totals = torch.zeros(4, device=self.device)
        steps = 0
        for _ in range(num_gradient_steps):
            sample: ReplayBatch[torch.Tensor] = source.sample(batch_size, gamma=cfg.gamma).to(
                self.device
            )
            terms = self._step(sample)
            if terms is None:
                continue  # a skipped batch (nan_policy: skip_batch) ends its gradient step
            totals += terms
            steps += 1
            self.gradient_steps += 1
            F.polyak_update(self._target_params, self._critic_params, cfg.tau)
        means = (totals / max(steps, 1)).tolist()
        return {
            "loss/value": means[0],
            "loss/critic": means[1],
            "loss/actor": means[2],
            "train/advantage_mean": means[3],
        }

    def _step(self, sample: ReplayBatch[torch.Tensor]) -> torch.Tensor | None:
        """One step of value, critics and actor; returns [value loss, critic loss, actor
        loss, advantage mean] (None: the batch was skipped)."""
        cfg = self.config
        ndim = len(self.obs_shape)
        obs = flatten_obs(self.preprocess(sample.obs), ndim)
        next_obs = flatten_obs(self.preprocess(sample.next_obs), ndim)
        actions = to_unit(sample.actions, self.action_scale, self.action_bias)
        obs_actions = torch.cat([obs, actions], 1)

        with torch.no_grad():
            target_q = torch.min(*self.critic_target(obs_actions)).squeeze(1)
        advantage = target_q - self.value(obs).squeeze(1)
        value_loss = F.expectile_loss(advantage, cfg.expectile).mean()
        if optimizer_step(self, self.value_optimizer, value_loss, self._value_params) is None:
            return None

        with torch.no_grad():
            target = sample.rewards + sample.discounts * self.value(next_obs).squeeze(1)
        critic_loss = F.twin_q_loss(self.critic(obs_actions), target)
        if optimizer_step(self, self.critic_optimizer, critic_loss, self._critic_params) is None:
            return None

        weights = torch.exp(cfg.beta * advantage.detach()).clamp(max=cfg.max_weight)
        mean = torch.tanh(self.actor(obs))
        log_prob, _ = D.gaussian_log_prob_entropy(mean, self.log_std, actions)
        actor_loss = -(weights * log_prob).mean()
        if optimizer_step(self, self.actor_optimizer, actor_loss, self._actor_params) is None:
            return None
        return torch.stack(
            [
                value_loss.detach(),
                critic_loss.detach(),
                actor_loss.detach(),
                advantage.detach().mean(),
            ]
        )
