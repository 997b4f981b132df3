"""The ``rlfleet`` command: train, collect, eval, play, plot and tune.

``rlfleet train ALGO --env ENV_ID [flags]`` builds its flags from the algorithm's config
dataclass, so every hyperparameter is settable under its config name and listed in
``--help`` with its shipped preset value for that env as the default.
``rlfleet train OPTIONS.yaml [flags]`` trains from an ML-Agents-style run options file
(:mod:`rlfleet.runs.run_options`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, TypeVar

import numpy as np
import tyro
from rich.console import Console
from rich.markup import escape

from rlfleet.algos.registry import get_algorithm, list_algorithms
from rlfleet.config.loader import load_yaml, validate
from rlfleet.distributed.config import DistributedConfig
from rlfleet.envs.make import VectorMode
from rlfleet.errors import ConfigError, RlfleetError, cli_wording
from rlfleet.logging.history import ENV_STEPS
from rlfleet.nn.device import resolve_device
from rlfleet.runs.run import (
    EnvConfig,
    RunConfig,
    default_run_config,
    default_run_dir,
    interrupted_message,
    load_run_config,
    run_config_from_dict,
)
from rlfleet.train.trainer import TrainerConfig, TrainResult
from rlfleet.tune.setup import TuneConfig

HP = TypeVar("HP")
COMMANDS = ("train", "collect", "eval", "play", "plot", "tune", "check-env")
_err = Console(stderr=True, highlight=False, soft_wrap=True)
_out = Console(highlight=False, soft_wrap=True)


@dataclass
class TrainCommand(Generic[HP]):
    """Train an agent. Flags default to the shipped preset for the algorithm and env."""

    env: str
    """Gymnasium env id (e.g. CartPole-v1), module:EnvId, module:EnvClass, or pettingzoo:<module>
    (multi-agent)."""
    hyperparameters: Annotated[HP, tyro.conf.OmitArgPrefixes]
    trainer: Annotated[TrainerConfig, tyro.conf.OmitArgPrefixes]
    num_envs: int = 8
    """Training envs stepped together."""
    vector_mode: VectorMode = "auto"
    """native, sync, async, or auto (native where the env has it, else sync)."""
    num_test_envs: int = 10
    """Envs the test episodes run on."""
    step_timeout_s: float = 60.0
    """async workers: seconds one step or reset may take before the worker counts as hung."""
    restart_failed_envs: bool = False
    """Restart env workers that die, raise or hang, truncate their episode and go on."""
    seed: int = 0
    """Seeds networks, sampling and env resets."""
    device: str = "cpu"
    """Torch device: cpu, cuda, cuda:N, mps or xpu (one this machine lacks is refused)."""
    torch_threads: int | None = 1
    """CPU threads for torch (None: one per core; 1 is fastest for small networks)."""
    deterministic: bool = False
    """Refuse nondeterministic torch kernels (bitwise-repeatable runs)."""
    run_dir: Path | None = None
    """Run directory (default: runs/<algo>-<env>-s<seed>-<time>)."""
    resume: Path | None = None
    """Continue the run in this directory from its latest checkpoint."""
    force: bool = False
    """Overwrite an existing run directory."""
    config: Path | None = None
    """Start from a run config YAML (e.g. another run's config.yaml)."""


@dataclass
class DistributedTrainCommand(TrainCommand[HP]):
    """Train an actor-learner agent on Ray. Flags default to the shipped preset."""

    distributed: Annotated[DistributedConfig, tyro.conf.OmitArgPrefixes] = field(
        default_factory=DistributedConfig
    )


@dataclass
class TrainOptionsCommand:
    """Train from a run options YAML file (ML-Agents style; see docs/run-options.md)."""

    run_options: tyro.conf.Positional[Path]
    """The run options file."""
    run_id: str | None = None
    """Run directory name under results_dir (overrides checkpoint_settings.run_id)."""
    results_dir: str | None = None
    """Parent of run directories (overrides checkpoint_settings.results_dir)."""
    resume: bool = False
    """Continue the run from its latest checkpoint."""
    force: bool = False
    """Replace an existing run directory."""
    initialize_from: str | None = None
    """Start from another run's weights: a run id under results_dir, or a run directory."""
    overrides: Annotated[list[str], tyro.conf.arg(name="set"), tyro.conf.UseAppendAction] = field(
        default_factory=list
    )
    """Override one setting, e.g. --set behaviors.CartPole.hyperparameters.learning_rate=3e-4
    (repeatable; the value is read as YAML)."""


@dataclass
class OfflineTrainCommand(TrainCommand[HP]):
    """Train an offline agent from a dataset; the env runs the test episodes only. Flags
    default to the shipped preset."""

    num_envs: tyro.conf.Suppress[int] = 1
    """No env is stepped for training."""
    dataset: Path | None = None
    """Dataset directory to learn from (written by `rlfleet collect`); required."""


@dataclass
class CollectCommand:
    """Record an offline dataset with a trained run's policy."""

    run_dir: tyro.conf.Positional[Path]
    """Run directory written by `rlfleet train`."""
    steps: int
    """Transitions to record."""
    out: Path
    """Dataset directory to write."""
    epsilon: float = 0.0
    """Probability of a uniformly random action instead of the policy's."""
    stochastic: bool = False
    """Sample the policy's actions instead of taking the greedy action."""
    checkpoint: Literal["best", "latest"] = "best"
    """Which policy: the best-scoring one or the latest checkpoint."""
    num_envs: int = 4
    """Envs stepped together."""
    seed: int = 0
    """Seed of the env resets and random actions."""
    force: bool = False
    """Overwrite an existing dataset directory."""
    device: str | None = None
    """Torch device to run the policy on (default: the one the run trained on)."""


@dataclass
class EvalCommand:
    """Evaluate a trained run's policy on test episodes."""

    run_dir: tyro.conf.Positional[Path]
    """Run directory written by `rlfleet train`."""
    episodes: int = 20
    """Number of test episodes."""
    checkpoint: Literal["best", "latest"] = "best"
    """Which policy: the best-scoring one or the latest checkpoint."""
    seed: int = 12345
    """Seed of the evaluation envs."""
    stochastic: bool = False
    """Sample actions instead of taking the greedy action."""
    device: str | None = None
    """Torch device to run the policy on (default: the one the run trained on)."""


@dataclass
class PlayCommand:
    """Play a trained policy: on screen, to video files, or to PNG frames."""

    run_dir: tyro.conf.Positional[Path]
    """Run directory written by `rlfleet train`."""
    episodes: int = 1
    """Episodes to play."""
    video_dir: Path | None = None
    """Write one MP4 per episode here."""
    frame_dir: Path | None = None
    """Write every frame as PNG here (episode-NNN/frame-NNNNN.png)."""
    render: bool = False
    """Show the env's own window (needs a display)."""
    checkpoint: Literal["best", "latest"] = "best"
    """Which policy: the best-scoring one or the latest checkpoint."""
    seed: int = 0
    """Seed of the played episodes."""
    fps: int = 30
    """Frames per second of the videos."""
    device: str | None = None
    """Torch device to run the policy on (default: the one the run trained on)."""


@dataclass
class CheckEnvCommand:
    """Check an env against the Gymnasium / PettingZoo API and measure its step time."""

    target: tyro.conf.Positional[str]
    """Registered env id (CartPole-v1), package.module:EnvId or package.module:EnvClass."""
    steps: int = 2000
    """Random steps to run."""
    seed: int = 0
    """Seed of the resets and random actions."""


@dataclass
class PlotCommand:
    """Plot one run's learning curve, or compare runs: the seeds of one config are drawn as
    their IQM (or mean) with a 95% bootstrap confidence band, one panel per env."""

    run_dirs: tyro.conf.Positional[list[Path]]
    """Run directories written by `rlfleet train`."""
    out: Path | None = None
    """Output PNG (default: the first run's plots/compare.png; for one run its learning curve)."""
    metric: str = "test/return_mean"
    """History column to plot."""
    statistic: Literal["iqm", "mean"] = "iqm"
    """Across the seeds of a config: interquartile mean (rliable's; with under 4 runs it is
    the mean) or mean."""
    smooth: int = 1
    """Rolling mean over this many logged values of each run (1: no smoothing)."""


@dataclass
class TuneCommand:
    """Search hyperparameters with Optuna: each trial trains several seeds, unpromising
    trials are pruned, and the best config is written as YAML for `rlfleet train`."""

    env: str
    """Gymnasium env id (e.g. CartPole-v1), module:EnvId or module:EnvClass."""
    options: Annotated[TuneConfig, tyro.conf.OmitArgPrefixes] = field(default_factory=TuneConfig)


@cli_wording()
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlfleet`` command; returns the exit code. Errors name
    command-line flags, not the Python parameters behind them."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        _out.print(
            "usage: rlfleet {train,collect,eval,play,plot,tune,check-env} ...\n\n"
            "  train ALGO --env ENV   train an agent (ALGO: " + ", ".join(list_algorithms()) + ")\n"
            "  train OPTIONS.yaml     train from a run options file (ML-Agents style)\n"
            "  collect RUN_DIR        record an offline dataset with a trained policy\n"
            "  eval RUN_DIR           evaluate a trained policy\n"
            "  play RUN_DIR           play episodes on screen, to video or to frames\n"
            "  plot RUN_DIR...        plot learning curves of one or more runs\n"
            "  tune ALGO --env ENV    search hyperparameters with Optuna\n"
            "  check-env ENV          check an env's API, seeding, values and speed\n\n"
            "`rlfleet COMMAND --help` lists a command's flags."
        )
        return 0
    command, rest = args[0], args[1:]
    try:
        if command == "train":
            return _train(rest)
        if command == "collect":
            return _collect(tyro.cli(CollectCommand, args=rest, prog="rlfleet collect"))
        if command == "eval":
            return _eval(tyro.cli(EvalCommand, args=rest, prog="rlfleet eval"))
        if command == "play":
            return _play(tyro.cli(PlayCommand, args=rest, prog="rlfleet play"))
        if command == "plot":
            return _plot(tyro.cli(PlotCommand, args=rest, prog="rlfleet plot"))
        if command == "tune":
            return _tune(rest)
        if command == "check-env":
            return _check_env(tyro.cli(CheckEnvCommand, args=rest, prog="rlfleet check-env"))
        raise ConfigError(f"unknown command {command!r} (expected one of: {', '.join(COMMANDS)})")
    except RlfleetError as err:
        # Escaped: messages quote code (a worker's traceback), whose [index] is no markup.
        _err.print(f"[bold red]error:[/] {escape(str(err))}")
        return 2
    except KeyboardInterrupt:
        # `train` names its resume command itself; anything else has nothing to resume.
        _err.print("interrupted")
        return 130


# ------------------------------------------------------------------- train
def _train(rest: list[str]) -> int:
    if not rest or rest[0].startswith("-"):
        if rest and rest[0] in ("-h", "--help"):
            _out.print(
                "usage: rlfleet train ALGO --env ENV [flags]   (ALGO: "
                + ", ".join(list_algorithms())
                + ")\n"
                "       rlfleet train OPTIONS.yaml [--run-id ID] [--resume | --force | "
                "--initialize-from RUN] [--set KEY=VALUE]\n"
                "`rlfleet train ALGO --help` lists every flag with its preset value; "
                "`rlfleet train OPTIONS.yaml --help` the run options flags."
            )
            return 0
        raise ConfigError(
            "rlfleet train needs an algorithm or a run options file first: "
            "rlfleet train ALGO --env ENV, or rlfleet train OPTIONS.yaml"
        )
    if _is_options_file(rest[0]):
        return _train_options(tyro.cli(TrainOptionsCommand, args=rest, prog="rlfleet train"))
    algo_name, rest = rest[0], rest[1:]
    algo_cls = get_algorithm(algo_name)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--env")
    pre.add_argument("--resume", type=Path)
    pre.add_argument("--config", type=Path)
    pre.add_argument("--dataset")
    known, _ = pre.parse_known_args(rest)
    wants_help = any(a in ("-h", "--help") for a in rest)
    if known.resume is not None:
        base = load_run_config(known.resume)
    elif known.config is not None:
        base = run_config_from_dict(load_yaml(known.config), str(known.config))
    elif known.env is not None:
        base = default_run_config(algo_cls.name, known.env)
    elif wants_help:
        base = default_run_config(algo_cls.name, "CartPole-v1")
    else:
        raise ConfigError(f"rlfleet train {algo_name}: --env is required (e.g. --env CartPole-v1)")
    if base.algo != algo_cls.name:
        raise ConfigError(
            f"{known.resume or known.config} is a {base.algo} run, not {algo_cls.name}"
        )
    distributed = algo_cls.kind == "distributed"
    offline = algo_cls.kind == "offline"
    command_class: Any = (
        DistributedTrainCommand if distributed else OfflineTrainCommand if offline else TrainCommand
    )
    extra: dict[str, Any] = {"distributed": base.distributed} if distributed else {}
    if offline:
        extra["dataset"] = Path(base.dataset) if base.dataset is not None else None
    default = command_class(
        env=base.env.id,
        hyperparameters=base.hyperparameters,
        trainer=base.trainer,
        num_envs=base.env.num_envs,
        vector_mode=base.env.vector_mode,
        num_test_envs=base.env.num_test_envs,
        step_timeout_s=base.env.step_timeout_s,
        restart_failed_envs=base.env.restart_failed_envs,
        seed=base.seed,
        device=base.device,
        torch_threads=base.torch_threads,
        deterministic=base.deterministic,
        run_dir=known.resume,
        resume=known.resume,
        **extra,
    )
    command_type: Any = command_class[algo_cls.config_class]
    cmd = tyro.cli(
        command_type,
        default=default,
        args=rest,
        prog=f"rlfleet train {algo_cls.name}",
    )
    resolve_device(cmd.device, "--device")
    cfg = RunConfig(
        algo=algo_cls.name,
        env=validate(
            EnvConfig,
            {
                "id": cmd.env,
                "num_envs": cmd.num_envs,
                "vector_mode": cmd.vector_mode,
                "num_test_envs": cmd.num_test_envs,
                "step_timeout_s": cmd.step_timeout_s,
                "restart_failed_envs": cmd.restart_failed_envs,
                "kwargs": base.env.kwargs,
                "atari": base.env.atari,
            },
            "--env",
        ),
        hyperparameters=validate(algo_cls.config_class, cmd.hyperparameters, "hyperparameters"),
        trainer=validate(TrainerConfig, cmd.trainer, "trainer"),
        seed=cmd.seed,
        device=cmd.device,
        torch_threads=cmd.torch_threads,
        deterministic=cmd.deterministic,
        distributed=(
            validate(DistributedConfig, cmd.distributed, "distributed") if distributed else None
        ),
        reward_signals=base.reward_signals,
        environment_parameters=base.environment_parameters,
        dataset=str(cmd.dataset) if offline and cmd.dataset is not None else None,
        multi_agent=base.multi_agent if cmd.env == base.env.id else None,
    )
    from rlfleet.runs.run import train

    resume = cmd.resume is not None
    run_dir = cmd.resume or cmd.run_dir or default_run_dir(cfg)
    try:
        result = train(cfg, run_dir, resume=resume, force=cmd.force)
    except KeyboardInterrupt:
        resume_command = f"rlfleet train {cfg.algo} --resume {shlex.quote(str(run_dir))}"
        _err.print(interrupted_message(run_dir, resume_command))
        return 130
    if cfg.trainer.verbose:
        _report(result)
    return 0


def _is_options_file(arg: str) -> bool:
    return arg.endswith((".yaml", ".yml")) or Path(arg).is_file()


def _train_options(cmd: TrainOptionsCommand) -> int:
    from rlfleet.runs.from_options import (
        RUN_OPTIONS_FILE,
        resolve_run_options,
        run_dir_of,
        the_behavior,
        train_from_options,
    )
    from rlfleet.runs.options_parser import load_run_options

    flags = {
        "run_id": cmd.run_id,
        "results_dir": cmd.results_dir,
        "initialize_from": cmd.initialize_from,
        # Flags only switch these on; a file's own true value stays unless overridden.
        "resume": cmd.resume or None,
        "force": cmd.force or None,
    }
    options = load_run_options(cmd.run_options, overrides=cmd.overrides, flags=flags)
    run_dir = run_dir_of(resolve_run_options(options, cmd.run_options))
    try:
        result = train_from_options(options, cmd.run_options)
    except KeyboardInterrupt:
        # The run directory's own options file replays the run, --set overrides included.
        resume_command = f"rlfleet train {shlex.quote(str(run_dir / RUN_OPTIONS_FILE))} --resume"
        _err.print(interrupted_message(run_dir, resume_command))
        return 130
    if the_behavior(options)[1].trainer_settings.verbose:
        _report(result)
    return 0


def _report(result: TrainResult) -> None:
    if result.step_unit == ENV_STEPS:
        best_at = f"step {result.best_env_step:,}"
        done = f"{result.env_steps:,} env steps, {result.episodes:,} episodes"
    else:
        # Offline: the counter counts gradient steps, and no training episode is played.
        best_at = f"{result.step_unit.removesuffix('s')} {result.best_env_step:,}"
        done = f"{result.env_steps:,} {result.step_unit}"
    _out.print(
        f"done ({result.stop_reason}): best test score {result.best_score:.1f} at {best_at}; "
        f"{done} in {result.wall_time_s:.1f} s\nrun directory: {result.run_dir}\n"
        f"learning curve: {result.run_dir}/plots/learning_curve.png"
    )


# -------------------------------------------------------------------- tune
def _tune(rest: list[str]) -> int:
    if not rest or rest[0].startswith("-"):
        if rest and rest[0] in ("-h", "--help"):
            _out.print(
                "usage: rlfleet tune ALGO --env ENV [--trials N] [flags]   (ALGO: "
                + ", ".join(list_algorithms())
                + ")\n`rlfleet tune ALGO --help` lists every flag; docs/tuning.md explains them."
            )
            return 0
        raise ConfigError("rlfleet tune needs an algorithm first: rlfleet tune ALGO --env ENV")
    algo_cls = get_algorithm(rest[0])
    cmd = tyro.cli(TuneCommand, args=rest[1:], prog=f"rlfleet tune {algo_cls.name}")
    from rlfleet.tune import tune

    try:
        result = tune(algo_cls.name, cmd.env, cmd.options)
    except KeyboardInterrupt:
        _err.print(
            "interrupted; running trials were queued again — rerun the same command to resume "
            "the study"
        )
        return 130
    lines = [
        f"study {result.study_name!r}: {result.complete} complete, {result.pruned} pruned, "
        f"{result.failed} failed of {result.requested} trials"
        + (
            f" ({result.unfinished} not finished yet; rerun the same command to continue)"
            if result.unfinished
            else ""
        ),
    ]
    if result.best_config is not None and result.best_value is not None:
        lines.append(
            f"best: trial {result.best_trial}, value {result.best_value:.2f} — train it with "
            f"`rlfleet train {algo_cls.name} --config {result.best_config}`"
        )
    lines.append(f"trials: {result.trials_table}")
    lines.extend(f"plot: {path}" for path in result.plots)
    lines.extend(f"note: {note}" for note in result.notes)
    _out.print("\n".join(lines))
    return 0


# ----------------------------------------------------------------- collect
def _collect(cmd: CollectCommand) -> int:
    from rlfleet.collect.record import record_dataset
    from rlfleet.data.dataset import check_output_dir
    from rlfleet.runs.run import load_algorithm

    # Refuse a taken output directory before spending time on recording.
    check_output_dir(cmd.out, overwrite=cmd.force)
    algo, cfg = load_algorithm(cmd.run_dir, which=cmd.checkpoint, device=_device(cmd.device))
    dataset = record_dataset(
        algo,
        cfg.env.id,
        cmd.steps,
        epsilon=cmd.epsilon,
        deterministic=not cmd.stochastic,
        num_envs=cmd.num_envs,
        seed=cmd.seed,
        env_kwargs=cfg.env.kwargs,
        source={"run_dir": str(cmd.run_dir), "checkpoint": cmd.checkpoint},
        show_progress=True,
    )
    path = dataset.save(cmd.out, overwrite=cmd.force)
    _out.print(f"wrote {path}\n{dataset.stats().describe()}")
    return 0


def _device(flag: str | None) -> str | None:
    """A ``--device`` flag, checked before a run is loaded (None: the run's own device)."""
    if flag is not None:
        resolve_device(flag, "--device")
    return flag


# -------------------------------------------------------------- eval / play
def _eval(cmd: EvalCommand) -> int:
    from rlfleet.runs.run import evaluate

    stats, cfg = evaluate(
        cmd.run_dir,
        cmd.episodes,
        seed=cmd.seed,
        deterministic=not cmd.stochastic,
        which=cmd.checkpoint,
        device=_device(cmd.device),
    )
    _out.print(
        f"{cfg.algo} on {cfg.env.id}: mean return {stats.mean:.2f} ± {stats.std:.2f} over "
        f"{stats.lengths.size} episodes (min {stats.returns.min():.1f}, "
        f"max {stats.returns.max():.1f}; "
        f"mean length {np.mean(stats.lengths):.1f})"
    )
    return 0


def _play(cmd: PlayCommand) -> int:
    from rlfleet.collect.runner import PolicyRunner
    from rlfleet.envs.make import make_env
    from rlfleet.nn.masks import MASK_KEY
    from rlfleet.nn.obs import batch_of_one
    from rlfleet.runs.multi_agent import is_multi_agent_run, play_command
    from rlfleet.runs.run import check_env_matches, load_algorithm

    if is_multi_agent_run(cmd.run_dir):
        return play_command(
            cmd.run_dir,
            episodes=cmd.episodes,
            seed=cmd.seed,
            frame_dir=cmd.frame_dir,
            checkpoint=cmd.checkpoint,
        )
    algo, cfg = load_algorithm(cmd.run_dir, which=cmd.checkpoint, device=_device(cmd.device))
    record = cmd.video_dir is not None or cmd.frame_dir is not None
    if record and cmd.render:
        raise ConfigError(
            "--render shows a window; combine it with neither --video-dir nor --frame-dir"
        )
    render_mode = "human" if cmd.render else ("rgb_array" if record else None)
    if render_mode == "rgb_array":
        # Off-screen rendering: keep pygame-based envs from looking for a display or audio.
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    env = make_env(
        cfg.env.id, render_mode=render_mode, atari=cfg.env.atari.for_evaluation(), **cfg.env.kwargs
    )
    writer = _FrameWriter(cmd.video_dir, cmd.frame_dir, cmd.fps) if record else None
    try:
        check_env_matches(algo, env.observation_space, env.action_space, cfg.env.id)
        runner = PolicyRunner(algo, 1)
        not_done = np.zeros(1, dtype=bool)
        for episode in range(cmd.episodes):
            obs, info = env.reset(seed=cmd.seed + episode)
            runner.reset()
            total, length, done = 0.0, 0, False
            frames: list[np.ndarray] = []
            while not done:
                if writer is not None:
                    frames.append(np.asarray(env.render()))
                infos = {MASK_KEY: np.asarray(info[MASK_KEY])[None]} if MASK_KEY in info else None
                acted = runner.act(batch_of_one(obs), infos, not_done, deterministic=True)
                action = algo.env_actions(acted.step.actions)[0]
                obs, reward, terminated, truncated, info = env.step(action)
                total += float(reward)
                length += 1
                done = bool(terminated or truncated)
            if writer is not None:
                frames.append(np.asarray(env.render()))
                for path in writer.write(episode, frames):
                    _out.print(f"wrote {path}")
            _out.print(f"episode {episode + 1}: return {total:.2f}, length {length}")
    finally:
        env.close()
    return 0


class _FrameWriter:
    """Writes an episode's frames as an MP4 and/or PNG files."""

    def __init__(self, video_dir: Path | None, frame_dir: Path | None, fps: int) -> None:
        self.video_dir = video_dir
        self.frame_dir = frame_dir
        self.fps = fps

    def write(self, episode: int, frames: list[np.ndarray]) -> list[Path]:
        written: list[Path] = []
        if self.video_dir is not None:
            try:
                import imageio.v2 as imageio
            except ImportError as err:
                from rlfleet.errors import MissingDependencyError

                raise MissingDependencyError(
                    "writing videos needs imageio and imageio-ffmpeg: pip install 'rlfleet[video]'"
                ) from err
            self.video_dir.mkdir(parents=True, exist_ok=True)
            path = self.video_dir / f"episode-{episode:03d}.mp4"
            imageio.mimwrite(path, frames, fps=self.fps, macro_block_size=1)  # type: ignore[arg-type]
            written.append(path)
        if self.frame_dir is not None:
            from PIL import Image

            folder = self.frame_dir / f"episode-{episode:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i, frame in enumerate(frames):
                Image.fromarray(frame).save(folder / f"frame-{i:05d}.png")
            written.append(folder)
        return written


# --------------------------------------------------------------- check-env
def _check_env(cmd: CheckEnvCommand) -> int:
    from rich.table import Table

    from rlfleet.envs.check import check_env
    from rlfleet.envs.make import env_spec

    # A target that names no env is bad input (exit 2), not an env that fails its checks.
    env_spec(cmd.target)
    report = check_env(cmd.target, num_steps=cmd.steps, seed=cmd.seed)
    table = Table(title=f"rlfleet check-env {cmd.target}", show_lines=False)
    table.add_column("", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("finding")
    style = {"error": "[bold red]error[/]", "warning": "[yellow]warning[/]", "info": "[green]ok[/]"}
    for finding in report.findings:
        table.add_row(style[finding.level], finding.check, finding.message)
    _out.print(table)
    errors, warnings = len(report.errors()), len(report.warnings())
    _out.print(f"{errors} error(s), {warnings} warning(s)")
    return 0 if report.ok else 1


# -------------------------------------------------------------------- plot
def _plot(cmd: PlotCommand) -> int:
    from rlfleet.logging.plots import plot_learning_curve, plot_runs

    if not cmd.run_dirs:
        raise ConfigError(
            "rlfleet plot needs one or more run directories: rlfleet plot RUN_DIR [RUN_DIR ...] "
            "(directories written by `rlfleet train`)"
        )
    first = cmd.run_dirs[0]
    if len(cmd.run_dirs) == 1 and cmd.metric == "test/return_mean":
        out = cmd.out or first / "plots" / "learning_curve.png"
        history = first / "history.parquet"
        if not history.is_file():
            from rlfleet.errors import RunDirError

            raise RunDirError(
                f"{first}: no history.parquet — expected a run directory written by `rlfleet train`"
            )
        plot_learning_curve(history, out, title=first.name, smooth=cmd.smooth)
    else:
        out = cmd.out or first / "plots" / "compare.png"
        plot_runs(cmd.run_dirs, out, cmd.metric, statistic=cmd.statistic, smooth=cmd.smooth)
    _out.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
