"""``rlfleet train``: from an algorithm and flags, or from one YAML file.

``rlfleet train ALGO --env ENV [flags]``
    Every flag is a field of the typed run config (:class:`~rlfleet.runs.config.RunConfig`): the
    command embeds its sections (:class:`~rlfleet.runs.config.EnvConfig`, the algorithm's
    config, :class:`~rlfleet.train.loop.TrainerConfig`, ...) and tyro builds them, so
    ``--help`` lists every setting under its config name. The flags are laid over a base run
    config: the shipped preset for ALGO on ENV, the file ``--config FILE`` names, or with
    ``--resume RUN_DIR`` the run's own ``config.yaml``; ``--help`` shows the base's values as
    the defaults.

``rlfleet train FILE.yaml [flags]``
    A run config (a run's ``config.yaml``, ``rlfleet tune``'s ``best.yaml``) takes the same
    flags as its algorithm, laid over the file; ML-Agents run options take the run-options
    flags (:class:`TrainOptionsCommand`). :mod:`rlfleet.runs.run_file` tells them apart.

tyro fills a command's defaults from an object built before it parses, so the base must be
known first: :func:`train_base` reads the flags that choose it (``--env``, ``--config``,
``--resume``) from the arguments; tyro then parses all of them once, into the typed configs.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import (
    Annotated,
    Any,
    Generic,
    Literal,
    TypeVar,
    get_args,
    get_origin,
    get_type_hints,
)

import tyro

from rlfleet.algos.base import Algorithm
from rlfleet.algos.registry import algorithm_classes, get_algorithm
from rlfleet.cli.common import err, out
from rlfleet.cli.xagents import (
    XAgentsFlags,
    apply_flags,
    check_alias_conflicts,
    check_history_checkpoint,
    run_dir_of,
    write_history_checkpoint,
)
from rlfleet.config.fields import Seed, ThreadCount
from rlfleet.config.loader import load_yaml
from rlfleet.config.versions import current_version
from rlfleet.distributed.config import DistributedConfig
from rlfleet.errors import ConfigError
from rlfleet.logging.history import ENV_STEPS
from rlfleet.marl.trainer import MultiAgentSettings, Reduction
from rlfleet.nn.device import resolve_device
from rlfleet.nn.precision import check_precision
from rlfleet.runs.adapt import still_adapted
from rlfleet.runs.config import (
    EnvConfig,
    RunConfig,
    check_run_config,
    default_run_config,
    load_run_config,
    run_config_from_dict,
)
from rlfleet.runs.run import train as train_run
from rlfleet.runs.run_dir import ScheduleOnResume, default_run_dir, interrupted_message
from rlfleet.runs.run_file import RUN_CONFIG, RunFile, read_run_file, reading_as
from rlfleet.train.loop import TrainerConfig, TrainResult
from rlfleet.train.threads import DEFAULT_TORCH_THREADS

HP = TypeVar("HP")
HELP_ENV = "CartPole-v1"
"""The env whose preset ``rlfleet train ALGO --help`` shows when no ``--env`` is given."""


@dataclass
class TrainCommand(Generic[HP]):
    """Train an agent. Flags default to the shipped preset for the algorithm and env (or to
    the run config --config or --resume names)."""

    env: Annotated[EnvConfig, tyro.conf.OmitArgPrefixes]
    hyperparameters: Annotated[HP, tyro.conf.OmitArgPrefixes]
    trainer: Annotated[TrainerConfig, tyro.conf.OmitArgPrefixes]
    seed: Seed = 0
    """Seeds networks, sampling and env resets."""
    device: str = "cpu"
    """Torch device: cpu, cuda, cuda:N, mps or xpu (one this machine lacks is refused)."""
    torch_threads: ThreadCount | Literal["auto"] | None = DEFAULT_TORCH_THREADS
    """CPU threads for torch: a number, auto (chosen from the network width and batch size:
    1 for small networks) or None (one per core)."""
    deterministic: bool = False
    """Refuse nondeterministic torch kernels (bitwise-repeatable runs)."""
    adapt_defaults: bool = True
    """For an env the shipped presets do not name: adapt the defaults to a short probe of the
    env (one line per adapted setting says why). Flags given are never adapted."""
    run_dir: Path | None = None
    """Run directory (default: runs/<algo>-<env>-s<seed>-<time>, with -2, -3, ... if taken)."""
    resume: Path | None = None
    """Continue the run in this directory from its latest checkpoint."""
    schedule_on_resume: ScheduleOnResume | None = None
    """With --resume and a new --max-steps: continue keeps the schedules over the run's earlier
    max_steps, stretch runs them over the new one (needed when the run has a schedule)."""
    force: bool = False
    """Overwrite an existing run directory."""
    config: Path | None = None
    """Start from a run config YAML (e.g. another run's config.yaml, or tune's best.yaml)."""
    xagents: Annotated[XAgentsFlags, tyro.conf.OmitArgPrefixes] = field(
        default_factory=XAgentsFlags
    )
    base: tyro.conf.Suppress[RunConfig | None] = None
    """The run config the flags are laid over (its sections without flags, such as reward
    signals and environment parameters, come from it as they are)."""
    algorithm: tyro.conf.Suppress[Any] = None
    """The algorithm class, looked up once from the command line."""

    def run_config(self) -> RunConfig:
        """The base run config with the flags laid over it, checked once."""
        # Spelling and availability, before anything else is checked or built.
        device = resolve_device(self.device, "--device")
        check_precision(self.trainer.precision, device, "--precision")
        return check_run_config(
            self.laid_over(), "command line", algorithm_class=self.algorithm, flags=True
        )

    def laid_over(self) -> RunConfig:
        """The base run config with the flags laid over it (unchecked)."""
        if self.base is None or self.algorithm is None:
            raise ConfigError("rlfleet train ALGO: --env is required (e.g. --env CartPole-v1)")
        laid = replace(
            self.base,
            env=self.env,
            hyperparameters=self.hyperparameters,
            trainer=self.trainer,
            seed=self.seed,
            device=self.device,
            torch_threads=self.torch_threads,
            deterministic=self.deterministic,
            adapt_defaults=self.adapt_defaults,
            **self._kind_settings(),
        )
        laid = apply_flags(self.xagents, laid, self.algorithm)
        # A setting a flag changes is the user's, no longer adapted.
        return replace(laid, adapted=still_adapted(self.base.adapted, self.base, laid))

    def _kind_settings(self) -> dict[str, Any]:
        """RunConfig fields only some kinds of run have flags for."""
        return {}

    def run(self) -> int:
        cfg = self.run_config()
        named = run_dir_of(self.xagents, self.run_dir, self.resume)
        run_dir = self.resume or self.run_dir or named or default_run_dir(cfg)
        check_history_checkpoint(self.xagents, resume=self.resume is not None, force=self.force)
        since = None if self.resume is not None else time.time()
        try:
            result = train_run(
                cfg,
                run_dir,
                resume=self.resume is not None,
                force=self.force,
                algorithm_class=self.algorithm,
                schedule_on_resume=self.schedule_on_resume,
            )
        except KeyboardInterrupt:
            resume_command = f"rlfleet train {cfg.algo} --resume {shlex.quote(str(run_dir))}"
            err.print(interrupted_message(run_dir, resume_command, new_run_since=since))
            write_history_checkpoint(self.xagents, run_dir)
            return 130
        write_history_checkpoint(self.xagents, run_dir)
        if cfg.trainer.verbose:
            report(result)
        return 0


MULTI_AGENT_FLAGS = (
    "share_parameters",
    "learning_mask",
    "exploration_mask",
    "centralized_critic",
    "return_reduction",
    "shared_memory",
)
"""The fields of :class:`~rlfleet.marl.trainer.MultiAgentSettings` that
:class:`MultiAgentTrainCommand` has flags for (same names)."""


@dataclass
class MultiAgentTrainCommand(TrainCommand[HP]):
    """Train the agents of a PettingZoo game (``--env pettingzoo:<module>``), one algorithm
    per agent or per group sharing parameters. Flags default to the shipped preset; the
    other multi-agent settings (schedules, centralized-critic and self-play
    hyperparameters) come from ``--config FILE``'s ``multi_agent:`` section."""

    # The most used settings of the run config's ``multi_agent:`` section as flat flags:
    # nested, its names (batch_size, central_critic.learning_rate, ...) would collide with
    # the algorithm's own flags.
    share_parameters: bool = False
    """One network for all agents (with an agent-id feature) instead of one per agent."""
    learning_mask: list[bool] | None = None
    """One flag per agent, in possible_agents order: false freezes it (default: all learn)."""
    exploration_mask: list[bool] | None = None
    """One flag per agent: false makes it act greedily in training (default: all explore,
    frozen agents too)."""
    centralized_critic: bool = False
    """PPO learners use a critic over the env's global state (MAPPO)."""
    return_reduction: Reduction = "learning_mean"
    """How a test step's per-agent returns become its score: the learning agents' mean
    (learning_mean), the mean, sum, min or max over all agents, or one agent's (its index)."""
    shared_memory: bool = False
    """Step the env copies in subprocess workers, observations in shared memory."""

    def _kind_settings(self) -> dict[str, Any]:
        settings = (self.base.multi_agent if self.base is not None else None) or (
            MultiAgentSettings()
        )
        flags = {name: getattr(self, name) for name in MULTI_AGENT_FLAGS}
        return {"multi_agent": replace(settings, **flags)}


@dataclass
class DistributedTrainCommand(TrainCommand[HP]):
    """Train an actor-learner agent on Ray. Flags default to the shipped preset."""

    distributed: Annotated[DistributedConfig, tyro.conf.OmitArgPrefixes] = field(
        default_factory=DistributedConfig
    )

    def _kind_settings(self) -> dict[str, Any]:
        return {"distributed": self.distributed}


@dataclass
class OfflineTrainCommand(TrainCommand[HP]):
    """Train an offline agent from a dataset; the env runs the test episodes only. Flags
    default to the shipped preset."""

    dataset: Path | None = None
    """Dataset directory to learn from (written by `rlfleet collect`); required."""

    def _kind_settings(self) -> dict[str, Any]:
        return {"dataset": None if self.dataset is None else str(self.dataset)}


@dataclass
class TrainOptionsCommand:
    """Train from ML-Agents-style run options (see docs/run-options.md)."""

    run_options: tyro.conf.Positional[Path]
    """The run options file."""
    run_id: str | None = None
    """Run directory name under results_dir (overrides checkpoint_settings.run_id)."""
    results_dir: str | None = None
    """Parent of run directories (overrides checkpoint_settings.results_dir)."""
    resume: bool = False
    """Continue the run from its latest checkpoint."""
    schedule_on_resume: ScheduleOnResume | None = None
    """With --resume and a new max_steps: continue keeps the schedules over the run's earlier
    max_steps, stretch runs them over the new one (needed when the run has a schedule)."""
    force: bool = False
    """Replace an existing run directory."""
    initialize_from: str | None = None
    """Start from another run's weights: a run id under results_dir, or a run directory."""
    overrides: Annotated[list[str], tyro.conf.arg(name="set"), tyro.conf.UseAppendAction] = field(
        default_factory=list
    )
    """Override one setting, e.g. --set behaviors.CartPole.hyperparameters.learning_rate=3e-4
    (repeatable; the value is read as YAML)."""
    file: tyro.conf.Suppress[RunFile | None] = None
    """The file, read once to recognise its format."""

    def run(self) -> int:
        from rlfleet.runs.from_options import (
            RUN_OPTIONS_FILE,
            resolve_run_options,
            run_dir_of,
            the_behavior,
            train_from_options,
        )
        from rlfleet.runs.options_parser import parse_run_options

        flags = {
            "run_id": self.run_id,
            "results_dir": self.results_dir,
            "initialize_from": self.initialize_from,
            # Flags only switch these on; a file's own true value stays unless overridden.
            "resume": self.resume or None,
            "force": self.force or None,
        }
        run_file = self.file or read_run_file(self.run_options)
        with reading_as(run_file):
            options = parse_run_options(
                run_file.data, str(self.run_options), overrides=self.overrides, flags=flags
            )
        run_dir = run_dir_of(resolve_run_options(options, self.run_options))
        since = None if options.checkpoint_settings.resume else time.time()
        try:
            result = train_from_options(
                options, self.run_options, schedule_on_resume=self.schedule_on_resume
            )
        except KeyboardInterrupt:
            # The run directory's own options file replays the run, --set overrides included.
            options_file = current_version(run_dir, RUN_OPTIONS_FILE)
            resume_command = f"rlfleet train {shlex.quote(str(options_file))} --resume"
            err.print(interrupted_message(run_dir, resume_command, new_run_since=since))
            return 130
        if the_behavior(options)[1].trainer_settings.verbose:
            report(result)
        return 0


def command_class(algo_cls: type[Algorithm[Any]], *, multi_agent: bool = False) -> Any:
    """The command of ``rlfleet train ALGO``: its flags are the algorithm's config fields,
    and for a multi-agent run (a PettingZoo game) the multi-agent settings."""
    generic: Any = {
        "distributed": DistributedTrainCommand,
        "offline": OfflineTrainCommand,
    }.get(algo_cls.kind, MultiAgentTrainCommand if multi_agent else TrainCommand)
    return generic[algo_cls.config_class]


def default_command(algo_cls: type[Algorithm[Any]], base: RunConfig, resume: Path | None) -> Any:
    """The command whose fields are ``base``'s: what the flags are laid over."""
    kind: dict[str, Any] = {}
    if algo_cls.kind == "distributed":
        kind["distributed"] = base.distributed
    if algo_cls.kind == "offline":
        kind["dataset"] = None if base.dataset is None else Path(base.dataset)
    if base.multi_agent is not None:
        kind.update({name: getattr(base.multi_agent, name) for name in MULTI_AGENT_FLAGS})
    return command_class(algo_cls, multi_agent=base.multi_agent is not None)(
        env=base.env,
        hyperparameters=base.hyperparameters,
        trainer=base.trainer,
        seed=base.seed,
        device=base.device,
        torch_threads=base.torch_threads,
        deterministic=base.deterministic,
        adapt_defaults=base.adapt_defaults,
        run_dir=resume,
        resume=resume,
        base=base,
        algorithm=algo_cls,
        **kind,
    )


@dataclass(frozen=True)
class TrainBase:
    """What ``rlfleet train ALGO ...`` lays its flags over: known before they are parsed."""

    algorithm: type[Algorithm[Any]]
    config: RunConfig
    resume: Path | None


def train_base(algo_cls: type[Algorithm[Any]], args: Sequence[str]) -> TrainBase:
    """The base of ``rlfleet train ALGO [args]``: the run ``--resume`` continues, else the
    file ``--config`` names, else the shipped preset for ``--env``, adapted to the env when
    the presets do not name it and ``--no-adapt-defaults`` is not given (for ``--help``
    alone: the preset for :data:`HELP_ENV`)."""
    check_alias_conflicts(args)
    chosen = base_flags(args)
    resume = Path(chosen["resume"]) if "resume" in chosen else None
    if resume is not None:
        base = load_run_config(resume)
    elif "config" in chosen:
        path = chosen["config"]
        base = run_config_from_dict(load_yaml(path), path)
    elif "env" in chosen:
        overrides = {"adapt_defaults": chosen.get("adapt_defaults") != "false"}
        base = default_run_config(algo_cls, chosen["env"], overrides, adapt=True)
    elif any(arg in ("-h", "--help") for arg in args):
        base = default_run_config(algo_cls, HELP_ENV)
    else:
        raise ConfigError(
            f"rlfleet train {algo_cls.name}: --env is required (e.g. --env CartPole-v1)"
        )
    if base.algo != algo_cls.name:
        raise ConfigError(f"{resume or chosen['config']} is a {base.algo} run, not {algo_cls.name}")
    return TrainBase(algo_cls, base, resume)


def base_flags(args: Sequence[str]) -> dict[str, str]:
    """The values of ``--env``, ``--config`` and ``--resume`` in ``args`` (``--flag VALUE`` or
    ``--flag=VALUE``; the last one given wins, as tyro's parse lets it), and ``adapt_defaults``
    (``true`` or ``false``) when ``--adapt-defaults`` or ``--no-adapt-defaults`` is given."""
    found: dict[str, str] = {}
    for i, arg in enumerate(args):
        if arg in ("--adapt-defaults", "--no-adapt-defaults"):
            found["adapt_defaults"] = "true" if arg == "--adapt-defaults" else "false"
            continue
        name, equals, value = arg.partition("=")
        if name not in ("--env", "--config", "--resume"):
            continue
        if not equals:
            if i + 1 >= len(args):
                continue  # tyro reports the missing value
            value = args[i + 1]
        found[name.removeprefix("--")] = value
    return found


def file_command(run_file: RunFile, args: Sequence[str]) -> Any:
    """The command of ``rlfleet train FILE.yaml [args]``, its flags parsed from ``args``."""
    prog = f"rlfleet train {run_file.path}"
    if run_file.format != RUN_CONFIG:
        return tyro.cli(
            TrainOptionsCommand,
            args=[str(run_file.path), *args],
            prog="rlfleet train",
            default=TrainOptionsCommand(run_options=run_file.path, file=run_file),
        )
    with reading_as(run_file):
        base = run_config_from_dict(run_file.data, str(run_file.path))
    algo_cls: type[Algorithm[Any]] = get_algorithm(base.algo)
    check_alias_conflicts(args)
    chosen = base_flags(args)
    for flag in ("config", "resume"):
        if flag in chosen:
            raise ConfigError(
                f"rlfleet train {run_file.path}: the file is the run config already; drop "
                f"--{flag} (to continue a run: rlfleet train {algo_cls.name} --resume RUN_DIR)"
            )
    default = default_command(algo_cls, base, None)
    return tyro.cli(command_class(algo_cls), args=list(args), prog=prog, default=default)


def command_line(cfg: RunConfig, algo_cls: type[Algorithm[Any]]) -> list[str]:
    """The flags of ``rlfleet train ALGO`` that set every setting of ``cfg`` that has a flag
    (the others, such as ``env.kwargs`` or ``reward_signals``, come from the base run
    config): laid over any base, they give ``cfg`` back."""
    sections: list[tuple[Any, Any]] = [(EnvConfig, cfg.env), (TrainerConfig, cfg.trainer)]
    sections.append((algo_cls.config_class, cfg.hyperparameters))
    scalars: dict[str, Any] = {
        "seed": cfg.seed,
        "device": cfg.device,
        "torch_threads": cfg.torch_threads,
        "deterministic": cfg.deterministic,
        "adapt_defaults": cfg.adapt_defaults,
    }
    if algo_cls.kind == "distributed":
        sections.append((DistributedConfig, cfg.distributed))
    if algo_cls.kind == "offline":
        scalars["dataset"] = cfg.dataset
    flags: list[str] = []
    for cls, section in sections:
        hints = get_type_hints(cls, include_extras=True)
        for item in fields(cls):
            hint = hints[item.name]
            if get_origin(hint) is Annotated and tyro.conf.Suppress in get_args(hint)[1:]:
                continue
            flags += _flag(_flag_name(hint, item.name), getattr(section, item.name))
    for name, value in scalars.items():
        flags += _flag(name, value)
    return flags


def _flag_name(hint: Any, name: str) -> str:
    """A field's flag name (``tyro.conf.arg(name=...)`` renames one)."""
    if get_origin(hint) is Annotated:
        for marker in get_args(hint)[1:]:
            if getattr(marker, "name", None) and not isinstance(marker, type):
                return str(marker.name)
    return name


def _flag(name: str, value: Any) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + name.replace("_", "-")]
    if value is None:
        return [flag, "None"]
    if isinstance(value, tuple | list):
        return [flag, *(_text(v) for v in value)]
    return [flag, _text(value)]


def _text(value: Any) -> str:
    # repr: the shortest text that reads back as the same float.
    return repr(value) if isinstance(value, float) else str(value)


def is_run_file(arg: str) -> bool:
    """Whether ``rlfleet train ARG`` names a YAML file rather than an algorithm."""
    return arg.endswith((".yaml", ".yml")) or Path(arg).is_file()


def subcommands(selected: TrainBase | None) -> list[Any]:
    """``rlfleet train``'s subcommands, one per algorithm; the selected one defaults to its
    base run config."""
    members = []
    for name, algo_cls in algorithm_classes().items():
        multi_agent = False
        default = None
        if selected is not None and selected.algorithm.name == name:
            algo_cls = selected.algorithm
            default = default_command(algo_cls, selected.config, selected.resume)
            multi_agent = selected.config.multi_agent is not None
        summary = (algo_cls.__doc__ or "").strip().split("\n\n")[0]
        members.append(
            Annotated[
                command_class(algo_cls, multi_agent=multi_agent),
                tyro.conf.subcommand(name, default=default, description=summary or None),
            ]
        )
    return members


def report(result: TrainResult) -> None:
    """The lines ``rlfleet train`` ends with: why it stopped, the best score, where it went."""
    if result.step_unit == ENV_STEPS:
        best_at = f"step {result.best_env_step:,}"
        done = f"{result.env_steps:,} env steps, {result.episodes:,} episodes"
    else:
        # Offline: the counter counts gradient steps, and no training episode is played.
        best_at = f"{result.step_unit.removesuffix('s')} {result.best_env_step:,}"
        done = f"{result.env_steps:,} {result.step_unit}"
    out.print(
        f"done ({result.stop_reason}): best test score {result.best_score:.1f} at {best_at}; "
        f"{done} in {result.wall_time_s:.1f} s (test {result.test_share:.0%} of time)\n"
        f"run directory: {result.run_dir}\n"
        f"learning curve: {result.run_dir}/plots/learning_curve.png"
    )
