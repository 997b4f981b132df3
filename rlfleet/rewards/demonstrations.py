"""Demonstration datasets: what GAIL imitates.

Format (version 1, meant to grow into rlfleet's offline-dataset format): one ``.npz``
file, written by :func:`save_demonstrations` and read with ``allow_pickle=False``, so
loading never runs code from the file. Arrays:

``observations``
    ``[N, *obs_shape]`` float32: the observation each action was taken in.
``actions``
    ``[N]`` int64 for Discrete action spaces, ``[N, *action_shape]`` float32 for Box.

Row ``i`` of both is one decision of the demonstrator. Episode boundaries are not stored:
GAIL compares single transitions. Extra arrays are allowed and ignored, so a future
dataset format can add rewards, episode starts and next observations without breaking
these files.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rlfleet.envs.spaces import describe_space
from rlfleet.errors import ConfigError, replacing

REQUIRED_ARRAYS = ("observations", "actions")


@dataclass(frozen=True)
class Demonstrations:
    """``N`` demonstrated decisions."""

    observations: np.ndarray
    """``[N, *obs_shape]`` float32."""
    actions: np.ndarray
    """``[N]`` int64 (Discrete) or ``[N, *action_shape]`` float32 (Box)."""

    def __len__(self) -> int:
        return int(self.observations.shape[0])


def save_demonstrations(path: str | Path, demos: Demonstrations) -> None:
    """Write ``demos`` as an ``.npz`` file (the name should end in ``.npz``), through a
    sibling temporary file: a failed write (a full disk) leaves any earlier file, and is a
    RunDirError naming ``path`` and the free space."""
    with replacing(path) as tmp, tmp.open("wb") as f:
        np.savez_compressed(f, observations=demos.observations, actions=demos.actions)


def load_demonstrations(
    path: str | Path, observation_space: spaces.Space[Any], action_space: spaces.Space[Any]
) -> Demonstrations:
    """Read and check a demonstration file against the env's spaces.

    Raises:
        ConfigError: the file is missing, not an ``.npz``, holds pickled objects, lacks an
            array, or its shapes, dtypes or values do not fit the spaces.
    """
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [name for name in REQUIRED_ARRAYS if name not in data.files]
            if missing:
                raise ConfigError(
                    f"{path}: demonstration file lacks array(s) {missing}; expected "
                    f"{list(REQUIRED_ARRAYS)} (found {sorted(data.files)})"
                )
            observations, actions = data["observations"], data["actions"]
    except FileNotFoundError:
        raise ConfigError(f"{path}: demonstration file not found") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise ConfigError(
            f"{path}: not a readable demonstration .npz (arrays only, no pickled objects): "
            f"{str(err).splitlines()[0] if str(err) else type(err).__name__}"
        ) from None
    return Demonstrations(
        _check_observations(path, observations, observation_space),
        _check_actions(path, actions, action_space, len(observations)),
    )


def _check_observations(path: Path, obs: np.ndarray, space: spaces.Space[Any]) -> np.ndarray:
    shape = tuple(space.shape or ())
    if obs.ndim != 1 + len(shape) or tuple(obs.shape[1:]) != shape or obs.shape[0] == 0:
        raise ConfigError(
            f"{path}: observations have shape {obs.shape}; expected "
            f"[N, {', '.join(map(str, shape))}] with N >= 1 for observation space "
            f"{describe_space(space)}"
        )
    if obs.dtype.kind not in "biuf" or not np.isfinite(obs).all():
        raise ConfigError(f"{path}: observations must be finite numbers (dtype {obs.dtype})")
    return obs.astype(np.float32)


def _check_actions(path: Path, actions: np.ndarray, space: spaces.Space[Any], n: int) -> np.ndarray:
    if isinstance(space, spaces.Discrete):
        if actions.shape != (n,) or actions.dtype.kind not in "iu":
            raise ConfigError(
                f"{path}: actions have shape {actions.shape} and dtype {actions.dtype}; expected "
                f"[{n}] integers for action space {describe_space(space)}"
            )
        low, high = int(space.start), int(space.start) + int(space.n)
        if actions.min() < low or actions.max() >= high:
            raise ConfigError(
                f"{path}: actions range over [{actions.min()}, {actions.max()}], outside "
                f"{describe_space(space)}"
            )
        return (actions - low).astype(np.int64)
    shape = tuple(space.shape or ())
    if tuple(actions.shape) != (n, *shape) or actions.dtype.kind not in "biuf":
        raise ConfigError(
            f"{path}: actions have shape {actions.shape}; expected [{n}, "
            f"{', '.join(map(str, shape))}] numbers for action space {describe_space(space)}"
        )
    if not np.isfinite(actions).all():
        raise ConfigError(f"{path}: actions must be finite")
    return actions.astype(np.float32)


def record_demonstrations(
    env: gym.Env[Any, Any],
    policy: Callable[[np.ndarray], Any],
    num_episodes: int,
    *,
    seed: int = 0,
) -> tuple[Demonstrations, list[float]]:
    """Play ``num_episodes`` episodes of ``policy(obs) -> action`` and record them.

    Returns the demonstrations and each episode's return (to check the demonstrator is good).
    """
    observations: list[np.ndarray] = []
    actions: list[Any] = []
    returns: list[float] = []
    for episode in range(num_episodes):
        obs, _ = env.reset(seed=seed + episode)
        done, total = False, 0.0
        while not done:
            action = policy(np.asarray(obs))
            observations.append(np.asarray(obs, dtype=np.float32))
            actions.append(action)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = bool(terminated or truncated)
        returns.append(total)
    action_array = np.asarray(actions)
    action_array = (
        action_array.astype(np.int64)
        if isinstance(env.action_space, spaces.Discrete)
        else action_array.astype(np.float32)
    )
    return Demonstrations(np.stack(observations), action_array), returns
