"""The typed run config: everything that defines a training run, as ``config.yaml`` holds it.

:class:`RunConfig` (with :class:`EnvConfig`) is built from the shipped preset, a YAML file or
flags, checked once (:func:`check_run_config`), and written back as the run's record
(:func:`run_config_to_dict`); :func:`load_run_config` reads a run directory's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

from rlfleet.algos.base import Algorithm
from rlfleet.algos.kinds import ImitationPolicy
from rlfleet.algos.registry import get_algorithm
from rlfleet.config.fields import (
    MAX_SEED,
    EnvCount,
    PositiveFloat,
    Seed,
    ThreadCount,
)
from rlfleet.config.loader import load_yaml, merge, preset, to_dict, validate
from rlfleet.config.versions import current_version
from rlfleet.data.storage import available_memory_bytes
from rlfleet.distributed.config import DistributedConfig
from rlfleet.envs.atari import AtariConfig
from rlfleet.envs.curriculum import EnvironmentParameterSettings
from rlfleet.envs.make import VectorMode
from rlfleet.errors import (
    ConfigError,
    DatasetError,
    InsufficientMemoryError,
    RunDirError,
    option,
)
from rlfleet.marl.trainer import MultiAgentSettings
from rlfleet.nn.budget import BYTES_PER_PARAMETER, parameter_lower_bound
from rlfleet.nn.device import resolve_device
from rlfleet.rewards.settings import RewardSignalsSettings
from rlfleet.runs.adapt import adapted_preset
from rlfleet.runs.options_parameters import parse_environment_parameters
from rlfleet.runs.options_signals import parse_reward_signals
from rlfleet.runs.run_options import parameter_to_dict
from rlfleet.train.behavioral_cloning import BehavioralCloningSettings, check_demo_path
from rlfleet.train.loop import TrainerConfig
from rlfleet.train.threads import DEFAULT_TORCH_THREADS, check_thread_setting

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
    num_envs: EnvCount = 8
    """Training envs stepped together."""
    vector_mode: VectorMode = "auto"
    """``native``, ``sync``, ``async``, ``envpool`` (EnvPool's C++ classic-control envs) or
    ``auto`` (native where the env has it, else sync; never envpool)."""
    num_test_envs: EnvCount = 10
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
    seed: Seed = 0
    """Seeds networks, sampling and env resets."""
    device: str = "cpu"
    """Torch device: ``cpu``, ``cuda``, ``cuda:N``, ``mps`` or ``xpu``; one this machine lacks
    is refused before anything is built or written."""
    torch_threads: ThreadCount | Literal["auto"] | None = DEFAULT_TORCH_THREADS
    """CPU threads for torch while training: a number, ``auto`` (chosen from the work of one
    gradient step, see :func:`rlfleet.train.threads.auto_torch_threads`: one for small
    networks, whose kernels are too short to split, up to one per core for CNNs and wide
    networks at large batches), or unset (the caller's setting, by default one per core);
    the caller's count is restored afterwards."""
    deterministic: bool = False
    """Make torch refuse nondeterministic kernels (``torch.set_deterministic_debug_mode``), so
    the same seed on the same machine gives bitwise the same run, resumed or not."""
    adapt_defaults: bool = True
    """For an env the shipped presets do not name: adapt the defaults to what a short
    random-policy probe of the env measures (see :mod:`rlfleet.runs.adapt`); settings given
    in a config or as flags are never adapted. Off: the preset's ``default`` section as it
    is."""
    distributed: DistributedConfig | None = None
    """Actors, learners and Ray cluster of an actor-learner algorithm (impala, appo);
    unset for every other algorithm."""
    reward_signals: RewardSignalsSettings | None = None
    """What the agent maximises (none: the env's reward as it is); see
    :mod:`rlfleet.rewards.signals` for how signals combine. On- and off-policy algorithms;
    offline and actor-learner runs refuse them."""
    behavioral_cloning: BehavioralCloningSettings | None = None
    """Clone demonstrations into the policy after each update, beside the RL loss
    (ML-Agents' ``behavioral_cloning``; ppo and sac, see
    :mod:`rlfleet.train.behavioral_cloning`); unset: no cloning."""
    environment_parameters: dict[str, EnvironmentParameterSettings] = field(default_factory=dict)
    """Env parameters drawn at every episode, with optional curricula (train and test envs)."""
    dataset: str | None = None
    """Offline algorithms (bc, cql, iql, td3_bc): the dataset directory to learn from
    (see :mod:`rlfleet.data.dataset`); unset for every other algorithm."""
    multi_agent: MultiAgentSettings | None = None
    """A multi-agent run (env ``pettingzoo:<module>``): parameter sharing, learning and
    exploration masks, the collection and update steps' sizes, the test score, centralized
    critic and self-play (defaults when unset); unset for every other env."""

    agent_behaviors: dict[str, AgentBehavior] = field(default_factory=dict)
    """A multi-agent run whose agents play with several algorithms (run options with several
    behaviors): each behavior's agents share one network of its own ``algo`` and
    ``hyperparameters``; the top-level ``algo`` and ``hyperparameters`` are the first
    behavior's. Empty: every agent plays ``algo`` (see ``multi_agent.share_parameters``)."""
    adapted: dict[str, str] = field(default_factory=dict)
    """The record of the settings adapted to the env (see ``adapt_defaults``): dotted key
    (``hyperparameters.normalize_obs``) -> why. The values themselves are in their
    sections; this says where they came from."""

    def __post_init__(self) -> None:
        if self.multi_agent is None and is_multi_agent_env(self.env.id):
            self.multi_agent = MultiAgentSettings()


@dataclass
class AgentBehavior:
    """One behavior of a multi-agent run with several: the agents it plays, sharing one
    network, and its algorithm."""

    agents: list[str]
    """The env agents it plays."""
    algo: str
    """Registered algorithm name."""
    hyperparameters: Any
    """The algorithm's config."""


def parse_behaviors(data: Any, where: str, env_id: str) -> dict[str, AgentBehavior]:
    """A run config's ``agent_behaviors`` (see :attr:`RunConfig.agent_behaviors`), validated."""
    if not data:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where}: agent_behaviors: expected a mapping of behaviors, got {data!r}"
        )
    if not is_multi_agent_env(env_id):
        raise ConfigError(
            f"{where}: agent_behaviors name the agents of a multi-agent env "
            f"({MULTI_AGENT_PREFIX}<module>), not of {env_id}"
        )
    out: dict[str, AgentBehavior] = {}
    for name, entry in data.items():
        if isinstance(entry, AgentBehavior):
            entry = {"agents": entry.agents, "algo": entry.algo,
                     "hyperparameters": entry.hyperparameters}  # fmt: skip
        here = f"{where}: agent_behaviors.{name}"
        if not isinstance(entry, dict) or set(entry) != {"agents", "algo", "hyperparameters"}:
            raise ConfigError(f"{here}: expected a mapping of agents, algo and hyperparameters")
        agents = entry["agents"]
        if (
            not isinstance(agents, list)
            or not agents
            or not all(isinstance(a, str) for a in agents)
        ):
            raise ConfigError(f"{here}.agents: expected a list of agent names, got {agents!r}")
        algo_cls = get_algorithm(str(entry["algo"]))
        out[str(name)] = AgentBehavior(
            list(agents),
            algo_cls.name,
            validate(
                algo_cls.config_class, entry["hyperparameters"] or {}, f"{here}.hyperparameters"
            ),
        )
    return out


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
        seed=data.get("seed", 0),
        device=data.get("device", "cpu"),
        torch_threads=data.get("torch_threads", DEFAULT_TORCH_THREADS),
        deterministic=bool(data.get("deterministic", False)),
        adapt_defaults=data.get("adapt_defaults", True),
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
        behavioral_cloning=(
            None
            if data.get("behavioral_cloning") is None
            else validate(
                BehavioralCloningSettings,
                data["behavioral_cloning"],
                f"{where}: behavioral_cloning",
            )
        ),
        environment_parameters=parse_environment_parameters(
            data.get("environment_parameters"), f"{where}: environment_parameters"
        ),
        dataset=None if dataset is None else str(dataset),
        multi_agent=data.get("multi_agent"),
        agent_behaviors=data.get("agent_behaviors"),
        adapted=data.get("adapted") or {},
    )


def check_run_config(
    cfg: RunConfig,
    where: str,
    *,
    algorithm_class: type[Algorithm[Any]] | None = None,
    flags: bool = False,
) -> RunConfig:
    """A typed RunConfig built in Python (e.g. command-line flags laid over a preset or a
    config file), checked as :func:`run_config_from_dict` checks a mapping: the constraints
    of every field (positive sizes, probabilities in [0, 1], ...), the device's spelling and
    the sections that belong to the algorithm's kind. With ``flags`` (``rlfleet train``'s
    flags laid over a checked config), a bad setting of the env, hyperparameters, trainer
    or distributed section is named by its flag (``--learning-rate``)."""
    algo_cls = algorithm_class or get_algorithm(cfg.algo)
    return _checked(
        algo_cls,
        where,
        env=validate(EnvConfig, cfg.env, f"{where}: env", flags=flags),
        hyperparameters=validate(
            algo_cls.config_class, cfg.hyperparameters, f"{where}: hyperparameters", flags=flags
        ),
        trainer=validate(TrainerConfig, cfg.trainer, f"{where}: trainer", flags=flags),
        seed=cfg.seed,
        device=cfg.device,
        torch_threads=cfg.torch_threads,
        deterministic=cfg.deterministic,
        adapt_defaults=cfg.adapt_defaults,
        distributed=(
            None
            if cfg.distributed is None
            else validate(DistributedConfig, cfg.distributed, f"{where}: distributed", flags=flags)
        ),
        reward_signals=cfg.reward_signals,
        behavioral_cloning=(
            None
            if cfg.behavioral_cloning is None
            else validate(
                BehavioralCloningSettings,
                cfg.behavioral_cloning,
                f"{where}: behavioral_cloning",
            )
        ),
        environment_parameters=cfg.environment_parameters,
        dataset=cfg.dataset,
        multi_agent=cfg.multi_agent,
        agent_behaviors=cfg.agent_behaviors,
        adapted=cfg.adapted,
    )


def _checked(algo_cls: type[Algorithm[Any]], where: str, **parts: Any) -> RunConfig:
    """A RunConfig of validated sections, after the checks across them."""
    check_thread_setting(parts["torch_threads"], where)
    seed = parts["seed"]
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"{where}: seed must be an integer from 0 to {MAX_SEED}, got {seed!r}")
    if not isinstance(parts["adapt_defaults"], bool):
        raise ConfigError(
            f"{where}: adapt_defaults must be true or false, got {parts['adapt_defaults']!r}"
        )
    adapted = parts["adapted"]
    if not isinstance(adapted, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in adapted.items()
    ):
        raise ConfigError(
            f"{where}: adapted must map setting names to reasons (text), got {adapted!r}"
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
    cloning = parts["behavioral_cloning"]
    if cloning is not None:
        if not issubclass(algo_cls, ImitationPolicy):
            raise ConfigError(
                f"{where}: behavioral_cloning needs an algorithm with an imitation loss "
                f"(ppo, sac), not {algo_cls.name}"
            )
        check_demo_path(cloning.demo_path, f"{where}: behavioral_cloning.demo_path")
        if is_multi_agent_env(parts["env"].id):
            raise ConfigError(
                f"{where}: behavioral_cloning applies to single-agent runs, not to the "
                f"multi-agent env {parts['env'].id}"
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
        signals = parts["reward_signals"]
        if signals is not None and not signals.only_the_env_reward():
            extrinsic = signals.extrinsic
            got = [
                f"extrinsic (strength {extrinsic.strength:g})"
                if name == "extrinsic" and extrinsic is not None
                else name
                for name in signals.enabled()
            ]
            raise ConfigError(
                f"{where}: reward_signals apply to single-agent runs; a multi-agent env "
                f"({env_id}) trains on its own rewards: expected none or extrinsic at "
                f"strength 1, got {', '.join(got)}"
            )
        if parts["environment_parameters"]:
            raise ConfigError(
                f"{where}: environment_parameters apply to single-agent runs, not to the "
                f"multi-agent env {env_id}"
            )
        if parts["env"].restart_failed_envs:
            raise ConfigError(
                f"{where}: env.restart_failed_envs applies to single-agent runs; a "
                f"multi-agent env ({env_id}) is never restarted (a failed worker stops the "
                "run with EnvWorkerError; resume it from its last checkpoint)"
            )
    elif parts["multi_agent"] is not None:
        raise ConfigError(
            f"{where}: 'multi_agent' settings apply to multi-agent envs "
            f"({MULTI_AGENT_PREFIX}<module>), not to {env_id}"
        )
    parts["agent_behaviors"] = parse_behaviors(parts["agent_behaviors"], where, env_id)
    # Only the spelling: a GPU run's config.yaml stays readable on a machine without one.
    resolve_device(parts["device"], f"{where}: device", check_available=False)
    parts["device"] = str(parts["device"])
    check_network_memory(
        where, parts["hyperparameters"], parts["reward_signals"], parts["multi_agent"]
    )
    return RunConfig(algo=algo_cls.name, **parts)


def check_network_memory(where: str, *settings: Any) -> None:
    """Refuse network sizes whose parameters alone (with gradients and optimizer state)
    cannot fit in the memory available now (see :mod:`rlfleet.nn.budget`).

    Raises:
        InsufficientMemoryError: naming the estimate and the memory available.
    """
    parameters = sum(parameter_lower_bound(s) for s in settings)
    needed = parameters * BYTES_PER_PARAMETER
    available = available_memory_bytes()
    if needed > available:
        gib = 1024**3
        raise InsufficientMemoryError(
            f"{where}: the networks these settings ask for (hidden_sizes, lstm_hidden_size, "
            f"hidden_units x num_layers) have at least {parameters:,} parameters and need "
            f"{needed / gib:.1f} GiB with their gradients and optimizer state, but only "
            f"{available / gib:.1f} GiB of memory is available; use smaller layers"
        )


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
    algo: str | type[Algorithm[Any]],
    env_id: str,
    overrides: dict[str, Any] | None = None,
    *,
    adapt: bool = False,
    where: str | None = None,
) -> RunConfig:
    """The shipped preset for ``algo`` (a name, or the class it names) on ``env_id`` with
    ``overrides`` merged on top.

    ``adapt``: for an env the presets do not name, probe it and adapt the defaults the
    overrides leave unset (:func:`rlfleet.runs.adapt.adapted_preset`; not when the
    overrides set ``adapt_defaults`` false), as ``rlfleet train`` and ``PPO(env)`` do.
    ``where`` names the config in errors (default: the preset).
    """
    algo_cls = get_algorithm(algo) if isinstance(algo, str) else algo
    overrides = overrides or {}
    if adapt:
        env_kwargs = overrides.get("env", {}).get("kwargs")
        base, record = adapted_preset(algo_cls, env_id, overrides, env_kwargs=env_kwargs)
    else:
        base, record = preset(algo_cls.name, env_id), {}
    data = merge(base, {"algo": algo_cls.name, "env": {"id": env_id}})
    if record:
        data["adapted"] = record
    return run_config_from_dict(
        merge(data, overrides),
        where or f"{algo_cls.name} preset for {env_id}",
        algorithm_class=algo_cls,
    )


def run_config_to_dict(cfg: RunConfig) -> dict[str, Any]:
    data = {
        "algo": cfg.algo,
        "seed": cfg.seed,
        "device": cfg.device,
        "torch_threads": cfg.torch_threads,
        "deterministic": cfg.deterministic,
        "adapt_defaults": cfg.adapt_defaults,
        "env": to_dict(cfg.env),
        "trainer": to_dict(cfg.trainer),
        "hyperparameters": to_dict(cfg.hyperparameters),
    }
    if cfg.distributed is not None:
        data["distributed"] = to_dict(cfg.distributed)
    if cfg.reward_signals is not None:
        data["reward_signals"] = to_dict(cfg.reward_signals)
    if cfg.behavioral_cloning is not None:
        data["behavioral_cloning"] = to_dict(cfg.behavioral_cloning)
    if cfg.environment_parameters:
        data["environment_parameters"] = {
            name: parameter_to_dict(p) for name, p in cfg.environment_parameters.items()
        }
    if cfg.dataset is not None:
        data["dataset"] = cfg.dataset
    if cfg.multi_agent is not None:
        data["multi_agent"] = to_dict(cfg.multi_agent)
    if cfg.agent_behaviors:
        data["agent_behaviors"] = {
            name: {
                "agents": list(b.agents),
                "algo": b.algo,
                "hyperparameters": to_dict(b.hyperparameters),
            }
            for name, b in cfg.agent_behaviors.items()
        }
    if cfg.adapted:
        data["adapted"] = dict(cfg.adapted)
    return data


def load_run_config(run_dir: str | Path) -> RunConfig:
    """The config a run directory trains with: its current version (``config.yaml``, or the
    highest ``config.N.yaml`` a resume that changed the config wrote; see
    :mod:`rlfleet.config.versions`)."""
    run_dir = Path(run_dir)
    path = current_version(run_dir, CONFIG_FILE)
    if not path.is_file():
        raise RunDirError(
            f"{run_dir}: no {CONFIG_FILE} — expected a run directory written by `rlfleet train`"
        )
    return run_config_from_dict(load_yaml(path), str(path))
