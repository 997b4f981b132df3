"""Preallocated on-policy rollout storage: ``[num_steps, num_envs]`` tensors, written in place."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from rlfleet.types import PolicyStep

_STEP_FIELDS = (
    "obs",
    "actions",
    "log_probs",
    "values",
    "rewards",
    "terminated",
    "truncated",
    "valid",
)
"""The ``[num_steps, num_envs, ...]`` tensors."""


class RolloutStorage:
    """One rollout of ``num_steps`` vector steps from ``num_envs`` envs.

    Every tensor is allocated once; :meth:`insert` copies into row ``t``. ``valid`` is 0 on
    the reset step next-step autoreset inserts after an episode end (its action was
    ignored by the env), and ``next_value`` holds the value of the observation after the
    last step, for bootstrapping.
    """

    def __init__(
        self,
        num_steps: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        *,
        obs_dtype: torch.dtype = torch.float32,
        action_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.num_steps = num_steps
        self.num_envs = num_envs
        shape = (num_steps, num_envs)
        self.obs = torch.zeros((*shape, *obs_shape), dtype=obs_dtype)
        self.actions = torch.zeros((*shape, *action_shape), dtype=action_dtype)
        self.log_probs = torch.zeros(shape)
        self.values = torch.zeros(shape)
        self.rewards = torch.zeros(shape)
        self.terminated = torch.zeros(shape)
        self.truncated = torch.zeros(shape)
        self.valid = torch.zeros(shape)
        self.next_value = torch.zeros(num_envs)
        self.next_obs = torch.zeros((num_envs, *obs_shape), dtype=obs_dtype)

    @classmethod
    def for_spaces(
        cls,
        num_steps: int,
        num_envs: int,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
    ) -> RolloutStorage:
        """Storage shaped for these single-env spaces: float Box actions, integer otherwise."""
        return cls(
            num_steps,
            num_envs,
            tuple(observation_space.shape or ()),
            tuple(action_space.shape or ()),
            action_dtype=torch.float32 if isinstance(action_space, spaces.Box) else torch.int64,
        )

    def copy_envs_from(self, other: RolloutStorage, start: int) -> None:
        """Copy all of ``other`` into env columns ``start : start + other.num_envs``.

        A learner batches rollout fragments from several actors side by side this way, into
        one storage allocated once.
        """
        if other.num_steps != self.num_steps or start + other.num_envs > self.num_envs:
            raise ValueError(
                f"fragment of {other.num_steps} steps x {other.num_envs} envs does not fit at "
                f"env {start} of a {self.num_steps} x {self.num_envs} storage"
            )
        end = start + other.num_envs
        for name in _STEP_FIELDS:
            getattr(self, name)[:, start:end].copy_(getattr(other, name))
        self.next_value[start:end].copy_(other.next_value)
        self.next_obs[start:end].copy_(other.next_obs)

    def insert(
        self,
        t: int,
        obs: torch.Tensor,
        step: PolicyStep,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        valid: np.ndarray,
    ) -> None:
        """Write vector step ``t``."""
        self.obs[t].copy_(obs)
        self.actions[t].copy_(step.actions.reshape(self.actions[t].shape))
        if step.log_probs is not None:
            self.log_probs[t].copy_(step.log_probs)
        if step.values is not None:
            self.values[t].copy_(step.values)
        self.rewards[t].copy_(torch.from_numpy(rewards))
        self.terminated[t].copy_(torch.from_numpy(terminated))
        self.truncated[t].copy_(torch.from_numpy(truncated))
        self.valid[t].copy_(torch.from_numpy(valid))

    def next_values(self) -> torch.Tensor:
        """``[T, N]`` values of the observation that followed each step.

        Under next-step autoreset the observation after an episode's last step is its true
        final observation, stored as the next row; so a truncated episode bootstraps from
        the value of its final state.
        """
        return torch.cat([self.values[1:], self.next_value.unsqueeze(0)], dim=0)
