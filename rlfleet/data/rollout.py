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
    the observation after the last step, for bootstrapping (``next_obs`` and ``next_mask``
    hold that observation and its mask, for algorithms that recompute it).

    Observations are stored in the dtype the algorithm keeps them in (uint8 for images).
    Two optional fields:

    ``masks``
        ``[T, N, mask_size]`` bool action masks; allocated the first time a step brings a
        mask (the env decides, not the config), None until then.
    ``states``
        ``[T, N, *state_shape]`` recurrent state each step was acted on with (after the
        reset at an episode start), when ``state_shape`` is given.
    """

    obs: torch.Tensor
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    valid: torch.Tensor
    masks: torch.Tensor | None
    states: torch.Tensor | None

    def __init__(
        self,
        num_steps: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        *,
        obs_dtype: torch.dtype = torch.float32,
        action_dtype: torch.dtype = torch.float32,
        state_shape: tuple[int, ...] | None = None,
    ) -> None:
        self.num_envs = num_envs
        self._shapes = {
            "obs": (obs_shape, obs_dtype),
            "actions": (action_shape, action_dtype),
            **{name: ((), torch.float32) for name in _FIELDS[2:]},
        }
        if state_shape is not None:
            self._shapes["states"] = (state_shape, torch.float32)
        self._buffers: dict[str, torch.Tensor] = {}
        self._allocate(num_steps)
        self.next_value = torch.zeros(num_envs)
        self.next_obs = torch.zeros((num_envs, *obs_shape), dtype=obs_dtype)
        self.next_mask: torch.Tensor | None = None
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
        for name in (*_FIELDS, "masks", "states"):
            buffer = self._buffers.get(name)
            setattr(self, name, None if buffer is None else buffer[:num_steps])

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
        one storage allocated once. Recurrent states are copied when both storages keep them.
        """
        if other.num_steps != self.num_steps or start + other.num_envs > self.num_envs:
            raise ValueError(
                f"fragment of {other.num_steps} steps x {other.num_envs} envs does not fit at "
                f"env {start} of a {self.num_steps} x {self.num_envs} storage"
            )
        end = start + other.num_envs
        for name in _FIELDS:
            getattr(self, name)[:, start:end].copy_(getattr(other, name))
        if self.states is not None and other.states is not None:
            self.states[:, start:end].copy_(other.states)
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
        *,
        mask: torch.Tensor | None = None,
        state: torch.Tensor | None = None,
    ) -> None:
        """Write vector step ``t`` (doubling the capacity if ``t`` is past it)."""
        if mask is not None and "masks" not in self._buffers:
            self._shapes["masks"] = (tuple(mask.shape[1:]), torch.bool)
            self._buffers["masks"] = torch.ones(
                (self.capacity, self.num_envs, *mask.shape[1:]), dtype=torch.bool
            )
            self.next_mask = torch.ones(mask.shape, dtype=torch.bool)
        if t >= self.capacity:
            self._allocate(2 * self.capacity)
        buffers = self._buffers
        buffers["obs"][t].copy_(obs)
        buffers["actions"][t].copy_(step.actions.reshape(buffers["actions"][t].shape))
        if step.log_probs is not None:
            buffers["log_probs"][t].copy_(step.log_probs)
        if step.values is not None:
            buffers["values"][t].copy_(step.values)
        if mask is not None:
            buffers["masks"][t].copy_(mask)
        if state is not None:
            buffers["states"][t].copy_(state)
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

    def episode_starts(self) -> torch.Tensor:
        """``[T, N]``: 1 where step ``t`` begins an episode (the step after a reset step),
        which is where a recurrent policy's state was reset."""
        starts = torch.zeros_like(self.valid)
        starts[1:] = 1.0 - self.valid[:-1]
        return starts
