"""Small datasets for offline tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.algos.bc import BC
from rlfleet.collect.record import record_dataset
from rlfleet.data.dataset import COLUMNS, OfflineDataset
from rlfleet.envs.make import make_env


def random_dataset(env_id: str, num_steps: int, seed: int = 0) -> OfflineDataset:
    """``num_steps`` transitions of uniformly random actions."""
    env = make_env(env_id)
    policy = BC(env.observation_space, env.action_space)
    env.close()
    return record_dataset(policy, env_id, num_steps, epsilon=1.0, seed=seed)


def save_random_dataset(env_id: str, path: Path, num_steps: int = 1000) -> Path:
    return random_dataset(env_id, num_steps).save(path)


def pendulum_swing_up(obs: np.ndarray) -> np.ndarray:
    """A scripted Pendulum-v1 expert (mean return about -140): pump energy towards the
    upright state's, then balance with a PD controller once near the top.

    Pendulum's dynamics ``thdd = 15 sin(th) + 3 u`` conserve ``E = thd^2 / 2 + 15 cos(th)``
    without torque, and ``dE/dt = 3 u thd``: full torque along the velocity adds energy.
    """
    cos, sin, velocity = (float(x) for x in obs)
    if cos > 0.85:
        torque = -(10.0 * np.arctan2(sin, cos) + 2.0 * velocity)
    else:
        energy = 0.5 * velocity**2 + 15.0 * cos
        direction = np.sign(velocity) if abs(velocity) > 1e-3 else 1.0
        torque = 2.0 * direction * np.sign(15.0 - energy)
    return np.clip(np.array([torque], np.float32), -2.0, 2.0)


def mixed_pendulum_dataset(expert_episodes: int, random_episodes: int, seed: int = 0) -> Any:
    """Whole 200-step Pendulum-v1 episodes: ``expert_episodes`` of :func:`pendulum_swing_up`,
    then ``random_episodes`` of uniformly random torques."""
    env = make_env("Pendulum-v1")
    rng = np.random.default_rng(seed)
    columns: dict[str, list[Any]] = {name: [] for name in COLUMNS}
    for episode in range(expert_episodes + random_episodes):
        obs, _ = env.reset(seed=seed + episode)
        done = False
        while not done:
            if episode < expert_episodes:
                action = pendulum_swing_up(obs)
            else:
                action = rng.uniform(-2.0, 2.0, 1).astype(np.float32)
            next_obs, reward, terminated, truncated, _ = env.step(action)
            for name, value in zip(
                COLUMNS, (obs, action, reward, terminated, truncated, next_obs), strict=True
            ):
                columns[name].append(value)
            obs, done = next_obs, terminated or truncated
    env.close()
    return OfflineDataset(
        *(np.asarray(columns[name]) for name in COLUMNS),
        observation_space=env.observation_space,
        action_space=env.action_space,
        env_id="Pendulum-v1",
        source={"kind": "arrays", "expert_episodes": expert_episodes, "random": random_episodes},
    )
