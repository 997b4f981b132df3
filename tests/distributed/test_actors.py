"""Rollout actors: a worker run in-process (no Ray), and the driver's scheduling, weight
broadcast and restarts on an in-process stand-in for Ray that runs each call at once."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rlfleet.algos import IMPALA
from rlfleet.algos.impala import IMPALAConfig
from rlfleet.distributed.actors import (
    RolloutActors,
    RolloutWorker,
    WorkerSpec,
    fragment_storage,
    load_policy_weights,
    policy_weights,
)
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import ClusterError

SPEC = WorkerSpec(
    env_id="CartPole-v1",
    num_envs=2,
    vector_mode="sync",
    env_kwargs={},
    algo="impala",
    hyperparameters=IMPALAConfig(num_steps=8),
    seed=3,
)


def _algorithm() -> IMPALA:
    envs = make_vec_env("CartPole-v1", 1, seed=0)
    try:
        return IMPALA(envs.single_observation_space, envs.single_action_space, SPEC.hyperparameters)
    finally:
        envs.close()


def test_policy_weights_are_a_cpu_snapshot_that_loads_into_another_copy() -> None:
    source, target = _algorithm(), _algorithm()
    weights = policy_weights(source, version=4)
    assert weights.version == 4
    with torch.no_grad():
        for parameter in source.net.parameters():
            parameter.add_(1.0)  # later updates do not reach the snapshot
    load_policy_weights(target, weights)
    assert not torch.equal(target.parameters_vector(), source.parameters_vector())
    load_policy_weights(target, policy_weights(source, version=5))
    assert torch.equal(target.parameters_vector(), source.parameters_vector())


def test_a_worker_collects_fragments_with_its_own_seed_and_the_weights_it_is_sent() -> None:
    first, again, second = RolloutWorker(0, SPEC), RolloutWorker(0, SPEC), RolloutWorker(1, SPEC)
    obs_space, action_space = first.start()
    assert obs_space.shape == (4,)
    assert action_space.n == 2  # type: ignore[attr-defined]
    info, fragment = first.collect(None)
    assert (info.actor, info.policy_version) == (0, -1)
    assert fragment.obs.shape == (8, 2, 4)
    assert info.stats.env_steps == 16
    _, same = again.collect(None)  # started on demand, same index: same seed
    assert torch.equal(same.obs, fragment.obs)
    _, other = second.collect(None)  # another index: another stream
    assert not torch.equal(other.obs[0], fragment.obs[0])

    trained = _algorithm()
    with torch.no_grad():
        for parameter in trained.net.parameters():
            parameter.mul_(-1.0)
    info, _ = first.collect(policy_weights(trained, version=7))
    assert info.policy_version == 7
    assert first.running is not None
    assert torch.equal(first.running[0].algorithm.parameters_vector(), trained.parameters_vector())
    info, _ = first.collect(None)  # no weights: keeps the version it has
    assert info.policy_version == 7


# --------------------------------------------------------------------------- fake Ray
class _ActorDied(Exception):
    pass


class _TaskFailed(Exception):
    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _Ref:
    def __init__(self, value: Any = None, error: Exception | None = None) -> None:
        self.value, self.error = value, error


class _Method:
    def __init__(self, handle: _Handle, name: str, num_returns: int = 1) -> None:
        self.handle, self.name, self.num_returns = handle, name, num_returns

    def options(self, num_returns: int) -> _Method:
        return _Method(self.handle, self.name, num_returns)

    def remote(self, *args: Any) -> Any:
        handle = self.handle
        handle.calls.append((self.name, args))
        if handle.dies_on_call == len(handle.calls):
            refs = [_Ref(error=_ActorDied("actor died")) for _ in range(self.num_returns)]
        else:
            result = getattr(handle.worker, self.name)(*args)
            values = result if self.num_returns > 1 else (result,)
            refs = [_Ref(value) for value in values]
        return tuple(refs) if self.num_returns > 1 else refs[0]


class _Handle:
    def __init__(self, fake: FakeRay, index: int, spec: WorkerSpec) -> None:
        self.worker = _Worker(index)
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.dies_on_call = fake.deaths.pop(index, None)
        self.killed = False

    def __getattr__(self, name: str) -> _Method:
        return _Method(self, name)


class _Worker:
    """Stands in for RolloutWorker: a fragment is just the actor and the version it had."""

    def __init__(self, index: int) -> None:
        self.index, self.version = index, -1

    def start(self) -> str:
        return f"spaces of {self.index}"

    def collect(self, weights: Any) -> tuple[Any, Any]:
        if weights is not None:
            self.version = weights
        return (self.index, self.version), f"fragment of {self.index}"


class FakeRay:
    """What RolloutActors calls of ``ray``, run synchronously in this process."""

    class exceptions:  # mirrors ray.exceptions
        RayTaskError = _TaskFailed
        RayActorError = _ActorDied

    def __init__(self, deaths: dict[int, int] | None = None) -> None:
        self.deaths = dict(deaths or {})
        """Actor index -> the call on which its next handle dies."""
        self.handles: list[_Handle] = []

    def remote(self, cls: type) -> Any:
        fake = self

        class Remote:
            def options(self, **_: Any) -> Remote:
                return self

            def remote(self, index: int, spec: WorkerSpec) -> _Handle:
                handle = _Handle(fake, index, spec)
                fake.handles.append(handle)
                return handle

        return Remote()

    def wait(
        self, refs: list[_Ref], num_returns: int, timeout: float
    ) -> tuple[list[_Ref], list[_Ref]]:
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref: _Ref) -> Any:
        if ref.error is not None:
            raise ref.error
        return ref.value

    def kill(self, handle: _Handle, no_restart: bool) -> None:
        handle.killed = True


def _actors(ray: FakeRay, **options: Any) -> Any:
    """RolloutActors on the fake Ray (typed Any: its fragments are the fake worker's tuples)."""
    settings: dict[str, Any] = dict(
        num_actors=2,
        requests_per_actor=1,
        num_storages=2,
        max_restarts=1,
        num_cpus=1.0,
        fragment_timeout_s=1.0,
    )
    settings.update(options)
    return RolloutActors(ray, SPEC, **settings)


def test_fragments_come_from_every_actor_and_weights_go_once_per_version() -> None:
    ray = FakeRay()
    actors = _actors(ray)
    assert actors.start(timeout_s=1.0) == ["spaces of 0", "spaces of 1"]
    first = actors.gather(2)
    assert sorted(info for info, _ in first) == [(0, -1), (1, -1)]
    assert [ray.get(ref) for _, ref in first] in (
        ["fragment of 0", "fragment of 1"],
        ["fragment of 1", "fragment of 0"],
    )
    actors.set_weights(1, 1)
    second = actors.gather(2)
    assert sorted(info for info, _ in second) == [(0, 1), (1, 1)]
    actors.gather(2)
    sent = [[args[0] for name, args in h.calls if name == "collect"] for h in ray.handles]
    # Each actor gets the version-1 weights with exactly one request, then none.
    assert [requests.count(1) for requests in sent] == [1, 1]
    assert len(actors.pending) <= actors.num_storages


def test_num_storages_bounds_the_fragments_that_exist_at_once() -> None:
    # docs/distributed.md: num_storages bounds the fragments being collected, finished and
    # waiting, or held by the learner during an update. Two actors with two requests each
    # could have four out; three storages allow three.
    ray = FakeRay()
    actors = _actors(ray, requests_per_actor=2, num_storages=3)
    actors.start(timeout_s=1.0)
    seen: list[int] = []
    submit = actors._submit

    def counted(held: int) -> None:
        submit(held)
        seen.append(len(actors.pending) + held)

    actors._submit = counted
    for _ in range(6):
        batch = actors.gather(2)
        # During the update the learner holds the batch; the rest are out or waiting.
        seen.append(len(actors.pending) + len(batch))
    assert max(seen) == 3


def test_a_dead_actor_is_replaced_and_gets_the_weights_again() -> None:
    ray = FakeRay(deaths={1: 3})  # actor 1 dies on its third call (its second collect)
    actors = _actors(ray)
    actors.start(timeout_s=1.0)
    actors.set_weights(5, 5)
    infos = [info for _ in range(3) for info, _ in actors.gather(2)]
    assert actors.restarts == 1
    assert ray.handles[1].killed
    replacement = ray.handles[2]
    assert replacement.worker.index == 1
    # The replacement's first request carries the weights, so it collects with version 5.
    assert replacement.calls[0] == ("collect", (5,))
    assert (1, 5) in infos


def test_actors_that_die_past_their_restarts_end_training_with_a_cluster_error() -> None:
    ray = FakeRay(deaths={0: 2, 1: 2})
    actors = _actors(ray, max_restarts=0)
    actors.start(timeout_s=1.0)
    with pytest.raises(ClusterError, match=r"all 2 rollout actors died .* no actor is left"):
        actors.gather(2)


class _SilentRay(FakeRay):
    """Actors that start, then (once ``silent``) never return a fragment: every wait times
    out."""

    silent = False
    waited = 0.0

    def wait(
        self, refs: list[_Ref], num_returns: int, timeout: float
    ) -> tuple[list[_Ref], list[_Ref]]:
        if not self.silent:
            return super().wait(refs, num_returns, timeout)
        self.waited = timeout
        return [], refs


def test_no_fragment_within_the_timeout_stops_the_run_with_a_cluster_error() -> None:
    ray = _SilentRay()
    actors = _actors(ray, fragment_timeout_s=7.0)
    actors.start(timeout_s=1.0)
    ray.silent = True
    with pytest.raises(ClusterError, match=r"no rollout fragment arrived within 7 s"):
        actors.gather(2)
    assert ray.waited == 7.0


def test_statistics_reach_actors_with_the_weights_and_only_the_learner_changes_them() -> None:
    config = IMPALAConfig(num_steps=8, normalize_obs=True)
    spec = WorkerSpec("CartPole-v1", 2, "sync", {}, "impala", config, seed=3)
    worker = RolloutWorker(0, spec)
    obs_space, action_space = worker.start()
    learner = IMPALA(obs_space, action_space, config)
    assert learner.obs_stats.normalizer is not None
    _, fragment = worker.collect(policy_weights(learner, version=0))
    assert worker.running is not None
    copy = worker.running[0].algorithm
    assert isinstance(copy, IMPALA)
    assert copy.obs_stats.normalizer is not None
    assert float(copy.obs_stats.normalizer.count) == pytest.approx(
        1e-4
    )  # collecting did not change them
    batch = fragment_storage(learner, 8, 2)
    batch.copy_envs_from(fragment, 0)
    learner.update(batch)  # the learner folds the raw observations the fragment carries
    assert float(learner.obs_stats.normalizer.count) == pytest.approx(16 + 1e-4)
    assert float(copy.obs_stats.normalizer.count) == pytest.approx(1e-4)
    worker.collect(policy_weights(learner, version=1))
    for name in ("mean", "var", "count"):
        assert torch.equal(
            getattr(copy.obs_stats.normalizer, name), getattr(learner.obs_stats.normalizer, name)
        )
    # the actor acts on observations normalised with the statistics it was sent
    obs = torch.randn(5, 4)
    sent = copy.act(obs, deterministic=True).values
    assert torch.equal(
        sent, learner.net.act(learner.obs_stats.normalizer(obs), learner.generator).values
    )


def test_a_recurrent_worker_carries_its_state_and_ships_the_state_of_every_step() -> None:
    config = IMPALAConfig(num_steps=8, lstm_hidden_size=4)
    spec = WorkerSpec("CartPole-v1", 2, "sync", {}, "impala", config, seed=3)
    worker = RolloutWorker(0, spec)
    worker.start()
    _, first = worker.collect(None)
    assert first.states is not None
    assert first.states.shape == (8, 2, 2, 4)
    assert torch.equal(first.states[0], torch.zeros(2, 2, 4))  # a fresh start
    assert worker.running is not None
    carried = worker.running[0].runner.state
    assert carried is not None
    keep = first.valid[-1].view(2, 1, 1)  # an env whose last step was a reset step restarts
    _, second = worker.collect(None)
    assert second.states is not None
    assert torch.equal(second.states[0], carried * keep)
    assert second.states[0].abs().sum() > 0
