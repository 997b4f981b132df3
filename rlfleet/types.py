"""Small typed records passed between collectors, algorithms and trainers.

They are plain dataclasses of tensors or arrays with fixed fields, not a dict of anything,
so every consumer knows exactly what it receives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import torch

ObsT = TypeVar("ObsT", torch.Tensor, dict[str, torch.Tensor])


@dataclass(frozen=True)
class PolicyStep:
    """What a policy returns for a batch of observations (one row per env)."""

    actions: torch.Tensor
    """Actions in the policy's own representation (unclipped for Box spaces)."""
    log_probs: torch.Tensor | None = None
    """Log-probability of each action under the policy that chose it."""
    values: torch.Tensor | None = None
    """State-value estimate of each observation, when the algorithm has a critic."""
    state: torch.Tensor | None = None
    """A recurrent policy's state after this step (the input of the next one)."""


@dataclass(frozen=True)
class RolloutBatch:
    """A flat batch of on-policy samples, ready for minibatching.

    ``weights`` is 1 for real transitions and 0 for the reset step that next-step
    autoreset inserts after each episode end; losses are weighted means over it.
    """

    obs: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    weights: torch.Tensor

    def __len__(self) -> int:
        return int(self.obs.shape[0])

    def index(self, idx: torch.Tensor) -> RolloutBatch:
        """The samples at positions ``idx``."""
        return RolloutBatch(
            obs=self.obs[idx],
            actions=self.actions[idx],
            log_probs=self.log_probs[idx],
            values=self.values[idx],
            advantages=self.advantages[idx],
            returns=self.returns[idx],
            weights=self.weights[idx],
        )


@dataclass(frozen=True)
class ReplayBatch(Generic[ObsT]):
    """A batch of (n-step) transitions sampled from a replay buffer.

    The target of a transition is ``rewards + discounts * V(next_obs)``: ``rewards`` is the
    discounted sum of up to ``n_step`` rewards and ``discounts`` is ``gamma ** m`` for the
    ``m`` steps summed, or 0 when the episode terminated within them (a truncated episode
    keeps its discount and bootstraps from its true final observation).

    Observations are raw (the buffer's dtype, e.g. uint8 images); tensors are views of the
    buffer's preallocated sample arrays, valid until the next ``sample`` call.
    """

    obs: ObsT
    actions: torch.Tensor
    rewards: torch.Tensor
    next_obs: ObsT
    discounts: torch.Tensor
    weights: torch.Tensor
    """Importance-sampling weights (all 1 for uniform sampling)."""
    indices: np.ndarray
    """Flat buffer slots of the sampled transitions, for priority updates."""
    action_masks: torch.Tensor | None = None
    """Bool ``[batch, mask_size]`` legal actions at ``obs`` (None: the buffer holds no masks)."""
    next_action_masks: torch.Tensor | None = None
    """Bool ``[batch, mask_size]`` legal actions at ``next_obs``, the state the target
    bootstraps from (after ``n_step`` steps); may have no legal entry where the episode
    terminated, whose discount is 0."""

    def to(self, device: torch.device) -> ReplayBatch[ObsT]:
        """The batch with every tensor on ``device`` (itself when they already are there,
        as a CPU batch for a CPU network is)."""
        if self.rewards.device == device:
            return self

        def move(x: Any) -> Any:
            if isinstance(x, dict):
                return {k: move(v) for k, v in x.items()}
            return None if x is None else x.to(device, non_blocking=True)

        return ReplayBatch(
            obs=move(self.obs),
            actions=move(self.actions),
            rewards=move(self.rewards),
            next_obs=move(self.next_obs),
            discounts=move(self.discounts),
            weights=move(self.weights),
            indices=self.indices,
            action_masks=move(self.action_masks),
            next_action_masks=move(self.next_action_masks),
        )


@dataclass
class CollectStats:
    """What one collection step produced."""

    env_steps: int = 0
    """Environment steps taken (all sub-envs counted, reset steps included)."""
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)

    @property
    def episodes(self) -> int:
        return len(self.episode_returns)


@dataclass(frozen=True)
class EvalStats:
    """Returns and lengths of test episodes."""

    returns: np.ndarray
    lengths: np.ndarray

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns)) if self.returns.size else float("nan")

    @property
    def std(self) -> float:
        return float(np.std(self.returns)) if self.returns.size else float("nan")


@dataclass(frozen=True)
class Minibatch:
    """A minibatch; ``weights`` = valid mask / its sum, so a masked mean is one ``dot``.

    Feed-forward: ``obs`` is ``[batch, ...]``. Recurrent: ``obs`` is ``[L, sequences, ...]``,
    ``states`` the stored state at each sequence's first step and ``starts`` ``[L,
    sequences]``; every other field is flattened to ``[L * sequences]`` in the same order.
    """

    obs: torch.Tensor
    actions: torch.Tensor
    old_log_probs: torch.Tensor
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    weights: torch.Tensor
    masks: torch.Tensor | None
    states: torch.Tensor | None = None
    starts: torch.Tensor | None = None
