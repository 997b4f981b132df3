"""Replay buffers for off-policy learning: storage x sampler x writer, after TorchRL.

:class:`ReplayBuffer` composes the three parts:

- storage, :class:`~rlfleet.data.storage.TransitionStorage`: preallocated ``[rows, num_envs]``
  arrays and their ``.npz`` file format (no pickle);
- sampler, :mod:`rlfleet.data.samplers`: :class:`~rlfleet.data.samplers.UniformSampler` or
  :class:`~rlfleet.data.samplers.PrioritizedSampler` picks the slots of a batch, whose n-step
  returns are computed at sampling time, so one buffer serves any ``n_step``;
- writer: the buffer itself, a circular cursor that writes one vector step per row,
  overwrites the oldest row when full, and tells the sampler which slots became (or stopped
  being) complete transitions.

Next observations. The next observation of a transition is the observation of the
following row, so observations are stored once. This fits Gymnasium's next-step autoreset
exactly (see :mod:`rlfleet.envs.make`): the step that ends an episode returns the true final
observation, and the following reset step stores that final observation in its row, with
``valid`` false because the env ignored its action. Invalid rows and the newest row (whose
next observation is not yet written) are never sampled. Dict observations are sampled as a
dict of tensors, one per stored key.

Action masks (see :mod:`rlfleet.nn.masks`). Off-policy targets bootstrap from the legal
actions of the next state only, so a buffer for an env that masks actions keeps the mask of
every row, as the env gave it with the row's observation: in a bool
``[rows, num_envs, mask_size]`` array (``mask_size`` given), or, for a Dict observation with an
``action_mask`` key, in that observation key itself. Batches then carry ``action_masks`` and
``next_action_masks`` (the mask of the row the target bootstraps from, ``n_step`` rows on);
without masks both are None and the buffer does no mask work at all. A reset row keeps the
mask of its final observation, so a truncated episode bootstraps over the legal actions of
its final state; a terminal state may have none.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from rlfleet.data.samplers import Sampler, UniformSampler, n_step_targets
from rlfleet.data.storage import TransitionStorage
from rlfleet.errors import ConfigError
from rlfleet.nn.masks import MASK_KEY
from rlfleet.types import ReplayBatch

__all__ = ["ReplayBuffer"]


class ReplayBuffer:
    """Circular storage of ``capacity`` transitions from ``num_envs`` parallel envs.

    Args:
        capacity: transitions kept (rounded up to a multiple of ``num_envs``); the oldest
            are overwritten first.
        observation_space / action_space: single-env spaces.
        num_envs: envs written together by :meth:`add`.
        sampler: :class:`~rlfleet.data.samplers.UniformSampler` (default) or
            :class:`~rlfleet.data.samplers.PrioritizedSampler`.
        mask_size: entries of the env's action mask, when it gives one: every row then
            stores its mask (see the module docstring). Not needed when the mask is the
            ``action_mask`` key of a Dict observation, which is stored anyway.

    Raises:
        ConfigError: a ``mask_size`` below 1, or one that differs from the size of the
            observation's ``action_mask`` key.
        InsufficientMemoryError: the storage would not fit in the memory available now.
    """

    def __init__(
        self,
        capacity: int,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        num_envs: int = 1,
        *,
        sampler: Sampler | None = None,
        mask_size: int | None = None,
    ) -> None:
        self.sampler: Sampler = sampler if sampler is not None else UniformSampler()
        self.storage = TransitionStorage(
            capacity,
            observation_space,
            action_space,
            num_envs,
            mask_size=mask_size,
            extra_bytes_per_slot=self.sampler.bytes_per_slot(),
        )
        self._valid_flat = self.storage.valid.reshape(-1)
        self.pos = 0
        """Row the next :meth:`add` writes."""
        self.rows_filled = 0
        """Rows written so far (at most ``rows``)."""
        self.rows_dropped = False
        """Whether older rows were overwritten (or left out by :meth:`load`): the oldest
        row's episode may then lack its start."""
        self._num_sampleable = 0
        self._batch_size = -1
        self.sampler.attach(self.capacity)
        self._env_index = np.arange(num_envs)

    # ------------------------------------------------------------- the storage
    @property
    def observation_space(self) -> spaces.Space[Any]:
        return self.storage.observation_space

    @property
    def action_space(self) -> spaces.Space[Any]:
        return self.storage.action_space

    @property
    def num_envs(self) -> int:
        return self.storage.num_envs

    @property
    def rows(self) -> int:
        """Rows of the storage (``capacity / num_envs``)."""
        return self.storage.rows

    @property
    def capacity(self) -> int:
        """Transitions kept, a multiple of ``num_envs``."""
        return self.storage.capacity

    @property
    def mask_size(self) -> int | None:
        """Entries of the action mask each row keeps (None: the buffer holds no masks)."""
        return self.storage.mask_size

    @property
    def obs(self) -> dict[str, np.ndarray]:
        """Stored observations, ``[rows, num_envs, ...]`` per key (``"obs"`` if not a Dict)."""
        return self.storage.obs

    @property
    def actions(self) -> np.ndarray:
        return self.storage.actions

    @property
    def rewards(self) -> np.ndarray:
        return self.storage.rewards

    @property
    def terminated(self) -> np.ndarray:
        return self.storage.terminated

    @property
    def truncated(self) -> np.ndarray:
        return self.storage.truncated

    @property
    def valid(self) -> np.ndarray:
        return self.storage.valid

    @property
    def action_masks(self) -> np.ndarray | None:
        """Bool ``[rows, num_envs, mask_size]`` mask of each row's observation (None: no
        masks, or masks kept in the observations)."""
        return self.storage.action_masks

    # ----------------------------------------------------------------- writing
    def __len__(self) -> int:
        """Transitions that can be sampled now."""
        return self._num_sampleable

    def add(
        self,
        obs: np.ndarray | Mapping[str, Any],
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        valid: np.ndarray,
        action_mask: np.ndarray | None = None,
    ) -> None:
        """Write one vector step: ``[num_envs, ...]`` arrays of what each env saw and did.

        ``valid`` is false on the reset step of next-step autoreset (the action was ignored);
        that row still stores the final observation of the episode before it (and, in
        ``action_mask``, that observation's mask, as the env gave it).

        Raises:
            ConfigError: ``action_mask`` missing for a buffer with a ``mask_size``, or given
                to a buffer that keeps no separate masks.
        """
        row = self.pos
        storage = self.storage
        if self.rows_filled == storage.rows:
            self._num_sampleable -= int(storage.valid[row].sum())
            self.rows_dropped = True
        storage.write(row, obs, actions, rewards, terminated, truncated, valid, action_mask)
        cleared = row * storage.num_envs + self._env_index
        if self.rows_filled:
            # The previous row now has its next observation: it becomes a transition.
            prev = (row - 1) % storage.rows
            ready = prev * storage.num_envs + self._env_index[storage.valid[prev]]
            self._num_sampleable += ready.size
        else:
            ready = cleared[:0]
        self.sampler.on_write(cleared, ready)
        self.pos = (row + 1) % storage.rows
        self.rows_filled = min(self.rows_filled + 1, storage.rows)

    def clear(self) -> None:
        """Forget every stored transition: the buffer is as new, its storage still allocated
        (a prioritized sampler forgets the stored priorities)."""
        self.storage.valid[:] = False
        self.pos = 0
        self.rows_filled = 0
        self.rows_dropped = False
        self._num_sampleable = 0
        self.sampler.attach(self.capacity)

    def mark_stream_break(self) -> None:
        """The envs were reset without a final step: the newest row has no next observation.

        A collector calls this before its first write into a buffer that already holds
        data (after ``load`` or a resumed checkpoint), so the last stored transition is
        never paired with the first observation of an unrelated episode.
        """
        if self.rows_filled:
            self.storage.valid[(self.pos - 1) % self.rows] = False

    def sampleable(self, slots: np.ndarray) -> np.ndarray:
        """Which flat slots hold a complete transition."""
        newest = (self.pos - 1) % self.rows * self.num_envs
        ok: np.ndarray = self._valid_flat[slots] & (
            (slots < newest) | (slots >= newest + self.num_envs)
        )
        return ok

    # ---------------------------------------------------------------- sampling
    def _prepare_batch(self, batch_size: int) -> None:
        """Allocate the sample arrays once per batch size; samples are copied into them."""
        storage = self.storage
        self._batch_size = batch_size
        self._out_obs = {
            k: np.zeros((batch_size, *v.shape[2:]), v.dtype) for k, v in storage.obs.items()
        }
        self._out_next = {k: np.zeros_like(v) for k, v in self._out_obs.items()}
        self._out_actions = np.zeros((batch_size, *storage.action_shape), storage.action_dtype)
        self._out_rewards = np.zeros(batch_size, np.float32)
        self._out_discounts = np.zeros(batch_size, np.float32)
        self._out_weights = np.ones(batch_size, np.float32)
        self._ones = np.ones(batch_size, np.float32)
        masks: dict[str, torch.Tensor] = {}
        if storage.mask_size is not None:
            self._out_masks = np.zeros((batch_size, storage.mask_size), bool)
            self._out_next_masks = np.zeros_like(self._out_masks)
            masks["action_masks"] = torch.from_numpy(self._out_masks)
            masks["next_action_masks"] = torch.from_numpy(self._out_next_masks)
        self._batch = ReplayBatch[Any](
            obs=storage.as_obs({k: torch.from_numpy(v) for k, v in self._out_obs.items()}),
            actions=torch.from_numpy(self._out_actions),
            rewards=torch.from_numpy(self._out_rewards),
            next_obs=storage.as_obs({k: torch.from_numpy(v) for k, v in self._out_next.items()}),
            discounts=torch.from_numpy(self._out_discounts),
            weights=torch.from_numpy(self._out_weights),
            indices=np.zeros(batch_size, np.int64),
            **masks,
        )

    def sample(
        self, batch_size: int, *, gamma: float, n_step: int = 1, progress: float = 0.0
    ) -> ReplayBatch[Any]:
        """A batch of ``batch_size`` transitions with ``n_step`` returns discounted by ``gamma``.

        ``progress`` (0 to 1) anneals the prioritized sampler's ``beta``. The returned
        tensors are reused by the next call.
        """
        if self._num_sampleable == 0:
            raise ConfigError(
                "replay buffer: no complete transition to sample yet (collect more steps "
                "before the first update, e.g. with learning_starts)"
            )
        if batch_size != self._batch_size:
            self._prepare_batch(batch_size)
        storage = self.storage
        slots, weights = self.sampler.sample(self, batch_size, progress)
        n = storage.num_envs
        if n_step == 1:
            next_rows = slots // n + 1
            next_rows[next_rows == storage.rows] = 0
            np.take(storage.rewards.reshape(-1), slots, out=self._out_rewards)
            np.multiply(gamma, ~storage.terminated.reshape(-1)[slots], out=self._out_discounts)
        else:
            next_rows = n_step_targets(
                storage,
                (self.pos - 1) % storage.rows,
                slots,
                gamma,
                n_step,
                out_returns=self._out_rewards,
                out_discounts=self._out_discounts,
            )
        next_slots = next_rows * n + slots % n
        for key, array in storage.obs.items():
            flat = array.reshape(-1, *array.shape[2:])
            np.take(flat, slots, axis=0, out=self._out_obs[key])
            np.take(flat, next_slots, axis=0, out=self._out_next[key])
        np.take(
            storage.actions.reshape(-1, *storage.action_shape), slots, axis=0, out=self._out_actions
        )
        if storage.mask_size is not None:
            self._sample_masks(slots, next_slots)
        self._out_weights[:] = self._ones if weights is None else weights
        self._batch.indices[:] = slots
        return self._batch

    def _sample_masks(self, slots: np.ndarray, next_slots: np.ndarray) -> None:
        """Masks of the sampled rows and of the rows their targets bootstrap from."""
        action_masks = self.storage.action_masks
        if action_masks is None:  # the observation's mask key, sampled with it
            batch = self._batch_size
            np.not_equal(self._out_obs[MASK_KEY].reshape(batch, -1), 0, out=self._out_masks)
            np.not_equal(self._out_next[MASK_KEY].reshape(batch, -1), 0, out=self._out_next_masks)
            return
        flat = action_masks.reshape(-1, action_masks.shape[2])
        np.take(flat, slots, axis=0, out=self._out_masks)
        np.take(flat, next_slots, axis=0, out=self._out_next_masks)

    def rows_at(self, rows: np.ndarray) -> dict[str, Any]:
        """The stored rows ``rows`` as ``[len(rows), num_envs, ...]`` arrays: ``obs``,
        ``next_obs`` (the following row's observation), ``actions``, ``rewards``,
        ``terminated``, ``truncated`` and ``valid``; for reading what was just collected.
        Rows whose next observation is not written yet (the newest) get ``valid`` false.
        """
        storage = self.storage
        next_rows = (rows + 1) % storage.rows
        valid = storage.valid[rows].copy()
        if self.rows_filled:
            valid[rows == (self.pos - 1) % storage.rows] = False
        return {
            "obs": storage.as_obs({k: v[rows] for k, v in storage.obs.items()}),
            "next_obs": storage.as_obs({k: v[next_rows] for k, v in storage.obs.items()}),
            "actions": storage.actions[rows],
            "rewards": storage.rewards[rows],
            "terminated": storage.terminated[rows],
            "truncated": storage.truncated[rows],
            "valid": valid,
        }

    def update_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Pass new priorities (e.g. absolute TD errors) of sampled slots to the sampler."""
        self.sampler.update_priorities(slots, priorities)

    # ------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """Stored rows, write position and sampler state (numpy arrays, for checkpoints)."""
        return {
            "arrays": {k: v[: self.rows_filled] for k, v in self.storage.arrays().items()},
            "pos": self.pos,
            "rows_filled": self.rows_filled,
            "rows_dropped": self.rows_dropped,
            "sampler": self.sampler.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output of a buffer with the same spaces and size."""
        rows_filled = int(state["rows_filled"])
        self.storage.load_arrays(state["arrays"], rows_filled)
        self.pos = int(state["pos"])
        self.rows_filled = rows_filled
        # A state saved before the flag existed: a write position inside the filled rows
        # means the buffer had wrapped.
        self.rows_dropped = bool(state.get("rows_dropped", 0 < self.pos < rows_filled))
        self._recount()
        self.sampler.load_state_dict(state["sampler"])

    def _recount(self) -> np.ndarray:
        sampleable = self.storage.valid.copy()
        if self.rows_filled < self.rows:
            sampleable[self.rows_filled :] = False
        if self.rows_filled:
            sampleable[(self.pos - 1) % self.rows] = False
        self._num_sampleable = int(sampleable.sum())
        return sampleable.reshape(-1)

    def save(self, path: str | Path) -> Path:
        """Write the buffer to an ``.npz`` file (atomically; nothing is pickled)."""
        return self.storage.save(
            path, pos=self.pos, rows_filled=self.rows_filled, rows_dropped=self.rows_dropped
        )

    def load(self, path: str | Path) -> None:
        """Replace the contents with a file written by :meth:`save`.

        The file may come from a buffer of another capacity (the newest transitions that fit
        are kept) but must have the same spaces and ``num_envs``. Everything is checked
        before anything is replaced, so a refused file leaves the buffer as it was.

        Raises:
            CheckpointError: unreadable file, or spaces / num_envs that differ (named).
        """
        self.rows_filled, self.rows_dropped = self.storage.load(path)
        self.pos = self.rows_filled % self.rows
        self.sampler.reset(self._recount())
