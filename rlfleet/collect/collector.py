"""The Collector steps a vector env with an algorithm's policy and fills storage.

It works in whole batches: one ``preprocess`` + ``act`` call per vector step for all envs
(through a :class:`~rlfleet.collect.runner.PolicyRunner`, which also carries action masks
and recurrent state), observations moved to tensors once per step, written in place into
preallocated storage.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium.vector import VectorEnv

from rlfleet.algos.base import Algorithm
from rlfleet.collect.runner import PolicyRunner
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
        self.obs, self.infos = envs.reset(seed=seed)
        self.prev_done = np.zeros(self.num_envs, dtype=bool)
        self.runner = PolicyRunner(algorithm, self.num_envs)
        self.tracker = EpisodeTracker(self.num_envs)
        self.env_steps = 0

    def collect_rollout(
        self, storage: RolloutStorage, num_episodes: int | None = None
    ) -> CollectStats:
        """Fill ``storage`` with vector steps of the exploring policy.

        By default exactly ``storage.capacity`` steps; with ``num_episodes``, as many steps
        as it takes for that many episodes to end (the storage grows if needed).
        """
        stats = CollectStats()
        algo = self.algorithm
        t = 0
        while t < storage.capacity if num_episodes is None else stats.episodes < num_episodes:
            acted = self.runner.act(self.obs, self.infos, self.prev_done, update_stats=True)
            next_obs, rewards, terminated, truncated, self.infos = self.envs.step(
                algo.env_actions(acted.step.actions)
            )
            valid = ~self.prev_done
            storage.insert(
                t,
                acted.obs,
                acted.step,
                rewards,
                terminated,
                truncated,
                valid,
                mask=acted.mask,
                state=acted.state,
            )
            done = terminated | truncated
            self.tracker.step(rewards, done, valid, stats.episode_returns, stats.episode_lengths)
            self.prev_done = done
            self.obs = next_obs
            t += 1
        storage.set_length(t)
        _check_finite(storage.rewards, "reward", self.env_steps)
        last = self.runner.act(
            self.obs, self.infos, self.prev_done, deterministic=True, advance=False
        )
        storage.next_obs.copy_(last.obs)
        if last.mask is not None and storage.next_mask is not None:
            storage.next_mask.copy_(last.mask)
        if last.step.values is not None:
            storage.next_value.copy_(last.step.values)
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
