"""Actor-learner training on Ray: rollout actors, learners, versioned weight broadcast.

Ray is an optional extra (``pip install 'rlfleet[ray]'``); it is imported only when a
distributed run starts. :class:`rlfleet.DistributedAgent` is the front door that composes a
run from these pieces. See ``docs/distributed.md`` for running on a multi-node cluster.
"""

from rlfleet.distributed.config import DistributedConfig
from rlfleet.distributed.trainer import DistributedTrainer

__all__ = ["DistributedConfig", "DistributedTrainer"]
