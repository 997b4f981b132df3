"""A run: a typed run config, its run directory, and training or loading from it.

Run directory layout (``runs/<run-id>/``)::

    config.yaml        the resolved run config; `rlfleet train --config` replays it exactly
    run_options.yaml   runs started from run options only: the resolved options
                       (`rlfleet train RUN/run_options.yaml` replays them)
    history.parquet    one row per logged step (train/, loss/, test/, time/ metrics)
    checkpoints/       atomic step-numbered checkpoints and a `latest.json` pointer
    best/              the best-scoring policy
    plots/             learning_curve.png
    videos/            what `rlfleet play --video-dir` writes by default
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import TracebackType
from typing import Annotated, Any

import torch
import tyro
from gymnasium.vector import VectorEnv

from rlfleet.algos.base import Algorithm
from rlfleet.algos.registry import get_algorithm
from rlfleet.checkpoint import CheckpointManager, load_checkpoint
from rlfleet.collect.evaluator import Evaluator
from rlfleet.config.fields import PositiveFloat, PositiveInt
from rlfleet.config.loader import dump_yaml, load_yaml, merge, preset, to_dict, validate
from rlfleet.data.dataset import OfflineDataset
from rlfleet.distributed.config import DistributedConfig
from rlfleet.distributed.trainer import DistributedTrainer
from rlfleet.envs.atari import AtariConfig
from rlfleet.envs.curriculum import EnvironmentParameterSettings, EnvParameterManager
from rlfleet.envs.make import VectorMode, env_spec, make_vec_env
from rlfleet.envs.spaces import describe_space, space_from_json, spaces_equal
from rlfleet.errors import CheckpointError, ConfigError, DatasetError, RunDirError, option
from rlfleet.marl.agents import Agents, make_agents
from rlfleet.marl.collector import MultiAgentCollector, MultiAgentTestEpisodes, learners_of
from rlfleet.marl.envs import MultiAgentVecEnv, load_pettingzoo_factory
from rlfleet.marl.trainer import DecentralizedTrainer, MultiAgentSettings, agents_state
from rlfleet.nn.device import resolve_device
from rlfleet.rewards.settings import RewardSignalsSettings
from rlfleet.rewards.signals import RewardSignals
from rlfleet.runs.options_parameters import parse_environment_parameters
from rlfleet.runs.options_signals import parse_reward_signals
from rlfleet.runs.run_options import parameter_to_dict
from rlfleet.train.loop import TrainerConfig, TrainingLoop, TrainResult
from rlfleet.train.threads import DEFAULT_TORCH_THREADS, torch_threads
from rlfleet.train.trainer import OfflineTrainer, OffPolicyTrainer, OnPolicyTrainer, Trainer
from rlfleet.types import EvalStats

CONFIG_FILE = "config.yaml"
MULTI_AGENT_PREFIX = "pettingzoo:"
"""Env ids of multi-agent runs: ``pettingzoo:<module>`` (see
:func:`rlfleet.marl.envs.load_pettingzoo_factory`)."""


def is_multi_agent_env(env_id: str) -> bool:
    """Whether ``env_id`` names a PettingZoo game, trained as a multi-agent run."""
    return env_id.startswith(MULTI_AGENT_PREFIX)


@dataclass
class EnvConfig:
    """Which environment to train on and how to vectorise it."""

    id: Annotated[str, tyro.conf.arg(name="env")]
    """Gymnasium env id (e.g. CartPole-v1), ``module:EnvId`` or ``module:EnvClass``
    (see :func:`rlfleet.envs.make.env_spec`), or ``pettingzoo:<module>`` for a multi-agent
    game (see :func:`rlfleet.marl.envs.load_pettingzoo_factory`)."""
    num_envs: PositiveInt = 8
    """Training envs stepped together."""
    vector_mode: VectorMode = "auto"
    """``native``, ``sync``, ``async`` or ``auto`` (native where the env has it, else sync)."""
    num_test_envs: PositiveInt = 10
    """Envs the test episodes run on."""
    kwargs: Annotated[dict[str, Any], tyro.conf.Suppress] = field(default_factory=dict)
    """Keyword arguments for the env constructor (config files only: no flag)."""
    step_timeout_s: PositiveFloat = 60.0
    """``async`` workers: seconds one step or reset may take before the worker counts as hung
    (it is killed, then training raises EnvWorkerError or restarts it)."""
    restart_failed_envs: bool = False
    """Restart an env worker that died, raised or hung, truncate its episode and go on
    (needs ``vector_mode`` ``async``; ``auto`` picks it). Off: training stops with
    EnvWorkerError. Restarts are logged as ``train/env_restarts``."""
    atari: Annotated[AtariConfig, tyro.conf.Suppress] = field(default_factory=AtariConfig)
    """Preprocessing of Atari (ALE) envs; ignored for other envs (config files only: no
    flag)."""


@dataclass
class RunConfig:
    """Everything that defines a training run; ``config.yaml`` holds exactly this."""

    algo: str
    """Registered algorithm name."""
    env: EnvConfig
    hyperparameters: Any
    """The algorithm's config dataclass (e.g. :class:`rlfleet.algos.PPOConfig`)."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    seed: int = 0
    """Seeds networks, sampling and env resets."""
    device: str = "cpu"
    """Torch device: ``cpu``, ``cuda``, ``cuda:N``, ``mps`` or ``xpu``; one this machine lacks
    is refused before anything is built or written."""
    torch_threads: PositiveInt | None = DEFAULT_TORCH_THREADS
    """CPU threads for torch while training (unset: the caller's setting, by default one per
    core); the caller's count is restored afterwards. One thread is fastest for small
    networks: their kernels are too short to split, and a second thread only adds
    synchronisation (measured: 2x slower PPO on CartPole on two cores)."""
    deterministic: bool = False
    """Make torch refuse nondeterministic kernels (``torch.use_deterministic_algorithms``), so
    the same seed on the same machine gives bitwise the same run, resumed or not."""
    distributed: DistributedConfig | None = None
    """Actors, learners and Ray cluster of an actor-learner algorithm (impala, appo);
    unset for every other algorithm."""
    reward_signals: RewardSignalsSettings | None = None
    """What the agent maximises (none: the env's reward as it is); see
    :mod:`rlfleet.rewards.signals` for how signals combine. On- and off-policy algorithms;
    offline and actor-learner runs refuse them."""
    environment_parameters: dict[str, EnvironmentParameterSettings] = field(default_factory=dict)
    """Env parameters drawn at every episode, with optional curricula (train and test envs)."""
    dataset: str | None = None
    """Offline algorithms (bc, cql, iql, td3_bc): the dataset directory to learn from
    (see :mod:`rlfleet.data.dataset`); unset for every other algorithm."""
    multi_agent: MultiAgentSettings | None = None
    """A multi-agent run (env ``pettingzoo:<module>``): parameter sharing, learning and
    exploration masks, the collection and update steps' sizes, the test score, centralized
    critic and self-play (defaults when unset); unset for every other env."""

    def __post_init__(self) -> None:
        if self.multi_agent is None and is_multi_agent_env(self.env.id):
            self.multi_agent = MultiAgentSettings()


RUN_CONFIG_KEYS: tuple[str, ...] = tuple(f.name for f in fields(RunConfig))
"""The top-level keys of a run config (``config.yaml``, ``best.yaml``)."""


def run_config_from_dict(
    data: Any, where: str, *, algorithm_class: type[Algorithm[Any]] | None = None
) -> RunConfig:
    """Validate a mapping (a parsed ``config.yaml`` or preset overlay) into a RunConfig.

    ``algorithm_class``: the class ``data['algo']`` names, when the caller has looked it up
    already (the lookup is then not repeated).
    """
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where}: expected a mapping with keys algo, env, hyperparameters, trainer, seed"
        )
    unknown = set(data) - set(RUN_CONFIG_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {sorted(unknown)} (valid: {sorted(RUN_CONFIG_KEYS)})"
        )
    if "algo" not in data or "env" not in data:
        raise ConfigError(f"{where}: needs 'algo' and 'env'")
    algo_cls = algorithm_class or get_algorithm(str(data["algo"]))
    if str(data["algo"]).lower() != algo_cls.name:
        raise ConfigError(f"{where}: algo is {data['algo']!r}, expected {algo_cls.name!r}")
    seed = data.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"{where}: seed must be an integer, got {seed!r}")
    distributed = data.get("distributed")
    dataset = data.get("dataset")
    return _checked(
        algo_cls,
        where,
        env=validate(EnvConfig, data["env"], f"{where}: env"),
        hyperparameters=validate(
            algo_cls.config_class, data.get("hyperparameters") or {}, f"{where}: hyperparameters"
        ),
        trainer=validate(TrainerConfig, data.get("trainer") or {}, f"{where}: trainer"),
        seed=seed,
        device=data.get("device", "cpu"),
        torch_threads=data.get("torch_threads", DEFAULT_TORCH_THREADS),
        deterministic=bool(data.get("deterministic", False)),
        distributed=(
            validate(DistributedConfig, distributed or {}, f"{where}: distributed")
            if algo_cls.kind == "distributed"
            else distributed or None
        ),
        reward_signals=(
            None
            if data.get("reward_signals") is None
            else parse_reward_signals(data["reward_signals"], f"{where}: reward_signals")
        ),
        environment_parameters=parse_environment_parameters(
            data.get("environment_parameters"), f"{where}: environment_parameters"
        ),
        dataset=None if dataset is None else str(dataset),
        multi_agent=data.get("multi_agent"),
    )


def check_run_config(
    cfg: RunConfig, where: str, *, algorithm_class: type[Algorithm[Any]] | None = None
) -> RunConfig:
    """A typed RunConfig built in Python (e.g. command-line flags laid over a preset or a
    config file), checked as :func:`run_config_from_dict` checks a mapping: the constraints
    of every field (positive sizes, probabilities in [0, 1], ...), the device's spelling and
    the sections that belong to the algorithm's kind."""
    algo_cls = algorithm_class or get_algorithm(cfg.algo)
    return _checked(
        algo_cls,
        where,
        env=validate(EnvConfig, cfg.env, f"{where}: env"),
        hyperparameters=validate(
            algo_cls.config_class, cfg.hyperparameters, f"{where}: hyperparameters"
        ),
        trainer=validate(TrainerConfig, cfg.trainer, f"{where}: trainer"),
        seed=cfg.seed,
        device=cfg.device,
        torch_threads=cfg.torch_threads,
        deterministic=cfg.deterministic,
        distributed=(
            None
            if cfg.distributed is None
            else validate(DistributedConfig, cfg.distributed, f"{where}: distributed")
        ),
        reward_signals=cfg.reward_signals,
        environment_parameters=cfg.environment_parameters,
        dataset=cfg.dataset,
        multi_agent=cfg.multi_agent,
    )


def _checked(algo_cls: type[Algorithm[Any]], where: str, **parts: Any) -> RunConfig:
    """A RunConfig of validated sections, after the checks across them."""
    threads = parts["torch_threads"]
    if threads is not None and (
        not isinstance(threads, int) or isinstance(threads, bool) or threads < 1
    ):
        raise ConfigError(
            f"{where}: torch_threads must be a positive integer or null, got {threads!r}"
        )
    if algo_cls.kind == "distributed":
        if parts["distributed"] is None:
            parts["distributed"] = DistributedConfig()
    elif parts["distributed"]:
        raise ConfigError(
            f"{where}: 'distributed' settings apply to actor-learner algorithms "
            f"(impala, appo), not to {algo_cls.name}"
        )
    else:
        parts["distributed"] = None
    if algo_cls.kind != "offline" and parts["dataset"] is not None:
        raise ConfigError(
            f"{where}: 'dataset' is for offline algorithms (bc, cql, iql, td3_bc), "
            f"not for {algo_cls.name}"
        )
    env_id = parts["env"].id
    if is_multi_agent_env(env_id):
        if algo_cls.kind not in ("on_policy", "off_policy"):
            raise ConfigError(
                f"{where}: a multi-agent env ({env_id}) trains on- or off-policy algorithms, "
                f"not {algo_cls.name} ({algo_cls.kind})"
            )
        parts["multi_agent"] = validate(
            MultiAgentSettings, parts["multi_agent"] or {}, f"{where}: multi_agent"
        )
    elif parts["multi_agent"] is not None:
        raise ConfigError(
            f"{where}: 'multi_agent' settings apply to multi-agent envs "
            f"({MULTI_AGENT_PREFIX}<module>), not to {env_id}"
        )
    # Only the spelling: a GPU run's config.yaml stays readable on a machine without one.
    resolve_device(parts["device"], f"{where}: device", check_available=False)
    parts["device"] = str(parts["device"])
    return RunConfig(algo=algo_cls.name, **parts)


def check_dataset_setting(algo: type[Algorithm[Any]], dataset: str | None, where: str) -> None:
    """An offline algorithm needs an existing dataset directory (that no other algorithm
    takes one is checked with the rest of the config)."""
    if algo.kind != "offline":
        return
    if dataset is None:
        raise ConfigError(
            f"{where}: {algo.name} learns offline and needs a dataset directory "
            f"({option('dataset', 'DIR')}, or 'dataset:' in the config); record one with "
            "`rlfleet collect`"
        )
    if not Path(dataset).is_dir():
        raise DatasetError(
            f"{where}: dataset {dataset!r} is not a directory (expected one written by "
            "`rlfleet collect` or OfflineDataset.save)"
        )


def default_run_config(
    algo: str | type[Algorithm[Any]], env_id: str, overrides: dict[str, Any] | None = None
) -> RunConfig:
    """The shipped preset for ``algo`` (a name, or the class it names) on ``env_id`` with
    ``overrides`` merged on top."""
    algo_cls = get_algorithm(algo) if isinstance(algo, str) else algo
    data = merge(preset(algo_cls.name, env_id), {"algo": algo_cls.name, "env": {"id": env_id}})
    return run_config_from_dict(
        merge(data, overrides or {}),
        f"{algo_cls.name} preset for {env_id}",
        algorithm_class=algo_cls,
    )


def run_config_to_dict(cfg: RunConfig) -> dict[str, Any]:
    data = {
        "algo": cfg.algo,
        "seed": cfg.seed,
        "device": cfg.device,
        "torch_threads": cfg.torch_threads,
        "deterministic": cfg.deterministic,
        "env": to_dict(cfg.env),
        "trainer": to_dict(cfg.trainer),
        "hyperparameters": to_dict(cfg.hyperparameters),
    }
    if cfg.distributed is not None:
        data["distributed"] = to_dict(cfg.distributed)
    if cfg.reward_signals is not None:
        data["reward_signals"] = to_dict(cfg.reward_signals)
    if cfg.environment_parameters:
        data["environment_parameters"] = {
            name: parameter_to_dict(p) for name, p in cfg.environment_parameters.items()
        }
    if cfg.dataset is not None:
        data["dataset"] = cfg.dataset
    if cfg.multi_agent is not None:
        data["multi_agent"] = to_dict(cfg.multi_agent)
    return data


def load_run_config(run_dir: str | Path) -> RunConfig:
    """The config a run directory was trained with."""
    run_dir = Path(run_dir)
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise RunDirError(
            f"{run_dir}: no {CONFIG_FILE} — expected a run directory written by `rlfleet train`"
        )
    return run_config_from_dict(load_yaml(path), str(path))


def default_run_dir(cfg: RunConfig) -> Path:
    env = cfg.env.id.replace("/", "-").replace(":", "-")
    return Path("runs") / f"{cfg.algo}-{env}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_run_dir(run_dir: str | Path, *, resume: bool, force: bool) -> None:
    """Refuse a run directory that cannot be used as asked, touching nothing: an existing one
    needs ``resume`` (continue) or ``force`` (replace, and only a run directory)."""
    run_dir = Path(run_dir)
    if resume:
        if not (run_dir / CONFIG_FILE).is_file():
            raise RunDirError(f"cannot resume {run_dir}: no {CONFIG_FILE} there")
        return
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"run directory {run_dir} is a file; expected a directory path")
    if run_dir.exists() and any(run_dir.iterdir()):
        if not force:
            raise RunDirError(
                f"run directory {run_dir} already exists; pass {option('resume')} to continue "
                f"it or {option('force')} to overwrite it"
            )
        if not (run_dir / CONFIG_FILE).is_file() and not (run_dir / "checkpoints").is_dir():
            raise RunDirError(
                f"refusing to overwrite {run_dir} ({option('force')}): it does not look like a "
                "run directory"
            )


class RunDirAttempt:
    """One attempt to start a run in ``run_dir``, undone if it fails to start.

    Use as ``with RunDirAttempt(run_dir, resume=..., force=...) as attempt:`` around building
    the run, and call :meth:`started` once it is built and its files are written. The
    constructor checks the directory (:func:`check_run_dir`); entering creates it, and moves a
    run that ``force`` replaces aside instead of deleting it. :meth:`started` deletes the
    replaced run.

    If the block raises (an error or Ctrl-C) before :meth:`started`, what this attempt
    created is removed, never anything that was there before, and the replaced run is put
    back: a failed start leaves no directory that would make the same command ask for
    ``--force``. Resuming creates and removes nothing.
    """

    def __init__(self, run_dir: str | Path, *, resume: bool, force: bool) -> None:
        check_run_dir(run_dir, resume=resume, force=force)
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.force = force
        self._created: Path | None = None
        """The outermost directory this attempt created (None: ``run_dir`` existed)."""
        self._replaced: Path | None = None
        """The temporary directory holding the run that ``force`` replaces."""
        self._started = False

    def __enter__(self) -> RunDirAttempt:
        if self.resume:
            return self
        run_dir = self.run_dir
        if self.force and run_dir.is_dir() and any(run_dir.iterdir()):
            # Aside, next to it (same file system, so a rename), until the new run has started.
            self._replaced = Path(
                tempfile.mkdtemp(prefix=f".{run_dir.name}.replaced-", dir=run_dir.parent)
            )
            run_dir.rename(self._replaced / run_dir.name)
        missing = [path for path in (run_dir, *run_dir.parents) if not path.exists()]
        self._created = missing[-1] if missing else None
        run_dir.mkdir(parents=True, exist_ok=True)
        return self

    def started(self) -> None:
        """The run is built and its files written: the replaced run goes for good."""
        self._started = True
        if self._replaced is not None:
            shutil.rmtree(self._replaced)
            self._replaced = None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is None or self._started or self.resume:
            if self._replaced is not None:  # left the block without calling started()
                shutil.rmtree(self._replaced)
            return
        if self._created is not None:
            shutil.rmtree(self._created, ignore_errors=True)
        elif self.run_dir.is_dir():
            for child in self.run_dir.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        if self._replaced is not None:
            (self._replaced / self.run_dir.name).rename(self.run_dir)
            self._replaced.rmdir()
            self._replaced = None


def interrupted_message(run_dir: str | Path, resume_command: str) -> str:
    """What to tell the user after Ctrl-C stopped the run in ``run_dir``: the command that
    continues it, or that it has no checkpoint to continue from yet."""
    run_dir = Path(run_dir)
    if CheckpointManager(run_dir / "checkpoints", readonly=True).latest() is not None:
        return f"interrupted; the latest checkpoint is intact — continue with `{resume_command}`"
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return (
            "interrupted before the first checkpoint; nothing was kept — run the same command "
            "to start again"
        )
    return (
        f"interrupted before the first checkpoint, so {run_dir} has nothing to resume from — "
        f"start again with --force (it replaces {run_dir})"
    )


def build_algorithm(
    cfg: RunConfig,
    observation_space: Any,
    action_space: Any,
    *,
    algorithm_class: type[Algorithm[Any]] | None = None,
) -> Algorithm[Any]:
    """The algorithm ``cfg`` names (``algorithm_class``: its class, when already looked up)."""
    algo_cls = algorithm_class or get_algorithm(cfg.algo)
    algo: Algorithm[Any] = algo_cls(
        observation_space, action_space, cfg.hyperparameters, seed=cfg.seed, device=cfg.device
    )
    return algo


def given_or_built(
    cfg: RunConfig,
    algorithm: Algorithm[Any] | None,
    observation_space: Any,
    action_space: Any,
    *,
    algorithm_class: type[Algorithm[Any]] | None = None,
) -> Algorithm[Any]:
    """``algorithm`` checked against the env's spaces, or a new one built from ``cfg``."""
    if algorithm is None:
        return build_algorithm(
            cfg, observation_space, action_space, algorithm_class=algorithm_class
        )
    check_env_matches(algorithm, observation_space, action_space, cfg.env.id)
    return algorithm


def make_trainer(
    cfg: RunConfig,
    run_dir: str | Path | None,
    *,
    resume: bool = False,
    test_envs: VectorEnv[Any, Any, Any] | None = None,
    algorithm: Algorithm[Any] | None = None,
    algorithm_class: type[Algorithm[Any]] | None = None,
    agents: Agents | None = None,
    **hooks: Any,
) -> TrainingLoop[Any, Any]:
    """Build envs, algorithm and the trainer that fits the algorithm's kind, or for a
    multi-agent env the agents and their :class:`~rlfleet.marl.trainer.DecentralizedTrainer`.

    ``test_envs`` replaces the test envs built from ``cfg.env`` (e.g. a differently
    configured env to evaluate on; single-agent runs); the trainer closes them with its own.
    ``algorithm`` trains that algorithm in place instead of building one from ``cfg`` (its
    spaces must be the env's; :meth:`rlfleet.algos.base.Algorithm.learn` passes itself);
    ``algorithm_class`` is the class ``cfg.algo`` names, when the caller has looked it up.
    ``agents`` are a multi-agent run's agents when already built (see :func:`build_agents`).
    The trainer runs on ``cfg.torch_threads`` CPU threads.
    """
    hooks = {"torch_threads": cfg.torch_threads, **hooks}
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    if cfg.multi_agent is not None:
        resolve_device(cfg.device)
        return DecentralizedTrainer(
            _pettingzoo_factory(cfg),
            agents or build_agents(cfg),
            cfg.trainer,
            cfg.multi_agent,
            num_envs=cfg.env.num_envs,
            num_test_envs=cfg.env.num_test_envs,
            seed=cfg.seed,
            run_dir=run_dir,
            run_metadata={"env_id": cfg.env.id, "seed": cfg.seed},
            resume_from_log=resume,
            **hooks,
        )
    metadata: dict[str, Any] = {"env_id": cfg.env.id, "seed": cfg.seed}
    algo_cls = algorithm_class or get_algorithm(cfg.algo)
    kind = algo_cls.kind
    # Check the device and read (and check) the dataset before any env is built.
    resolve_device(cfg.device)
    check_dataset_setting(algo_cls, cfg.dataset, "run config")
    dataset = OfflineDataset.load(cfg.dataset) if cfg.dataset is not None else None
    parameters = env_parameter_manager(cfg)
    if kind == "distributed" and (parameters is not None or cfg.reward_signals is not None):
        raise ConfigError(
            f"{cfg.algo}: environment parameters and reward signals are not supported by "
            "actor-learner training yet"
        )
    if kind == "offline" and cfg.reward_signals is not None:
        raise ConfigError(
            f"{cfg.algo}: reward signals score the transitions a run collects; an offline "
            "algorithm learns from its dataset's rewards, so remove reward_signals"
        )
    # Parameters need a reset hook in every sub-env: make_vec_env then builds sync envs.
    wrappers = None if parameters is None else [parameters.wrapper()]
    if test_envs is None:
        test_envs = make_vec_env(
            cfg.env.id,
            cfg.env.num_test_envs,
            mode=cfg.env.vector_mode,
            env_kwargs=cfg.env.kwargs,
            wrappers=wrappers,
            step_timeout_s=cfg.env.step_timeout_s,
            restart_failed_envs=cfg.env.restart_failed_envs,
            atari=cfg.env.atari.for_evaluation(),
        )
    if dataset is not None:
        metadata["dataset"] = cfg.dataset
        algo = given_or_built(
            cfg,
            algorithm,
            test_envs.single_observation_space,
            test_envs.single_action_space,
            algorithm_class=algo_cls,
        )
        try:
            dataset.check_spaces(algo.observation_space, algo.action_space, cfg.env.id)
        except DatasetError:
            test_envs.close()
            raise
        return OfflineTrainer(
            algo,
            dataset,
            test_envs,
            cfg.trainer,
            run_dir=run_dir,
            run_metadata=metadata,
            seed=cfg.seed,
            resume_from_log=resume,
            **hooks,
        )
    if kind == "distributed":
        # Rollout actors build the training envs on their own nodes.
        algo = given_or_built(
            cfg,
            algorithm,
            test_envs.single_observation_space,
            test_envs.single_action_space,
            algorithm_class=algo_cls,
        )
        return DistributedTrainer(
            algo,
            test_envs,
            cfg.trainer,
            env_id=cfg.env.id,
            num_envs=cfg.env.num_envs,
            vector_mode=cfg.env.vector_mode,
            env_kwargs=cfg.env.kwargs,
            distributed=cfg.distributed,
            run_dir=run_dir,
            run_metadata=metadata,
            seed=cfg.seed,
            resume_from_log=resume,
            **hooks,
        )
    train_envs = make_vec_env(
        cfg.env.id,
        cfg.env.num_envs,
        seed=cfg.seed,
        mode=cfg.env.vector_mode,
        env_kwargs=cfg.env.kwargs,
        wrappers=wrappers,
        step_timeout_s=cfg.env.step_timeout_s,
        restart_failed_envs=cfg.env.restart_failed_envs,
        atari=cfg.env.atari,
    )
    if parameters is not None:
        parameters.attach(train_envs, test_envs)
    algo = given_or_built(
        cfg,
        algorithm,
        train_envs.single_observation_space,
        train_envs.single_action_space,
        algorithm_class=algo_cls,
    )
    signals = None
    if cfg.reward_signals is not None:
        signals = RewardSignals(
            cfg.reward_signals,
            train_envs.single_observation_space,
            train_envs.single_action_space,
            cfg.env.num_envs,
            seed=cfg.seed,
            device=cfg.device,
        )
    hooks = {**hooks, "reward_signals": signals, "env_parameters": parameters}
    trainers: dict[str, type[OnPolicyTrainer] | type[OffPolicyTrainer]] = {
        "on_policy": OnPolicyTrainer,
        "off_policy": OffPolicyTrainer,
    }
    if algo.kind in trainers:
        return trainers[algo.kind](
            algo,
            train_envs,
            test_envs,
            cfg.trainer,
            run_dir=run_dir,
            run_metadata=metadata,
            seed=cfg.seed,
            resume_from_log=resume,
            **hooks,
        )
    raise ConfigError(f"{cfg.algo}: no trainer for algorithms of kind {algo.kind!r} yet")


def _pettingzoo_factory(cfg: RunConfig) -> Callable[..., Any]:
    """The env factory of a multi-agent run, with the config's env kwargs."""
    factory = load_pettingzoo_factory(cfg.env.id)
    kwargs = dict(cfg.env.kwargs)
    return (lambda **extra: factory(**kwargs, **extra)) if kwargs else factory


def build_agents(cfg: RunConfig, *, learning: bool = True) -> Agents:
    """The agents of a multi-agent run: the run's algorithm for every agent, one per agent or
    one shared (``multi_agent.share_parameters``); agent ``i`` seeded ``seed + i``.
    ``learning=False`` freezes them all (to evaluate or play)."""
    settings = cfg.multi_agent or MultiAgentSettings()
    factory = _pettingzoo_factory(cfg)
    algorithms = make_agents(
        factory,
        lambda obs, act, seed: build_algorithm(replace(cfg, seed=seed), obs, act),
        share_parameters=settings.share_parameters,
        seed=cfg.seed,
    )
    probe = MultiAgentVecEnv(factory, 1)
    names = probe.possible_agents
    probe.close()
    if not learning:
        return Agents(names, algorithms, [False] * len(names), [False] * len(names))
    return Agents(names, algorithms, settings.learning_mask, settings.exploration_mask)


def env_parameter_manager(cfg: RunConfig) -> EnvParameterManager | None:
    """The curriculum of ``cfg``'s environment parameters (None without parameters).

    A run config trains one behavior: completion criteria may call it by any name, but all
    by the same one.
    """
    if not cfg.environment_parameters:
        return None
    named = sorted(
        {
            lesson.completion_criteria.behavior
            for settings in cfg.environment_parameters.values()
            for lesson in settings.curriculum
            if lesson.completion_criteria is not None
        }
    )
    if len(named) > 1:
        raise ConfigError(
            f"environment_parameters: completion criteria name behaviors {named}, but a "
            "run trains one"
        )
    return EnvParameterManager(cfg.environment_parameters, named or ["default"])


def train(
    cfg: RunConfig,
    run_dir: str | Path | None = None,
    *,
    resume: bool = False,
    force: bool = False,
    initialize_from: str | Path | None = None,
    files: Mapping[str, Any] | None = None,
    algorithm_class: type[Algorithm[Any]] | None = None,
    **hooks: Any,
) -> TrainResult:
    """Train a run end to end: run directory, config.yaml, training, plots.

    ``resume`` continues the run in ``run_dir`` from its latest checkpoint (counters,
    optimiser, schedules, RNG and history continue); ``force`` replaces an existing run;
    ``initialize_from`` starts a new run from the policy weights of another run directory
    (ignored when resuming); ``files`` are more YAML files to write into the run directory
    (name -> data), such as ``run_options.yaml``; ``algorithm_class`` is the class
    ``cfg.algo`` names, when the caller has looked it up already. Torch uses
    ``cfg.torch_threads`` CPU threads meanwhile; the caller's count is restored when it
    returns.

    A run that fails to start (a device this machine lacks, an env that cannot be built, a
    checkpoint that does not match, ...) leaves no run directory behind, and a run ``force``
    was to replace is kept (see :class:`RunDirAttempt`).
    """
    # What can be checked without building the run, before its directory is touched (the
    # dataset is checked, and read, once, where the trainer is built).
    resolve_device(cfg.device)
    if cfg.multi_agent is not None:
        load_pettingzoo_factory(cfg.env.id)
        if initialize_from is not None:
            raise ConfigError(
                "initialize_from: a multi-agent run starts from fresh agents; resume it instead"
            )
    else:
        env_spec(cfg.env.id)
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(cfg)
    # Agents are built with the caller's torch threads, as a script builds them before its
    # DecentralizedTrainer: initial weights (orthogonal init) depend on the thread count, so
    # a run config and the same script give the same agents.
    agents = build_agents(cfg) if cfg.multi_agent is not None else None
    with (
        torch_threads(cfg.torch_threads),
        RunDirAttempt(run_dir, resume=resume, force=force) as attempt,
    ):
        trainer = make_trainer(
            cfg, run_dir, resume=resume, algorithm_class=algorithm_class, agents=agents, **hooks
        )
        try:
            if initialize_from is not None and not resume:
                assert isinstance(trainer, Trainer)  # refused above for multi-agent runs
                initialize_weights(trainer.algorithm, initialize_from)
            # Written once the run is built, so a resume that fails leaves config.yaml as it was.
            dump_yaml(run_config_to_dict(cfg), run_dir / CONFIG_FILE)
            for name, data in (files or {}).items():
                dump_yaml(data, run_dir / name)
            attempt.started()
            return trainer.run()
        finally:
            trainer.close()


def load_policy(
    run_dir: str | Path, *, which: str = "best", device: str | None = None
) -> tuple[Algorithm[Any] | Agents, RunConfig]:
    """The trained policy of a run: its algorithm, or the
    :class:`~rlfleet.marl.agents.Agents` of a multi-agent run (frozen and greedy); ``best``
    (the best-scoring, falling back to the latest checkpoint) or ``latest``; on ``device``,
    or the device the run trained on."""
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    if device is not None:
        cfg = replace(cfg, device=device)
    order = ["best", "checkpoints"] if which == "best" else ["checkpoints"]
    for sub in order:
        path = CheckpointManager(run_dir / sub, readonly=True).latest()
        if path is not None:
            break
    else:
        raise CheckpointError(
            f"{run_dir}: no checkpoint found (train the run first, or check the path)"
        )
    state, metadata = load_checkpoint(path)
    if metadata.get("algorithm") != cfg.algo:
        raise CheckpointError(
            f"{path}: checkpoint is for {metadata.get('algorithm')!r} but "
            f"{run_dir}/{CONFIG_FILE} says {cfg.algo!r}"
        )
    if cfg.multi_agent is not None:
        agents = build_agents(cfg, learning=False)
        agents.load_state_dict(agents_state(state))
        return agents, cfg
    obs_space = space_from_json(metadata["observation_space"])
    action_space = space_from_json(metadata["action_space"])
    algo = build_algorithm(cfg, obs_space, action_space)
    algo.load_state_dict(state["algorithm"])
    return algo, cfg


def load_algorithm(
    run_dir: str | Path, *, which: str = "best", device: str | None = None
) -> tuple[Algorithm[Any], RunConfig]:
    """The trained algorithm of a single-agent run (see :func:`load_policy`).

    Raises:
        RunDirError: ``run_dir`` is a multi-agent run, whose policy is several agents
            (:func:`load_policy` returns them).
    """
    policy, cfg = load_policy(run_dir, which=which, device=device)
    if isinstance(policy, Agents):
        raise RunDirError(
            f"{run_dir} is a multi-agent run ({cfg.env.id}): its policy is the agents "
            f"{policy.names}, which load_policy returns; this command takes a single-agent run"
        )
    return policy, cfg


def evaluate(
    run_dir: str | Path,
    episodes: int,
    *,
    seed: int = 12345,
    deterministic: bool = True,
    which: str = "best",
    device: str | None = None,
) -> tuple[EvalStats, RunConfig]:
    """Test episodes of a run's trained policy on its env (single- or multi-agent): greedy
    unless ``deterministic`` is false; a multi-agent run's ``returns`` are
    ``[episodes, agents]``.

    Raises:
        CheckpointError: the env's spaces differ from the ones the policy was trained on.
        ConfigError: stochastic tests of a multi-agent run (its test episodes are greedy).
    """
    policy, cfg = load_policy(run_dir, which=which, device=device)
    if isinstance(policy, Agents):
        if not deterministic:
            raise ConfigError(
                f"{run_dir} is a multi-agent run: its test episodes are greedy (drop "
                f"{option('stochastic')})"
            )
        envs = MultiAgentVecEnv(_pettingzoo_factory(cfg), min(cfg.env.num_test_envs, episodes))
        try:
            collector = MultiAgentCollector(
                envs,
                learners_of(
                    policy,
                    envs,
                    buffer_size=1,
                    critic_state_size=None,
                    central_critic=(cfg.multi_agent or MultiAgentSettings()).central_critic,
                ),
                collection_step_num_env_steps=1,
            )
            return MultiAgentTestEpisodes(envs, collector, seed).run(episodes), cfg
        finally:
            envs.close()
    vec = make_vec_env(
        cfg.env.id,
        min(cfg.env.num_test_envs, episodes),
        mode=cfg.env.vector_mode,
        env_kwargs=cfg.env.kwargs,
        atari=cfg.env.atari.for_evaluation(),
    )
    try:
        check_env_matches(policy, vec.single_observation_space, vec.single_action_space, cfg.env.id)
        stats = Evaluator(vec, policy, seed=seed).run(episodes, deterministic=deterministic)
    finally:
        vec.close()
    return stats, cfg


def initialize_weights(algo: Algorithm[Any], run_dir: str | Path) -> Path:
    """Load the network weights (and normaliser statistics) of another run into ``algo``:
    its latest checkpoint, else its best. Optimiser, counters and schedules stay fresh.
    Returns the checkpoint used."""
    run_dir = Path(run_dir)
    for sub in ("checkpoints", "best"):
        path = CheckpointManager(run_dir / sub, readonly=True).latest()
        if path is not None:
            break
    else:
        raise CheckpointError(
            f"cannot initialize from {run_dir}: no checkpoint there (expected a run directory "
            "written by `rlfleet train`)"
        )
    state, metadata = load_checkpoint(path)
    if metadata.get("algorithm") != algo.name:
        raise CheckpointError(
            f"cannot initialize {algo.name} from {path}: it holds a "
            f"{metadata.get('algorithm')!r} policy"
        )
    for label, ours, theirs in (
        ("observation", algo.observation_space, space_from_json(metadata["observation_space"])),
        ("action", algo.action_space, space_from_json(metadata["action_space"])),
    ):
        if not spaces_equal(ours, theirs):
            raise CheckpointError(
                f"cannot initialize from {path}: its {label} space {describe_space(theirs)} "
                f"differs from this env's {describe_space(ours)}"
            )
    modules = state["algorithm"]["modules"]
    try:
        for key, module in algo.modules().items():
            module.load_state_dict(modules[key])
    except (KeyError, RuntimeError) as err:
        raise CheckpointError(
            f"cannot initialize {algo.name} from {path}: the networks differ "
            f"({str(err).splitlines()[0]})"
        ) from err
    return path


def check_env_matches(
    algo: Algorithm[Any], observation_space: Any, action_space: Any, env_id: str
) -> None:
    """Refuse to run a policy on an env whose spaces differ from the ones it was trained on."""
    for label, trained, found in (
        ("observation", algo.observation_space, observation_space),
        ("action", algo.action_space, action_space),
    ):
        if not spaces_equal(trained, found):
            raise CheckpointError(
                f"{env_id}: {label} space {describe_space(found)} does not match the trained "
                f"policy's {describe_space(trained)}"
            )
