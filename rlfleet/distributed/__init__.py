"""Actor-learner training on Ray: rollout actors, learners, versioned weight broadcast.

Ray is an optional extra (``pip install 'rlfleet[ray]'``); it is imported only when a
distributed run starts. See ``docs/distributed.md`` for running on a multi-node cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlfleet.distributed.config import DistributedConfig

if TYPE_CHECKING:
    from rlfleet.distributed.agent import DistributedAgent
    from rlfleet.distributed.trainer import DistributedTrainer

__all__ = ["DistributedAgent", "DistributedConfig", "DistributedTrainer"]


def __getattr__(name: str) -> Any:
    # Imported on first use: the trainer modules import rlfleet.train.run, which imports
    # DistributedConfig from this package.
    if name == "DistributedAgent":
        from rlfleet.distributed.agent import DistributedAgent

        return DistributedAgent
    if name == "DistributedTrainer":
        from rlfleet.distributed.trainer import DistributedTrainer

        return DistributedTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
