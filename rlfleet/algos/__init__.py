"""Algorithms, one file each, registered by name."""

from rlfleet.algos.appo import APPO, APPOConfig
from rlfleet.algos.base import Algorithm
from rlfleet.algos.impala import IMPALA, IMPALAConfig
from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.algos.registry import get_algorithm, list_algorithms, register

__all__ = [
    "APPO",
    "IMPALA",
    "PPO",
    "APPOConfig",
    "Algorithm",
    "IMPALAConfig",
    "PPOConfig",
    "get_algorithm",
    "list_algorithms",
    "register",
]
