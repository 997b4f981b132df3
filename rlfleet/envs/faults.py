"""Exceptions of in-process envs, turned into :class:`~rlfleet.errors.EnvWorkerError`.

An env that raises deep inside a ``SyncVectorEnv`` loop gives a traceback that says neither
which sub-env failed nor after how many steps. :class:`EnvFaultWrapper` wraps each sub-env
of a ``sync`` vector env and re-raises with the env index, its step count and the place
the exception came from; :class:`VectorEnvFaultWrapper` does the same for a ``native``
vectorised env, which steps all its envs in one call, so there the index is not known.
The original exception is chained (``raise ... from``), so its full traceback stays.
rlfleet's own errors (e.g. a :class:`~rlfleet.errors.NonFiniteError` of a check inside the
env) pass through unchanged, and an env that calls ``sys.exit`` is an EnvWorkerError too.
:class:`EnvFaultWrapper` also checks a sub-env's first ``reset`` and ``step`` outputs
(:mod:`rlfleet.envs.outputs`): a string reward or a wrongly shaped observation is an
:class:`~rlfleet.errors.EnvSpecError` naming the field.

An env that crashes the interpreter (a segfault in its C code, ``os._exit``) or hangs takes
an in-process vector env with it: nothing in the process can catch that. Subprocess workers
(``vector_mode: async``, :mod:`rlfleet.envs.workers`) report such faults themselves and can
restart the env.
"""

from __future__ import annotations

import traceback
from typing import Any, SupportsFloat

import gymnasium as gym
from gymnasium.vector import VectorEnv, VectorWrapper

from rlfleet.envs.outputs import check_reset_output, check_step_output
from rlfleet.errors import EnvWorkerError, RlfleetError

SURVIVE_CRASHES = (
    "vector_mode 'async' runs each env in its own process, where an exception, exit, crash "
    "or hang is reported (and restarted with restart_failed_envs)"
)
"""What to suggest when an in-process env fails: only ``async`` workers survive a segfault
or hang of the env (see docs/reliability.md)."""


def _origin(err: BaseException) -> str:
    """``file:line in function`` of the innermost frame of an exception's traceback."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return "unknown location"
    last = frames[-1]
    return f"{last.filename}:{last.lineno} in {last.name}"


class EnvFaultWrapper(gym.Wrapper[Any, Any, Any, Any]):
    """Re-raises an exception of one sub-env's ``step``/``reset`` as EnvWorkerError.

    Args:
        env: the sub-env.
        index: its index in the vector env, for the message.
    """

    def __init__(self, env: gym.Env[Any, Any], index: int) -> None:
        super().__init__(env)
        self.index = index
        self.steps = 0
        """``step`` calls that returned, over all episodes."""
        self.episode_steps = 0
        self._reset_checked = False

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        when = (
            f"step number {self.steps + 1} of its life (step {self.episode_steps + 1} of its "
            "episode)"
        )
        try:
            result = self.env.step(action)
        except RlfleetError:
            raise
        except Exception as err:
            raise EnvWorkerError(
                f"env index {self.index} raised {type(err).__name__}: {err} in {when}, "
                f"at {_origin(err)}"
            ) from err
        except SystemExit as stop:
            raise self._exited(stop, when) from stop
        if self.steps == 0:
            check_step_output(f"{self._name()} step", self.observation_space, result)
        self.steps += 1
        self.episode_steps += 1
        return result  # type: ignore[no-any-return]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        when = f"reset after {self.steps} steps of its life"
        try:
            result = self.env.reset(seed=seed, options=options)
        except RlfleetError:
            raise
        except Exception as err:
            raise EnvWorkerError(
                f"env index {self.index} raised {type(err).__name__}: {err} in {when}, "
                f"at {_origin(err)}"
            ) from err
        except SystemExit as stop:
            raise self._exited(stop, when) from stop
        if not self._reset_checked:
            check_reset_output(f"{self._name()} reset", self.observation_space, result)
            self._reset_checked = True
        self.episode_steps = 0
        return result  # type: ignore[no-any-return]

    def _name(self) -> str:
        return f"env index {self.index} ({type(self.env.unwrapped).__name__})"

    def _exited(self, stop: SystemExit, when: str) -> EnvWorkerError:
        return EnvWorkerError(
            f"{self._name()} called exit({stop.code!r}) in {when}; an env in this process "
            f"cannot be restarted — {SURVIVE_CRASHES}"
        )


class VectorEnvFaultWrapper(VectorWrapper):
    """Re-raises an exception of a whole vector env's ``step``/``reset`` as EnvWorkerError."""

    def __init__(self, env: VectorEnv[Any, Any, Any]) -> None:
        super().__init__(env)
        self.vector_steps = 0
        """``step`` calls that returned."""

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        try:
            result = self.env.step(actions)
        except RlfleetError:
            raise
        except Exception as err:
            raise self._error(err, f"step number {self.vector_steps + 1}") from err
        self.vector_steps += 1
        return result

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        try:
            return self.env.reset(seed=seed, options=options)
        except RlfleetError:
            raise
        except Exception as err:
            raise self._error(err, f"reset after {self.vector_steps} steps") from err

    def _error(self, err: Exception, when: str) -> EnvWorkerError:
        return EnvWorkerError(
            f"the vectorised env {type(self.env.unwrapped).__name__} raised "
            f"{type(err).__name__}: {err} in {when}, at {_origin(err)} (it steps all "
            f"{self.num_envs} envs in one call, so which env failed is not known)"
        )
