"""Subprocess environment workers that fail loudly, never hang, and can be restarted.

:class:`WorkerVectorEnv` runs each sub-env in its own process, like Gymnasium's
``AsyncVectorEnv`` with shared memory, and behaves the same when nothing goes wrong:
next-step autoreset (:attr:`gymnasium.vector.AutoresetMode.NEXT_STEP`), the same batching
of observations, rewards, ``terminated``, ``truncated`` and infos as ``SyncVectorEnv``.
Observations *and* actions live in shared memory, so a step sends one short command
through each pipe and no arrays.

What it adds is fault handling. A worker that exits, is killed, raises in ``step`` or
``reset``, or does not answer within ``step_timeout_s`` makes ``step``/``reset`` raise
:class:`~rlfleet.errors.EnvWorkerError` at once (a hang: after ``step_timeout_s``). The
message names the env index, the process id, the exit code or signal, and the remote
traceback. Tracebacks travel as text formatted in the worker, never as pickled exceptions;
a worker that crashed in native code or hung leaves the Python stack that
:mod:`faulthandler` dumped. Every other worker is then shut down, so no process outlives
the error. (The process and fault machinery is :mod:`rlfleet.envs.processes`, which the
multi-agent workers of :mod:`rlfleet.marl.workers` share.)

With ``restart_failed_envs=True`` a failed worker is instead replaced by a new process
built from the same env function and reset with the seed ``s + 1000 * restarts`` (``s``:
the seed that env got at the last ``reset(seed=...)``, i.e. ``seed + index``), and the
vector env goes on. How the failure shows up, so that collectors keep their next-step
autoreset bookkeeping:

* the failing step returns, for that env, the new episode's first observation with reward 0,
  ``terminated=False``, ``truncated=True`` and ``info["env_restarted"] = True``: the old
  episode ends there, truncated, because the process that held it is gone;
* the next step is that env's reset step, exactly as after any episode end: it ignores the
  action and returns the same first observation with reward 0 and both flags false (the
  restart already reset the env, so nothing is sent to the worker).

A collector therefore marks the next step invalid as usual and starts the new episode from
that first observation. Two approximations are unavoidable, since the true final
observation and reward died with the process: the failing step's reward is 0, and the
truncated episode bootstraps from the value of the new episode's first observation. A
worker that fails while doing a reset step is restarted without truncating anything (the
episode had already ended). A worker that fails more than ``max_restarts_in_a_row`` times
without one successful step in between raises :class:`~rlfleet.errors.EnvWorkerError`
anyway. :attr:`WorkerVectorEnv.restarts` counts restarts per env.

Workers start with the given :mod:`multiprocessing` context (the platform default when
``None``); with ``spawn`` or ``forkserver`` they import rlfleet and the env function's
module afresh, so both must be importable there (``PYTHONPATH`` is inherited), and the
env functions must be picklable by the standard library (module-level functions or
``functools.partial`` of them; with ``fork`` any callable works). Nothing rlfleet reads from
disk is unpickled; only the parent and its own workers exchange messages.
"""

from __future__ import annotations

import contextlib
import copy
import multiprocessing
import traceback
import warnings
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any, NoReturn

import gymnasium as gym
import numpy as np
from gymnasium.error import CustomSpaceError
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import (
    batch_space,
    create_shared_memory,
    read_from_shared_memory,
    write_to_shared_memory,
)

from rlfleet.envs.outputs import check_reset_output, check_step_output
from rlfleet.envs.processes import SPEC_ERROR as _SPEC_ERROR
from rlfleet.envs.processes import STARTUP as _STARTUP
from rlfleet.envs.processes import Fault as _Fault
from rlfleet.envs.processes import WorkerPool, commands, describe_faults, spec_error
from rlfleet.errors import ConfigError, EnvSpecError, EnvWorkerError

RESTART_SEED_STRIDE = 1000
"""A restarted env is reset with ``seed + RESTART_SEED_STRIDE * restarts``."""
_CLOSE_TIMEOUT_S = 5.0
"""How long close() waits for workers to exit by themselves before terminating them."""

EnvFn = Callable[[], gym.Env[Any, Any]]


class WorkerVectorEnv(VectorEnv[Any, Any, Any]):
    """Sub-envs in subprocesses with shared-memory observations and actions (see module doc).

    Args:
        env_fns: one function per sub-env that builds it; passed to its worker process and
            called again to rebuild a restarted env.
        step_timeout_s: seconds a worker may take to answer one ``step``, ``reset`` or
            ``call`` before it counts as hung.
        restart_failed_envs: restart a failed worker, truncate its episode and go on,
            instead of raising.
        max_restarts_in_a_row: with ``restart_failed_envs``, raise anyway once a worker
            fails more than this many times without a successful step in between.
        startup_timeout_s: seconds a worker may take to start and build its env.
        context: :mod:`multiprocessing` start method (``fork``, ``spawn``,
            ``forkserver``); the platform default when ``None``.

    Actions are written into shared memory with the action space's dtype (a float64 action
    for a float32 ``Box`` reaches the env as float32). Observation and action spaces must
    be ones Gymnasium can place in shared memory: Box, Discrete, MultiDiscrete,
    MultiBinary, and Dict/Tuple of those.
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFn],
        *,
        step_timeout_s: float = 60.0,
        restart_failed_envs: bool = False,
        max_restarts_in_a_row: int = 3,
        startup_timeout_s: float = 120.0,
        context: str | None = None,
    ) -> None:
        self._pool: WorkerPool | None = None
        if not env_fns:
            raise ConfigError("WorkerVectorEnv needs at least one env function, got none")
        for name, value in (
            ("step_timeout_s", step_timeout_s),
            ("startup_timeout_s", startup_timeout_s),
        ):
            if not value > 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        if max_restarts_in_a_row < 0:
            raise ConfigError(f"max_restarts_in_a_row must be >= 0, got {max_restarts_in_a_row}")
        self.num_envs = len(env_fns)
        self.step_timeout_s = float(step_timeout_s)
        self.restart_failed_envs = restart_failed_envs
        self.max_restarts_in_a_row = max_restarts_in_a_row
        self.startup_timeout_s = float(startup_timeout_s)

        # The spaces must be known before the workers start, to size the shared memory.
        probe = env_fns[0]()
        try:
            self.single_observation_space = probe.observation_space
            self.single_action_space = probe.action_space
            self.metadata = dict(probe.metadata)
            self.render_mode = probe.render_mode
        finally:
            probe.close()
        self.metadata["autoreset_mode"] = AutoresetMode.NEXT_STEP
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

        # A context offers the module's Array(), which is all Gymnasium's helper uses.
        ctx: Any = multiprocessing.get_context(context)
        try:
            self._obs_memory = create_shared_memory(
                self.single_observation_space, self.num_envs, ctx
            )
            self._action_memory = create_shared_memory(self.single_action_space, self.num_envs, ctx)
        except CustomSpaceError as err:
            raise EnvSpecError(
                "WorkerVectorEnv keeps observations and actions in shared memory, which "
                "needs Box, Discrete, MultiDiscrete, MultiBinary or Dict/Tuple of those; got "
                f"observation space {self.single_observation_space} and action space "
                f"{self.single_action_space}"
            ) from err
        self._observations = read_from_shared_memory(
            self.single_observation_space, self._obs_memory, self.num_envs
        )
        self._actions = read_from_shared_memory(
            self.single_action_space, self._action_memory, self.num_envs
        )
        self._env_fns = list(env_fns)
        self._restarts = np.zeros(self.num_envs, dtype=np.int64)
        self._failures_in_a_row = np.zeros(self.num_envs, dtype=np.int64)
        self._reset_seeds: list[int | None] = [None] * self.num_envs
        self._autoreset = np.zeros(self.num_envs, dtype=np.bool_)
        # Envs restarted on the last step: their reset step is answered without the worker.
        self._restarted = np.zeros(self.num_envs, dtype=np.bool_)
        self._restart_infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        self._rewards = np.zeros(self.num_envs, dtype=np.float64)
        self._terminations = np.zeros(self.num_envs, dtype=np.bool_)
        self._truncations = np.zeros(self.num_envs, dtype=np.bool_)
        self._vector_steps = 0

        self._pool = WorkerPool(context)
        try:
            for i in range(self.num_envs):
                self._start_worker(i)
            replies, faults = self._gather(self._labels(_STARTUP), self.startup_timeout_s)
            if faults:
                self._fail(faults, "")
            for i, (obs_space, action_space) in sorted(replies.items()):
                if obs_space != self.single_observation_space or (
                    action_space != self.single_action_space
                ):
                    raise EnvSpecError(
                        f"env {i} has observation space {obs_space} and action space "
                        f"{action_space}; expected the spaces of env 0, "
                        f"{self.single_observation_space} and {self.single_action_space}"
                    )
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------- public
    @property
    def restarts(self) -> tuple[int, ...]:
        """How many times each env's worker has been restarted."""
        return tuple(int(r) for r in self._restarts)

    @property
    def pids(self) -> tuple[int | None, ...]:
        """Process ids of the current workers."""
        return self._workers.pids

    def reset(
        self,
        *,
        seed: int | list[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the sub-envs, like :meth:`gymnasium.vector.SyncVectorEnv.reset`.

        ``seed``: ``None`` (random), an int (env ``i`` gets ``seed + i``) or one per env;
        ``options["reset_mask"]`` (a bool array) resets only the selected envs.
        """
        self._check_open()
        if seed is None:
            seeds: list[int | None] = [None] * self.num_envs
        elif isinstance(seed, int):
            seeds = [seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ConfigError(
                f"reset(seed=...) got {len(seeds)} seeds for num_envs={self.num_envs}"
            )
        options = dict(options) if options is not None else None
        mask = np.ones(self.num_envs, dtype=np.bool_)
        if options is not None and "reset_mask" in options:
            mask = np.asarray(options.pop("reset_mask"))
            if mask.shape != (self.num_envs,) or mask.dtype != np.bool_ or not mask.any():
                raise ConfigError(
                    f"options['reset_mask'] must be a bool array of shape ({self.num_envs},) "
                    f"with at least one True, got {mask!r}"
                )
        indices = [i for i in range(self.num_envs) if mask[i]]
        for i in indices:
            self._reset_seeds[i] = seeds[i]
            self._send(i, "reset", {"seed": seeds[i], "options": options})
        replies, faults = self._gather(self._labels("reset", indices), self.step_timeout_s)
        self._handle_faults(faults)
        infos: dict[str, Any] = {}
        for i in indices:
            restarted = {**self._restart_infos[i], "env_restarted": True}
            info = restarted if i in faults else replies[i]
            self._autoreset[i] = self._restarted[i] = False
            self._terminations[i] = self._truncations[i] = False
            infos = self._add_info(infos, info, i)
        return copy.deepcopy(self._observations), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every sub-env, with next-step autoreset (see the module docstring)."""
        self._check_open()
        _write_batch(self._actions, actions)
        self._vector_steps += 1
        commands: dict[int, str] = {}
        for i in range(self.num_envs):
            if not self._restarted[i]:
                commands[i] = "reset" if self._autoreset[i] else "step"
                self._send(i, commands[i], {} if self._autoreset[i] else None)
        labels = {
            i: f"{command} (vector step {self._vector_steps})" for i, command in commands.items()
        }
        replies, faults = self._gather(labels, self.step_timeout_s)
        self._handle_faults(faults)
        infos: dict[str, Any] = {}
        for i in range(self.num_envs):
            info: dict[str, Any]
            truncated = False
            if self._restarted[i]:  # the reset step after a restart
                self._restarted[i] = False
                reward, terminated, info = 0.0, False, self._restart_infos[i]
            elif i in faults:
                reward, terminated, info = 0.0, False, {"env_restarted": True}
                # A failed step ends the episode; a failed reset step had ended it already.
                truncated = commands[i] == "step"
                if truncated:
                    self._restarted[i] = True
                else:
                    info.update(self._restart_infos[i])
            elif commands[i] == "reset":
                reward, terminated, info = 0.0, False, replies[i]
            else:
                reward, terminated, truncated, info = replies[i]
                self._failures_in_a_row[i] = 0
            self._rewards[i] = reward
            self._terminations[i] = terminated
            self._truncations[i] = truncated
            infos = self._add_info(infos, info, i)
        self._autoreset = self._terminations | self._truncations
        return (
            copy.deepcopy(self._observations),
            self._rewards.copy(),
            self._terminations.copy(),
            self._truncations.copy(),
            infos,
        )

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call a method (or read an attribute) of every sub-env; results in env order."""
        self._check_open()
        for i in range(self.num_envs):
            self._send(i, "call", (name, args, kwargs))
        replies = self._answers(f"call({name!r})")
        return tuple(replies[i] for i in range(self.num_envs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """An attribute of every sub-env."""
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set an attribute on every sub-env: one value for all, or a list/tuple of one per env."""
        self._check_open()
        if not isinstance(values, list | tuple):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ConfigError(
                f"set_attr({name!r}) got {len(values)} values for num_envs={self.num_envs}"
            )
        for i, value in enumerate(values):
            self._send(i, "setattr", (name, value))
        self._answers(f"set_attr({name!r})")

    def render(self) -> tuple[Any, ...]:
        """The rendered frames of the sub-envs."""
        return self.call("render")

    def close_extras(self, **kwargs: Any) -> None:
        """Stop every worker: ask, wait up to a few seconds, then terminate, then kill."""
        if self._pool is not None:
            self._pool.close(_CLOSE_TIMEOUT_S)

    def __del__(self) -> None:
        # A vector env dropped without close() must not leave processes behind.
        if not getattr(self, "closed", True):
            self.close()

    # --------------------------------------------------------------- workers
    @property
    def _workers(self) -> WorkerPool:
        assert self._pool is not None
        return self._pool

    def _start_worker(self, index: int) -> None:
        self._workers.start(
            index,
            _serve,
            (
                index,
                self.num_envs,
                self._env_fns[index],
                self._obs_memory,
                self._action_memory,
            ),
            tag=f"-restart{self._restarts[index]}",
        )

    def _send(self, index: int, command: str, data: Any) -> None:
        self._workers.send(index, command, data)

    def _answers(self, label: str) -> dict[int, Any]:
        """Every worker's answer to a ``call``/``setattr`` command.

        An exception there leaves the worker alive and its env untouched, so it is raised
        without shutting anything down; a worker that died or hung is fatal as in ``step``.
        """
        replies, faults = self._gather(self._labels(label), self.step_timeout_s)
        if faults:
            if all(f.kind == "raised" for f in faults.values()):
                raise EnvWorkerError(describe_faults(faults))
            self._fail(faults, "")
        return replies

    def _labels(self, label: str, indices: Sequence[int] | None = None) -> dict[int, str]:
        return {i: label for i in (range(self.num_envs) if indices is None else indices)}

    def _gather(
        self, labels: dict[int, str], timeout: float
    ) -> tuple[dict[int, Any], dict[int, _Fault]]:
        return self._workers.gather(labels, timeout)

    def _handle_faults(self, faults: dict[int, _Fault]) -> None:
        """Raise for the faults, or restart the failed workers and reset their envs.

        An env whose first outputs break the Gymnasium API (:mod:`rlfleet.envs.outputs`) is
        an :class:`~rlfleet.errors.EnvSpecError`, never restarted: a new worker would return
        the same."""
        if not faults:
            return
        message = spec_error(faults)
        if message is not None:
            self.close()
            raise EnvSpecError(message)
        if not self.restart_failed_envs:
            self._fail(
                faults,
                "to restart failed workers and go on, set restart_failed_envs=True "
                "(env.restart_failed_envs in a run config)",
            )
        for i in sorted(faults):
            self._restart_infos[i] = self._restart(i, faults[i])

    def _restart(self, index: int, fault: _Fault) -> dict[str, Any]:
        """Replace a failed worker by a new process and reset its env; returns the reset info."""
        while True:
            self._failures_in_a_row[index] += 1
            if self._failures_in_a_row[index] > self.max_restarts_in_a_row:
                self._fail(
                    {index: fault},
                    f"env worker {index} failed {self._failures_in_a_row[index]} times in a row "
                    f"(max_restarts_in_a_row={self.max_restarts_in_a_row})",
                )
            self._workers.stop(index)
            self._restarts[index] += 1
            # stacklevel 4: the caller of step()/reset() (through _handle_faults, _restart).
            warnings.warn(f"restarting {fault.describe()}", RuntimeWarning, stacklevel=4)
            self._start_worker(index)
            _, faults = self._gather({index: _STARTUP}, self.startup_timeout_s)
            if not faults:
                base = self._reset_seeds[index]
                seed = (
                    None
                    if base is None
                    else base + RESTART_SEED_STRIDE * int(self._restarts[index])
                )
                self._send(index, "reset", {"seed": seed, "options": None})
                label = f"reset after restart {self._restarts[index]}"
                replies, faults = self._gather({index: label}, self.step_timeout_s)
                if not faults:
                    info: dict[str, Any] = replies[index]
                    return info
            fault = faults[index]

    def _fail(self, faults: dict[int, _Fault], hint: str) -> NoReturn:
        """Shut every worker down and raise one error describing all the faults."""
        self.close()
        raise EnvWorkerError(describe_faults(faults, hint))

    def _check_open(self) -> None:
        if self.closed:
            raise EnvWorkerError(
                "this WorkerVectorEnv is closed (by close() or after a worker failure); "
                "build a new one"
            )


def _write_batch(views: Any, batch: Any) -> None:
    """Copy a batched action into the shared-memory views (dicts and tuples recursively)."""
    if isinstance(views, dict):
        for key, view in views.items():
            _write_batch(view, batch[key])
    elif isinstance(views, tuple):
        for view, part in zip(views, batch, strict=True):
            _write_batch(view, part)
    else:
        np.copyto(views, batch)


def _read_item(views: Any, index: int) -> Any:
    """One env's action out of the shared-memory views, as ``iterate`` would give it."""
    if isinstance(views, dict):
        return {key: _read_item(view, index) for key, view in views.items()}
    if isinstance(views, tuple):
        return tuple(_read_item(view, index) for view in views)
    return views[index].copy()


def _serve(
    conn: Connection,
    index: int,
    num_envs: int,
    env_fn: EnvFn,
    obs_memory: Any,
    action_memory: Any,
) -> None:
    """A worker's body: build the env, then answer commands until told to close.

    Every answer is ``(True, payload)`` or ``(False, traceback_text)``. An exception in
    ``step`` or ``reset`` leaves the env in an unknown state, so the worker reports it and
    exits; one in ``call``/``setattr`` is reported and the worker goes on.
    """
    try:
        env = env_fn()
    except Exception:
        conn.send((False, traceback.format_exc()))
        return
    obs_space = env.observation_space
    actions = read_from_shared_memory(env.action_space, action_memory, num_envs)
    name = f"env index {index} ({type(env.unwrapped).__name__})"
    checked = {"step": False, "reset": False}
    try:
        conn.send((True, (obs_space, env.action_space)))
        for command, data in commands(conn):
            try:
                if command == "step":
                    result = env.step(_read_item(actions, index))
                    if not checked["step"]:
                        check_step_output(f"{name} step", obs_space, result)
                        checked["step"] = True
                    obs, reward, terminated, truncated, info = result
                    write_to_shared_memory(obs_space, index, obs, obs_memory)
                    conn.send((True, (reward, terminated, truncated, info)))
                elif command == "reset":
                    reset = env.reset(**data)
                    if not checked["reset"]:
                        check_reset_output(f"{name} reset", obs_space, reset)
                        checked["reset"] = True
                    obs, info = reset
                    write_to_shared_memory(obs_space, index, obs, obs_memory)
                    conn.send((True, info))
                elif command == "call":
                    name, args, kwargs = data
                    attr = env.get_wrapper_attr(name)
                    conn.send((True, attr(*args, **kwargs) if callable(attr) else attr))
                elif command == "setattr":
                    env.set_wrapper_attr(*data)
                    conn.send((True, None))
                else:
                    raise ValueError(f"unknown worker command {command!r}")
            except EnvSpecError as error:
                conn.send((False, _SPEC_ERROR + str(error)))
                return
            except Exception:
                conn.send((False, traceback.format_exc()))
                if command in ("step", "reset"):
                    return
    finally:
        # After a failure the env is broken; an error closing it adds nothing.
        with contextlib.suppress(Exception):
            env.close()
