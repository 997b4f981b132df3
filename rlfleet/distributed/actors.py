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

What an actor builds its envs from has to travel to it (see :func:`env_source`): an env id
with its keyword arguments, or a factory that Ray can serialise (a Gymnasium ``EnvSpec``
rebuilt with ``gym.make``, or the user's own function); :func:`build_vec_env` turns either into
a next-step-autoreset vector env, on an actor or on the driver alike.

Observation statistics (``normalize_obs``) are the learner's: they are among the modules a
:class:`PolicyWeights` carries, actors act on observations normalised with the copy they were
sent and never change it, and fragments carry the raw observations, which the learner folds
into its statistics before it learns on them. A recurrent policy's state goes on from one
fragment to the next in the actor's collector (the envs' episodes go on too), and each
fragment stores the state every step was acted on with, so the learner replays the fragment
from its first step's state.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch
from gymnasium import spaces
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode, VectorEnv

from rlfleet.algos.base import Algorithm
from rlfleet.algos.registry import get_algorithm
from rlfleet.collect.collector import Collector
from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs.faults import EnvFaultWrapper
from rlfleet.envs.make import VectorMode, make_vec_env
from rlfleet.errors import ClusterError, EnvSpecError, EnvWorkerError
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
    env_factory: EnvFactory | None = None
    """Builds the envs instead of ``env_id`` (see :class:`EnvSource`)."""


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
        envs = build_vec_env(
            EnvSource(spec.env_id, spec.env_kwargs, spec.env_factory),
            spec.num_envs,
            seed=seed,
            mode=spec.vector_mode,
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


# ----------------------------------------------------------- what actors build
EnvFactory = Callable[[], "gym.Env[Any, Any] | VectorEnv[Any, Any, Any]"]
"""A function that builds one env, or a whole vector env."""

VECTOR_SPEC_KWARGS = ("num_envs", "vectorization_mode", "vector_kwargs")
"""Keyword arguments ``gym.make_vec`` records in a vector env's spec that belong to the vector
env, not to the env constructor."""

TRAVELS = (
    "an env id, a vector env of registered envs (built with gym.make or gym.make_vec), or a "
    "factory function Ray can serialise"
)


@dataclass(frozen=True)
class EnvSource:
    """How to build a run's envs anywhere: an env id with keyword arguments, or a factory.

    ``env_id`` names the env in the run's config and directory even when ``factory`` builds
    it (then it is the spec's id, or the factory's name).
    """

    env_id: str
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    factory: EnvFactory | None = None
    num_envs: int | None = None
    """Envs of one built vector env when the source fixes it (a given vector env, or a
    factory that returns one); None: the run's ``num_envs``."""


def env_source(env: Any, role: str, *, travels: bool = True) -> EnvSource:
    """What ``env`` (an env id, a Gymnasium env or vector env, or a factory) is rebuilt from.

    A vector env (or env) is rebuilt from its spec: one of Gymnasium's own envs as its id and
    keyword arguments when the spec is exactly what the registry builds with them, else the
    spec itself through ``gym.make`` (which replays the wrappers ``gym.make`` recorded in it
    and needs no registry entry). A factory is called
    once here, to check that it returns an env or a vector env. With ``travels`` (the training
    env, which Ray actors rebuild in other processes) a spec or factory that Ray cannot
    serialise is refused here with an EnvSpecError naming what can travel; ``role`` names the
    argument in errors.
    """
    if isinstance(env, str):
        return EnvSource(env)
    if isinstance(env, VectorEnv | gym.Env):
        source = _source_of_spec(_spec_of(env, role), role)
        num_envs = env.num_envs if isinstance(env, VectorEnv) else None
        source = dataclasses.replace(source, num_envs=num_envs)
    elif callable(env):
        built = env()
        try:
            if not isinstance(built, VectorEnv | gym.Env):
                raise EnvSpecError(
                    f"{role}: the factory returned a {type(built).__name__}, expected a "
                    "gymnasium.Env or a gymnasium.vector.VectorEnv"
                )
            spec = built.spec
            name = getattr(env, "__name__", "")
            label = spec.id if spec is not None else (name if name.isidentifier() else "factory")
            num_envs = built.num_envs if isinstance(built, VectorEnv) else None
        finally:
            if isinstance(built, VectorEnv | gym.Env):
                built.close()
        source = EnvSource(label, factory=env, num_envs=num_envs)
    else:
        raise EnvSpecError(
            f"{role}: expected an env id, a gymnasium.vector.VectorEnv or a function that "
            f"returns an env, got a {type(env).__name__}"
        )
    if travels and source.factory is not None:
        _check_serialisable(source.factory, role)
    return source


def _spec_of(env: gym.Env[Any, Any] | VectorEnv[Any, Any, Any], role: str) -> EnvSpec:
    """The spec that rebuilds one sub-env of ``env`` (or ``env`` itself)."""
    subs = getattr(env, "envs", None)
    if isinstance(env, VectorEnv) and isinstance(subs, list | tuple) and subs:
        specs: list[EnvSpec | None] = [sub.spec for sub in subs]
        if any(spec is None for spec in specs):
            raise EnvSpecError(
                f"{role}: a sub-env of the {type(env).__name__} has no spec (it was not built "
                f"with gym.make), so rollout actors cannot rebuild it; pass {TRAVELS}"
            )
        first = specs[0]
        assert first is not None
        if any(spec != first for spec in specs):
            raise EnvSpecError(
                f"{role}: the sub-envs of the {type(env).__name__} differ ({first.id} ...), "
                "but each rollout actor builds copies of one env; pass a factory instead"
            )
        return first
    spec = env.spec
    if spec is None:
        raise EnvSpecError(
            f"{role}: the {type(env).__name__} has no spec (it was not built with gym.make or "
            f"gym.make_vec), so rollout actors cannot rebuild it; pass {TRAVELS}"
        )
    if isinstance(env, VectorEnv):
        kwargs = dict(spec.kwargs)
        if kwargs.pop("wrappers", None):
            raise EnvSpecError(
                f"{role}: the vector env's spec records wrappers given to gym.make_vec, which "
                f"do not travel with it; pass a factory that applies them ({TRAVELS})"
            )
        for key in VECTOR_SPEC_KWARGS:
            kwargs.pop(key, None)
        spec = dataclasses.replace(spec, kwargs=kwargs)
    return spec


def _source_of_spec(spec: EnvSpec, role: str) -> EnvSource:
    registered = gym.registry.get(spec.id)
    kwargs = dict(spec.kwargs)
    if registered is not None and registered.max_episode_steps != spec.max_episode_steps:
        kwargs["max_episode_steps"] = spec.max_episode_steps
    # Gymnasium's own envs are registered in every process that imports it: they travel as
    # id and kwargs, and actors get the native vector env where there is one. Any other env
    # travels as its spec, which gym.make rebuilds without a registry entry (an id registered
    # only in the driver would be unknown to the actors).
    plain = (
        registered is not None
        and registered.entry_point == spec.entry_point
        and isinstance(spec.entry_point, str)
        and spec.entry_point.startswith("gymnasium.envs.")
        and not spec.additional_wrappers
        and "render_mode" not in kwargs
    )
    if plain:
        return EnvSource(spec.id, kwargs)
    return EnvSource(spec.id, factory=functools.partial(gym.make, spec))


def _check_serialisable(factory: EnvFactory, role: str) -> None:
    """Refuse a factory Ray cannot send to an actor, here rather than inside the actor."""
    try:
        # Ray is optional and heavy: imported only when a factory has to travel.
        from ray.util import inspect_serializability
    except ImportError:
        return  # without Ray nothing travels: training stops with the install hint
    report = io.StringIO()
    ok, failures = inspect_serializability(factory, name="factory", print_file=report)
    if ok:
        return
    # Ray's report colours its lines; the reasons follow "serialization:".
    reasons = [
        line.split("serialization:", 1)[1].strip()
        for line in report.getvalue().splitlines()
        if "FAIL" in line and "serialization:" in line
    ]
    culprits = sorted(" -> ".join(f.path) for f in failures)
    raise EnvSpecError(
        f"{role}: rollout actors rebuild the env in other processes, but the factory "
        f"cannot be serialised ({reasons[-1] if reasons else 'unknown reason'}; "
        f"in: {', '.join(culprits) or 'the factory'}); pass {TRAVELS}"
    )


def build_vec_env(
    source: EnvSource,
    num_envs: int,
    *,
    seed: int | None = None,
    mode: VectorMode = "auto",
) -> VectorEnv[Any, Any, Any]:
    """``num_envs`` copies of ``source``'s env as one next-step-autoreset vector env (a
    factory that returns a vector env gives that vector env, whatever ``num_envs``)."""
    if source.factory is None:
        return make_vec_env(
            source.env_id, num_envs, seed=seed, mode=mode, env_kwargs=source.env_kwargs
        )
    first = source.factory()
    envs: VectorEnv[Any, Any, Any]
    if isinstance(first, VectorEnv):
        envs = first
        found = envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        if found != AutoresetMode.NEXT_STEP:
            envs.close()
            raise EnvSpecError(
                f"{source.env_id}: the factory's vector env uses autoreset mode {found}, "
                "rlfleet expects NEXT_STEP"
            )
    else:
        fns = [functools.partial(_given, first)] + [source.factory] * (num_envs - 1)
        envs = gym.vector.SyncVectorEnv(
            [functools.partial(_with_fault_wrapper, fn, i) for i, fn in enumerate(fns)],
            autoreset_mode=AutoresetMode.NEXT_STEP,
        )
    if seed is not None:
        envs.reset(seed=seed)
        envs.action_space.seed(seed)
    return envs


def _given(env: Any) -> Any:
    return env


def _with_fault_wrapper(make: Callable[[], Any], index: int) -> gym.Env[Any, Any]:
    return EnvFaultWrapper(make(), index)
