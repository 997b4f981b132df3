"""Algorithms, one file each, registered by name."""

from rlfleet.algos.a2c import A2C, A2CConfig
from rlfleet.algos.acer import ACER, ACERConfig
from rlfleet.algos.appo import APPO, APPOConfig
from rlfleet.algos.base import Algorithm
from rlfleet.algos.bc import BC, BCConfig
from rlfleet.algos.cql import CQL, CQLConfig
from rlfleet.algos.ddpg import DDPG, DDPGConfig
from rlfleet.algos.dqn import DQN, DQNConfig
from rlfleet.algos.impala import IMPALA, IMPALAConfig
from rlfleet.algos.iql import IQL, IQLConfig
from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.algos.registry import get_algorithm, list_algorithms, register
from rlfleet.algos.sac import SAC, SACConfig
from rlfleet.algos.td3 import TD3, TD3Config
from rlfleet.algos.td3_bc import TD3BC, TD3BCConfig
from rlfleet.algos.trpo import TRPO, TRPOConfig

__all__ = [
    "A2C",
    "ACER",
    "APPO",
    "BC",
    "CQL",
    "DDPG",
    "DQN",
    "IMPALA",
    "IQL",
    "PPO",
    "SAC",
    "TD3",
    "TD3BC",
    "TRPO",
    "A2CConfig",
    "ACERConfig",
    "APPOConfig",
    "Algorithm",
    "BCConfig",
    "CQLConfig",
    "DDPGConfig",
    "DQNConfig",
    "IMPALAConfig",
    "IQLConfig",
    "PPOConfig",
    "SACConfig",
    "TD3BCConfig",
    "TD3Config",
    "TRPOConfig",
    "get_algorithm",
    "list_algorithms",
    "register",
]
