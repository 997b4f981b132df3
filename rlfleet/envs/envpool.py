"""EnvPool (Weng et al. 2022, arXiv:2206.10558): classic-control envs stepped in C++.

``vector_mode: envpool`` runs the envs of :data:`ENVPOOL_IDS` on EnvPool's C++
implementations, all sub-envs in one call, instead of gymnasium's Python envs. The physics
is the same as gymnasium's (same spaces, same time limits), but the random number generator
is not: the same seed gives other episodes than ``sync`` or ``native`` do.

EnvPool's gymnasium API already has rlfleet's vector-env contract (see
:func:`rlfleet.envs.make.make_vec_env`), and :class:`EnvPoolVectorEnv` maps it one to one:

- next-step autoreset: the step that ends an episode returns its final observation with
  ``terminated`` or ``truncated`` set (EnvPool's ``done & ~trunc`` and ``trunc``); the next
  step of that sub-env ignores its action and returns the first observation of the new
  episode with reward 0. So a truncated episode bootstraps from its true final observation,
  and the collector's episode returns and lengths count exactly as with ``sync``.
- seeding: EnvPool fixes seeds when the pool is built and ignores ``reset(seed=...)``.
  A seeded reset therefore builds a new pool (a few milliseconds for classic control) whose
  sub-env ``i`` is seeded with ``seed + i`` (or with the ``i``-th seed of a list), modulo
  2**31 since EnvPool's seeds are int32; an unseeded reset continues the sub-envs'
  generators. Without any seed the pool draws its seeds from the operating system, as
  gymnasium does (EnvPool's own default is a fixed 42).
- results come back in sub-env order: the pool waits for all its envs (EnvPool's
  synchronous mode, ``batch_size == num_envs``).

What EnvPool cannot do is refused at construction with an
:class:`~rlfleet.errors.EnvSpecError`: other env ids (Atari runs on ale-py's own C++ vector
env, ``vector_mode: native``), per-env wrappers (environment parameters need a reset hook in
every sub-env), and env keyword arguments other than ``max_episode_steps`` (the others are
either gymnasium's or EnvPool's, not both). Its envs' state lives in C++, so a resumed run
starts new episodes (see :mod:`rlfleet.envs.state`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rlfleet.errors import EnvSpecError, MissingDependencyError

ENVPOOL_IDS: tuple[str, ...] = (
    "CartPole-v0",
    "CartPole-v1",
    "Pendulum-v1",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
    "Acrobot-v1",
)
"""Env ids ``vector_mode: envpool`` runs: gymnasium's classic-control envs that EnvPool
implements with the same spaces and time limits."""

INT32_SEEDS = 2**31
"""EnvPool's seeds are int32: larger seeds are taken modulo this."""

ENVPOOL_KWARGS: tuple[str, ...] = ("max_episode_steps",)
"""Env keyword arguments that mean the same to EnvPool as to ``gymnasium.make``."""


def require_envpool(env_id: str) -> ModuleType:
    """The ``envpool`` module.

    Raises:
        MissingDependencyError: envpool is not installed.
    """
    try:
        import envpool  # optional dependency: imported on demand
    except ImportError:
        raise MissingDependencyError(
            f"vector mode 'envpool' for {env_id!r} needs envpool: install it with "
            "`pip install 'rlfleet[envpool]'`"
        ) from None
    return envpool


def check_envpool_env(env_id: str, env_kwargs: dict[str, Any]) -> None:
    """Raise EnvSpecError unless EnvPool runs ``env_id`` with ``env_kwargs`` as gymnasium
    would."""
    if env_id not in ENVPOOL_IDS:
        raise EnvSpecError(
            f"vector mode 'envpool' runs {', '.join(ENVPOOL_IDS)}; got {env_id!r} "
            "(use vector mode 'auto', 'native', 'sync' or 'async' for it)"
        )
    unknown = sorted(set(env_kwargs) - set(ENVPOOL_KWARGS))
    if unknown:
        raise EnvSpecError(
            f"vector mode 'envpool' takes the env kwargs {list(ENVPOOL_KWARGS)} only; got "
            f"{unknown} for {env_id!r} (use vector mode 'sync' to pass them to the env)"
        )


class EnvPoolVectorEnv(VectorEnv[Any, Any, Any]):
    """``num_envs`` copies of an EnvPool env as a next-step-autoreset gymnasium vector env.

    Args:
        env_id: one of :data:`ENVPOOL_IDS`.
        num_envs: number of sub-envs.
        env_kwargs: ``max_episode_steps`` or nothing.
        num_threads: EnvPool's worker threads (0: one per sub-env, up to the CPU count).

    Raises:
        EnvSpecError: the id or a kwarg is not one EnvPool runs as gymnasium does.
        MissingDependencyError: envpool is not installed.
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.NEXT_STEP}  # noqa: RUF012

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        env_kwargs: dict[str, Any] | None = None,
        *,
        num_threads: int = 0,
    ) -> None:
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        check_envpool_env(env_id, self.env_kwargs)
        self._envpool = require_envpool(env_id)
        self.num_envs = num_envs
        self.num_threads = num_threads
        self._pool = self._build(_os_seeds(num_envs))
        self.single_observation_space = self._pool.single_observation_space
        self.single_action_space = self._pool.single_action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)

    def _build(self, seeds: list[int]) -> Any:
        pool = self._envpool.make_gymnasium(
            self.env_id,
            num_envs=self.num_envs,
            num_threads=self.num_threads,
            env_seed=seeds,
            **self.env_kwargs,
        )
        with warnings.catch_warnings():
            # EnvPool describes float32 bounds in float64 and gymnasium warns that it casts
            # them; the pool builds (and caches) its spaces on first use.
            warnings.filterwarnings("ignore", ".*Box (low|high)'s precision lowered")
            _ = pool.observation_space, pool.action_space
        return pool

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every sub-env; a seed builds a new pool seeded with it (see the module)."""
        if seed is not None:
            self._pool.close()
            self._pool = self._build(self._seeds(seed))
        obs, info = self._pool.reset(options=options)
        return obs, info

    def _seeds(self, seed: int | Sequence[int | None]) -> list[int]:
        if isinstance(seed, int):
            return [(seed + i) % INT32_SEEDS for i in range(self.num_envs)]
        if len(seed) != self.num_envs:
            raise EnvSpecError(
                f"reset got {len(seed)} seeds for {self.num_envs} envs; expected one per env"
            )
        drawn = _os_seeds(self.num_envs)
        return [drawn[i] if s is None else int(s) % INT32_SEEDS for i, s in enumerate(seed)]

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs, rewards, terminated, truncated, info = self._pool.step(np.asarray(actions))
        return obs, rewards, terminated, truncated, info

    def close_extras(self, **kwargs: Any) -> None:
        self._pool.close()


def _os_seeds(num_envs: int) -> list[int]:
    """Seeds from the operating system's entropy, in EnvPool's range."""
    state = np.random.SeedSequence().generate_state(num_envs, dtype=np.uint32)
    return [int(s) % INT32_SEEDS for s in state]
