"""Where and how wide an actor-learner run spreads: the ``distributed:`` section of a run."""

from __future__ import annotations

import math
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
    """Ray cluster to join: ``auto``, ``ray://HOST:PORT`` or ``HOST:PORT`` (unset: start a
    local cluster)."""
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
