"""The Collector steps a vector env with an algorithm's policy and fills storage.

It works in whole batches: one ``preprocess`` + ``act`` call per vector step for all envs,
observations moved to tensors once per step, written in place into preallocated storage:
a rollout (on-policy) or a replay buffer (off-policy).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import VectorEnv

from rlfleet.algos.base import Algorithm
from rlfleet.data.replay import ReplayBuffer
from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs.spaces import describe_space
from rlfleet.envs.stats import EpisodeTracker
from rlfleet.errors import EnvSpecError, NonFiniteError
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
        self._replay: ReplayBuffer | None = None

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
        last = algo.act(obs, deterministic=True)
        if last.values is not None:
            storage.next_value.copy_(last.values)
        stats.env_steps = storage.num_steps * self.num_envs
        self.env_steps += stats.env_steps
        return stats

    def collect_transitions(
        self, buffer: ReplayBuffer, num_steps: int, *, random_actions: bool = False
    ) -> CollectStats:
        """Step all envs ``num_steps`` times with the exploring policy, into ``buffer``.

        ``random_actions`` draws uniformly from the action space instead (the warm-up before
        ``learning_starts``), from the algorithm's generator so that seeds repeat. Every
        vector step is stored, reset steps included (they hold the final observation of the
        episode before), flagged invalid so they are never sampled as transitions.
        """
        if buffer is not self._replay:
            # The envs were reset when this collector started: whatever the buffer held last
            # did not lead to the observation we write next.
            buffer.mark_stream_break()
            self._replay = buffer
        stats = CollectStats()
        algo = self.algorithm
        for _ in range(num_steps):
            obs = np.asarray(self.obs)
            if random_actions:
                actions = random_env_actions(
                    self.envs.single_action_space, self.num_envs, algo.generator
                )
            else:
                step = algo.act(algo.preprocess(torch.from_numpy(obs), update_stats=True))
                actions = algo.env_actions(step.actions)
            next_obs, rewards, terminated, truncated, _ = self.envs.step(actions)
            if not np.isfinite(rewards).all():
                env = int(np.flatnonzero(~np.isfinite(rewards))[0])
                raise NonFiniteError(
                    f"non-finite reward {rewards[env]} from env index {env} "
                    f"(after {self.env_steps + stats.env_steps} env steps)"
                )
            valid = ~self.prev_done
            buffer.add(obs, actions, rewards, terminated, truncated, valid)
            done = terminated | truncated
            self.tracker.step(rewards, done, valid, stats.episode_returns, stats.episode_lengths)
            self.prev_done = done
            self.obs = next_obs
            stats.env_steps += self.num_envs
        self.env_steps += stats.env_steps
        return stats


def random_env_actions(
    space: spaces.Space[Any], num_envs: int, generator: torch.Generator
) -> np.ndarray:
    """``num_envs`` uniform actions, ready for ``env.step`` (Discrete and bounded Box)."""
    if isinstance(space, spaces.Discrete):
        draws = torch.randint(int(space.n), (num_envs,), generator=generator) + int(space.start)
        return draws.numpy()
    if isinstance(space, spaces.Box):
        low = torch.as_tensor(space.low, dtype=torch.float64)
        high = torch.as_tensor(space.high, dtype=torch.float64)
        unit = torch.rand((num_envs, *space.shape), generator=generator, dtype=torch.float64)
        return (low + unit * (high - low)).numpy().astype(space.dtype)
    raise EnvSpecError(
        f"random warm-up actions: unsupported action space {describe_space(space)} "
        "(expected Discrete or Box)"
    )


def _check_finite(values: torch.Tensor, field: str, env_steps: int) -> None:
    if not torch.isfinite(values).all():
        step, env = np.argwhere(~np.isfinite(values.numpy()))[0]
        raise NonFiniteError(
            f"non-finite {field} from env index {env} at rollout step {step} "
            f"(after {env_steps} env steps)"
        )
