"""Where and how wide an actor-learner run spreads: the ``distributed:`` section of a run,
and the documented defaults of :class:`rlfleet.DistributedAgent` fitted to the machine."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Literal

from rlfleet.config.fields import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from rlfleet.errors import ConfigError


@dataclass
class DistributedConfig:
    """Actors, learners and the Ray cluster of a distributed run (IMPALA, APPO)."""

    num_actors: PositiveInt = 2
    """Rollout actors, each with its own vector env (``num_envs`` envs) and policy copy."""
    num_learners: PositiveInt = 1
    """Learners; more than one average their gradients (torch.distributed, gloo)."""
    num_storages: PositiveInt | None = None
    """Most fragments that exist at once, being collected or waiting for the learner
    (unset: ``requests_per_actor * num_actors``)."""
    requests_per_actor: Literal[1, 2] = 2
    """Collection requests in flight per actor: 2 lets an actor start the next fragment
    while the learner consumes the last one."""
    ray_address: str | None = None
    """Ray cluster to join: ``auto``, ``ray://HOST:PORT`` or ``HOST:PORT`` (unset: the
    ``RAY_ADDRESS`` environment variable's, else start a local cluster)."""
    actor_num_cpus: PositiveFloat = 1.0
    """CPUs Ray reserves for each rollout actor (fractions pack several on one core)."""
    learner_num_cpus: PositiveFloat = 1.0
    """CPUs Ray reserves for each learner actor (with ``num_learners > 1``)."""
    learner_num_gpus: NonNegativeFloat = 0.0
    """GPUs per learner actor: 1 places learners on GPU nodes and trains there on CUDA
    (with ``num_learners > 1``)."""
    max_actor_restarts: NonNegativeInt = 3
    """Times each rollout actor that dies is replaced by a new one before it counts as lost."""
    fragment_timeout_s: PositiveFloat = 300.0
    """Longest wait for any fragment before the run stops with an error."""
    th_compile: bool = False
    """Run the learner's loss through ``torch.compile``."""

    @property
    def storages(self) -> int:
        """``num_storages``, or its default."""
        return self.num_storages or self.requests_per_actor * self.num_actors

    @property
    def cpus_reserved(self) -> int:
        """CPUs the actors and learner actors reserve together, rounded up."""
        learners = self.num_learners * self.learner_num_cpus if self.num_learners > 1 else 0.0
        return math.ceil(self.num_actors * self.actor_num_cpus + learners)

    def check(self, batch_fragments: int) -> None:
        """Refuse settings that could never run: ConfigError naming the fields."""
        if self.storages < self.num_actors:
            raise ConfigError(
                f"num_storages ({self.storages}) must be >= num_actors ({self.num_actors}): "
                "every actor needs a storage to fill"
            )
        needed = batch_fragments * self.num_learners
        if self.storages < needed:
            raise ConfigError(
                f"num_storages ({self.storages}) must be >= batch_fragments x num_learners "
                f"({batch_fragments} x {self.num_learners} = {needed}): the learners wait for "
                "that many fragments at once"
            )
        if self.ray_address is not None and not self.ray_address.strip():
            raise ConfigError("ray_address is empty; leave it unset to start a local cluster")


DOCUMENTED_NUM_ACTORS = 45
"""RLLTE's documented default of ``DistributedAgent(num_actors=...)``."""
DOCUMENTED_NUM_LEARNERS = 4
"""RLLTE's documented default of ``num_learners``."""
DOCUMENTED_NUM_STORAGES = 60
"""RLLTE's documented default of ``num_storages``."""


def fitted_defaults(
    num_actors: int | None,
    num_learners: int | None,
    num_storages: int | None,
    cpus: int | None,
    *,
    batch_fragments: int,
) -> tuple[int, int, int]:
    """``(num_actors, num_learners, num_storages)``: the given values, and for those left
    unset RLLTE's documented 45 / 4 / 60, fitted to ``cpus`` (None: not known, e.g. a remote
    cluster not joined yet; the documented values stand).

    Each actor and each learner actor reserves one CPU, and the driver keeps one. The
    documented 45 actors and 4 learners need 50; with fewer CPUs an unset ``num_learners``
    becomes 1 (the driver learns, reserving no CPU of its own) and an unset ``num_actors``
    becomes what the remaining CPUs hold (at least 1), each change with a warning naming
    both numbers. An unset ``num_storages`` is 60, raised to what the actors and learners
    need (``num_actors`` and ``batch_fragments x num_learners``). Values that are given are
    kept as they are.
    """
    full = DOCUMENTED_NUM_ACTORS + DOCUMENTED_NUM_LEARNERS + 1
    learners = num_learners
    if learners is None:
        learners = DOCUMENTED_NUM_LEARNERS
        if cpus is not None and cpus < full:
            learners = 1
            _fitted("num_learners", DOCUMENTED_NUM_LEARNERS, learners, cpus)
    actors = num_actors
    if actors is None:
        actors = DOCUMENTED_NUM_ACTORS
        if cpus is not None:
            room = cpus - 1 - (learners if learners > 1 else 0)
            actors = max(1, min(DOCUMENTED_NUM_ACTORS, room))
            if actors != DOCUMENTED_NUM_ACTORS:
                _fitted("num_actors", DOCUMENTED_NUM_ACTORS, actors, cpus)
    storages = num_storages
    if storages is None:
        storages = max(DOCUMENTED_NUM_STORAGES, actors, batch_fragments * learners)
    return actors, learners, storages


def _fitted(name: str, documented: int, used: int, cpus: int) -> None:
    warnings.warn(
        f"{name}: the documented default {documented} needs more than the {cpus} CPUs "
        f"available; using {used} (pass {name} to choose)",
        UserWarning,
        stacklevel=4,
    )
