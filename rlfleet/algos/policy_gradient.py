"""Pieces the policy-gradient algorithms share; each algorithm file keeps its own loss.

- PPO, A2C, TRPO and ACER take the same spaces and normalise observations and rewards the
  same way (:func:`make_normalizers`, saved under the same checkpoint keys by
  :func:`normalizer_modules`); PPO, A2C and TRPO estimate the advantages of a rollout the
  same way (:func:`rollout_advantages`), and explore with gSDE the same way
  (:func:`check_sde`, :func:`make_exploration`).
- IMPALA and APPO re-evaluate a batch of actor fragments with the learner's network and
  correct it for the actors' lag with V-trace (:class:`LearnerBatch`, :func:`vtrace_targets`);
  a recurrent network is unrolled from the states the actors stored
  (:func:`recurrent_rollout`). Their observation statistics belong to the learner
  (:class:`LearnerObsStats`): fragments carry raw observations, the learner folds each batch
  into the statistics before it learns on it, and actors normalise with the copy that travels
  with the weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import torch
from gymnasium import spaces
from torch import nn

from rlfleet import functional as F
from rlfleet.data.rollout import RolloutStorage
from rlfleet.errors import ConfigError
from rlfleet.nn.actor_critic import ActorCritic
from rlfleet.nn.normalize import (
    RewardScaler,
    RunningNormalizer,
    make_obs_normalizer,
    obs_normalizer_modules,
)
from rlfleet.nn.obs import ObsLayout
from rlfleet.nn.sde import StateDependentNoise
from rlfleet.seeding import stream_seed

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
    """The config fields of V-trace (and of the recurrent unroll that precedes it)."""

    gamma: float
    rho_bar: float
    c_bar: float
    vtrace_lambda: float
    sequence_length: int | None


def make_normalizers(
    layout: ObsLayout, config: NormalizationSettings, algo: str, device: torch.device
) -> tuple[RunningNormalizer | None, RewardScaler | None]:
    """The observation normaliser and the reward scaler the config turns on (None when off)."""
    obs_normalizer = make_obs_normalizer(layout, config.normalize_obs, algo)
    if obs_normalizer is not None:
        obs_normalizer.to(device)
    return obs_normalizer, RewardScaler(config.gamma) if config.normalize_reward else None


class SdeSettings(Protocol):
    """The config fields of gSDE exploration (:mod:`rlfleet.nn.sde`)."""

    use_sde: bool
    sde_sample_freq: int
    num_steps: int
    action_noise_color: float


def check_sde(config: SdeSettings, algo: str, action_space: spaces.Space[Any]) -> None:
    """ConfigError unless the gSDE settings fit each other and the action space."""
    if not config.use_sde:
        return
    if not isinstance(action_space, spaces.Box):
        raise ConfigError(
            f"{algo}: use_sde explores Box actions with state-dependent noise; got action space "
            f"{type(action_space).__name__} (use use_sde: false)"
        )
    if config.action_noise_color:
        raise ConfigError(
            f"{algo}: use_sde and action_noise_color are two kinds of exploration noise; got "
            f"both (action_noise_color {config.action_noise_color:g}): set one of them"
        )
    if config.sde_sample_freq == 0 or config.sde_sample_freq < -1:
        raise ConfigError(
            f"{algo}: sde_sample_freq is a positive number of steps, or -1 for once per "
            f"rollout; got {config.sde_sample_freq}"
        )


def make_exploration(
    config: SdeSettings, latent_dim: int, action_dim: int, seed: int
) -> StateDependentNoise | None:
    """The gSDE exploration matrices of a policy whose last hidden features are
    ``latent_dim`` wide (None when ``use_sde`` is off), redrawn every ``sde_sample_freq``
    steps, or once per rollout of ``num_steps``."""
    if not config.use_sde:
        return None
    period = config.sde_sample_freq if config.sde_sample_freq > 0 else config.num_steps
    return StateDependentNoise(latent_dim, action_dim, stream_seed(seed, "exploration"), period)


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


class RecurrentSettings(Protocol):
    """The config fields of a recurrent actor-learner policy."""

    num_steps: int
    sequence_length: int | None


def check_sequence_length(algo: str, config: RecurrentSettings) -> None:
    """ConfigError unless ``sequence_length`` divides ``num_steps``."""
    if config.sequence_length is not None and config.num_steps % config.sequence_length:
        raise ConfigError(
            f"{algo}: sequence_length ({config.sequence_length}) must divide num_steps "
            f"({config.num_steps})"
        )


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
    states: torch.Tensor | None = None
    """``[num_steps, envs, *state_shape]``: a recurrent policy's state at each step, as the
    actor acted on it (None: a feed-forward policy)."""
    starts: torch.Tensor | None = None
    """``[num_steps, envs]``: 1 where a step begins an episode (recurrent policies only)."""

    @classmethod
    def of(
        cls,
        batch: RolloutStorage,
        device: torch.device,
        obs_normalizer: RunningNormalizer | None = None,
    ) -> LearnerBatch:
        """The batch's tensors, moved to ``device`` once, observations normalised with
        ``obs_normalizer`` when given."""
        obs, next_obs = batch.obs.to(device), batch.next_obs.to(device)
        if obs_normalizer is not None:
            obs, next_obs = obs_normalizer(obs), obs_normalizer(next_obs)
        states = starts = None
        if batch.states is not None:
            states, starts = batch.states.to(device), batch.episode_starts().to(device)
        return cls(
            obs,
            batch.actions.to(device),
            next_obs,
            batch.log_probs.to(device),
            batch.rewards.to(device),
            batch.terminated.to(device),
            batch.truncated.to(device),
            batch.valid.to(device),
            states,
            starts,
        )


class LearnerObsStats:
    """Running observation statistics that an actor-learner algorithm's learner owns.

    IMPALA and APPO hold one as ``obs_stats`` and keep its :attr:`normalizer` out of
    ``Algorithm.obs_normalizer``: ``preprocess`` then leaves observations raw, fragments carry
    them raw, and ``act`` normalises with the statistics as they are (:meth:`normalized`)
    without changing them. Only the learner's :meth:`fold` changes them, with the observations
    of the batch it is about to learn on. The normaliser is among the algorithm's modules as
    ``obs_normalizer``, so the statistics travel with the weights to the actors and into
    checkpoints and saved policies.
    """

    def __init__(self, normalizer: RunningNormalizer | None) -> None:
        self.normalizer = normalizer
        """The statistics (None: ``normalize_obs`` is off and observations stay raw)."""
        self.gather: Callable[[torch.Tensor], torch.Tensor] | None = None
        """Set by a group of learners: gathers every learner's observations, so that each
        folds the whole group's batch and their statistics stay equal."""

    def modules(self) -> dict[str, nn.Module]:
        """The algorithm's ``modules()`` entry for the statistics (none when off)."""
        return obs_normalizer_modules(self.normalizer)

    def normalized(self, obs: torch.Tensor) -> torch.Tensor:
        """``obs`` normalised with the statistics as they are (unchanged when off)."""
        if self.normalizer is None:
            return obs
        out: torch.Tensor = self.normalizer(obs)
        return out

    def fold(self, batch: RolloutStorage) -> None:
        """Fold the batch's observations (every stored step) into the statistics."""
        stats = self.normalizer
        if stats is None:
            return
        obs = batch.obs.reshape(-1, *stats.mean.shape).to(stats.mean.device)
        if self.gather is not None:
            obs = self.gather(obs)
        stats.update(obs)


def recurrent_rollout(
    net: ActorCritic, batch: LearnerBatch, sequence_length: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:meth:`ActorCritic.evaluate_rollout` for a recurrent network.

    The ``[T, N]`` batch is cut into ``T / L`` sequences per env (``L`` =
    ``sequence_length``, the whole fragment when None), each unrolled from the state the actor
    stored at its first step, with the state zeroed where an episode starts, as the actor
    did. Each sequence runs one step further, into the next sequence's first observation (the
    observation after the fragment, for the last one), whose value the last one keeps.
    """
    assert batch.states is not None
    assert batch.starts is not None
    steps, envs = batch.obs.shape[:2]
    length = sequence_length or steps
    chunks = steps // length
    obs = torch.cat([batch.obs, batch.next_obs.unsqueeze(0)])
    starts = torch.cat([batch.starts, (1.0 - batch.valid[-1]).unsqueeze(0)])
    # rows [k * L, (k + 1) * L] of chunk k: [L + 1, chunks]
    rows = (torch.arange(chunks) * length).unsqueeze(0) + torch.arange(length + 1).unsqueeze(1)
    rows = rows.to(obs.device)
    seq_obs = obs[rows].reshape(length + 1, chunks * envs, *obs.shape[2:])
    seq_starts = starts[rows].reshape(length + 1, chunks * envs)
    first = batch.states[::length].reshape(chunks * envs, *batch.states.shape[2:])
    # The actor-learner algorithms' policies have no gSDE: the log std is the parameter.
    out, values, _ = net.sequence(seq_obs, first, seq_starts)
    # [L + 1, chunks, N] -> drop the look-ahead row -> [chunks, L, N] -> [T, N]
    out = out.reshape(length + 1, chunks, envs, -1)
    all_values = values.reshape(length + 1, chunks, envs)
    step_out = out[:length].transpose(0, 1).reshape(steps * envs, -1)
    step_values = all_values[:length].transpose(0, 1).reshape(steps, envs)
    next_values = torch.cat([step_values[1:], all_values[length, chunks - 1].unsqueeze(0)])
    actions = batch.actions.reshape(steps * envs, *batch.actions.shape[2:])
    log_probs, entropy = net.head.log_prob_entropy(step_out, actions, log_std=net.log_std)
    return (
        log_probs.reshape(steps, envs),
        entropy.reshape(steps, envs),
        step_values,
        next_values,
    )


def vtrace_targets(
    net: ActorCritic, batch: LearnerBatch, config: VtraceSettings
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Evaluate the fragments with the learner's network (unrolled from the actors' states
    when it is recurrent, see :func:`recurrent_rollout`), then V-trace
    (:func:`rlfleet.functional.vtrace`) from that evaluation.

    Returns ``[num_steps, envs]`` log-probabilities, entropies and values (with gradients
    when called with them), value targets ``v_s`` and advantages (without).
    """
    if batch.states is None:
        log_probs, entropy, values, next_values = net.evaluate_rollout(
            batch.obs, batch.actions, batch.next_obs
        )
    else:
        log_probs, entropy, values, next_values = recurrent_rollout(
            net, batch, config.sequence_length
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
            config.vtrace_lambda,
        )
    return log_probs, entropy, values, vs, advantages
