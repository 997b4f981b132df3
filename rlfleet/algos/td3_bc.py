"""TD3+BC (Fujimoto & Gu 2021, "A Minimalist Approach to Offline Reinforcement Learning",
arXiv:2106.06860), for Box actions.

TD3 on a fixed dataset, with one change to the actor: it maximises
``lambda * Q(s, pi(s)) - (pi(s) - a)^2``, where ``lambda = alpha / mean|Q(s, pi(s))|``
rescales Q so that ``alpha`` alone sets the balance between improving on the data and
staying close to it. Critics as TD3's: twin, target-policy smoothing, delayed actor and
target updates. Actions are regressed in the action space scaled to [-1, 1].

With ``normalize_obs`` (the default, as in the paper) observations are normalised by the
dataset's mean and standard deviation: :class:`~rlfleet.train.trainer.OfflineTrainer` passes
the whole dataset through ``preprocess(update_stats=True)`` once before training, and the
statistics are saved with the networks.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from gymnasium import spaces
from torch import nn

from rlfleet.algos import functional as F
from rlfleet.algos.base import Algorithm
from rlfleet.algos.registry import register
from rlfleet.config.fields import NonNegativeFloat, PositiveFloat, PositiveInt, UnitFloat
from rlfleet.nn.actions import box_scale_bias
from rlfleet.nn.mlp import Activation, flat_size, flatten_obs, mlp
from rlfleet.nn.normalize import RunningNormalizer
from rlfleet.nn.twin import TwinMLP
from rlfleet.types import PolicyStep, ReplayBatch

if TYPE_CHECKING:
    from rlfleet.data.replay import ReplayBuffer


@dataclass
class TD3BCConfig:
    """TD3+BC hyperparameters (the paper's defaults)."""

    learning_rate: PositiveFloat = 3e-4
    """Adam step size of actor and critics."""
    batch_size: PositiveInt = 256
    """Transitions per gradient step."""
    gamma: UnitFloat = 0.99
    """Discount factor."""
    tau: UnitFloat = 0.005
    """Polyak step of the target networks after each delayed update."""
    policy_delay: PositiveInt = 2
    """Critic steps per actor (and target) update."""
    target_policy_noise: NonNegativeFloat = 0.2
    """Std of the smoothing noise on target actions (in units of half the action range)."""
    target_noise_clip: NonNegativeFloat = 0.5
    """Clip of that smoothing noise."""
    alpha: NonNegativeFloat = 2.5
    """Weight of the Q term against the behavior-cloning term (0: pure BC)."""
    normalize_obs: bool = True
    """Normalise observations by the dataset's mean and standard deviation."""
    hidden_sizes: tuple[PositiveInt, ...] = (256, 256)
    """Hidden layer widths of the actor and of each critic."""
    activation: Activation = "relu"
    """Hidden-layer activation."""
    adam_eps: PositiveFloat = 1e-8
    """Adam epsilon."""


@register
class TD3BC(Algorithm[TD3BCConfig]):
    """TD3 with a behavior-cloning term in the actor loss, for Box actions."""

    name = "td3_bc"
    kind = "offline"
    config_class = TD3BCConfig
    action_spaces = (spaces.Box,)

    def __init__(
        self,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        config: TD3BCConfig | None = None,
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__(
            observation_space, action_space, config or TD3BCConfig(), seed=seed, device=device
        )
        self.obs_shape: tuple[int, ...] = tuple(observation_space.shape or ())
        self.action_shape: tuple[int, ...] = tuple(action_space.shape or ())
        self.action_dim = flat_size(self.action_shape)
        assert isinstance(action_space, spaces.Box)  # check_spaces accepted only Box
        self.action_scale, self.action_bias = box_scale_bias(action_space, self.device)
        self.build_networks()

    def _build(self) -> None:
        cfg = self.config
        obs_dim = flat_size(self.obs_shape)
        self.actor = mlp(
            obs_dim, cfg.hidden_sizes, self.action_dim, cfg.activation, ortho_init=False
        ).to(self.device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic = TwinMLP(
            obs_dim + self.action_dim, cfg.hidden_sizes, (1, 1), cfg.activation, ortho_init=False
        ).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.obs_normalizer = (
            RunningNormalizer(self.obs_shape).to(self.device) if cfg.normalize_obs else None
        )
        self._actor_params: list[torch.Tensor] = list(self.actor.parameters())
        self._critic_params: list[torch.Tensor] = list(self.critic.parameters())
        self._online_params = self._actor_params + self._critic_params
        self._target_params: list[torch.Tensor] = [
            *self.actor_target.parameters(),
            *self.critic_target.parameters(),
        ]
        fused = self.device.type in ("cpu", "cuda")
        self.actor_optimizer = torch.optim.Adam(
            self._actor_params, lr=cfg.learning_rate, eps=cfg.adam_eps, fused=fused
        )
        self.critic_optimizer = torch.optim.Adam(
            self._critic_params, lr=cfg.learning_rate, eps=cfg.adam_eps, fused=fused
        )

    def modules(self) -> dict[str, nn.Module]:
        found: dict[str, nn.Module] = {
            "actor": self.actor,
            "actor_target": self.actor_target,
            "critic": self.critic,
            "critic_target": self.critic_target,
        }
        if self.obs_normalizer is not None:
            found["obs_normalizer"] = self.obs_normalizer
        return found

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor_optimizer": self.actor_optimizer, "critic_optimizer": self.critic_optimizer}

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
        """The deterministic policy (offline there is no exploration to add)."""
        self.refuse_unsupported_inputs(action_mask, state)
        unit = torch.tanh(self.actor(flatten_obs(obs, len(self.obs_shape))))
        actions = unit * self.action_scale + self.action_bias
        return PolicyStep(actions=actions.reshape(-1, *self.action_shape))

    # --------------------------------------------------------------- training
    def update(
        self,
        batch: ReplayBuffer,
        *,
        batch_size: int | None = None,
        num_gradient_steps: int = 1,
    ) -> dict[str, float]:
        """``num_gradient_steps`` critic steps; actor and targets every ``policy_delay``."""
        cfg = self.config
        batch_size = batch_size or cfg.batch_size
        critic_total = torch.zeros(())
        actor_totals = torch.zeros(2)  # actor loss, behavior-cloning term
        actor_updates = 0
        for _ in range(num_gradient_steps):
            sample: ReplayBatch[torch.Tensor] = batch.sample(batch_size, gamma=cfg.gamma)
            obs, actions, critic_loss = self._critic_step(sample)
            critic_total += critic_loss
            self.gradient_steps += 1
            if self.gradient_steps % cfg.policy_delay == 0:
                actor_totals += self._actor_step(obs, actions)
                F.polyak_update(self._target_params, self._online_params, cfg.tau)
                actor_updates += 1
        metrics = {"loss/critic": float(critic_total) / max(num_gradient_steps, 1)}
        if actor_updates:
            actor_loss, bc_loss = (actor_totals / actor_updates).tolist()
            metrics["loss/actor"] = actor_loss
            metrics["loss/bc"] = bc_loss
        return metrics

    def _critic_step(
        self, sample: ReplayBatch[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One critic step; returns the batch's flat observations, scaled actions and loss."""
        cfg = self.config
        ndim = len(self.obs_shape)
        obs = flatten_obs(self.preprocess(sample.obs), ndim)
        next_obs = flatten_obs(self.preprocess(sample.next_obs), ndim)
        actions = (sample.actions.reshape(obs.shape[0], -1) - self.action_bias) / self.action_scale
        with torch.no_grad():
            noise = torch.randn(actions.shape, generator=self.generator) * cfg.target_policy_noise
            noise = noise.clamp(-cfg.target_noise_clip, cfg.target_noise_clip)
            next_actions = (torch.tanh(self.actor_target(next_obs)) + noise).clamp(-1.0, 1.0)
            next_q = torch.min(*self.critic_target(torch.cat([next_obs, next_actions], 1)))
            target = sample.rewards + sample.discounts * next_q.squeeze(1)
        q1, q2 = self.critic(torch.cat([obs, actions], 1))
        loss = nn.functional.mse_loss(q1.squeeze(1), target) + nn.functional.mse_loss(
            q2.squeeze(1), target
        )
        self.critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.critic_optimizer.step()
        return obs, actions, loss.detach()

    def _actor_step(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``-lambda * Q(s, pi(s)) + (pi(s) - a)^2``; returns (loss, BC term)."""
        policy_actions = torch.tanh(self.actor(obs))
        q = self.critic(torch.cat([obs, policy_actions], 1))[0]
        scale = self.config.alpha / q.abs().mean().detach().clamp(min=1e-6)
        bc_loss = nn.functional.mse_loss(policy_actions, actions)
        loss = -scale * q.mean() + bc_loss
        self.actor_optimizer.zero_grad(set_to_none=True)
        loss.backward(inputs=self._actor_params)
        self.actor_optimizer.step()
        return torch.stack([loss.detach(), bc_loss.detach()])
