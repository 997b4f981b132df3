"""A behavior's reward signals, combined into the one reward its algorithm maximises.

How signals are combined: each transition's reward is the strength-weighted sum
``sum_i strength_i * r_i`` over the enabled signals, and the algorithm discounts it with
one gamma — the extrinsic signal's (:meth:`RewardSignalsSettings.discount`). ML-Agents
instead gives each signal its own value head, return and advantage; one reward stream
keeps PPO's critic, storage and update unchanged (and works for SAC's single critic as
well) at the cost of discounting intrinsic rewards with the extrinsic gamma. With the
usual settings the gammas are equal and the two schemes differ only in how the critic
splits its estimate. A signal configured with a different gamma gets a warning when the
run options are loaded.

Intrinsic signals are learned: the rewards of a batch are computed first (the surprise of
data not yet learned from), then each signal updates on the same batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs.stats import EpisodeTracker
from rlfleet.errors import CheckpointError
from rlfleet.nn.optim import NanPolicy
from rlfleet.rewards.base import RewardSignal, Transitions
from rlfleet.rewards.curiosity import CuriositySignal
from rlfleet.rewards.extrinsic import ExtrinsicSignal
from rlfleet.rewards.gail import GAILSignal
from rlfleet.rewards.rnd import RNDSignal
from rlfleet.rewards.settings import RewardSignalsSettings

SIGNAL_CLASSES: dict[str, type[RewardSignal]] = {
    "extrinsic": ExtrinsicSignal,
    "curiosity": CuriositySignal,
    "rnd": RNDSignal,
    "gail": GAILSignal,
}


class RewardSignals:
    """The enabled signals of one behavior.

    Args:
        settings: which signals, with their settings.
        observation_space / action_space: the env's single-env spaces.
        num_envs: training envs (for per-episode intrinsic returns).
        seed: each signal is seeded from it (networks and minibatch order).
    """

    def __init__(
        self,
        settings: RewardSignalsSettings,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        num_envs: int,
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        self.settings = settings
        self.action_start = (
            int(action_space.start) if isinstance(action_space, spaces.Discrete) else 0
        )
        """Rollouts store the policy's action indices; signals see env actions, as replay
        buffers and demonstrations hold them, so indices are shifted by a Discrete ``start``."""
        self.signals: list[RewardSignal] = [
            SIGNAL_CLASSES[name](
                getattr(settings, name),
                observation_space,
                action_space,
                seed=seed + 1000 * (i + 1),
                device=device,
            )
            for i, name in enumerate(settings.enabled())
        ]
        self.trackers = {s.name: EpisodeTracker(num_envs) for s in self.signals if s.intrinsic}

    def set_nan_policy(self, policy: NanPolicy) -> None:
        """What a non-finite loss or gradient in a signal's update does (the trainer passes
        its own ``nan_policy``, the one its algorithm follows)."""
        for signal in self.signals:
            signal.nan_policy = policy

    @property
    def skipped_batches(self) -> int:
        """Minibatches the signals skipped under ``nan_policy: skip_batch``."""
        return sum(signal.skipped_batches for signal in self.signals)

    @property
    def is_identity(self) -> bool:
        """True when the combined reward is the env's reward unchanged (extrinsic, strength 1)."""
        return [s.name for s in self.signals] == ["extrinsic"] and self.signals[0].strength == 1.0

    def combine(self, batch: Transitions) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``[B]`` combined rewards, and each intrinsic signal's strength-weighted ``[B]``
        rewards; reset steps (weight 0) get 0."""
        total = torch.zeros(len(batch))
        parts: dict[str, torch.Tensor] = {}
        for signal in self.signals:
            weighted = signal.strength * signal.rewards(batch) * batch.weights
            total += weighted
            if signal.intrinsic:
                parts[signal.name] = weighted
        return total, parts

    def update(self, batch: Transitions, *, batch_size: int, num_epochs: int) -> dict[str, float]:
        """Let every learned signal learn from ``batch``; returns their metrics."""
        metrics: dict[str, float] = {}
        for signal in self.signals:
            metrics.update(signal.update(batch, batch_size=batch_size, num_epochs=num_epochs))
        return metrics

    def process_rollout(
        self,
        storage: RolloutStorage,
        last_obs: torch.Tensor,
        *,
        batch_size: int,
        num_epochs: int,
    ) -> dict[str, float]:
        """Replace ``storage.rewards`` by the combined rewards, then update the signals.

        ``last_obs`` is the preprocessed observation after the rollout's last step (the
        ``next_obs`` of its last row). Returns metrics: each intrinsic signal's mean reward
        per step and its return per finished episode (``train/intrinsic_<name>_return``),
        and the signals' own losses.
        """
        steps, num_envs = storage.num_steps, storage.num_envs
        n = steps * num_envs
        next_obs = torch.cat([storage.obs[1:], last_obs.unsqueeze(0).to(storage.obs.dtype)])
        actions = storage.actions.reshape(n, *storage.actions.shape[2:])
        batch = Transitions(
            obs=storage.obs.reshape(n, *storage.obs.shape[2:]),
            actions=actions + self.action_start if self.action_start else actions,
            next_obs=next_obs.reshape(n, *next_obs.shape[2:]),
            env_rewards=storage.rewards.reshape(n).clone(),
            weights=storage.valid.reshape(n),
        )
        total, parts = self.combine(batch)
        done = (storage.terminated + storage.truncated).numpy() > 0
        metrics = self.intrinsic_metrics(parts, done, storage.valid.numpy() > 0)
        storage.rewards.copy_(total.reshape(steps, num_envs))
        metrics.update(self.update(batch, batch_size=batch_size, num_epochs=num_epochs))
        return metrics

    def intrinsic_metrics(
        self, parts: dict[str, torch.Tensor], done: np.ndarray, valid: np.ndarray
    ) -> dict[str, float]:
        """Metrics of freshly collected ``[T, num_envs]`` steps in time order, given each
        intrinsic signal's flat ``[T * num_envs]`` weighted rewards (from :meth:`combine`):
        the mean reward per step and the return of every episode that finished
        (``train/intrinsic_<name>_return``; episodes span collection steps)."""
        metrics: dict[str, float] = {}
        steps, num_envs = done.shape
        for name, weighted in parts.items():
            rewards = weighted.reshape(steps, num_envs).numpy().astype(np.float64)
            metrics[f"train/intrinsic_{name}_reward"] = float(
                rewards[valid].mean() if valid.any() else 0.0
            )
            finished: list[float] = []
            tracker = self.trackers[name]
            for t in range(steps):
                tracker.step(rewards[t], done[t], valid[t], finished, [])
            if finished:
                metrics[f"train/intrinsic_{name}_return"] = float(np.mean(finished))
        return metrics

    # ------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        return {
            "signals": {s.name: s.state_dict() for s in self.signals},
            "episode_returns": {k: t.returns.copy() for k, t in self.trackers.items()},
            "episode_lengths": {k: t.lengths.copy() for k, t in self.trackers.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = set(state["signals"])
        wanted = {s.name for s in self.signals}
        if saved != wanted:
            raise CheckpointError(
                f"checkpoint holds reward signals {sorted(saved)}, the run has {sorted(wanted)}"
            )
        for signal in self.signals:
            signal.load_state_dict(state["signals"][signal.name])
        for name, tracker in self.trackers.items():
            tracker.returns[:] = state["episode_returns"][name]
            tracker.lengths[:] = state["episode_lengths"][name]
