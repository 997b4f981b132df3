"""Algorithms, one file each, registered by name."""

from rlfleet.algos.appo import APPO, APPOConfig
from rlfleet.algos.base import Algorithm
from rlfleet.algos.bc import BC, BCConfig
from rlfleet.algos.ddpg import DDPG, DDPGConfig
from rlfleet.algos.dqn import DQN, DQNConfig
from rlfleet.algos.impala import IMPALA, IMPALAConfig
from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.algos.registry import get_algorithm, list_algorithms, register
from rlfleet.algos.sac import SAC, SACConfig
from rlfleet.algos.td3 import TD3, TD3Config

__all__ = [
    "APPO",
    "BC",
    "DDPG",
    "DQN",
    "IMPALA",
    "PPO",
    "SAC",
    "TD3",
    "APPOConfig",
    "Algorithm",
    "BCConfig",
    "DDPGConfig",
    "DQNConfig",
    "IMPALAConfig",
    "PPOConfig",
    "SACConfig",
    "TD3Config",
    "get_algorithm",
    "list_algorithms",
    "register",
]
