"""Replay buffers for off-policy learning: storage x sampler, after TorchRL.

:class:`ReplayBuffer` is preallocated circular storage for ``num_envs`` parallel streams of
transitions; a sampler picks which transitions a batch holds: :class:`UniformSampler` or
:class:`PrioritizedSampler` (Schaul et al. 2016, arXiv:1511.05952, with a vectorised numpy
sum-tree). n-step returns are computed at sampling time by
:func:`rlfleet.functional.n_step_return`, so one buffer serves any ``n_step``.

Layout. Storage is ``[rows, num_envs]``: row ``t`` holds what env ``e`` saw and did at
vector step ``t`` (observation, action, reward, terminated, truncated, valid). The next
observation of a transition is the observation of the following row, so observations are
stored once, never twice (an 84x84x4 uint8 Atari frame stack costs 28 KB per transition, not
56 KB). This fits Gymnasium's next-step autoreset exactly (see :mod:`rlfleet.envs.make`):
the step that ends an episode returns the true final observation, and the following reset
step stores that final observation in its row, with ``valid`` false because the env ignored
its action. Invalid rows and the newest row (whose next observation is not yet written) are
never sampled.

Observations keep their space's dtype (uint8 images stay uint8); Dict observations are
stored one array per key (nested keys joined with ``/``) and sampled as a dict of tensors.

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

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from gymnasium import spaces

from rlfleet import functional as F
from rlfleet.envs.spaces import describe_space, space_from_json, space_to_json, spaces_equal
from rlfleet.errors import CheckpointError, ConfigError, EnvSpecError, InsufficientMemoryError
from rlfleet.nn.masks import MASK_KEY
from rlfleet.types import ReplayBatch

__all__ = [
    "PrioritizedSampler",
    "ReplayBuffer",
    "Sampler",
    "UniformSampler",
    "available_memory_bytes",
]

_GIB = 1024**3
_SINGLE = "obs"
"""Storage key of a non-Dict observation."""
_FILE_FORMAT = 1


class Sampler(Protocol):
    """Chooses the flat slots (``row * num_envs + env``) of a batch."""

    def attach(self, num_slots: int) -> None:
        """Size internal structures for a buffer of ``num_slots`` slots."""

    def bytes_per_slot(self) -> float:
        """Memory the sampler needs per buffer slot (for the buffer's memory estimate)."""

    def on_write(self, cleared: np.ndarray, ready: np.ndarray) -> None:
        """Slots ``cleared`` can no longer be sampled; slots ``ready`` now can."""

    def sample(
        self, buffer: ReplayBuffer, batch_size: int, progress: float
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Flat slots of a batch and their importance weights (None: all 1)."""

    def update_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """New priorities (e.g. absolute TD errors) of sampled slots."""

    def reset(self, sampleable: np.ndarray) -> None:
        """Rebuild from scratch after storage was loaded: ``sampleable`` is a flat bool mask."""

    def state_dict(self) -> dict[str, Any]:
        """RNG and priorities, for checkpoints."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""


class UniformSampler:
    """Every stored transition equally likely (with replacement, as in DQN)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def attach(self, num_slots: int) -> None:
        """Uniform sampling keeps no per-slot state."""

    def bytes_per_slot(self) -> float:
        return 0.0

    def on_write(self, cleared: np.ndarray, ready: np.ndarray) -> None:
        """Uniform sampling reads the buffer's own sampleable mask instead."""

    def sample(
        self, buffer: ReplayBuffer, batch_size: int, progress: float
    ) -> tuple[np.ndarray, None]:
        high = buffer.rows_filled * buffer.num_envs
        slots = self.rng.integers(0, high, batch_size)
        # Rejection keeps the batch shape fixed; reset rows are about one in an episode's
        # length, so a redraw is rare and a second one rarer.
        bad = ~buffer.sampleable(slots)
        while bad.any():
            slots[bad] = self.rng.integers(0, high, int(bad.sum()))
            bad = ~buffer.sampleable(slots)
        return slots, None

    def update_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Uniform sampling has no priorities."""

    def reset(self, sampleable: np.ndarray) -> None:
        """Nothing to rebuild."""

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rng.bit_generator.state = dict(state["rng"])


class PrioritizedSampler:
    """Proportional prioritized replay: ``P(i) = p_i^alpha / sum_k p_k^alpha``.

    New transitions get the highest priority seen so far, so each is likely sampled at least
    once. Importance weights ``(N * P(i))^-beta`` correct the bias, with ``beta`` annealed
    linearly from ``beta`` to 1 over training. Deviation from the paper: weights are
    normalised by the largest weight in the batch rather than over the whole buffer (no
    min-tree needed; same direction, weights still only scale updates down).

    The sum-tree is one float64 array: leaves at ``[size, 2 * size)``, node ``i`` the sum of
    ``2i`` and ``2i + 1``. Updates and sampling walk all batch members down or up the tree
    level by level in numpy, so a batch costs ``log2(size)`` vector operations.
    """

    def __init__(
        self, alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-6, seed: int = 0
    ) -> None:
        if alpha < 0 or not 0 <= beta <= 1:
            raise ConfigError(
                f"prioritized replay: expected alpha >= 0 and beta in [0, 1], "
                f"got alpha={alpha}, beta={beta}"
            )
        self.alpha = alpha
        self.beta = beta
        self.eps = eps
        self.rng = np.random.default_rng(seed)
        self.max_priority = 1.0
        self.size = 1
        self.tree = np.zeros(2)

    def attach(self, num_slots: int) -> None:
        self.size = 1 << max(num_slots - 1, 1).bit_length()
        self.tree = np.zeros(2 * self.size)

    def bytes_per_slot(self) -> float:
        return 32.0  # two float64 nodes per leaf, leaves padded up to a power of two

    def total(self) -> float:
        """Sum of all priorities (raised to ``alpha``)."""
        return float(self.tree[1])

    def priorities(self, slots: np.ndarray) -> np.ndarray:
        """Current ``p^alpha`` of ``slots``."""
        leaf_values: np.ndarray = self.tree[slots + self.size]
        return leaf_values

    def _set(self, slots: np.ndarray, values: np.ndarray | float) -> None:
        nodes = slots + self.size
        self.tree[nodes] = values
        nodes = nodes // 2
        while nodes.size and nodes[0] >= 1:
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]
            nodes = nodes // 2

    def on_write(self, cleared: np.ndarray, ready: np.ndarray) -> None:
        if cleared.size:
            self._set(cleared, 0.0)
        if ready.size:
            self._set(ready, self.max_priority**self.alpha)

    def _find(self, values: np.ndarray) -> np.ndarray:
        """Leaf index whose prefix-sum interval holds each value."""
        nodes = np.ones(values.shape, dtype=np.int64)
        while nodes[0] < self.size:
            left = self.tree[2 * nodes]
            right = values > left
            values = values - left * right
            nodes = 2 * nodes + right
        leaves: np.ndarray = nodes - self.size
        return leaves

    def sample(
        self, buffer: ReplayBuffer, batch_size: int, progress: float
    ) -> tuple[np.ndarray, np.ndarray]:
        total = self.total()
        # Stratified: one draw per equal slice of the total, for lower-variance batches.
        values = (np.arange(batch_size) + self.rng.random(batch_size)) * (total / batch_size)
        slots = self._find(values)
        probs = self.priorities(slots)
        zero = probs <= 0.0
        # Rounding at a slice edge can land on an empty leaf; draw those again.
        while zero.any():
            slots[zero] = self._find(self.rng.random(int(zero.sum())) * total)
            probs = self.priorities(slots)
            zero = probs <= 0.0
        beta = self.beta + (1.0 - self.beta) * min(max(progress, 0.0), 1.0)
        weights = (len(buffer) * probs / total) ** -beta
        weights /= weights.max()
        return slots, weights

    def update_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        priorities = np.abs(priorities) + self.eps
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self._set(slots, priorities**self.alpha)

    def reset(self, sampleable: np.ndarray) -> None:
        self.tree[:] = 0.0
        self.tree[self.size : self.size + sampleable.size] = np.where(
            sampleable, self.max_priority**self.alpha, 0.0
        )
        self._rebuild()

    def _rebuild(self) -> None:
        level = self.size // 2
        while level >= 1:
            nodes = np.arange(level, 2 * level)
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]
            level //= 2

    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": self.rng.bit_generator.state,
            "max_priority": self.max_priority,
            "leaves": self.tree[self.size :].copy(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rng.bit_generator.state = dict(state["rng"])
        self.max_priority = float(state["max_priority"])
        self.tree[self.size :] = state["leaves"]
        self._rebuild()


def available_memory_bytes() -> int:
    """Memory the kernel says can be allocated without swapping (``MemAvailable``)."""
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _leaf_spaces(
    space: spaces.Space[Any], prefix: str = "", what: str = "observations"
) -> dict[str, spaces.Space[Any]]:
    """Storage key -> leaf space; Dict keys (observations only) are joined with ``/``."""
    if isinstance(space, spaces.Dict) and what == "observations":
        leaves: dict[str, spaces.Space[Any]] = {}
        for key, sub in space.spaces.items():
            leaves.update(_leaf_spaces(sub, f"{prefix}{key}/"))
        return leaves
    if not isinstance(
        space, spaces.Box | spaces.Discrete | spaces.MultiDiscrete | spaces.MultiBinary
    ):
        raise EnvSpecError(
            f"replay buffer: cannot store {what} of space {describe_space(space)}; supported: "
            "Box, Discrete, MultiDiscrete, MultiBinary (and Dict of those for observations)"
        )
    return {prefix.rstrip("/") or _SINGLE: space}


def _leaf_values(obs: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obs, Mapping):
        values: dict[str, Any] = {}
        for key, sub in obs.items():
            values.update(_leaf_values(sub, f"{prefix}{key}/"))
        return values
    return {prefix.rstrip("/") or _SINGLE: obs}


def _leaf_shape_dtype(space: spaces.Space[Any]) -> tuple[tuple[int, ...], np.dtype[Any]]:
    dtype = space.dtype if space.dtype is not None else np.dtype(np.float32)
    return tuple(space.shape or ()), np.dtype(dtype)


class ReplayBuffer:
    """Circular storage of ``capacity`` transitions from ``num_envs`` parallel envs.

    Args:
        capacity: transitions kept (rounded up to a multiple of ``num_envs``); the oldest
            are overwritten first.
        observation_space / action_space: single-env spaces.
        num_envs: envs written together by :meth:`add`.
        sampler: :class:`UniformSampler` (default) or :class:`PrioritizedSampler`.
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
        if capacity < 1 or num_envs < 1:
            raise ConfigError(
                f"replay buffer: expected capacity >= 1 and num_envs >= 1, "
                f"got capacity={capacity}, num_envs={num_envs}"
            )
        self.observation_space = observation_space
        self.action_space = action_space
        self.num_envs = num_envs
        # Two rows at least: a transition needs the row after it for its next observation.
        self.rows = max(math.ceil(capacity / num_envs), 2)
        self.capacity = self.rows * num_envs
        self.sampler: Sampler = sampler if sampler is not None else UniformSampler()
        self._obs_leaves = _leaf_spaces(observation_space)
        self._action_shape, self._action_dtype = _leaf_shape_dtype(
            _leaf_spaces(action_space, what="actions")[_SINGLE]
        )
        self._masks_in_obs = MASK_KEY in self._obs_leaves
        """The mask is the observation's ``action_mask`` key: stored with the observations."""
        self.mask_size = self._check_mask_size(mask_size)
        """Entries of the action mask each row keeps (None: the buffer holds no masks)."""
        self._check_memory()
        shape = (self.rows, num_envs)
        self.obs = {
            key: np.zeros((*shape, *leaf_shape), leaf_dtype)
            for key, (leaf_shape, leaf_dtype) in (
                (k, _leaf_shape_dtype(s)) for k, s in self._obs_leaves.items()
            )
        }
        self.actions = np.zeros((*shape, *self._action_shape), self._action_dtype)
        self.rewards = np.zeros(shape, np.float32)
        self.terminated = np.zeros(shape, bool)
        self.truncated = np.zeros(shape, bool)
        self.valid = np.zeros(shape, bool)
        self.action_masks: np.ndarray | None = (
            np.ones((*shape, self.mask_size), bool)
            if self.mask_size is not None and not self._masks_in_obs
            else None
        )
        """Bool ``[rows, num_envs, mask_size]`` mask of each row's observation (None: no
        masks, or masks kept in the observations)."""
        self._valid_flat = self.valid.reshape(-1)
        self.pos = 0
        """Row the next :meth:`add` writes."""
        self.rows_filled = 0
        """Rows written so far (at most ``rows``)."""
        self._num_sampleable = 0
        self._batch_size = -1
        self.sampler.attach(self.capacity)
        self._env_index = np.arange(num_envs)

    def _check_mask_size(self, mask_size: int | None) -> int | None:
        if mask_size is not None and mask_size < 1:
            raise ConfigError(f"replay buffer: expected mask_size >= 1, got {mask_size}")
        if not self._masks_in_obs:
            return mask_size
        in_obs = math.prod(_leaf_shape_dtype(self._obs_leaves[MASK_KEY])[0])
        if mask_size is not None and mask_size != in_obs:
            raise ConfigError(
                f"replay buffer: mask_size {mask_size} differs from the {in_obs} entries of the "
                f"observation's {MASK_KEY!r} key, which is the mask this buffer stores"
            )
        return in_obs

    # ------------------------------------------------------------------ memory
    def _bytes_per_slot(self) -> float:
        obs = sum(
            math.prod(shape) * dtype.itemsize
            for shape, dtype in (_leaf_shape_dtype(s) for s in self._obs_leaves.values())
        )
        action = math.prod(self._action_shape) * self._action_dtype.itemsize
        # A mask in the observations is counted with them.
        mask = 0 if self.mask_size is None or self._masks_in_obs else self.mask_size
        return obs + action + mask + 4 + 3 + self.sampler.bytes_per_slot()

    def _check_memory(self) -> None:
        needed = self.capacity * self._bytes_per_slot()
        available = available_memory_bytes()
        if needed > available:
            fits = int(available / self._bytes_per_slot())
            raise InsufficientMemoryError(
                f"replay buffer of {self.capacity:,} transitions of "
                f"{describe_space(self.observation_space)} needs {needed / _GIB:.2f} GiB, "
                f"but only {available / _GIB:.2f} GiB of memory is available; lower "
                f"buffer_size to at most about {fits:,}"
            )

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
        full = self.rows_filled == self.rows
        if full:
            self._num_sampleable -= int(self.valid[row].sum())
        if isinstance(obs, Mapping):
            for key, value in _leaf_values(obs).items():
                self.obs[key][row] = value
        else:
            self.obs[_SINGLE][row] = obs
        self.actions[row] = actions.reshape(self.actions.shape[1:])
        self.rewards[row] = rewards
        self.terminated[row] = terminated
        self.truncated[row] = truncated
        self.valid[row] = valid
        if action_mask is not None or self.action_masks is not None:
            self._add_mask(row, action_mask)
        cleared = row * self.num_envs + self._env_index
        if self.rows_filled:
            # The previous row now has its next observation: it becomes a transition.
            prev = (row - 1) % self.rows
            ready = prev * self.num_envs + self._env_index[self.valid[prev]]
            self._num_sampleable += ready.size
        else:
            ready = cleared[:0]
        self.sampler.on_write(cleared, ready)
        self.pos = (row + 1) % self.rows
        self.rows_filled = min(self.rows_filled + 1, self.rows)

    def _add_mask(self, row: int, action_mask: np.ndarray | None) -> None:
        if self.action_masks is None:
            where = (
                f"the observation's {MASK_KEY!r} key"
                if self._masks_in_obs
                else "nothing (build it with mask_size)"
            )
            raise ConfigError(f"replay buffer: got an action_mask, but it stores masks in {where}")
        if action_mask is None:
            raise ConfigError(
                f"replay buffer: it stores an action mask of {self.mask_size} entries per row, "
                "so add() needs the action_mask of every row"
            )
        self.action_masks[row] = action_mask

    def mark_stream_break(self) -> None:
        """The envs were reset without a final step: the newest row has no next observation.

        A collector calls this before its first write into a buffer that already holds
        data (after ``load`` or a resumed checkpoint), so the last stored transition is
        never paired with the first observation of an unrelated episode.
        """
        if self.rows_filled:
            self.valid[(self.pos - 1) % self.rows] = False

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
        self._batch_size = batch_size
        self._out_obs = {
            k: np.zeros((batch_size, *v.shape[2:]), v.dtype) for k, v in self.obs.items()
        }
        self._out_next = {k: np.zeros_like(v) for k, v in self._out_obs.items()}
        self._out_actions = np.zeros((batch_size, *self._action_shape), self._action_dtype)
        self._out_rewards = np.zeros(batch_size, np.float32)
        self._out_discounts = np.zeros(batch_size, np.float32)
        self._out_weights = np.ones(batch_size, np.float32)
        self._ones = np.ones(batch_size, np.float32)
        masks: dict[str, torch.Tensor] = {}
        if self.mask_size is not None:
            self._out_masks = np.zeros((batch_size, self.mask_size), bool)
            self._out_next_masks = np.zeros_like(self._out_masks)
            masks["action_masks"] = torch.from_numpy(self._out_masks)
            masks["next_action_masks"] = torch.from_numpy(self._out_next_masks)
        self._batch = ReplayBatch[Any](
            obs=self._as_obs({k: torch.from_numpy(v) for k, v in self._out_obs.items()}),
            actions=torch.from_numpy(self._out_actions),
            rewards=torch.from_numpy(self._out_rewards),
            next_obs=self._as_obs({k: torch.from_numpy(v) for k, v in self._out_next.items()}),
            discounts=torch.from_numpy(self._out_discounts),
            weights=torch.from_numpy(self._out_weights),
            indices=np.zeros(batch_size, np.int64),
            **masks,
        )

    def _as_obs(self, tensors: dict[str, torch.Tensor]) -> Any:
        return tensors[_SINGLE] if set(tensors) == {_SINGLE} else tensors

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
        slots, weights = self.sampler.sample(self, batch_size, progress)
        n = self.num_envs
        rows = slots // n
        if n_step == 1:
            next_rows = rows + 1
            next_rows[next_rows == self.rows] = 0
            np.take(self.rewards.reshape(-1), slots, out=self._out_rewards)
            np.multiply(gamma, ~self.terminated.reshape(-1)[slots], out=self._out_discounts)
        else:
            next_rows = self._n_step(slots, rows, gamma, n_step)
        next_slots = next_rows * n + slots % n
        for key, array in self.obs.items():
            flat = array.reshape(-1, *array.shape[2:])
            np.take(flat, slots, axis=0, out=self._out_obs[key])
            np.take(flat, next_slots, axis=0, out=self._out_next[key])
        np.take(self.actions.reshape(-1, *self._action_shape), slots, axis=0, out=self._out_actions)
        if self.mask_size is not None:
            self._sample_masks(slots, next_slots)
        self._out_weights[:] = self._ones if weights is None else weights
        self._batch.indices[:] = slots
        return self._batch

    def _sample_masks(self, slots: np.ndarray, next_slots: np.ndarray) -> None:
        """Masks of the sampled rows and of the rows their targets bootstrap from."""
        if self.action_masks is None:  # the observation's mask key, sampled with it
            batch = self._batch_size
            np.not_equal(self._out_obs[MASK_KEY].reshape(batch, -1), 0, out=self._out_masks)
            np.not_equal(self._out_next[MASK_KEY].reshape(batch, -1), 0, out=self._out_next_masks)
            return
        flat = self.action_masks.reshape(-1, self.action_masks.shape[2])
        np.take(flat, slots, axis=0, out=self._out_masks)
        np.take(flat, next_slots, axis=0, out=self._out_next_masks)

    def _n_step(self, slots: np.ndarray, rows: np.ndarray, gamma: float, n_step: int) -> np.ndarray:
        n = self.num_envs
        offsets = np.arange(n_step)
        window = (rows[:, None] + offsets) % self.rows * n + (slots % n)[:, None]
        # Steps up to the newest row have their next observation written; later ones do not.
        age = (self.pos - 1 - rows) % self.rows
        available = self.valid.reshape(-1)[window] & (offsets < age[:, None])
        returns, discounts, num_steps = F.n_step_return(
            torch.from_numpy(self.rewards.reshape(-1)[window]),
            torch.from_numpy(self.terminated.reshape(-1)[window]),
            torch.from_numpy(self.truncated.reshape(-1)[window]),
            torch.from_numpy(available),
            gamma,
        )
        self._out_rewards[:] = returns.numpy()
        self._out_discounts[:] = discounts.numpy()
        next_rows: np.ndarray = (rows + num_steps.numpy()) % self.rows
        return next_rows

    def rows_at(self, rows: np.ndarray) -> dict[str, Any]:
        """The stored rows ``rows`` as ``[len(rows), num_envs, ...]`` arrays: ``obs``,
        ``next_obs`` (the following row's observation), ``actions``, ``rewards``,
        ``terminated``, ``truncated`` and ``valid``; for reading what was just collected.
        Rows whose next observation is not written yet (the newest) get ``valid`` false.
        """
        next_rows = (rows + 1) % self.rows
        valid = self.valid[rows].copy()
        if self.rows_filled:
            valid[rows == (self.pos - 1) % self.rows] = False
        return {
            "obs": self._as_obs({k: v[rows] for k, v in self.obs.items()}),
            "next_obs": self._as_obs({k: v[next_rows] for k, v in self.obs.items()}),
            "actions": self.actions[rows],
            "rewards": self.rewards[rows],
            "terminated": self.terminated[rows],
            "truncated": self.truncated[rows],
            "valid": valid,
        }

    def update_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Pass new priorities (e.g. absolute TD errors) of sampled slots to the sampler."""
        self.sampler.update_priorities(slots, priorities)

    # ------------------------------------------------------------- persistence
    def _arrays(self) -> dict[str, np.ndarray]:
        arrays = {f"obs/{key}": value for key, value in self.obs.items()}
        arrays.update(
            actions=self.actions,
            rewards=self.rewards,
            terminated=self.terminated,
            truncated=self.truncated,
            valid=self.valid,
        )
        if self.action_masks is not None:
            arrays["action_masks"] = self.action_masks
        return arrays

    def _refuse_other_masks(self, stored: bool, what: str) -> None:
        """A saved buffer must keep action masks exactly when this one does."""
        if stored == (self.action_masks is not None):
            return
        if stored:
            raise CheckpointError(
                f"{what} holds action masks, but this buffer stores none: it was saved by a "
                "run whose env masks actions; load it into a buffer with mask_size"
            )
        raise CheckpointError(
            f"{what} holds no action masks, but this buffer stores a mask of {self.mask_size} "
            "entries per transition: the env masks actions and learning targets need the "
            "mask of every stored state; it was saved by a run without masks, so start from "
            "an empty buffer (a new run, or one that does not load this buffer)"
        )

    def state_dict(self) -> dict[str, Any]:
        """Stored rows, write position and sampler state (numpy arrays, for checkpoints)."""
        return {
            "arrays": {k: v[: self.rows_filled] for k, v in self._arrays().items()},
            "pos": self.pos,
            "rows_filled": self.rows_filled,
            "sampler": self.sampler.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output of a buffer with the same spaces and size."""
        arrays = state["arrays"]
        rows_filled = int(state["rows_filled"])
        self._refuse_other_masks("action_masks" in arrays, "replay buffer state")
        mine = self._arrays()
        if set(arrays) != set(mine) or rows_filled > self.rows:
            raise CheckpointError(
                f"replay buffer state does not fit this buffer: expected arrays "
                f"{sorted(mine)} with at most {self.rows} rows, got {sorted(arrays)} with "
                f"{rows_filled} rows"
            )
        for key, target in mine.items():
            if arrays[key].shape[1:] != target.shape[1:]:
                raise CheckpointError(
                    f"replay buffer state: {key} has shape {arrays[key].shape[1:]} per row, "
                    f"this buffer expects {target.shape[1:]}"
                )
        for key, target in mine.items():
            target[:rows_filled] = arrays[key]
        self.valid[rows_filled:] = False
        self.pos = int(state["pos"])
        self.rows_filled = rows_filled
        self._recount()
        self.sampler.load_state_dict(state["sampler"])

    def _recount(self) -> np.ndarray:
        sampleable = self.valid.copy()
        if self.rows_filled < self.rows:
            sampleable[self.rows_filled :] = False
        if self.rows_filled:
            sampleable[(self.pos - 1) % self.rows] = False
        self._num_sampleable = int(sampleable.sum())
        return sampleable.reshape(-1)

    def save(self, path: str | Path) -> Path:
        """Write the buffer to an ``.npz`` file (atomically; nothing is pickled)."""
        path = Path(path)
        arrays: dict[str, Any] = {k: v[: self.rows_filled] for k, v in self._arrays().items()}
        arrays.update(
            format_version=np.array(_FILE_FORMAT),
            pos=np.array(self.pos),
            rows_filled=np.array(self.rows_filled),
            num_envs=np.array(self.num_envs),
            observation_space=np.array(json.dumps(space_to_json(self.observation_space))),
            action_space=np.array(json.dumps(space_to_json(self.action_space))),
        )
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as file:
            np.savez(file, **arrays)
            file.flush()
            os.fsync(file.fileno())
        tmp.replace(path)
        return path

    def load(self, path: str | Path) -> None:
        """Replace the contents with a file written by :meth:`save`.

        The file may come from a buffer of another capacity (the newest transitions that fit
        are kept) but must have the same spaces and ``num_envs``. Everything is checked
        before anything is replaced, so a refused file leaves the buffer as it was.

        Raises:
            CheckpointError: unreadable file, or spaces / num_envs that differ (named).
        """
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                contents = {key: data[key] for key in data.files}
        except (OSError, ValueError, EOFError) as err:
            raise CheckpointError(f"{path}: not a readable replay buffer file ({err})") from err
        needed = {"format_version", "pos", "rows_filled", "num_envs", "observation_space"}
        if not needed <= set(contents):
            raise CheckpointError(
                f"{path}: not a replay buffer file (missing {sorted(needed - set(contents))})"
            )
        for label, mine in (
            ("observation", self.observation_space),
            ("action", self.action_space),
        ):
            try:
                theirs = space_from_json(json.loads(str(contents[f"{label}_space"])))
            except (EnvSpecError, ValueError, KeyError) as err:
                raise CheckpointError(f"{path}: unreadable {label} space ({err})") from err
            if not spaces_equal(theirs, mine):
                raise CheckpointError(
                    f"{path}: replay buffer holds {label}s of space {describe_space(theirs)}, "
                    f"but this buffer stores {describe_space(mine)}"
                )
        self._refuse_other_masks("action_masks" in contents, f"{path}: replay buffer file")
        num_envs = int(contents["num_envs"])
        if num_envs != self.num_envs:
            raise CheckpointError(
                f"{path}: replay buffer was written by {num_envs} envs, this buffer has "
                f"{self.num_envs}; use the same num_envs"
            )
        stored = int(contents["rows_filled"])
        pos = int(contents["pos"])
        for key, target in self._arrays().items():
            found = contents.get(key)
            if found is None or found.shape[1:] != target.shape[1:] or found.shape[0] < stored:
                raise CheckpointError(
                    f"{path}: replay buffer array {key!r} is missing or has the wrong shape "
                    f"(expected {stored} rows of {target.shape[1:]}, got "
                    f"{None if found is None else found.shape})"
                )
        # Chronological row order: a full buffer's oldest row is the one it would overwrite.
        order = np.concatenate([np.arange(pos, stored), np.arange(0, pos)])[-self.rows :]
        for key, target in self._arrays().items():
            target[: order.size] = contents[key][order]
        self.valid[order.size :] = False
        self.rows_filled = int(order.size)
        self.pos = self.rows_filled % self.rows
        self.sampler.reset(self._recount())
