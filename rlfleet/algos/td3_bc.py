"""TD3+BC (Fujimoto & Gu 2021, "A Minimalist Approach to Offline Reinforcement Learning",
arXiv:2106.06860), for Box actions.

TD3 on a fixed dataset, with one change to the actor: it maximises
``lambda * Q(s, pi(s)) - (pi(s) - a)^2``, where ``lambda = alpha / mean|Q(s, pi(s))|``
rescales Q so that ``alpha`` alone sets the balance between improving on the data and
staying close to it. Critics as TD3's: twin, target-policy smoothing, delayed actor and
target updates (the same :class:`~rlfleet.nn.deterministic.DeterministicActorCritic` and
:func:`~rlfleet.functional.td3_critic_loss`). Actions are regressed in the action
space scaled to [-1, 1].

With ``normalize_obs`` (the default, as in the paper) observations are normalised by the
dataset's mean and standard deviation: :class:`~rlfleet.train.trainer.OfflineTrainer` passes
the whole dataset through ``preprocess(update_stats=True)`` once before training, and the
statistics are saved with the networks.
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
from rlfleet.nn.deterministic import DeterministicActorCritic, box_batch
from rlfleet.nn.mlp import Activation, flat_size, flatten_obs
from rlfleet.nn.normalize import RunningNormalizer
from rlfleet.types import PolicyStep, ReplayBatch

if TYPE_CHECKING:
    from rlfleet.data.source import TransitionSource


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
    hidden_sizes: tuple[LayerWidth, ...] = (256, 256)
    """Hidden layer widths of the actor and of each critic."""
    activation: Activation = "relu"
    """Hidden-layer activation."""
    adam_eps: PositiveFloat = 1e-8
    """Adam epsilon."""


@register
class TD3BC(Algorithm[TD3BCConfig], OfflineAlgorithm):
    """TD3 with a behavior-cloning term in the actor loss, for Box actions."""

    name = "td3_bc"
    kind = "offline"
    config_class = TD3BCConfig
    action_spaces = (spaces.Box,)

    def _setup(self) -> None:
        self.obs_shape: tuple[int, ...] = tuple(self.observation_space.shape or ())

    def _build(self) -> None:
        cfg = self.config
        assert isinstance(self.action_space, spaces.Box)  # check_spaces accepted only Box
        self.nets = DeterministicActorCritic(
            flat_size(self.obs_shape), self.action_space, cfg, twin=True, device=self.device
        )
        """Actor and twin critics, their targets and optimisers (TD3's)."""
        self.obs_normalizer = (
            RunningNormalizer(self.obs_shape).to(self.device) if cfg.normalize_obs else None
        )

    def modules(self) -> dict[str, nn.Module]:
        found = self.nets.modules()
        if self.obs_normalizer is not None:
            found["obs_normalizer"] = self.obs_normalizer
        return found

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return self.nets.optimizers()

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
        return PolicyStep(actions=self.nets.act(flatten_obs(obs, len(self.obs_shape))))

    # --------------------------------------------------------------- training
    def update(
        self,
        source: TransitionSource,
        *,
        batch_size: int | None = None,
        num_gradient_steps: int = 1,
    ) -> dict[str, float]:
        """``num_gradient_steps`` critic steps; actor and targets every ``policy_delay``."""
        cfg = self.config
        batch_size = batch_size or cfg.batch_size
        critic_total = torch.zeros((), device=self.device)
        actor_totals = torch.zeros(2, device=self.device)  # actor loss, behavior-cloning term
        critic_updates = actor_updates = 0
        for _ in range(num_gradient_steps):
            sample: ReplayBatch[torch.Tensor] = source.sample(batch_size, gamma=cfg.gamma).to(
                self.device
            )
            critic = self._critic_step(sample)
            if critic is None:
                continue  # a skipped batch (nan_policy: skip_batch) ends its gradient step
            obs, actions, critic_loss = critic
            critic_total += critic_loss
            critic_updates += 1
            # The step that makes the gradient-step count a multiple of policy_delay has the
            # actor's too; a skipped actor step ends its gradient step uncounted, with no
            # target update (as TD3's).
            if (self.gradient_steps + 1) % cfg.policy_delay == 0:
                actor_terms = self._actor_step(obs, actions)
                if actor_terms is None:
                    continue
                actor_totals += actor_terms
                F.polyak_update(self.nets.target_params, self.nets.online_params, cfg.tau)
                actor_updates += 1
            self.gradient_steps += 1
        metrics = {"loss/critic": float(critic_total) / max(critic_updates, 1)}
        if actor_updates:
            actor_loss, bc_loss = (actor_totals / actor_updates).tolist()
            metrics["loss/actor"] = actor_loss
            metrics["loss/bc"] = bc_loss
        return metrics

    def _critic_step(
        self, sample: ReplayBatch[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """One critic step; returns the batch's flat observations, scaled actions and loss
        (None: the batch was skipped)."""
        ndim = len(self.obs_shape)
        batch = box_batch(
            sample,
            lambda obs: flatten_obs(self.preprocess(obs), ndim),
            self.nets.to_unit,
            generator=self.generator,
            next_noise=True,
        )
        loss = F.td3_critic_loss(self.nets, batch, self.config)
        if not self.nets.step_critic(self, loss):
            return None
        return batch.obs, batch.actions, loss.detach()

    def _actor_step(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor | None:
        """``-lambda * Q(s, pi(s)) + (pi(s) - a)^2``; returns (loss, BC term) (None: the
        batch was skipped)."""
        policy_actions = self.nets.policy(obs)
        q = self.nets.critic(torch.cat([obs, policy_actions], 1))[0]
        scale = self.config.alpha / q.abs().mean().detach().clamp(min=1e-6)
        bc_loss = nn.functional.mse_loss(policy_actions, actions)
        loss = -scale * q.mean() + bc_loss
        if not self.nets.step_actor(self, loss):
            return None
        return torch.stack([loss.detach(), bc_loss.detach()])
