"""Reward signals for off-policy learning: a replay buffer whose minibatches carry them.

An off-policy algorithm learns from minibatches sampled out of its replay buffer, so the
signals act on those minibatches, as in ML-Agents' SAC trainer. :class:`SignalReplay` stands
in for the buffer in ``algorithm.update``: every :meth:`SignalReplay.sample` takes a
minibatch from the buffer, replaces its rewards by the strength-weighted sum of the
signals' rewards for those transitions (computed now, by the signals as they are now), then
lets the signals learn from the same minibatch. The buffer keeps the env's rewards, so an
intrinsic reward is never stale and the saved buffer is the env's data.

Rewards are relabelled one transition at a time, so n-step returns (which sum stored
rewards) cannot be used with reward signals; the trainer refuses ``n_step > 1``.

:meth:`SignalReplay.observe_collection` scores the steps just collected, for the same
``train/intrinsic_<name>_reward`` and ``train/intrinsic_<name>_return`` metrics the
on-policy trainer logs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlfleet.data.replay import ReplayBuffer
from rlfleet.errors import ConfigError
from rlfleet.rewards.base import Transitions
from rlfleet.rewards.signals import RewardSignals
from rlfleet.types import ReplayBatch


class SignalReplay:
    """``buffer`` as an off-policy algorithm samples it, with ``signals``' rewards.

    Args:
        buffer: the replay buffer the trainer collects into.
        signals: the behavior's reward signals.
        preprocess: the algorithm's observation preprocessing (raw buffer observations to
            what the policy sees), applied without updating normalisation statistics.
    """

    def __init__(
        self,
        buffer: ReplayBuffer,
        signals: RewardSignals,
        preprocess: Callable[[Any], torch.Tensor],
    ) -> None:
        self.buffer = buffer
        self.signals = signals
        self.preprocess = preprocess
        self._next_row: int | None = None
        """First buffer row not yet scored by :meth:`observe_collection`."""
        self._sums: dict[str, float] = defaultdict(float)
        self._samples = 0
        self._ones = torch.ones(0)
        """Every sampled transition is real: the weights of a minibatch, kept for reuse."""

    def __len__(self) -> int:
        return len(self.buffer)

    def sample(
        self, batch_size: int, *, gamma: float, n_step: int = 1, progress: float = 0.0
    ) -> ReplayBatch[Any]:
        """A minibatch of the buffer whose ``rewards`` are the signals' combined rewards."""
        if n_step != 1:
            raise ConfigError(
                f"reward signals relabel one transition at a time: expected n_step = 1, "
                f"got n_step = {n_step}"
            )
        batch: ReplayBatch[Any] = self.buffer.sample(batch_size, gamma=gamma, progress=progress)
        if self._ones.shape[0] != batch_size:
            self._ones = torch.ones(batch_size)
        transitions = Transitions(
            obs=self.preprocess(batch.obs),
            actions=batch.actions,
            next_obs=self.preprocess(batch.next_obs),
            env_rewards=batch.rewards,
            weights=self._ones,
        )
        total, _ = self.signals.combine(transitions)
        metrics = self.signals.update(transitions, batch_size=batch_size, num_epochs=1)
        for key, value in metrics.items():
            self._sums[key] += value
        self._samples += 1
        # Last: until here the batch's rewards are the env's, which the signals may read.
        batch.rewards.copy_(total)
        return batch

    def update_priorities(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        self.buffer.update_priorities(slots, priorities)

    def observe_collection(self) -> dict[str, float]:
        """Score the transitions collected since the last call with the intrinsic signals;
        returns their mean reward per step and the intrinsic returns of finished episodes."""
        buffer = self.buffer
        if buffer.rows_filled == 0:
            return {}
        newest = (buffer.pos - 1) % buffer.rows
        if self._next_row is None:
            # The first call after construction or resume: rows already in the buffer came
            # before this run's episode bookkeeping and are not scored.
            self._next_row = newest
            return {}
        # Complete transitions are the rows before the newest (which waits for its next
        # observation); never more than one lap of the buffer.
        count = min((newest - self._next_row) % buffer.rows, buffer.rows - 1)
        if count == 0:
            return {}
        rows = (self._next_row + np.arange(count)) % buffer.rows
        self._next_row = newest
        data = buffer.rows_at(rows)
        n = count * buffer.num_envs
        transitions = Transitions(
            obs=self.preprocess(_flat(data["obs"], n)),
            actions=torch.from_numpy(_flat(data["actions"], n)),
            next_obs=self.preprocess(_flat(data["next_obs"], n)),
            env_rewards=torch.from_numpy(data["rewards"].reshape(n)),
            weights=torch.from_numpy(data["valid"].reshape(n).astype(np.float32)),
        )
        _, parts = self.signals.combine(transitions)
        done = data["terminated"] | data["truncated"]
        return self.signals.intrinsic_metrics(parts, done, data["valid"])

    def take_update_metrics(self) -> dict[str, float]:
        """The signals' own update metrics, averaged over the minibatches since last call."""
        if self._samples == 0:
            return {}
        means = {key: total / self._samples for key, total in self._sums.items()}
        self._sums.clear()
        self._samples = 0
        return means


def _flat(array: Any, n: int) -> Any:
    """``[T, num_envs, ...]`` to ``[T * num_envs, ...]`` (each array of a dict)."""
    if isinstance(array, dict):
        return {key: _flat(value, n) for key, value in array.items()}
    return array.reshape(n, *array.shape[2:])
