"""Proximal Policy Optimization (Schulman et al. 2017, arXiv:1707.06347).

The clipped-surrogate variant with the details of the reference implementation
(Huang et al. 2022, "The 37 Implementation Details of PPO"): separate actor and critic
MLPs with orthogonal init, advantage normalisation, optional value clipping, entropy
bonus, global gradient clipping, linear learning-rate and clip-range schedules, and an
optional early stop of the epochs on an approximate-KL target.

Deviations from the reference:

- advantages are normalised once over the whole rollout rather than per minibatch
  (identical when one minibatch covers the rollout, less noisy otherwise);
- losses are means weighted by the ``valid`` mask, so the reset steps that next-step
  autoreset inserts after an episode end carry no gradient;
- actor and critic are evaluated as one batched matmul (:class:`rlfleet.nn.twin.TwinMLP`)
  and Adam is the fused kernel: the same maths with far fewer kernel launches;
- when one minibatch covers the whole rollout it is not shuffled (the loss is a mean,
  so the order cannot matter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from gymnasium import spaces
from torch import nn

from rlfleet.algos import functional as F
from rlfleet.algos.base import Algorithm
from rlfleet.algos.registry import register
from rlfleet.config.fields import NonNegativeFloat, PositiveFloat, PositiveInt, UnitFloat
from rlfleet.data.rollout import RolloutStorage
from rlfleet.nn import distributions as D
from rlfleet.nn.mlp import Activation, flat_size, flatten_obs
from rlfleet.nn.normalize import RunningNormalizer
from rlfleet.nn.twin import TwinMLP
from rlfleet.train.schedules import ScheduleKind, scheduled
from rlfleet.types import PolicyStep


@dataclass
class PPOConfig:
    """PPO hyperparameters (names follow Stable-Baselines3 / CleanRL where they exist)."""

    learning_rate: PositiveFloat = 3e-4
    """Adam step size (the initial value when ``lr_schedule`` is linear)."""
    lr_schedule: ScheduleKind = "constant"
    """``constant`` or ``linear`` decay to 0 over the training budget."""
    num_steps: PositiveInt = 128
    """Steps collected per env per rollout (rollout size = num_steps * num_envs)."""
    batch_size: PositiveInt = 256
    """Minibatch size for each gradient step."""
    num_epochs: PositiveInt = 10
    """Passes over the rollout per update."""
    gamma: UnitFloat = 0.99
    """Discount factor."""
    gae_lambda: UnitFloat = 0.95
    """GAE bias/variance trade-off."""
    clip_range: PositiveFloat = 0.2
    """Clipping of the probability ratio (initial value when ``clip_range_schedule`` is linear)."""
    clip_range_schedule: ScheduleKind = "constant"
    """``constant`` or ``linear`` decay of the clip range."""
    clip_range_vf: PositiveFloat | None = None
    """If set, clip value predictions to within this distance of the old values."""
    ent_coef: NonNegativeFloat = 0.0
    """Weight of the entropy bonus."""
    vf_coef: NonNegativeFloat = 0.5
    """Weight of the value loss."""
    max_grad_norm: PositiveFloat = 0.5
    """Global gradient-norm clip."""
    normalize_advantage: bool = True
    """Standardise advantages over the rollout."""
    target_kl: PositiveFloat | None = None
    """Stop the epochs early once approximate KL exceeds 1.5 x this."""
    normalize_obs: bool = False
    """Normalise observations with running statistics (saved with the model)."""
    hidden_sizes: tuple[PositiveInt, ...] = (64, 64)
    """Hidden layer widths of the actor and of the critic."""
    activation: Activation = "tanh"
    """Hidden-layer activation."""
    log_std_init: float = 0.0
    """Initial log standard deviation of the Gaussian policy (Box actions)."""
    adam_eps: PositiveFloat = 1e-5
    """Adam epsilon."""


class _ActorCritic(nn.Module):
    def __init__(self, obs_dim: int, action_dim: int, continuous: bool, cfg: PPOConfig) -> None:
        super().__init__()
        self.twin = TwinMLP(obs_dim, cfg.hidden_sizes, (action_dim, 1), cfg.activation)
        self.log_std = (
            nn.Parameter(torch.full((action_dim,), cfg.log_std_init)) if continuous else None
        )


@dataclass(frozen=True)
class _Minibatch:
    """A minibatch; ``weights`` = valid mask / its sum, so a masked mean is one ``dot``."""

    obs: torch.Tensor
    actions: torch.Tensor
    old_log_probs: torch.Tensor
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    weights: torch.Tensor

    @staticmethod
    def take(idx: torch.Tensor | None, *tensors: torch.Tensor) -> _Minibatch:
        """Rows ``idx`` (all rows if None) of obs, actions, old log-probs, old values,
        advantages, returns and the valid mask, in that order."""
        obs, actions, log_probs, values, advantages, returns, mask = (
            tensors if idx is None else tuple(t[idx] for t in tensors)
        )
        weights = mask / mask.sum().clamp(min=1.0)
        return _Minibatch(obs, actions, log_probs, values, advantages, returns, weights)


@register
class PPO(Algorithm[PPOConfig]):
    """Clipped-surrogate PPO for Discrete and Box actions."""

    name = "ppo"
    kind = "on_policy"
    config_class = PPOConfig
    action_spaces = (spaces.Discrete, spaces.Box)

    def __init__(
        self,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        config: PPOConfig | None = None,
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__(
            observation_space, action_space, config or PPOConfig(), seed=seed, device=device
        )
        self.continuous = isinstance(action_space, spaces.Box)
        self.obs_shape: tuple[int, ...] = tuple(observation_space.shape or ())
        self.action_shape: tuple[int, ...] = (
            tuple(action_space.shape or ()) if self.continuous else ()
        )
        self.build_networks()

    def _build(self) -> None:
        cfg = self.config
        action_dim = (
            flat_size(self.action_shape) if self.continuous else int(self.action_space.n)  # type: ignore[attr-defined]
        )
        self.net = _ActorCritic(flat_size(self.obs_shape), action_dim, self.continuous, cfg).to(
            self.device
        )
        self.obs_normalizer = (
            RunningNormalizer(self.obs_shape).to(self.device) if cfg.normalize_obs else None
        )
        fused = self.device.type in ("cpu", "cuda")
        self.optimizer = torch.optim.Adam(
            self.net.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps, fused=fused
        )

    def modules(self) -> dict[str, nn.Module]:
        found: dict[str, nn.Module] = {"net": self.net}
        if self.obs_normalizer is not None:
            found["obs_normalizer"] = self.obs_normalizer
        return found

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer}

    # ----------------------------------------------------------------- acting
    def preprocess(self, obs: torch.Tensor, *, update_stats: bool = False) -> torch.Tensor:
        obs = obs.to(self.device, torch.float32)
        if self.obs_normalizer is None:
            return obs
        if update_stats:
            self.obs_normalizer.update(obs)
        normalized: torch.Tensor = self.obs_normalizer(obs)
        return normalized

    @torch.inference_mode()
    def act(self, obs: torch.Tensor, *, deterministic: bool = False) -> PolicyStep:
        out, values = self.net.twin(flatten_obs(obs, len(self.obs_shape)))
        values = values.squeeze(-1)
        if self.net.log_std is None:
            actions, log_probs = (
                D.categorical_greedy(out)
                if deterministic
                else D.categorical_sample(out, self.generator)
            )
        else:
            actions = (
                out if deterministic else D.gaussian_sample(out, self.net.log_std, self.generator)
            )
            log_probs, _ = D.gaussian_log_prob_entropy(out, self.net.log_std, actions)
            actions = actions.reshape(*actions.shape[:-1], *self.action_shape)
        return PolicyStep(actions=actions, log_probs=log_probs, values=values)

    @torch.inference_mode()
    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values of a batch of preprocessed observations."""
        values: torch.Tensor = self.net.twin(flatten_obs(obs, len(self.obs_shape)))[1]
        return values.squeeze(-1)

    # --------------------------------------------------------------- training
    def _evaluate(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, values = self.net.twin(flatten_obs(obs, len(self.obs_shape)))
        values = values.squeeze(-1)
        if self.net.log_std is None:
            log_probs, entropy = D.categorical_log_prob_entropy(out, actions)
        else:
            flat_actions = actions.reshape(actions.shape[0], -1)
            log_probs, entropy = D.gaussian_log_prob_entropy(out, self.net.log_std, flat_actions)
        return log_probs, entropy, values

    def _gradient_step(
        self, mb: _Minibatch, clip: float, params: list[torch.Tensor], track: bool
    ) -> torch.Tensor | None:
        """One clipped-surrogate gradient step; returns [policy, value, entropy, approx_kl,
        clip_fraction] when ``track``."""
        cfg = self.config
        log_probs, entropy, values = self._evaluate(mb.obs, mb.actions)
        log_ratio = log_probs - mb.old_log_probs
        ratio = log_ratio.exp()
        surrogate = torch.min(
            mb.advantages * ratio, mb.advantages * ratio.clamp(1.0 - clip, 1.0 + clip)
        )
        policy_loss = -torch.dot(surrogate, mb.weights)
        if cfg.clip_range_vf is not None:
            clipped = mb.old_values + (values - mb.old_values).clamp(
                -cfg.clip_range_vf, cfg.clip_range_vf
            )
            value_err = torch.max((values - mb.returns).pow(2), (clipped - mb.returns).pow(2))
        else:
            value_err = (values - mb.returns).pow(2)
        value_loss = torch.dot(value_err, mb.weights)
        loss = policy_loss + cfg.vf_coef * value_loss
        if cfg.ent_coef:
            loss = loss - cfg.ent_coef * torch.dot(entropy, mb.weights)

        for p in params:  # cheaper than optimizer.zero_grad() for a handful of tensors
            p.grad = None
        loss.backward()
        grad_norm = F.clip_grad_norm(params, cfg.max_grad_norm)
        if not self.gradients_are_finite(loss, grad_norm):
            return None
        self.optimizer.step()
        self.gradient_steps += 1
        if not track:
            return None
        with torch.no_grad():
            # http://joschu.net/blog/kl-approx.html: unbiased, low-variance estimator.
            approx_kl = torch.dot((ratio - 1.0) - log_ratio, mb.weights)
            clip_fraction = torch.dot(((ratio - 1.0).abs() > clip).float(), mb.weights)
            return torch.stack(
                [
                    policy_loss.detach(),
                    value_loss.detach(),
                    torch.dot(entropy.detach(), mb.weights),
                    approx_kl,
                    clip_fraction,
                ]
            )

    def update(
        self,
        batch: RolloutStorage,
        *,
        batch_size: int | None = None,
        num_repetitions: int | None = None,
    ) -> dict[str, float]:
        """Advantages by GAE, then ``num_repetitions`` epochs of minibatch gradient steps.

        Logged losses and statistics are means over the last epoch run.
        """
        cfg = self.config
        batch_size = batch_size or cfg.batch_size
        num_repetitions = num_repetitions or cfg.num_epochs
        advantages, returns = F.gae(
            batch.rewards,
            batch.values,
            batch.next_values(),
            batch.terminated,
            batch.truncated,
            cfg.gamma,
            cfg.gae_lambda,
        )
        n = batch.num_steps * batch.num_envs
        obs = batch.obs.reshape(n, *batch.obs.shape[2:])
        actions = batch.actions.reshape(n, *batch.actions.shape[2:])
        old_log_probs = batch.log_probs.reshape(n)
        old_values = batch.values.reshape(n)
        weights = batch.valid.reshape(n)
        advantages = advantages.reshape(n)
        returns = returns.reshape(n)
        if cfg.normalize_advantage:
            mean = F.weighted_mean(advantages, weights)
            std = F.weighted_mean((advantages - mean).pow(2), weights).sqrt()
            advantages = (advantages - mean) / (std + 1e-8)

        lr = scheduled(cfg.learning_rate, cfg.lr_schedule, self.progress) * self.lr_scale
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        clip = scheduled(cfg.clip_range, cfg.clip_range_schedule, self.progress)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]

        stats = torch.zeros(5)  # policy, value, entropy, approx_kl, clip_fraction
        num_minibatches = 0
        for epoch in range(num_repetitions):
            order = torch.randperm(n, generator=self.generator) if batch_size < n else None
            # Statistics cost a few ops per minibatch: gather them for the last epoch only
            # (what is logged), or for every epoch when target_kl needs the KL to stop early.
            track = cfg.target_kl is not None or epoch == num_repetitions - 1
            epoch_stats = torch.zeros(5)
            epoch_tracked = 0
            for start in range(0, n, batch_size):
                idx = None if order is None else order[start : start + batch_size]
                mb = _Minibatch.take(
                    idx, obs, actions, old_log_probs, old_values, advantages, returns, weights
                )
                step_stats = self._gradient_step(mb, clip, params, track)
                num_minibatches += 1
                if step_stats is not None:
                    epoch_stats += step_stats
                    epoch_tracked += 1
            if track and epoch_tracked:
                stats = epoch_stats / epoch_tracked
            if cfg.target_kl is not None and float(stats[3]) > 1.5 * cfg.target_kl:
                break

        means = stats.tolist()
        return {
            "loss/policy": means[0],
            "loss/value": means[1],
            "loss/entropy": means[2],
            "train/approx_kl": means[3],
            "train/clip_fraction": means[4],
            "train/explained_variance": F.explained_variance(old_values, returns),
            "train/learning_rate": lr,
            "train/clip_range": clip,
            "train/gradient_steps_per_update": float(num_minibatches),
        }
