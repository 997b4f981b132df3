"""Algorithms, one file each, registered by name."""

from rlfleet.algos.a2c import A2C, A2CConfig
from rlfleet.algos.acer import ACER, ACERConfig
from rlfleet.algos.base import Algorithm
from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.algos.registry import get_algorithm, list_algorithms, register
from rlfleet.algos.trpo import TRPO, TRPOConfig

__all__ = [
    "A2C",
    "ACER",
    "PPO",
    "TRPO",
    "A2CConfig",
    "ACERConfig",
    "Algorithm",
    "PPOConfig",
    "TRPOConfig",
    "get_algorithm",
    "list_algorithms",
    "register",
]
