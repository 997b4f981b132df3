"""Preallocated on-policy rollout storage: ``[num_steps, num_envs]`` tensors, written in place."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from rlfleet.types import PolicyStep

_FIELDS = ("obs", "actions", "log_probs", "values", "rewards", "terminated", "truncated", "valid")


class RolloutStorage:
    """One rollout of ``num_steps`` vector steps from ``num_envs`` envs.

    Tensors are allocated once, for ``capacity`` steps; :meth:`insert` copies into row
    ``t``. The public fields (``obs``, ``actions``, ``rewards``, ...) are views of the
    first ``num_steps`` rows. A rollout collected until a number of episodes has finished
    can outgrow the capacity: :meth:`insert` then doubles it, so growth is rare and
    amortised. ``valid`` is 0 on the reset step next-step autoreset inserts after an
    episode end (its action was ignored by the env), and ``next_value`` holds the value of
    the observation after the last step, for bootstrapping.
    """

    obs: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    valid: torch.Tensor

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
        self.num_envs = num_envs
        self._shapes = {
            "obs": (obs_shape, obs_dtype),
            "actions": (action_shape, action_dtype),
            **{name: ((), torch.float32) for name in _FIELDS[2:]},
        }
        self._buffers: dict[str, torch.Tensor] = {}
        self._allocate(num_steps)
        self.next_value = torch.zeros(num_envs)
        self.next_obs = torch.zeros((num_envs, *obs_shape), dtype=obs_dtype)
        self.set_length(num_steps)

    @property
    def capacity(self) -> int:
        return int(self._buffers["obs"].shape[0])

    def _allocate(self, capacity: int) -> None:
        old = self._buffers
        self._buffers = {
            name: torch.zeros((capacity, self.num_envs, *shape), dtype=dtype)
            for name, (shape, dtype) in self._shapes.items()
        }
        for name, tensor in old.items():
            self._buffers[name][: tensor.shape[0]].copy_(tensor)
        # numpy views of the same memory: env outputs are numpy, and a numpy row assignment
        # costs a fraction of a torch copy_ for these small per-step writes.
        self._numpy = {
            name: self._buffers[name].numpy()
            for name in ("rewards", "terminated", "truncated", "valid")
        }

    def set_length(self, num_steps: int) -> None:
        """Make the public fields views of the first ``num_steps`` rows."""
        self.num_steps = num_steps
        for name in _FIELDS:
            setattr(self, name, self._buffers[name][:num_steps])

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
        for name in _FIELDS:
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
        """Write vector step ``t`` (doubling the capacity if ``t`` is past it)."""
        if t >= self.capacity:
            self._allocate(2 * self.capacity)
        buffers = self._buffers
        buffers["obs"][t].copy_(obs)
        buffers["actions"][t].copy_(step.actions.reshape(buffers["actions"][t].shape))
        if step.log_probs is not None:
            buffers["log_probs"][t].copy_(step.log_probs)
        if step.values is not None:
            buffers["values"][t].copy_(step.values)
        self._numpy["rewards"][t] = rewards
        self._numpy["terminated"][t] = terminated
        self._numpy["truncated"][t] = truncated
        self._numpy["valid"][t] = valid

    def next_values(self) -> torch.Tensor:
        """``[T, N]`` values of the observation that followed each step.

        Under next-step autoreset the observation after an episode's last step is its true
        final observation, stored as the next row; so a truncated episode bootstraps from
        the value of its final state.
        """
        return torch.cat([self.values[1:], self.next_value.unsqueeze(0)], dim=0)
