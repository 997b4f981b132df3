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
from rlfleet.envs.state import get_env_state, set_env_state
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
            obs = algo.preprocess(torch.from_numpy(np.asarray(self.obs)), update_stats=True)
            step = algo.act(obs)
            next_obs, rewards, terminated, truncated, _ = self.envs.step(
                algo.env_actions(step.actions)
            )
            env_step = self.env_steps + (t + 1) * self.num_envs
            check_finite(rewards, "reward", env_step)
            if isinstance(next_obs, np.ndarray):
                check_finite(next_obs, "observation", env_step)
            valid = ~self.prev_done
            storage.insert(t, obs, step, rewards, terminated, truncated, valid)
            done = terminated | truncated
            self.tracker.step(rewards, done, valid, stats.episode_returns, stats.episode_lengths)
            self.prev_done = done
            self.obs = next_obs
            t += 1
        storage.set_length(t)
        obs = algo.preprocess(torch.from_numpy(np.asarray(self.obs)), update_stats=False)
        last = algo.act(obs, deterministic=True)
        if last.values is not None:
            storage.next_value.copy_(last.values)
        stats.env_steps = storage.num_steps * self.num_envs
        self.env_steps += stats.env_steps
        return stats

    def reset_envs(self) -> None:
        """Start a new episode in every env now; episodes in progress end uncounted."""
        self.obs, _ = self.envs.reset()
        self.prev_done[:] = False
        self.tracker.returns[:] = 0.0
        self.tracker.lengths[:] = 0

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue collecting exactly where this one stopped.

        ``env`` is None for envs whose state cannot be saved (see :mod:`rlfleet.envs.state`).
        """
        env_state = get_env_state(self.envs)
        return {
            "env_steps": self.env_steps,
            "env": env_state,
            "obs": np.asarray(self.obs).copy() if env_state is not None else None,
            "prev_done": self.prev_done.copy(),
            "episode_returns": self.tracker.returns.copy(),
            "episode_lengths": self.tracker.lengths.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`; envs that cannot be restored start new episodes."""
        self.env_steps = int(state["env_steps"])
        if state["env"] is None:
            return
        set_env_state(self.envs, state["env"])
        self.obs = state["obs"]
        self.prev_done = np.asarray(state["prev_done"], dtype=bool)
        self.tracker.returns[:] = state["episode_returns"]
        self.tracker.lengths[:] = state["episode_lengths"]


def check_finite(values: np.ndarray, field: str, env_step: int) -> None:
    """Raise NonFiniteError naming the env index if a float batch holds NaN or inf.

    ``values`` is ``[num_envs, ...]`` as returned by one vector step. Integer arrays (images,
    discrete observations) cannot hold NaN and pass for free.
    """
    if values.dtype.kind != "f" or np.isfinite(values).all():
        return
    bad = ~np.isfinite(values.reshape(values.shape[0], -1)).all(axis=1)
    env = int(np.flatnonzero(bad)[0])
    raise NonFiniteError(
        f"non-finite {field} from env index {env} at env step {env_step}: "
        f"{values[env].tolist() if values[env].size <= 8 else 'NaN/inf among its values'}"
        " (run `rlfleet check-env` on the env to find where it comes from)"
    )
