"""MinAtar (Young and Tian 2019, arXiv:1903.03176): five Atari games on a 10 x 10 grid.

The ``minatar`` package defines the Gymnasium ids ``MinAtar/<Game>-v0`` (all six actions)
and ``MinAtar/<Game>-v1`` (the game's minimal action set) for Asterix, Breakout, Freeway,
Seaquest and SpaceInvaders, but registers them only when ``minatar.gym.register_envs()`` is
called (Gymnasium 1.x loads no plugins). :func:`rlfleet.envs.make.env_spec` calls it on the
first id of the ``MinAtar`` namespace, so every command takes these ids as they are.

Observations are ``(10, 10, channels)`` bool grids, channels last, one channel per kind of
object; :class:`rlfleet.nn.encoders.GridEncoder` feeds them to a CNN (``cnn: minatar`` is the
network of the MinAtar paper). Episodes have no time limit of their own.
"""

from __future__ import annotations

import gymnasium as gym

from rlfleet.errors import MissingDependencyError

NAMESPACE = "MinAtar"


def is_minatar_id(env_id: str) -> bool:
    """Whether an env id is in the ``MinAtar`` namespace (``MinAtar/Breakout-v1``)."""
    return env_id.split("/", 1)[0] == NAMESPACE and "/" in env_id


def register_minatar_envs(env_id: str) -> None:
    """Register minatar's env ids with Gymnasium (once: an unknown id in the namespace does
    not register them again).

    Raises:
        MissingDependencyError: the ``minatar`` package is not installed.
    """
    try:
        from minatar import gym as minatar_gym  # optional dependency: imported on demand
    except ImportError:
        raise MissingDependencyError(
            f"{env_id!r} is a MinAtar env: install minatar with `pip install 'rlfleet[minatar]'`"
        ) from None
    if not any(is_minatar_id(known) for known in gym.registry):
        minatar_gym.register_envs()
