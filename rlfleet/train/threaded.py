"""Collection on a thread of its own, overlapped with learning: the off-policy trainer's
``threaded: true`` (ML-Agents' ``threaded``: "allow environments to step while updating the
model").

A collector thread steps the training envs with an *acting copy* of the algorithm and hands
each collection step's transitions to the learner (the caller's thread) through a queue; the
learner writes them into the replay buffer, then takes its gradient steps while the thread
already collects the next collection step. Torch releases the GIL inside its kernels, so the
two overlap even when the envs are Python code.

The learner asks for collection steps ahead of time, at most ``L`` of them not yet consumed
(``threaded_max_lead_steps`` in env steps, divided by the env steps of a collection step,
rounded down, at least 1). The acting copy takes the learner's newest published weights
before each collection step; the learner publishes after an update step once
``threaded_sync_interval`` (``K``) gradient steps have passed since the last publication.
That gives the staleness bound, which :attr:`ThreadedCollection.max_lead_env_steps` and
:attr:`ThreadedCollection.max_update_lag` record as the run goes:

- in env steps: the thread has collected at most ``L * c`` env steps that the learner has
  not yet consumed (``c``: env steps per collection step);
- in updates: transitions are collected with weights at most
  ``ceil(L * c * r) + K - 1`` gradient steps behind the learner's (``r``: gradient steps per
  env step, the update-to-data ratio). With SAC's defaults (``c = 1``, ``r = 1``, ``L = 1``,
  ``K = 1``) that is one gradient step; unthreaded it is zero.

The learner asks for no collection step past the end of the epoch under way (nor past
``max_steps``), so the thread is idle when the epoch ends: the test step and the checkpoint see
every collected step in the buffer and counted. A stop rule that fires within an epoch (a
reached target, ``max_episodes``) finds up to ``L`` collection steps collected ahead: they
are stored and counted too, so such a run ends up to ``L * c`` env steps later than an
unthreaded one would. Hooks run on the caller's thread and act on the learner; the acting
copy shares the learner's config object and follows its weights.

Exploration schedules (DQN's epsilon) follow the learner's progress when a collection step is
asked for, so they too lag by at most ``L * c`` env steps; whether a collection step is part
of the random warm-up (``learning_starts``) is decided exactly.

A threaded run is not bitwise reproducible: which weights act on which step depends on how
the two threads are scheduled. The acting copy's generator is seeded from the learner's
(which checkpoints save), so a resumed run does not replay the first session's draws. It is
off by default: on two shared cores it did not pay (the figures are in
``docs/off-policy.md``, "Threaded collection").

Written on the standard library's ``threading`` and ``queue``: what is needed is two queues
and a stop flag, with errors carried across; a process pool or an async framework would add
copies of every transition and a second interpreter's start-up for no gain here.
"""

from __future__ import annotations

import math
import queue
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlfleet.algos.base import Algorithm
from rlfleet.collect.collector import Collector
from rlfleet.types import CollectStats

_Row = tuple[Any, ...] | None
"""The arguments of one ``ReplayBuffer.add`` call, or None for ``mark_stream_break``."""

_STOP_JOIN_S = 30.0
"""How long stopping waits for a collection step in flight (an env step that hangs)."""


@dataclass(frozen=True)
class _Request:
    progress: float
    """The learner's progress through the budget when the step was asked for."""
    random_actions: bool
    """The step is part of the random warm-up before ``learning_starts``."""


@dataclass
class Chunk:
    """One collection step collected on the thread."""

    rows: list[_Row]
    """``ReplayBuffer.add`` arguments and stream breaks, in order."""
    stats: CollectStats
    random_actions: bool
    """Collected with random actions (no observation statistics to fold in)."""


@dataclass
class _Failure:
    error: BaseException


class _ChunkWriter:
    """What :meth:`Collector.collect_transitions` writes into on the thread: owned copies of
    each vector step, for the learner to add to the replay buffer."""

    def __init__(self, mask_size: int | None) -> None:
        self._mask_size = mask_size
        self.rows: list[_Row] = []

    @property
    def mask_size(self) -> int | None:
        return self._mask_size

    def add(
        self,
        obs: np.ndarray | Mapping[str, Any],
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        valid: np.ndarray,
        action_mask: np.ndarray | None = None,
    ) -> None:
        self.rows.append(
            (
                _owned(obs),
                _owned(actions),
                _owned(rewards),
                _owned(terminated),
                _owned(truncated),
                _owned(valid),
                None if action_mask is None else _owned(action_mask),
            )
        )

    def mark_stream_break(self) -> None:
        self.rows.append(None)


def _owned(value: Any) -> Any:
    """A copy the envs cannot overwrite in place on their next step."""
    if isinstance(value, Mapping):
        return {key: _owned(v) for key, v in value.items()}
    return np.array(value, copy=True)


@dataclass(frozen=True)
class _Published:
    version: int
    """The learner's gradient steps when these weights were published."""
    tensors: list[torch.Tensor]
    """Copies of :func:`_state_tensors` of the learner, in that order."""


def _state_tensors(algorithm: Algorithm[Any]) -> list[torch.Tensor]:
    """The parameters and buffers of the algorithm's modules, in a fixed order, as the live
    tensors (loading a checkpoint copies into them, so they stay the ones to read)."""
    return [
        tensor.detach()
        for module in algorithm.modules().values()
        for tensor in module.state_dict(keep_vars=True).values()
    ]


class ThreadedCollection:
    """A collector thread that steps ``collector``'s envs with an acting copy of ``learner``.

    The caller (the learner's thread) asks for collection steps with :meth:`request`, takes
    them in order with :meth:`next_chunk`, and publishes new weights with :meth:`publish`.
    :meth:`drain` waits for the steps asked for and returns them, leaving the thread idle:
    the collector and its envs can then be checkpointed. :meth:`stop` ends the thread. An
    exception on the thread is raised again, as it is, by the :meth:`next_chunk` or
    :meth:`drain` that reaches it.

    Args:
        collector: steps the training envs (only the thread touches it while it runs).
        learner: the algorithm that learns; the acting copy is built like it.
        mask_size: the replay buffer's ``mask_size``.
        num_vector_steps: vector steps per collection step.
        max_lead_chunks: ``L``, collection steps asked for and not yet consumed.
        sync_interval: ``K``, gradient steps between publications.
    """

    def __init__(
        self,
        collector: Collector,
        learner: Algorithm[Any],
        *,
        mask_size: int | None,
        num_vector_steps: int,
        max_lead_chunks: int,
        sync_interval: int,
    ) -> None:
        self.collector = collector
        self.learner = learner
        self.num_vector_steps = num_vector_steps
        self.max_lead_chunks = max_lead_chunks
        self.sync_interval = sync_interval
        self.actor = type(learner)(
            learner.observation_space,
            learner.action_space,
            learner.config,
            seed=learner.seed,
            device=learner.device,
            encoder=learner.encoder_factory,
        )
        """The acting copy: its weights are the learner's, as last published."""
        # Gathered once: walking state_dict() at every publication costs milliseconds.
        self._learner_tensors = _state_tensors(learner)
        self._actor_tensors = _state_tensors(self.actor)
        self._writer = _ChunkWriter(mask_size)
        self._requests: queue.Queue[_Request | None] = queue.Queue()
        self._results: queue.Queue[Chunk | _Failure] = queue.Queue()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._published: _Published | None = None
        self._actor_version = -1
        self.outstanding = 0
        """Collection steps asked for and not yet taken by :meth:`next_chunk`."""
        self._collected_env_steps = 0
        self._consumed_env_steps = 0
        self.max_lead_env_steps = 0
        """Most env steps the thread has been ahead of the learner (at the end of each of
        its collection steps)."""
        self.max_update_lag = 0
        """Most gradient steps the acting weights have been behind the learner's while
        they collected (sampled at the end of each collection step: the learner's count
        only grows, so that is the step's largest lag)."""

    @property
    def running(self) -> bool:
        """The thread is alive (collecting, or waiting to be asked)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def started(self) -> bool:
        """:meth:`start` was called and :meth:`stop` not since. A thread that failed is still
        started: its error waits for the next :meth:`next_chunk` or :meth:`drain`."""
        return self._thread is not None

    def start(self) -> None:
        """Start the thread, the acting copy on the learner's current weights, its generator
        seeded from the learner's (nothing if it is :attr:`started`)."""
        if self.started:
            return
        self._requests = queue.Queue()
        self._results = queue.Queue()
        self._stopping.clear()
        self._error = None
        self.outstanding = 0
        seed = int(torch.randint(2**62, (1,), generator=self.learner.generator))
        self.actor.generator.manual_seed(seed)
        self.publish(force=True)
        self._thread = threading.Thread(target=self._run, name="rlfleet-collector", daemon=True)
        self._thread.start()

    def request(self, *, progress: float, random_actions: bool) -> None:
        """Ask for one more collection step."""
        self.outstanding += 1
        self._requests.put(_Request(progress, random_actions))

    def next_chunk(self) -> Chunk:
        """The next collection step asked for, waiting for it if need be.

        Raises:
            the thread's exception, if it failed; RuntimeError if nothing was asked for.
        """
        if self._error is not None:
            raise self._error
        if self.outstanding == 0:
            raise RuntimeError("next_chunk: no collection step was requested")
        while True:
            try:
                item = self._results.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.running:
                    raise RuntimeError("the collector thread ended unexpectedly") from None
        if isinstance(item, _Failure):
            self._error = item.error
            self.outstanding = 0
            raise item.error
        self.outstanding -= 1
        self._consumed_env_steps += item.stats.env_steps
        return item

    def drain(self) -> list[Chunk]:
        """Wait for every collection step asked for and return them; the thread is then idle."""
        return [self.next_chunk() for _ in range(self.outstanding)]

    def publish(self, *, force: bool = False) -> None:
        """Offer the learner's weights to the acting copy, once ``sync_interval`` gradient
        steps have passed since the last time (or now, with ``force``)."""
        steps = self.learner.gradient_steps
        last = self._published
        if not force and last is not None and steps - last.version < self.sync_interval:
            return
        tensors = [t.clone() for t in self._learner_tensors]
        # One reference swap: the thread sees the old snapshot or the new one, never half.
        self._published = _Published(steps, tensors)

    def stop(self) -> None:
        """End the thread after the collection step in flight, if any (steps asked for and
        not yet collected are dropped)."""
        thread = self._thread
        if thread is None:
            return
        self._stopping.set()
        self._requests.put(None)
        thread.join(_STOP_JOIN_S)
        if thread.is_alive():
            warnings.warn(
                f"the collector thread did not stop within {_STOP_JOIN_S:.0f} s (an env step "
                "that does not return?); it is left to end with the process",
                RuntimeWarning,
                stacklevel=2,
            )
        self._thread = None
        self.outstanding = 0

    # ------------------------------------------------------------- the thread
    def _run(self) -> None:
        # Each thread has its own floating-point mode: flush subnormals here too, as the
        # learner's thread does while it trains.
        torch.set_flush_denormal(True)
        try:
            while True:
                request = self._requests.get()
                if request is None or self._stopping.is_set():
                    return
                self._results.put(self._collect(request))
        except BaseException as error:
            self._results.put(_Failure(error))

    def _collect(self, request: _Request) -> Chunk:
        self._refresh()
        self.actor.set_progress(request.progress)
        stats = self.collector.collect_transitions(
            self._writer,
            self.num_vector_steps,
            random_actions=request.random_actions,
            policy=self.actor,
        )
        rows, self._writer.rows = self._writer.rows, []
        self._collected_env_steps += stats.env_steps
        self.max_lead_env_steps = max(
            self.max_lead_env_steps, self._collected_env_steps - self._consumed_env_steps
        )
        self.max_update_lag = max(
            self.max_update_lag, self.learner.gradient_steps - self._actor_version
        )
        return Chunk(rows, stats, request.random_actions)

    def _refresh(self) -> None:
        published = self._published
        if published is None or published.version == self._actor_version:
            return
        torch._foreach_copy_(self._actor_tensors, published.tensors)
        self._actor_version = published.version


def update_lag_bound(max_lead_chunks: int, chunk_env_steps: int, ratio: float, sync: int) -> int:
    """The staleness bound in gradient steps (see the module docstring)."""
    return math.ceil(max_lead_chunks * chunk_env_steps * ratio) + sync - 1
