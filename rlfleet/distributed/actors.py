"""Rollout actors: Ray actors that step their own vector env with a copy of the policy.

Each :class:`RolloutWorker` runs the same :class:`~rlfleet.collect.collector.Collector` and
:class:`~rlfleet.data.rollout.RolloutStorage` as single-process training and answers a
``collect`` request with one fragment of ``num_steps`` vector steps. The driver's
:class:`RolloutActors` keeps at most ``requests_per_actor`` requests in flight per actor and
``num_storages`` fragments in existence at once (being collected, waiting, or held by the
learner), and replaces actors that die.

Weights travel through Ray's object store: after each update the learner puts one
:class:`PolicyWeights` object there, and the next request to each actor carries a reference
to it, which Ray resolves on the actor's node. An actor that already has that version gets
no weights with its request. Every fragment records the version that collected it, so the
trainer can log the policy lag.

Observation statistics (``normalize_obs``) are the learner's: they are among the modules a
:class:`PolicyWeights` carries, actors act on observations normalised with the copy they were
sent and never change it, and fragments carry the raw observations, which the learner folds
into its statistics before it learns on them. A recurrent policy's state goes on from one
fragment to the next in the actor's collector (the envs' episodes go on too), and each
fragment stores the state every step was acted on with, so the learner replays the fragment
from its first step's state.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch
from gymnasium import spaces

from rlfleet.algos.base import Algorithm
from rlfleet.algos.registry import get_algorithm
from rlfleet.collect.collector import Collector
from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs.make import VectorMode, make_vec_env
from rlfleet.errors import ClusterError, EnvWorkerError
from rlfleet.types import CollectStats

log = logging.getLogger("rlfleet.distributed")

SEED_STRIDE = 7919
"""Actor ``i`` seeds its envs and sampling with ``seed + SEED_STRIDE * (i + 1)``: distinct
streams per actor, none equal to the learner's or the test envs' seed."""


@dataclass(frozen=True)
class PolicyWeights:
    """A versioned copy of an algorithm's module weights (what actors need to act).

    ``modules`` holds the state dict of every module the algorithm saves, the learner's
    observation statistics (``obs_normalizer``) included when it normalises observations.
    """

    version: int
    modules: dict[str, dict[str, torch.Tensor]]


def policy_weights(algorithm: Algorithm[Any], version: int) -> PolicyWeights:
    """Snapshot ``algorithm``'s module weights (and observation statistics) on the CPU."""
    return PolicyWeights(
        version,
        {
            name: {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
            for name, module in algorithm.modules().items()
        },
    )


def load_policy_weights(algorithm: Algorithm[Any], weights: PolicyWeights) -> None:
    """Copy a :class:`PolicyWeights` snapshot into ``algorithm``'s modules."""
    for name, module in algorithm.modules().items():
        module.load_state_dict(weights.modules[name])


def fragment_storage(algorithm: Algorithm[Any], num_steps: int, num_envs: int) -> RolloutStorage:
    """Storage for ``num_envs`` envs' fragments of ``num_steps`` steps collected by
    ``algorithm``'s policy: observations as it keeps them (uint8 images), and the recurrent
    state of every step when the policy has one."""
    state = algorithm.initial_state(1)
    return RolloutStorage(
        num_steps,
        num_envs,
        algorithm.obs_layout.shape,
        algorithm.action_shape,
        obs_dtype=algorithm.obs_layout.dtype,
        action_dtype=algorithm.action_dtype,
        state_shape=None if state is None else tuple(state.shape[1:]),
    )


@dataclass(frozen=True)
class FragmentInfo:
    """What the driver needs to know about a fragment (the data itself goes to the learner)."""

    actor: int
    policy_version: int
    """Version of the weights that collected it (-1: the actor's initial weights)."""
    stats: CollectStats
    collect_s: float
    """Seconds the actor spent collecting it."""


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a rollout actor needs to build its env and policy copy."""

    env_id: str
    num_envs: int
    vector_mode: VectorMode
    env_kwargs: dict[str, Any]
    algo: str
    hyperparameters: Any
    seed: int


class RolloutWorker:
    """The body of one rollout actor (wrapped by ``ray.remote`` on the driver).

    The constructor only stores its arguments: Ray reruns it when it restarts a dead actor,
    and an env that fails to build should fail a :meth:`start` call, whose error reaches the
    driver as it was raised, rather than the actor's creation.
    """

    def __init__(self, index: int, spec: WorkerSpec) -> None:
        self.index = index
        self.spec = spec
        self.version = -1
        self.running: tuple[Collector, RolloutStorage] | None = None
        """The collector (env + policy copy) and the storage it fills, once started."""

    def start(self) -> tuple[spaces.Space[Any], spaces.Space[Any]]:
        """Build the vector env, the policy copy and the storage; returns the env's spaces."""
        # Small networks run fastest on one thread, and actors share the node's cores.
        torch.set_num_threads(1)
        spec = self.spec
        seed = spec.seed + SEED_STRIDE * (self.index + 1)
        envs = make_vec_env(
            spec.env_id, spec.num_envs, seed=seed, mode=spec.vector_mode, env_kwargs=spec.env_kwargs
        )
        obs_space, action_space = envs.single_observation_space, envs.single_action_space
        algorithm = get_algorithm(spec.algo)(
            obs_space, action_space, spec.hyperparameters, seed=seed
        )
        storage = fragment_storage(algorithm, spec.hyperparameters.num_steps, spec.num_envs)
        self.running = (Collector(envs, algorithm, seed=seed), storage)
        return obs_space, action_space

    def collect(self, weights: PolicyWeights | None) -> tuple[FragmentInfo, RolloutStorage]:
        """Load ``weights`` if given, then collect one fragment."""
        if self.running is None:
            self.start()
        assert self.running is not None
        collector, storage = self.running
        if weights is not None:
            load_policy_weights(collector.algorithm, weights)
            self.version = weights.version
        start = time.perf_counter()
        stats = collector.collect_rollout(storage)
        info = FragmentInfo(self.index, self.version, stats, time.perf_counter() - start)
        # Ray serialises the return value before the next request runs, so the one storage
        # can be refilled in place.
        return info, storage


class RolloutActors:
    """The driver's handle on all rollout actors: requests, fragments, restarts.

    Args:
        ray: the imported ``ray`` module.
        spec: how each actor builds its env and policy.
        num_actors / requests_per_actor / num_storages / max_restarts / num_cpus /
        fragment_timeout_s: see :class:`~rlfleet.distributed.config.DistributedConfig`.
    """

    def __init__(
        self,
        ray: Any,
        spec: WorkerSpec,
        *,
        num_actors: int,
        requests_per_actor: int,
        num_storages: int,
        max_restarts: int,
        num_cpus: float,
        fragment_timeout_s: float,
    ) -> None:
        self.ray = ray
        self.requests_per_actor = requests_per_actor
        self.num_storages = num_storages
        self.max_restarts = max_restarts
        self.fragment_timeout_s = fragment_timeout_s
        self.spec = spec
        # Restarts are the driver's, not Ray's (max_restarts=0): the driver then knows exactly
        # when an actor was replaced, so it can resend the weights and log the restart.
        self._remote = ray.remote(RolloutWorker).options(num_cpus=num_cpus, max_restarts=0)
        self.handles = [self._remote.remote(i, spec) for i in range(num_actors)]
        self.in_flight = [0] * num_actors
        self.sent_version = [-1] * num_actors
        self.failures = [0] * num_actors
        self.alive = [True] * num_actors
        self.restarts = 0
        """Actors that died and were replaced while training went on."""
        self.pending: dict[Any, tuple[int, Any]] = {}
        self.weights: tuple[int, Any] | None = None
        self._next = 0

    def start(self, timeout_s: float) -> list[tuple[spaces.Space[Any], spaces.Space[Any]]]:
        """Build every actor's env; an actor's error is raised here with its own message."""
        refs = [handle.start.remote() for handle in self.handles]
        _, not_ready = self.ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if not_ready:
            raise ClusterError(
                f"{len(not_ready)} of {len(refs)} rollout actors did not start within "
                f"{timeout_s:.0f} s: the cluster may not have the CPUs they reserve "
                "(num_actors x actor_num_cpus); lower actor_num_cpus or add nodes"
            )
        found = []
        for index, ref in enumerate(refs):
            try:
                found.append(self.ray.get(ref))
            except self.ray.exceptions.RayTaskError as err:
                raise EnvWorkerError(
                    f"rollout actor {index} could not start: {_cause(err)}"
                ) from None
            except self.ray.exceptions.RayActorError as err:
                raise ClusterError(f"rollout actor {index} died while starting: {err}") from None
        return found

    def set_weights(self, version: int, ref: Any, *, resend: bool = False) -> None:
        """Weights that requests from now on carry to actors that lack this version (to every
        actor with ``resend``, for new weights under an old version number)."""
        self.weights = (version, ref)
        if resend:
            self.sent_version = [-1] * len(self.handles)

    def gather(self, count: int) -> list[tuple[FragmentInfo, Any]]:
        """Wait for ``count`` fragments; returns their infos and object refs (the data)."""
        ray = self.ray
        out: list[tuple[FragmentInfo, Any]] = []
        while len(out) < count:
            self._submit(held=len(out))
            ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=self.fragment_timeout_s)
            if not ready:
                raise ClusterError(
                    f"no rollout fragment arrived within {self.fragment_timeout_s:.0f} s "
                    "(fragment_timeout_s)"
                )
            actor, data_ref = self.pending.pop(ready[0])
            self.in_flight[actor] -= 1
            try:
                info = ray.get(ready[0])
            except ray.exceptions.RayTaskError as err:
                raise EnvWorkerError(f"rollout actor {actor} failed: {_cause(err)}") from None
            except ray.exceptions.RayActorError as err:
                self._lost(actor, err)
                continue
            out.append((info, data_ref))
        return out

    def _submit(self, held: int) -> None:
        """Send requests while storages are free, fewest-in-flight actor first."""
        n = len(self.handles)
        while len(self.pending) + held < self.num_storages:
            order = [(self._next + k) % n for k in range(n)]
            candidates = [
                i for i in order if self.alive[i] and self.in_flight[i] < self.requests_per_actor
            ]
            if not candidates:
                return
            actor = min(candidates, key=lambda i: self.in_flight[i])
            self._next = (actor + 1) % n
            weights = None
            if self.weights is not None and self.sent_version[actor] < self.weights[0]:
                weights = self.weights[1]
                self.sent_version[actor] = self.weights[0]
            info_ref, data_ref = self.handles[actor].collect.options(num_returns=2).remote(weights)
            self.pending[info_ref] = (actor, data_ref)
            self.in_flight[actor] += 1

    def _lost(self, actor: int, err: Exception) -> None:
        """An actor died: forget its requests and start a replacement while restarts last."""
        for ref, (owner, _) in list(self.pending.items()):
            if owner == actor:
                del self.pending[ref]
                self.in_flight[actor] -= 1
        self.failures[actor] += 1
        reason = str(err).strip().splitlines()[0]
        self.ray.kill(self.handles[actor], no_restart=True)
        if self.failures[actor] > self.max_restarts:
            self.alive[actor] = False
            log.error(
                "rollout actor %d is lost (%s) after %d restarts", actor, reason, self.max_restarts
            )
            if not any(self.alive):
                raise ClusterError(
                    f"all {len(self.handles)} rollout actors died (last: {reason}) and used up "
                    f"their max_actor_restarts ({self.max_restarts}); no actor is left"
                )
            return
        self.handles[actor] = self._remote.remote(actor, self.spec)
        # The replacement builds its policy from scratch: it needs the weights again.
        self.sent_version[actor] = -1
        self.restarts += 1
        log.warning(
            "rollout actor %d died (%s); started a replacement (restart %d of %d), "
            "training goes on",
            actor,
            reason,
            self.failures[actor],
            self.max_restarts,
        )

    def shutdown(self) -> None:
        """Stop every actor for good."""
        for handle in self.handles:
            self.ray.kill(handle, no_restart=True)
        self.pending.clear()


def _cause(err: Exception) -> str:
    """The remote exception as its own type and message, without Ray's wrapping."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    return str(err)
