"""rlfleet: deep reinforcement learning with PyTorch behind one trainer vocabulary.

The public API, re-exported here: build a run from a preset and train it
(:func:`default_run_config`, :func:`train`, :func:`load_algorithm`), or assemble the pieces
(:func:`make_vec_env`, an algorithm such as :class:`PPO`, a trainer such as
:class:`OnPolicyTrainer`).
"""

__version__ = "0.1.0"

from rlfleet.algos import PPO, Algorithm, PPOConfig, get_algorithm, list_algorithms
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
from rlfleet.train.run import RunConfig, default_run_config, load_algorithm, train
from rlfleet.train.trainer import OnPolicyTrainer, Trainer, TrainerConfig, TrainResult

__all__ = [
    "PPO",
    "Algorithm",
    "CheckpointError",
    "ConfigError",
    "EnvSpecError",
    "EnvWorkerError",
    "MissingDependencyError",
    "NonFiniteError",
    "OnPolicyTrainer",
    "PPOConfig",
    "RlfleetError",
    "RunConfig",
    "RunDirError",
    "TrainResult",
    "Trainer",
    "TrainerConfig",
    "__version__",
    "default_run_config",
    "get_algorithm",
    "list_algorithms",
    "load_algorithm",
    "make_env",
    "make_vec_env",
    "train",
]
