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

Each name is imported on first use (PEP 562 ``__getattr__``), so that ``import rlfleet``, and
the ``rlfleet`` command that imports it, do not pay for torch and the trainers before they
need them; type checkers and IDEs read the names from the ``TYPE_CHECKING`` imports below.

This package is also the composition root, the one place that sees every layer: it installs
the training backend behind ``Algorithm.learn`` (:class:`rlfleet.runs.learn.RunBackend`) the
moment :mod:`rlfleet.algos` has been imported, however it was reached (``import rlfleet``
runs first in every case), so the algorithms need not import the trainers above them.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

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
from rlfleet.version import __version__

if TYPE_CHECKING:
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
    from rlfleet.envs.make import make_env, make_vec_env
    from rlfleet.marl.trainer import DecentralizedTrainer, MultiAgentSettings
    from rlfleet.runs.config import EnvConfig, RunConfig, default_run_config
    from rlfleet.runs.distributed_agent import DistributedAgent
    from rlfleet.runs.learn import load
    from rlfleet.runs.run import load_algorithm
    from rlfleet.train.loop import TrainerConfig, TrainResult
    from rlfleet.train.trainer import OfflineTrainer, OffPolicyTrainer, OnPolicyTrainer, Trainer

_LAZY: dict[str, str] = {
    "A2C": "rlfleet.algos",
    "ACER": "rlfleet.algos",
    "APPO": "rlfleet.algos",
    "BC": "rlfleet.algos",
    "CQL": "rlfleet.algos",
    "DDPG": "rlfleet.algos",
    "DQN": "rlfleet.algos",
    "IMPALA": "rlfleet.algos",
    "IQL": "rlfleet.algos",
    "PPO": "rlfleet.algos",
    "SAC": "rlfleet.algos",
    "TD3": "rlfleet.algos",
    "TD3BC": "rlfleet.algos",
    "TRPO": "rlfleet.algos",
    "A2CConfig": "rlfleet.algos",
    "ACERConfig": "rlfleet.algos",
    "APPOConfig": "rlfleet.algos",
    "Algorithm": "rlfleet.algos",
    "BCConfig": "rlfleet.algos",
    "CQLConfig": "rlfleet.algos",
    "DDPGConfig": "rlfleet.algos",
    "DQNConfig": "rlfleet.algos",
    "DecentralizedTrainer": "rlfleet.marl.trainer",
    "DistributedAgent": "rlfleet.runs.distributed_agent",
    "EnvConfig": "rlfleet.runs.config",
    "IMPALAConfig": "rlfleet.algos",
    "IQLConfig": "rlfleet.algos",
    "MultiAgentSettings": "rlfleet.marl.trainer",
    "OffPolicyTrainer": "rlfleet.train.trainer",
    "OfflineTrainer": "rlfleet.train.trainer",
    "OnPolicyTrainer": "rlfleet.train.trainer",
    "PPOConfig": "rlfleet.algos",
    "RunConfig": "rlfleet.runs.config",
    "SACConfig": "rlfleet.algos",
    "TD3BCConfig": "rlfleet.algos",
    "TD3Config": "rlfleet.algos",
    "TRPOConfig": "rlfleet.algos",
    "TrainResult": "rlfleet.train.loop",
    "Trainer": "rlfleet.train.trainer",
    "TrainerConfig": "rlfleet.train.loop",
    "default_run_config": "rlfleet.runs.config",
    "get_algorithm": "rlfleet.algos",
    "list_algorithms": "rlfleet.algos",
    "load": "rlfleet.runs.learn",
    "load_algorithm": "rlfleet.runs.run",
    "make_env": "rlfleet.envs.make",
    "make_vec_env": "rlfleet.envs.make",
}
"""Each lazily imported public name -> the module that defines it."""


# Hidden from type checkers, which read the names from the imports above: a module
# ``__getattr__`` would make them accept any name as an attribute of rlfleet.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        """A public name, imported from its module on first access and kept."""
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _RunBackend:
    """The training backend :class:`rlfleet.runs.learn.RunBackend`, imported on first use.

    It is installed while :mod:`rlfleet.algos` finishes importing, which may be in the middle of
    importing :mod:`rlfleet.runs.learn` itself; only a call comes late enough to import it.
    """

    def __init__(self) -> None:
        self._backend: Any = None

    def _resolve(self) -> Any:
        if self._backend is None:
            self._backend = importlib.import_module("rlfleet.runs.learn").RunBackend()
        return self._backend

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        return self._resolve().bind(*args, **kwargs)

    def learn(self, *args: Any, **kwargs: Any) -> Any:
        return self._resolve().learn(*args, **kwargs)


class _Root(types.ModuleType):
    """This package's module type: it sees each subpackage as the import system sets it."""

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "algos":
            # ``rlfleet.algos`` has just finished importing (and with it the algorithm base).
            value.base.install_training_backend(_RunBackend())


sys.modules[__name__].__class__ = _Root

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
