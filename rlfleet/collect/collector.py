"""The Collector steps a vector env with an algorithm's policy and fills storage.

It works in whole batches: one ``preprocess`` + ``act`` call per vector step for all envs,
observations moved to tensors once per step, written in place into preallocated storage.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium.vector import VectorEnv

from rlfleet.algos.base import Algorithm
from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs.stats import EpisodeTracker
from rlfleet.errors import NonFiniteError
from rlfleet.types import CollectStats


class Collector:
    """Keeps the vector env's current observations between collection steps.

    Args:
        envs: a next-step-autoreset vector env (see :func:`rlfleet.envs.make_vec_env`).
        algorithm: the policy that acts.
        seed: seed of the first reset (sub-env ``i`` gets ``seed + i``).
    """

    def __init__(
        self, envs: VectorEnv[Any, Any, Any], algorithm: Algorithm[Any], seed: int | None = None
    ) -> None:
        self.envs = envs
        self.algorithm = algorithm
        self.num_envs = envs.num_envs
        self.obs, _ = envs.reset(seed=seed)
        self.prev_done = np.zeros(self.num_envs, dtype=bool)
        self.tracker = EpisodeTracker(self.num_envs)
        self.env_steps = 0

    def collect_rollout(self, storage: RolloutStorage) -> CollectStats:
        """Fill ``storage`` with ``storage.num_steps`` vector steps of the exploring policy."""
        stats = CollectStats()
        algo = self.algorithm
        for t in range(storage.num_steps):
            obs = algo.preprocess(torch.from_numpy(np.asarray(self.obs)), update_stats=True)
            step = algo.act(obs)
            next_obs, rewards, terminated, truncated, _ = self.envs.step(
                algo.env_actions(step.actions)
            )
            valid = ~self.prev_done
            storage.insert(t, obs, step, rewards, terminated, truncated, valid)
            done = terminated | truncated
            self.tracker.step(rewards, done, valid, stats.episode_returns, stats.episode_lengths)
            self.prev_done = done
            self.obs = next_obs
        _check_finite(storage.rewards, "reward", self.env_steps)
        obs = algo.preprocess(torch.from_numpy(np.asarray(self.obs)), update_stats=False)
        storage.next_obs.copy_(obs)
        last = algo.act(obs, deterministic=True)
        if last.values is not None:
            storage.next_value.copy_(last.values)
        stats.env_steps = storage.num_steps * self.num_envs
        self.env_steps += stats.env_steps
        return stats


def _check_finite(values: torch.Tensor, field: str, env_steps: int) -> None:
    if not torch.isfinite(values).all():
        step, env = np.argwhere(~np.isfinite(values.numpy()))[0]
        raise NonFiniteError(
            f"non-finite {field} from env index {env} at rollout step {step} "
            f"(after {env_steps} env steps)"
        )
