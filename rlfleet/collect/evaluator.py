"""The Evaluator runs test episodes with a frozen, by default greedy, policy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from gymnasium.vector import VectorEnv

from rlfleet.algos.base import Algorithm
from rlfleet.collect.runner import PolicyRunner
from rlfleet.envs.stats import EpisodeTracker
from rlfleet.types import EvalStats


class Evaluator:
    """Runs exactly ``num_episodes`` test episodes on a vector env.

    Episodes are assigned to sub-envs up front (env ``i`` runs ``ceil`` or ``floor`` of
    ``num_episodes / num_envs``) so the result does not favour short episodes, which would
    finish first and be over-counted if the first ``num_episodes`` to end were taken.
    Observation statistics are never updated here; a recurrent policy starts every run
    from a fresh state.
    """

    def __init__(
        self, envs: VectorEnv[Any, Any, Any], algorithm: Algorithm[Any], seed: int | None = None
    ) -> None:
        self.envs = envs
        self.algorithm = algorithm
        self.seed = seed
        self._episodes_run = 0
        self.runner = PolicyRunner(algorithm, envs.num_envs)

    def state_dict(self) -> dict[str, int]:
        return {"episodes_run": self._episodes_run}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._episodes_run = int(state["episodes_run"])

    def run(
        self,
        num_episodes: int,
        *,
        deterministic: bool = True,
        on_episode: Callable[[int], object] | None = None,
    ) -> EvalStats:
        """Play ``num_episodes`` episodes and return their returns and lengths;
        ``on_episode`` is called with the number of episodes counted so far each time one
        ends (a progress bar's update)."""
        num_envs = self.envs.num_envs
        quota = np.full(num_envs, num_episodes // num_envs)
        quota[: num_episodes % num_envs] += 1
        # A fresh seed per evaluation: test episodes differ across epochs but are repeatable.
        seed = None if self.seed is None else self.seed + self._episodes_run
        self._episodes_run += num_episodes
        obs, infos = self.envs.reset(seed=seed)
        self.runner.reset()
        tracker = EpisodeTracker(num_envs)
        returns: list[list[float]] = [[] for _ in range(num_envs)]
        lengths: list[list[int]] = [[] for _ in range(num_envs)]
        prev_done = np.zeros(num_envs, dtype=bool)
        done_count = np.zeros(num_envs, dtype=np.int64)
        algo = self.algorithm
        while (done_count < quota).any():
            with torch.inference_mode():
                acted = self.runner.act(obs, infos, prev_done, deterministic=deterministic)
                actions = algo.env_actions(acted.step.actions)
            obs, rewards, terminated, truncated, infos = self.envs.step(actions)
            done = terminated | truncated
            # Envs that already ran their quota keep stepping but no longer count.
            valid = ~prev_done & (done_count < quota)
            finished_r: list[float] = []
            finished_l: list[int] = []
            tracker.step(rewards, done, valid, finished_r, finished_l)
            ended = np.flatnonzero(done & valid)
            for env in ended:
                returns[env].append(finished_r.pop(0))
                lengths[env].append(finished_l.pop(0))
                done_count[env] += 1
            if on_episode is not None and ended.size:
                on_episode(int(done_count.sum()))
            prev_done = done
        return EvalStats(
            returns=np.array([r for env in returns for r in env], dtype=np.float64),
            lengths=np.array([n for env in lengths for n in env], dtype=np.int64),
        )
