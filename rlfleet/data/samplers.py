"""Replay samplers: which stored transitions a batch holds, and their n-step targets.

The sampler part of the replay buffer (storage x sampler x writer, after TorchRL). A sampler
picks flat slots (``row * num_envs + env``) of a :class:`~rlfleet.data.storage.TransitionStorage`:
:class:`UniformSampler` (with replacement, as in DQN) or :class:`PrioritizedSampler` (Schaul
et al. 2016, arXiv:1511.05952, on a vectorised numpy sum-tree). :func:`n_step_targets` turns a
sampled slot into its n-step return with :func:`rlfleet.functional.n_step_return`, at
sampling time, so one buffer serves any ``n_step``.

Samplers keep their own numpy RNG, saved in checkpoints, so a resumed run draws the same
batches as one that never stopped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import torch

from rlfleet import functional as F
from rlfleet.data.storage import TransitionStorage
from rlfleet.errors import ConfigError

__all__ = [
    "PrioritizedSampler",
    "Sampler",
    "SlotSource",
    "UniformSampler",
    "n_step_targets",
]


class SlotSource(Protocol):
    """What a sampler reads of the buffer it samples from."""

    @property
    def num_envs(self) -> int:
        """Envs per row."""

    @property
    def rows_filled(self) -> int:
        """Rows written so far."""

    def __len__(self) -> int:
        """Transitions that can be sampled now."""

    def sampleable(self, slots: np.ndarray) -> np.ndarray:
        """Which flat slots hold a complete transition."""


class Sampler(Protocol):
    """Chooses the flat slots (``row * num_envs + env``) of a batch."""

    def attach(self, num_slots: int) -> None:
        """Size internal structures for a buffer of ``num_slots`` slots."""

    def bytes_per_slot(self) -> float:
        """Memory the sampler needs per buffer slot (for the buffer's memory estimate)."""

    def on_write(self, cleared: np.ndarray, ready: np.ndarray) -> None:
        """Slots ``cleared`` can no longer be sampled; slots ``ready`` now can."""

    def sample(
        self, buffer: SlotSource, batch_size: int, progress: float
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
        self, buffer: SlotSource, batch_size: int, progress: float
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
        self, buffer: SlotSource, batch_size: int, progress: float
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


def n_step_targets(
    storage: TransitionStorage,
    newest_row: int,
    slots: np.ndarray,
    gamma: float,
    n_step: int,
    *,
    out_returns: np.ndarray,
    out_discounts: np.ndarray,
) -> np.ndarray:
    """n-step returns and bootstrap discounts of the transitions in ``slots``.

    Writes the returns and discounts into ``out_returns`` / ``out_discounts`` and returns
    the rows the targets bootstrap from. A window stops at an episode end, at an invalid
    (reset) row, and before ``newest_row``, whose next observation is not written yet.
    """
    n = storage.num_envs
    rows = slots // n
    offsets = np.arange(n_step)
    window = (rows[:, None] + offsets) % storage.rows * n + (slots % n)[:, None]
    # Steps up to the newest row have their next observation written; later ones do not.
    age = (newest_row - rows) % storage.rows
    available = storage.valid.reshape(-1)[window] & (offsets < age[:, None])
    returns, discounts, num_steps = F.n_step_return(
        torch.from_numpy(storage.rewards.reshape(-1)[window]),
        torch.from_numpy(storage.terminated.reshape(-1)[window]),
        torch.from_numpy(storage.truncated.reshape(-1)[window]),
        torch.from_numpy(available),
        gamma,
    )
    out_returns[:] = returns.numpy()
    out_discounts[:] = discounts.numpy()
    next_rows: np.ndarray = (rows + num_steps.numpy()) % storage.rows
    return next_rows
