"""The ``rlfleet`` command: train, eval, play and plot.

``rlfleet train ALGO --env ENV_ID [flags]`` builds its flags from the algorithm's config
dataclass, so every hyperparameter is settable under its config name and listed in
``--help`` with its shipped preset value for that env as the default.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, TypeVar

import numpy as np
import tyro
from rich.console import Console

from rlfleet.algos.registry import get_algorithm, list_algorithms
from rlfleet.config.loader import load_yaml, validate
from rlfleet.envs.make import VectorMode
from rlfleet.errors import ConfigError, RlfleetError
from rlfleet.train.run import (
    EnvConfig,
    RunConfig,
    default_run_config,
    load_run_config,
    run_config_from_dict,
)
from rlfleet.train.trainer import TrainerConfig

HP = TypeVar("HP")
COMMANDS = ("train", "eval", "play", "plot")
_err = Console(stderr=True, highlight=False, soft_wrap=True)
_out = Console(highlight=False, soft_wrap=True)


@dataclass
class TrainCommand(Generic[HP]):
    """Train an agent. Flags default to the shipped preset for the algorithm and env."""

    env: str
    """Gymnasium env id (e.g. CartPole-v1), or module:EnvId."""
    hyperparameters: Annotated[HP, tyro.conf.OmitArgPrefixes]
    trainer: Annotated[TrainerConfig, tyro.conf.OmitArgPrefixes]
    num_envs: int = 8
    """Training envs stepped together."""
    vector_mode: VectorMode = "auto"
    """native, sync, async, or auto (native where the env has it, else sync)."""
    num_test_envs: int = 10
    """Envs the test episodes run on."""
    seed: int = 0
    """Seeds networks, sampling and env resets."""
    device: str = "cpu"
    """Torch device."""
    torch_threads: int | None = 1
    """CPU threads for torch (None: one per core; 1 is fastest for small networks)."""
    run_dir: Path | None = None
    """Run directory (default: runs/<algo>-<env>-s<seed>-<time>)."""
    resume: Path | None = None
    """Continue the run in this directory from its latest checkpoint."""
    force: bool = False
    """Overwrite an existing run directory."""
    config: Path | None = None
    """Start from a run config YAML (e.g. another run's config.yaml)."""


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


@dataclass
class PlotCommand:
    """Plot one or more runs; runs that differ only by seed are drawn as mean and spread."""

    run_dirs: tyro.conf.Positional[list[Path]]
    """Run directories."""
    out: Path | None = None
    """Output PNG (default: the first run's plots/compare.png; for one run its learning curve)."""
    metric: str = "test/return_mean"
    """History column to plot."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlfleet`` command; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        _out.print(
            "usage: rlfleet {train,eval,play,plot} ...\n\n"
            "  train ALGO --env ENV   train an agent (ALGO: " + ", ".join(list_algorithms()) + ")\n"
            "  eval RUN_DIR           evaluate a trained policy\n"
            "  play RUN_DIR           play episodes on screen, to video or to frames\n"
            "  plot RUN_DIR...        plot learning curves of one or more runs\n\n"
            "`rlfleet COMMAND --help` lists a command's flags."
        )
        return 0
    command, rest = args[0], args[1:]
    try:
        if command == "train":
            return _train(rest)
        if command == "eval":
            return _eval(tyro.cli(EvalCommand, args=rest, prog="rlfleet eval"))
        if command == "play":
            return _play(tyro.cli(PlayCommand, args=rest, prog="rlfleet play"))
        if command == "plot":
            return _plot(tyro.cli(PlotCommand, args=rest, prog="rlfleet plot"))
        raise ConfigError(f"unknown command {command!r} (expected one of: {', '.join(COMMANDS)})")
    except RlfleetError as err:
        _err.print(f"[bold red]error:[/] {err}")
        return 2
    except KeyboardInterrupt:
        _err.print(
            "interrupted; the latest checkpoint is intact — "
            "continue with `rlfleet train ALGO --resume RUN_DIR`"
        )
        return 130


# ------------------------------------------------------------------- train
def _train(rest: list[str]) -> int:
    if not rest or rest[0].startswith("-"):
        if rest and rest[0] in ("-h", "--help"):
            _out.print(
                "usage: rlfleet train ALGO --env ENV [flags]   (ALGO: "
                + ", ".join(list_algorithms())
                + ")\n"
                "`rlfleet train ALGO --help` lists every flag with its preset value."
            )
            return 0
        raise ConfigError("rlfleet train needs an algorithm first: rlfleet train ALGO --env ENV")
    algo_name, rest = rest[0], rest[1:]
    algo_cls = get_algorithm(algo_name)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--env")
    pre.add_argument("--resume", type=Path)
    pre.add_argument("--config", type=Path)
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
    default = TrainCommand(
        env=base.env.id,
        hyperparameters=base.hyperparameters,
        trainer=base.trainer,
        num_envs=base.env.num_envs,
        vector_mode=base.env.vector_mode,
        num_test_envs=base.env.num_test_envs,
        seed=base.seed,
        device=base.device,
        torch_threads=base.torch_threads,
        run_dir=known.resume,
        resume=known.resume,
    )
    command_type: Any = TrainCommand[algo_cls.config_class]  # type: ignore[name-defined]
    cmd = tyro.cli(
        command_type,
        default=default,
        args=rest,
        prog=f"rlfleet train {algo_cls.name}",
    )
    cfg = RunConfig(
        algo=algo_cls.name,
        env=validate(
            EnvConfig,
            {
                "id": cmd.env,
                "num_envs": cmd.num_envs,
                "vector_mode": cmd.vector_mode,
                "num_test_envs": cmd.num_test_envs,
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
    )
    from rlfleet.train.run import train

    resume = cmd.resume is not None
    run_dir = cmd.resume if resume else cmd.run_dir
    result = train(cfg, run_dir, resume=resume, force=cmd.force)
    _out.print(
        f"done ({result.stop_reason}): best test score {result.best_score:.1f} at step "
        f"{result.best_env_step:,}; {result.env_steps:,} env steps, {result.episodes:,} episodes "
        f"in {result.wall_time_s:.1f} s\nrun directory: {result.run_dir}\n"
        f"learning curve: {result.run_dir}/plots/learning_curve.png"
    )
    return 0


# -------------------------------------------------------------- eval / play
def _eval(cmd: EvalCommand) -> int:
    from rlfleet.collect.evaluator import Evaluator
    from rlfleet.envs.make import make_vec_env
    from rlfleet.train.run import check_env_matches, load_algorithm

    algo, cfg = load_algorithm(cmd.run_dir, which=cmd.checkpoint)
    envs = make_vec_env(
        cfg.env.id,
        min(cfg.env.num_test_envs, cmd.episodes),
        mode=cfg.env.vector_mode,
        env_kwargs=cfg.env.kwargs,
        atari=cfg.env.atari.for_evaluation(),
    )
    try:
        check_env_matches(algo, envs.single_observation_space, envs.single_action_space, cfg.env.id)
        stats = Evaluator(envs, algo, seed=cmd.seed).run(
            cmd.episodes, deterministic=not cmd.stochastic
        )
    finally:
        envs.close()
    _out.print(
        f"{cfg.algo} on {cfg.env.id}: mean return {stats.mean:.2f} ± {stats.std:.2f} over "
        f"{stats.returns.size} episodes (min {stats.returns.min():.1f}, "
        f"max {stats.returns.max():.1f}; "
        f"mean length {np.mean(stats.lengths):.1f})"
    )
    return 0


def _play(cmd: PlayCommand) -> int:
    from rlfleet.collect.runner import PolicyRunner
    from rlfleet.envs.make import make_env
    from rlfleet.nn.masks import MASK_KEY
    from rlfleet.nn.obs import batch_of_one
    from rlfleet.train.run import check_env_matches, load_algorithm

    algo, cfg = load_algorithm(cmd.run_dir, which=cmd.checkpoint)
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


# -------------------------------------------------------------------- plot
def _plot(cmd: PlotCommand) -> int:
    from rlfleet.logging.plots import plot_learning_curve, plot_runs

    first = cmd.run_dirs[0]
    if len(cmd.run_dirs) == 1 and cmd.metric == "test/return_mean":
        out = cmd.out or first / "plots" / "learning_curve.png"
        history = first / "history.parquet"
        if not history.is_file():
            from rlfleet.errors import RunDirError

            raise RunDirError(
                f"{first}: no history.parquet — expected a run directory written by `rlfleet train`"
            )
        plot_learning_curve(history, out, title=first.name)
    else:
        out = cmd.out or first / "plots" / "compare.png"
        plot_runs(cmd.run_dirs, out, cmd.metric)
    _out.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
