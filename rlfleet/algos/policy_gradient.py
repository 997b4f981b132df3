"""Pieces the policy-gradient algorithms share; each algorithm file keeps its own loss.

- PPO, A2C, TRPO and ACER take the same spaces and normalise observations and rewards the
  same way (:func:`make_normalizers`, saved under the same checkpoint keys by
  :func:`normalizer_modules`); PPO, A2C and TRPO estimate the advantages of a rollout the
  same way (:func:`rollout_advantages`).
- IMPALA and APPO re-evaluate a batch of actor fragments with the learner's network and
  correct it for the actors' lag with V-trace (:class:`LearnerBatch`, :func:`vtrace_targets`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import torch
from gymnasium import spaces
from torch import nn

from rlfleet import functional as F
from rlfleet.data.rollout import RolloutStorage
from rlfleet.nn.actor_critic import ActorCritic
from rlfleet.nn.normalize import RewardScaler, RunningNormalizer, make_obs_normalizer
from rlfleet.nn.obs import ObsLayout

ACTION_SPACES: tuple[type[spaces.Space[Any]], ...] = (
    spaces.Discrete,
    spaces.Box,
    spaces.MultiDiscrete,
    spaces.MultiBinary,
)
"""Every action space of :class:`rlfleet.nn.action_head.ActionHead`."""
OBSERVATION_SPACES: tuple[type[spaces.Space[Any]], ...] = (
    spaces.Box,
    spaces.Discrete,
    spaces.MultiDiscrete,
    spaces.MultiBinary,
    spaces.Dict,
)
"""Every observation space of :class:`rlfleet.nn.obs.ObsLayout`."""


class NormalizationSettings(Protocol):
    """The config fields of observation and reward normalisation."""

    normalize_obs: bool
    normalize_reward: bool
    gamma: float


class AdvantageSettings(Protocol):
    """The config fields of GAE advantages."""

    gamma: float
    gae_lambda: float
    normalize_advantage: bool
    time_horizon: int | None


class VtraceSettings(Protocol):
    """The config fields of V-trace."""

    gamma: float
    rho_bar: float
    c_bar: float


def make_normalizers(
    layout: ObsLayout, config: NormalizationSettings, algo: str, device: torch.device
) -> tuple[RunningNormalizer | None, RewardScaler | None]:
    """The observation normaliser and the reward scaler the config turns on (None when off)."""
    obs_normalizer = make_obs_normalizer(layout, config.normalize_obs, algo)
    if obs_normalizer is not None:
        obs_normalizer.to(device)
    return obs_normalizer, RewardScaler(config.gamma) if config.normalize_reward else None


def normalizer_modules(
    obs_normalizer: RunningNormalizer | None, reward_scaler: RewardScaler | None
) -> dict[str, nn.Module]:
    """The normalisers that are on, under their checkpoint keys."""
    found: dict[str, nn.Module] = {}
    if obs_normalizer is not None:
        found["obs_normalizer"] = obs_normalizer
    if reward_scaler is not None:
        found["reward_scaler"] = reward_scaler
    return found


def scaled_rewards(batch: RolloutStorage, reward_scaler: RewardScaler | None) -> torch.Tensor:
    """The rollout's rewards, scaled when reward normalisation is on (the scaler's statistics
    first take in this rollout's returns)."""
    if reward_scaler is None:
        return batch.rewards
    done = torch.maximum(batch.terminated, batch.truncated)
    scaled: torch.Tensor = reward_scaler(batch.rewards, done, batch.valid, update=True)
    return scaled


def rollout_advantages(
    batch: RolloutStorage, reward_scaler: RewardScaler | None, config: AdvantageSettings
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` of a rollout by GAE (:func:`rlfleet.functional.gae`)
    on its (scaled) rewards, advantages standardised over the valid steps if asked.

    With ``time_horizon`` set, each env's steps are also cut into segments of that many
    steps (:func:`rlfleet.functional.horizon_cuts`), bootstrapped where they are cut."""
    truncated = batch.truncated
    if config.time_horizon is not None:
        cuts = F.horizon_cuts(batch.terminated, truncated, batch.valid, config.time_horizon)
        truncated = torch.maximum(truncated, cuts)
    advantages, returns = F.gae(
        scaled_rewards(batch, reward_scaler),
        batch.values,
        batch.next_values(),
        batch.terminated,
        truncated,
        config.gamma,
        config.gae_lambda,
    )
    if config.normalize_advantage:
        advantages = F.standardize(advantages, batch.valid)
    return advantages, returns


class LearnerBatch(NamedTuple):
    """A ``[num_steps, envs]`` batch of actor fragments on the learner's device."""

    obs: torch.Tensor
    actions: torch.Tensor
    next_obs: torch.Tensor
    behaviour_log_probs: torch.Tensor
    """Log-probabilities of the actions under the actors' (lagging) copies of the policy."""
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    valid: torch.Tensor

    @classmethod
    def of(cls, batch: RolloutStorage, device: torch.device) -> LearnerBatch:
        """The batch's tensors, moved to ``device`` once."""
        return cls(
            batch.obs.to(device),
            batch.actions.to(device),
            batch.next_obs.to(device),
            batch.log_probs.to(device),
            batch.rewards.to(device),
            batch.terminated.to(device),
            batch.truncated.to(device),
            batch.valid.to(device),
        )


def vtrace_targets(
    net: ActorCritic, batch: LearnerBatch, config: VtraceSettings
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Evaluate the fragments with the learner's network, then V-trace
    (:func:`rlfleet.functional.vtrace`) from that evaluation.

    Returns ``[num_steps, envs]`` log-probabilities, entropies and values (with gradients
    when called with them), value targets ``v_s`` and advantages (without).
    """
    log_probs, entropy, values, next_values = net.evaluate_rollout(
        batch.obs, batch.actions, batch.next_obs
    )
    with torch.no_grad():
        vs, advantages = F.vtrace(
            batch.behaviour_log_probs,
            log_probs.detach(),
            batch.rewards,
            values.detach(),
            next_values.detach(),
            batch.terminated,
            batch.truncated,
            config.gamma,
            config.rho_bar,
            config.c_bar,
        )
    return log_probs, entropy, values, vs, advantages
