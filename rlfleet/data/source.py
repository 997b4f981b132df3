"""What an off-policy or offline update samples transitions from.

:class:`TransitionSource` is the whole interface such an update may use: the replay buffer
(:class:`rlfleet.data.replay.ReplayBuffer`) and the reward-signal view of it
(:class:`rlfleet.rewards.replay.SignalReplay`) both satisfy it, so an algorithm annotated
with it accepts either, and mypy checks every call an update makes on them.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from rlfleet.types import ReplayBatch


class TransitionSource(Protocol):
    """Sampled minibatches of transitions, with priority feedback."""

    def __len__(self) -> int:
        """Transitions held (a sample needs at least one)."""
        ...

    def sample(
        self, batch_size: int, *, gamma: float, n_step: int = 1, progress: float = 0.0
    ) -> ReplayBatch[Any]:
        """``batch_size`` transitions with ``n_step`` returns discounted by ``gamma``;
        ``progress`` (0 to 1) anneals a prioritized sampler's importance weights. The
        batch's tensors may be reused by the next call."""
        ...

    def update_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """New priorities (e.g. absolute TD errors) for the sampled ``slots``
        (``ReplayBatch.indices``); a uniform sampler ignores them."""
        ...
