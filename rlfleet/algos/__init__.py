"""Algorithms, one file each, registered by name."""

from rlfleet.algos.base import Algorithm
from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.algos.registry import get_algorithm, list_algorithms, register

__all__ = ["PPO", "Algorithm", "PPOConfig", "get_algorithm", "list_algorithms", "register"]
