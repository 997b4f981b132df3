"""rlfleet: deep reinforcement learning with PyTorch behind one trainer vocabulary.

The public API, re-exported here:

- algorithms (:class:`PPO`, :class:`SAC`, :class:`DQN`, ...) with their configs;
- trainers (:class:`OnPolicyTrainer`, :class:`OffPolicyTrainer`, :class:`OfflineTrainer`,
  :class:`DecentralizedTrainer`) and the actor-learner front door :class:`DistributedAgent`;
- environments (:func:`make_env`, :func:`make_vec_env`);
- runs built from a typed config (:class:`RunConfig`, :func:`default_run_config`; train one
  with :func:`rlfleet.runs.run.train`);
- :func:`load`, which reads back what ``algo.save`` or a run wrote;
- the typed errors every bad input raises.

Importing rlfleet also installs the training backend behind ``Algorithm.learn``
(:class:`rlfleet.runs.learn.RunBackend`): this package is the composition root, the one
place that sees every layer, so the algorithms need not import the trainers above them.
"""

from rlfleet.algos import (
    A2C,
    ACER,
    APPO,
    BC,
    CQL,
    DDPG,
    DQN,
    IMPALA,
    IQL,
    PPO,
    SAC,
    TD3,
    TD3BC,
    TRPO,
    A2CConfig,
    ACERConfig,
    Algorithm,
    APPOConfig,
    BCConfig,
    CQLConfig,
    DDPGConfig,
    DQNConfig,
    IMPALAConfig,
    IQLConfig,
    PPOConfig,
    SACConfig,
    TD3BCConfig,
    TD3Config,
    TRPOConfig,
    get_algorithm,
    list_algorithms,
)
from rlfleet.algos.base import install_training_backend
from rlfleet.envs.make import make_env, make_vec_env
from rlfleet.errors import (
    CheckpointError,
    ConfigError,
    EnvSpecError,
    EnvWorkerError,
    MissingDependencyError,
    NonFiniteError,
    RlfleetError,
    RunDirError,
)
from rlfleet.marl.trainer import DecentralizedTrainer, MultiAgentSettings
from rlfleet.runs.config import EnvConfig, RunConfig, default_run_config
from rlfleet.runs.distributed_agent import DistributedAgent
from rlfleet.runs.learn import RunBackend, load
from rlfleet.runs.run import load_algorithm
from rlfleet.train.loop import TrainerConfig, TrainResult
from rlfleet.train.trainer import OfflineTrainer, OffPolicyTrainer, OnPolicyTrainer, Trainer
from rlfleet.version import __version__

install_training_backend(RunBackend())

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
    "CheckpointError",
    "ConfigError",
    "DDPGConfig",
    "DQNConfig",
    "DecentralizedTrainer",
    "DistributedAgent",
    "EnvConfig",
    "EnvSpecError",
    "EnvWorkerError",
    "IMPALAConfig",
    "IQLConfig",
    "MissingDependencyError",
    "MultiAgentSettings",
    "NonFiniteError",
    "OffPolicyTrainer",
    "OfflineTrainer",
    "OnPolicyTrainer",
    "PPOConfig",
    "RlfleetError",
    "RunConfig",
    "RunDirError",
    "SACConfig",
    "TD3BCConfig",
    "TD3Config",
    "TRPOConfig",
    "TrainResult",
    "Trainer",
    "TrainerConfig",
    "__version__",
    "default_run_config",
    "get_algorithm",
    "list_algorithms",
    "load",
    "load_algorithm",
    "make_env",
    "make_vec_env",
]
