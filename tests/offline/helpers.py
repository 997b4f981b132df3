"""Small datasets for offline tests."""

from __future__ import annotations

from pathlib import Path

from rlfleet.algos.bc import BC
from rlfleet.collect.record import record_dataset
from rlfleet.data.dataset import OfflineDataset
from rlfleet.envs.make import make_env


def random_dataset(env_id: str, num_steps: int, seed: int = 0) -> OfflineDataset:
    """``num_steps`` transitions of uniformly random actions."""
    env = make_env(env_id)
    policy = BC(env.observation_space, env.action_space)
    env.close()
    return record_dataset(policy, env_id, num_steps, epsilon=1.0, seed=seed)


def save_random_dataset(env_id: str, path: Path, num_steps: int = 2000) -> Path:
    return random_dataset(env_id, num_steps).save(path)
