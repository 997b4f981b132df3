"""Multi-agent env copies stepped in subprocess workers, observations in shared memory.

:class:`WorkerMultiAgentVecEnv` is a :class:`~rlfleet.marl.envs.MultiAgentVecEnv` whose
copies each live in their own process: the same agents, spaces, turns, exits, episode ends
and seeding, so a run gives the same results with either (the copies are stepped by the same
:class:`~rlfleet.marl.envs.EnvCopy` code, in the worker). What crosses the pipe per step is
one short message per copy: the actions, and for each report its agent, reward and flags.
The observations and action masks are written by the worker into shared memory, one slot
per (copy, agent) for turns and one for exits, and copied out by the parent. Observations
arrive with their observation space's dtype; an agent whose observation space is not an array
space (Box, Discrete, MultiDiscrete, MultiBinary), or a mask given in ``info``, travels
through the pipe instead.

Faults are handled as in :class:`rlfleet.envs.workers.WorkerVectorEnv` (both use
:mod:`rlfleet.envs.processes`): a worker that raises, exits, is killed, or does not answer
within ``step_timeout_s`` makes ``reset``/``step``/``state`` raise
:class:`~rlfleet.errors.EnvWorkerError` naming the copy, the process id, the exit code or
signal, and the remote traceback (or the stack :mod:`faulthandler` dumped); an observation
that does not fit its space, or an env that breaks PettingZoo's rules, raises
:class:`~rlfleet.errors.EnvSpecError`. Either way every worker is shut down first, so no
process outlives the error.

Failed copies are not restarted: a multi-agent episode that loses its process has no
well-defined continuation for the other agents of that copy (whose turn comes next, what
each collected), so the error ends the run; resume it from its last checkpoint.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import traceback
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory

from rlfleet.envs.processes import (
    SPEC_ERROR,
    STARTUP,
    Fault,
    WorkerPool,
    commands,
    describe_faults,
    spec_error,
)
from rlfleet.errors import ConfigError, EnvSpecError, EnvWorkerError
from rlfleet.marl.envs import (
    MASK_KEY,
    AgentReport,
    CopyStep,
    EnvCopy,
    EnvFactory,
    MultiAgentVecEnv,
    check_num_envs,
)

_CLOSE_TIMEOUT_S = 5.0
"""How long close() waits for workers to exit by themselves before terminating them."""
_TURN, _EXIT = 0, 1
"""A copy's two shared-memory slots per agent: its next turn, and its exit."""
_ARRAY_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)

Packed = tuple[str, float, bool, bool, Any, Any]
"""One report as it crosses the pipe: agent, reward, terminated, truncated, mask, obs. The
mask and obs are ``None`` when absent, ``True`` when in shared memory, else the array."""


class _Slots:
    """The shared memory of one agent: its observations and action masks, two slots per
    copy (:data:`_TURN`, :data:`_EXIT`)."""

    def __init__(
        self,
        obs_space: spaces.Space[Any] | None,
        obs_memory: Any,
        mask_space: spaces.Space[Any] | None,
        mask_memory: Any,
        num_slots: int,
    ) -> None:
        self.obs_space, self.obs_memory = obs_space, obs_memory
        self.mask_space, self.mask_memory = mask_space, mask_memory
        self.num_slots = num_slots
        # Arrays of shape [num_slots, *space.shape] over the memory (None: no such memory).
        self.obs: Any = None
        self.masks: Any = None
        self.attach()

    def attach(self) -> None:
        """Make the array views of the memory (again, after a trip to a spawned process)."""
        if self.obs_space is not None:
            self.obs = read_from_shared_memory(self.obs_space, self.obs_memory, self.num_slots)
        if self.mask_space is not None:
            self.masks = read_from_shared_memory(self.mask_space, self.mask_memory, self.num_slots)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "obs": None, "masks": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.attach()


class WorkerMultiAgentVecEnv(MultiAgentVecEnv):
    """``num_envs`` copies of one PettingZoo env, each in a subprocess (see module doc).

    Args:
        env_fn: builds one env copy; called once here (to read the spaces) and once in each
            worker.
        num_envs: copies (one worker process each).
        seed: copy ``i`` is first reset with ``seed + i``; later resets continue its RNG.
        step_timeout_s: seconds a worker may take to answer one ``reset``, ``step`` or
            ``state`` before it counts as hung (it is killed and the env raises).
        startup_timeout_s: seconds a worker may take to start and build its env.
        context: :mod:`multiprocessing` start method (``fork``, ``spawn``,
            ``forkserver``); the platform default when ``None``. With ``spawn`` and
            ``forkserver``, ``env_fn`` must be picklable.

    Raises:
        EnvSpecError: the object built is not a PettingZoo env, has no agents, or a worker's
            copy has other agents or spaces than the first.
        EnvWorkerError: a worker could not start or build its env.
    """

    def __init__(
        self,
        env_fn: EnvFactory,
        num_envs: int,
        *,
        seed: int | None = None,
        step_timeout_s: float = 60.0,
        startup_timeout_s: float = 120.0,
        context: str | None = None,
    ) -> None:
        self._pool: WorkerPool | None = None
        self.closed = False
        check_num_envs(type(self).__name__, num_envs)
        for name, value in (
            ("step_timeout_s", step_timeout_s),
            ("startup_timeout_s", startup_timeout_s),
        ):
            if not value > 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        self.step_timeout_s = float(step_timeout_s)
        self.startup_timeout_s = float(startup_timeout_s)
        probe = env_fn()
        try:
            self._describe(probe, num_envs, seed)
        finally:
            close = getattr(probe, "close", None)
            if callable(close):
                close()
        self.envs = []  # the copies live in the workers
        self._states: dict[int, np.ndarray] = {}
        self._steps = 0
        ctx: Any = multiprocessing.get_context(context)
        num_slots = 2 * num_envs
        self._slots: dict[str, _Slots] = {}
        for agent in self.possible_agents:
            obs_space = self.observation_spaces[agent]
            shared_obs = obs_space if isinstance(obs_space, _ARRAY_SPACES) else None
            mask_space = None
            if self.has_masks(agent):
                mask_space = self.raw_observation_spaces[agent][MASK_KEY]  # type: ignore[index]
            self._slots[agent] = _Slots(
                shared_obs,
                None if shared_obs is None else create_shared_memory(shared_obs, num_slots, ctx),
                mask_space,
                None if mask_space is None else create_shared_memory(mask_space, num_slots, ctx),
                num_slots,
            )
        self._pool = WorkerPool(context, name="rlfleet-marl-worker")
        try:
            for i in range(num_envs):
                self._pool.start(i, _serve, (i, env_fn, self._slots))
            replies = self._gather(self._labels(STARTUP), self.startup_timeout_s)
            expected = self._spaces()
            for i, received in sorted(replies.items()):
                if received != expected:
                    raise EnvSpecError(
                        f"env copy {i} has agents and spaces {received}; expected those of "
                        f"the first copy, {expected}"
                    )
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> tuple[int | None, ...]:
        """Process ids of the workers, in copy order."""
        return self._workers.pids

    # ------------------------------------------------------------------ state
    def state(self, env_id: int) -> np.ndarray:
        """The global state of one copy, asked of its worker once per step."""
        cached = self._states.get(env_id)
        if cached is None:
            self._check_open()
            self._workers.send(env_id, "state", None)
            label = f"state() (vector step {self._steps})"
            cached = self._gather({env_id: label}, self.step_timeout_s)[env_id]
            self._states[env_id] = cached
        return cached

    def state_size(self) -> int:
        self._check_open()
        self._states.clear()
        self._workers.send(0, "state_size", self._seed)
        size: int = self._gather({0: "state_size()"}, self.step_timeout_s)[0]
        return size

    def close(self) -> None:
        """Stop every worker: ask, wait up to a few seconds, then terminate, then kill."""
        if self.closed:
            return
        self.closed = True
        if self._pool is not None:
            self._pool.close(_CLOSE_TIMEOUT_S)

    def __del__(self) -> None:
        # An env dropped without close() must not leave processes behind.
        if not getattr(self, "closed", True):
            self.close()

    # ------------------------------------------------------------------ copies
    def _reset_copies(self, seeds: list[int | None]) -> list[AgentReport]:
        self._check_open()
        self._states.clear()
        for i, seed in enumerate(seeds):
            self._workers.send(i, "reset", seed)
        replies = self._gather(self._labels("reset"), self.step_timeout_s)
        return [r for i in range(self.num_envs) for r in self._unpack(i, replies[i], _TURN)]

    def _step_copies(self, by_env: dict[int, dict[str, Any]]) -> list[CopyStep]:
        self._check_open()
        self._states.clear()
        self._steps += 1
        for env_id, actions in by_env.items():
            self._workers.send(env_id, "step", actions)
        label = f"step (vector step {self._steps})"
        replies = self._gather({i: label for i in by_env}, self.step_timeout_s)
        steps: list[CopyStep] = []
        for env_id in by_env:
            exits, turns, ended = replies[env_id]
            steps.append(
                (self._unpack(env_id, exits, _EXIT), self._unpack(env_id, turns, _TURN), ended)
            )
        return steps

    # --------------------------------------------------------------- workers
    @property
    def _workers(self) -> WorkerPool:
        assert self._pool is not None
        return self._pool

    def _labels(self, label: str) -> dict[int, str]:
        return dict.fromkeys(range(self.num_envs), label)

    def _gather(self, labels: dict[int, str], timeout: float) -> dict[int, Any]:
        """Every answer, or (after shutting every worker down) the error of the faults."""
        replies, faults = self._workers.gather(labels, timeout)
        if faults:
            self._fail(faults)
        return replies

    def _fail(self, faults: dict[int, Fault]) -> None:
        self.close()
        message = spec_error(faults)
        if message is not None:
            raise EnvSpecError(message)
        raise EnvWorkerError(describe_faults(faults))

    def _check_open(self) -> None:
        if self.closed:
            raise EnvWorkerError(
                f"this {type(self).__name__} is closed (by close() or after a worker "
                "failure); build a new one"
            )

    def _spaces(self) -> tuple[list[str], dict[str, str], dict[str, str]]:
        return _spaces_of(self.possible_agents, self.raw_observation_spaces, self.action_spaces)

    def _unpack(self, env_id: int, packed: list[Packed], kind: int) -> list[AgentReport]:
        slot = 2 * env_id + kind
        reports = []
        for agent, reward, terminated, truncated, mask, obs in packed:
            slots = self._slots[agent]
            if obs is True:
                assert slots.obs is not None
                obs = np.array(slots.obs[slot])
            if mask is True:
                assert slots.masks is not None
                mask = np.array(slots.masks[slot], dtype=bool)
            reports.append(AgentReport(env_id, agent, obs, reward, terminated, truncated, mask))
        return reports


def _spaces_of(
    agents: list[str],
    observation_spaces: Mapping[str, spaces.Space[Any]],
    action_spaces: Mapping[str, spaces.Space[Any]],
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """Agents and spaces, as comparable and picklable text."""
    return (
        list(agents),
        {a: repr(observation_spaces[a]) for a in agents},
        {a: repr(action_spaces[a]) for a in agents},
    )


def _pack(
    copy: EnvCopy, slots: dict[str, _Slots], reports: list[AgentReport], kind: int
) -> list[Packed]:
    """Write the reports' observations and masks into their slots; what goes by pipe."""
    slot = 2 * copy.env_id + kind
    used: set[str] = set()
    packed: list[Packed] = []
    for r in reports:
        agent_slots = slots.get(r.agent)
        obs: Any = r.obs
        mask: Any = r.mask
        # An agent the copy reports twice in one answer keeps its slot for the first report.
        if agent_slots is not None and r.agent not in used:
            used.add(r.agent)
            if agent_slots.obs is not None:
                _check_shape(copy, r.agent, "observation", obs, agent_slots.obs)
                agent_slots.obs[slot] = obs
                obs = True
            if agent_slots.masks is not None and mask is not None:
                _check_shape(copy, r.agent, "action mask", mask, agent_slots.masks)
                agent_slots.masks[slot] = mask
                mask = True
        packed.append((r.agent, r.reward, r.terminated, r.truncated, mask, obs))
    return packed


def _check_shape(copy: EnvCopy, agent: str, what: str, value: np.ndarray, views: Any) -> None:
    if value.shape != views.shape[1:]:
        raise EnvSpecError(
            f"env copy {copy.env_id} ({type(copy.env).__name__}): expected agent {agent!r}'s "
            f"{what} to have the shape of its space, {views.shape[1:]}, got {value.shape}"
        )


def _serve(conn: Connection, env_id: int, env_fn: EnvFactory, slots: dict[str, _Slots]) -> None:
    """A worker's body: build the env copy, then answer commands until told to close.

    Every answer is ``(True, payload)`` or ``(False, traceback_text)``; after an exception
    the copy is in an unknown state, so the worker reports it and exits.
    """
    try:
        env = env_fn()
        copy = EnvCopy(env_id, env)
        agents = list(env.possible_agents)
        description = _spaces_of(
            agents,
            {a: env.observation_space(a) for a in agents},
            {a: env.action_space(a) for a in agents},
        )
    except Exception:
        conn.send((False, traceback.format_exc()))
        return
    try:
        conn.send((True, description))
        for command, data in commands(conn):
            try:
                answer: Any
                if command == "step":
                    exits, turns, ended = copy.step(data)
                    answer = (
                        _pack(copy, slots, exits, _EXIT),
                        _pack(copy, slots, turns, _TURN),
                        ended,
                    )
                elif command == "reset":
                    answer = _pack(copy, slots, copy.reset(data), _TURN)
                elif command == "state":
                    answer = copy.state()
                elif command == "state_size":
                    answer = copy.state_size(data)
                else:
                    raise ValueError(f"unknown worker command {command!r}")
                conn.send((True, answer))
            except EnvSpecError as error:
                conn.send((False, SPEC_ERROR + str(error)))
                return
            except Exception:
                conn.send((False, traceback.format_exc()))
                return
    finally:
        # After a failure the env is broken; an error closing it adds nothing.
        with contextlib.suppress(Exception):
            env.close()
