"""Conservative Q-Learning (Kumar et al. 2020, "Conservative Q-Learning for Offline
Reinforcement Learning", arXiv:2006.04779), the CQL(H) variant.

Offline, a Q-network overestimates actions the dataset never shows, and a greedy policy
picks exactly those. CQL adds to the TD loss ``cql_alpha * (logsumexp_a Q(s, a) -
Q(s, a_data))``: it pushes Q down on all actions (softly, on the largest) and up on the
recorded ones, so unseen actions look no better than seen ones.

Discrete actions, on DQN's pieces: a Q-network over all actions, a target network copied
every ``target_update_interval`` gradient steps (or moved by ``tau``), Huber TD loss,
gradient-norm clipping; the logsumexp is exact over the actions. The policy is greedy. A batch
with ``next_action_masks`` (a replay buffer of an env that masks actions) bootstraps from the
best legal next action only.

Box actions, on SAC's pieces: a tanh-squashed Gaussian actor, twin critics (one
:class:`~rlfleet.nn.twin.TwinMLP`) with Polyak-averaged targets and the tuned entropy
coefficient; the logsumexp over actions is estimated by importance sampling from
``num_sampled_actions`` uniform actions and as many policy actions at ``s`` and at ``s'``
(appendix F of the paper; as in CORL's implementation). Deviations: no Lagrangian tuning of
``cql_alpha`` and no behavior-cloning warm-up of the actor.
"""

from __future__ import annotations

import copy
import math
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
from rlfleet.nn.entropy import EntropyCoefficient
from rlfleet.nn.masks import masked_max
from rlfleet.nn.mlp import Activation, flat_size, flatten_obs, mlp
from rlfleet.nn.optim import adam, optimizer_step
from rlfleet.types import PolicyStep, ReplayBatch

if TYPE_CHECKING:
    from rlfleet.data.source import TransitionSource

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
"""Clamp of the actor's log standard deviation (as SAC's)."""


@dataclass
class CQLConfig:
    """CQL hyperparameters (Box actions follow CORL's defaults, Discrete DQN's)."""

    learning_rate: PositiveFloat = 3e-4
    """Adam step size of the Q-network or critics (and the entropy coefficient)."""
    actor_learning_rate: PositiveFloat = 1e-4
    """Box: Adam step size of the actor."""
    batch_size: PositiveInt = 256
    """Transitions per gradient step."""
    gamma: UnitFloat = 0.99
    """Discount factor."""
    tau: UnitFloat = 0.005
    """Target update: 1 copies the online network, less moves the target that fraction."""
    target_update_interval: PositiveInt = 1
    """Gradient steps between target updates."""
    cql_alpha: NonNegativeFloat = 5.0
    """Weight of the conservative term (0: plain DQN / SAC on the dataset)."""
    num_sampled_actions: PositiveInt = 10
    """Box: actions of each kind (uniform, policy at s, policy at s') in the logsumexp."""
    ent_coef: PositiveFloat | None = None
    """Box: fixed entropy coefficient; unset: tuned towards ``-dim(A)``."""
    max_grad_norm: PositiveFloat = 10.0
    """Discrete: global gradient-norm clip of the Q-network."""
    hidden_sizes: tuple[LayerWidth, ...] = (256, 256)
    """Hidden layer widths of the Q-network, the actor and each critic."""
    activation: Activation = "relu"
    """Hidden-layer activation."""
    adam_eps: PositiveFloat = 1e-8
    """Adam epsilon."""


@register
class CQL(Algorithm[CQLConfig], OfflineAlgorithm):
    """Conservative Q-learning for Discrete (DQN-style) and Box (SAC-style) actions."""

    name = "cql"
    kind = "offline"
    config_class = CQLConfig
    action_spaces = (spaces.Discrete, spaces.Box)

    def _setup(self) -> None:
        self.continuous = isinstance(self.action_space, spaces.Box)
        self.obs_shape: tuple[int, ...] = tuple(self.observation_space.shape or ())
        if isinstance(self.action_space, spaces.Box):
            self.action_shape: tuple[int, ...] = tuple(self.action_space.shape)
            self.action_dim = flat_size(self.action_shape)
            self.action_scale, self.action_bias = box_scale_bias(self.action_space, self.device)
        else:
            self.action_shape = ()
            self.action_dim = int(self.action_space.n)  # type: ignore[attr-defined]
        self.target_entropy = -float(self.action_dim)

    def _build(self) -> None:
        cfg = self.config
        obs_dim = flat_size(self.obs_shape)
        eps, device = cfg.adam_eps, self.device

        if not self.continuous:
            self.q_net = mlp(
                obs_dim, cfg.hidden_sizes, self.action_dim, cfg.activation, ortho_init=False
            ).to(self.device)
            self.q_target = copy.deepcopy(self.q_net).requires_grad_(False)
            self._online_params: list[torch.Tensor] = list(self.q_net.parameters())
            self._target_params: list[torch.Tensor] = list(self.q_target.parameters())
            self.optimizer = adam(self._online_params, cfg.learning_rate, eps, device)
            return
        self.actor = mlp(
            obs_dim, cfg.hidden_sizes, 2 * self.action_dim, cfg.activation, ortho_init=False
        ).to(self.device)
        self.critic, self.critic_target = with_target(
            twin_critic(obs_dim + self.action_dim, cfg.hidden_sizes, cfg.activation).to(self.device)
        )
        self.ent_coef = EntropyCoefficient(
            cfg.ent_coef if cfg.ent_coef is not None else 1.0, trainable=cfg.ent_coef is None
        ).to(self.device)
        self._actor_params = list(self.actor.parameters())
        self._online_params = list(self.critic.parameters())
        self._target_params = list(self.critic_target.parameters())
        self._ent_coef_params: list[torch.Tensor] = [self.ent_coef.log_value]
        self.actor_optimizer = adam(self._actor_params, cfg.actor_learning_rate, eps, device)
        self.optimizer = adam(self._online_params, cfg.learning_rate, eps, device)
        self.ent_coef_optimizer = (
            adam(self._ent_coef_params, cfg.learning_rate, eps, device)
            if cfg.ent_coef is None
            else None
        )

    def modules(self) -> dict[str, nn.Module]:
        if not self.continuous:
            return {"q_net": self.q_net, "q_target": self.q_target}
        return {
            "actor": self.actor,
            "critic": self.critic,
            "critic_target": self.critic_target,
            "ent_coef": self.ent_coef,
        }

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        if not self.continuous:
            return {"optimizer": self.optimizer}
        found: dict[str, torch.optim.Optimizer] = {
            "optimizer": self.optimizer,
            "actor_optimizer": self.actor_optimizer,
        }
        if self.ent_coef_optimizer is not None:
            found["ent_coef_optimizer"] = self.ent_coef_optimizer
        return found

    # ----------------------------------------------------------------- acting
    def _policy_sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Box: actions in [-1, 1] from the squashed Gaussian actor, with log-densities."""
        mean, log_std = self.actor(obs).chunk(2, dim=-1)
        return D.squashed_gaussian_sample(
            mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX), self.generator
        )

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
        flat = flatten_obs(obs, len(self.obs_shape))
        if not self.continuous:
            return PolicyStep(actions=self.q_net(flat).argmax(-1))
        if deterministic:
            unit = torch.tanh(self.actor(flat).chunk(2, dim=-1)[0])
        else:
            unit, _ = self._policy_sample(flat)
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
        """``num_gradient_steps`` conservative steps, each on a fresh minibatch."""
        cfg = self.config
        batch_size = batch_size or cfg.batch_size
        step = self._box_step if self.continuous else self._discrete_step
        totals = torch.zeros(4, device=self.device)
        steps = 0
        for _ in range(num_gradient_steps):
            sample: ReplayBatch[torch.Tensor] = source.sample(batch_size, gamma=cfg.gamma).to(
                self.device
            )
            terms = step(sample)
            if terms is None:
                continue  # a skipped batch (nan_policy: skip_batch) ends its gradient step
            totals += terms
            steps += 1
            self.gradient_steps += 1
            if self.gradient_steps % cfg.target_update_interval == 0:
                F.polyak_update(self._target_params, self._online_params, cfg.tau)
        means = (totals / max(steps, 1)).tolist()
        metrics = {"loss/td": means[0], "loss/cql": means[1], "train/q_mean": means[2]}
        if self.continuous:
            metrics["loss/actor"] = means[3]
            metrics["train/ent_coef"] = float(self.ent_coef.log_value.detach().exp())
        return metrics

    def _discrete_step(self, sample: ReplayBatch[torch.Tensor]) -> torch.Tensor | None:
        """One conservative Q step; returns [td loss, cql loss, Q mean, 0] (None: the batch
        was skipped)."""
        ndim = len(self.obs_shape)
        obs = flatten_obs(self.preprocess(sample.obs), ndim)
        next_obs = flatten_obs(self.preprocess(sample.next_obs), ndim)
        target = self._discrete_target(sample, next_obs)
        q_all = self.q_net(obs)
        q = q_all.gather(1, sample.actions.unsqueeze(1)).squeeze(1)
        td_loss = nn.functional.smooth_l1_loss(q, target)
        cql_loss = (torch.logsumexp(q_all, dim=-1) - q).mean()
        loss = td_loss + self.config.cql_alpha * cql_loss
        norm = optimizer_step(
            self, self.optimizer, loss, self._online_params, max_grad_norm=self.config.max_grad_norm
        )
        if norm is None:
            return None
        no_actor = torch.zeros((), device=self.device)
        return torch.stack([td_loss.detach(), cql_loss.detach(), q.detach().mean(), no_actor])

    @torch.no_grad()
    def _discrete_target(
        self, sample: ReplayBatch[torch.Tensor], next_obs: torch.Tensor
    ) -> torch.Tensor:
        """``r + discount * max_a' Q_target(s', a')``, over the legal ``a'`` with masks."""
        next_value = masked_max(self.q_target(next_obs), sample.next_action_masks)
        return sample.rewards + sample.discounts * next_value

    def _box_step(self, sample: ReplayBatch[torch.Tensor]) -> torch.Tensor | None:
        """One step of entropy coefficient, conservative critics and actor; returns [td
        loss, cql loss, Q mean, actor loss] (None: the batch was skipped)."""
        cfg = self.config
        ndim = len(self.obs_shape)
        obs = flatten_obs(self.preprocess(sample.obs), ndim)
        next_obs = flatten_obs(self.preprocess(sample.next_obs), ndim)
        actions = to_unit(sample.actions, self.action_scale, self.action_bias)

        policy_actions, log_prob = self._policy_sample(obs)
        alpha = self.ent_coef.log_value.detach().exp()
        if self.ent_coef_optimizer is not None:
            alpha_loss = self.ent_coef.loss(log_prob, self.target_entropy)
            params = self._ent_coef_params
            if optimizer_step(self, self.ent_coef_optimizer, alpha_loss, params) is None:
                return None
        with torch.no_grad():
            next_actions, next_log_prob = self._policy_sample(next_obs)
            next_q1, next_q2 = self.critic_target(torch.cat([next_obs, next_actions], 1))
            next_value = torch.min(next_q1, next_q2).squeeze(1) - alpha * next_log_prob
            target = sample.rewards + sample.discounts * next_value
            sampled, log_density = self._sampled_actions(obs, next_obs)
        q1, q2 = self.critic(torch.cat([obs, actions], 1))
        td_loss = F.twin_q_loss((q1, q2), target)
        # logsumexp over sampled actions, each Q corrected by its sampling log-density.
        n, batch = cfg.num_sampled_actions, obs.shape[0]
        repeated = obs.unsqueeze(0).expand(3 * n, *obs.shape).reshape(-1, obs.shape[1])
        sq1, sq2 = self.critic(torch.cat([repeated, sampled], 1))
        cql_loss = torch.zeros((), device=self.device)
        for q_data, q_sampled in ((q1, sq1), (q2, sq2)):
            soft_max = torch.logsumexp(q_sampled.reshape(3 * n, batch) - log_density, dim=0)
            cql_loss = cql_loss + (soft_max - q_data.squeeze(1)).mean()
        critic_loss = td_loss + cfg.cql_alpha * cql_loss
        if optimizer_step(self, self.optimizer, critic_loss, self._online_params) is None:
            return None

        pi_q1, pi_q2 = self.critic(torch.cat([obs, policy_actions], 1))
        actor_loss = (alpha * log_prob - torch.min(pi_q1, pi_q2).squeeze(1)).mean()
        actor = self._actor_params
        if optimizer_step(self, self.actor_optimizer, actor_loss, actor, inputs=actor) is None:
            return None
        return torch.stack(
            [td_loss.detach(), cql_loss.detach(), q1.detach().mean(), actor_loss.detach()]
        )

    def _sampled_actions(
        self, obs: torch.Tensor, next_obs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[3 * n * batch, dim]`` actions (uniform, policy at s, policy at s') for the
        states of ``obs`` and their ``[3 * n, batch]`` sampling log-densities."""
        n, batch = self.config.num_sampled_actions, obs.shape[0]
        uniform = torch.rand((n * batch, self.action_dim), generator=self.generator) * 2 - 1
        uniform = uniform.to(obs.device)
        uniform_density = torch.full(
            (n, batch), -self.action_dim * math.log(2.0), device=obs.device
        )
        at_obs, at_obs_density = self._policy_sample(obs.repeat(n, 1))
        at_next, at_next_density = self._policy_sample(next_obs.repeat(n, 1))
        actions = torch.cat([uniform, at_obs, at_next])
        density = torch.cat(
            [uniform_density, at_obs_density.reshape(n, batch), at_next_density.reshape(n, batch)]
        )
        return actions, density
