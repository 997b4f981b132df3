"""Episode statistics for next-step-autoreset vector envs, tracked in preallocated arrays."""

from __future__ import annotations

import numpy as np


class EpisodeTracker:
    """Accumulates per-env returns and lengths and reports episodes as they finish.

    The reset step that next-step autoreset inserts after an episode end (``valid`` false)
    is not part of any episode and is skipped.
    """

    def __init__(self, num_envs: int) -> None:
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    def step(
        self,
        rewards: np.ndarray,
        done: np.ndarray,
        valid: np.ndarray,
        finished_returns: list[float],
        finished_lengths: list[int],
    ) -> None:
        """Add one vector step; append returns/lengths of episodes that ended to the lists."""
        self.returns += np.where(valid, rewards, 0.0)
        self.lengths += valid
        ended = done & valid
        if ended.any():
            finished_returns.extend(self.returns[ended].tolist())
            finished_lengths.extend(self.lengths[ended].tolist())
            self.returns[ended] = 0.0
            self.lengths[ended] = 0
