"""``rlfleet play RUN_DIR``: play a trained policy on screen, to videos or to PNG frames.

xagents' play command line runs too: ``rlfleet play ppo --env CartPole-v1 --weights
ppo-cartpole.tf`` plays the run that ``rlfleet train ppo ... --checkpoints ppo-cartpole.tf``
wrote, and ``--frame-delay``, ``--max-steps``, ``--frame-frequency`` and ``--action-idx``
mean what they mean in xagents.

The imports of training-side modules are inside :meth:`PlayCommand.run`: the ``rlfleet``
command builds every subcommand's flags at start-up, and only the command that runs should
pay for what it imports.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import tyro

from rlfleet.algos.registry import algorithm_classes
from rlfleet.cli.common import check_flags, device_flag, out, seed_flag
from rlfleet.config.fields import NonNegativeFloat, PositiveInt
from rlfleet.errors import ConfigError


@dataclass
class PlayCommand:
    """Play a trained policy: on screen, to video files, or to PNG frames."""

    run_dir: tyro.conf.Positional[Path | None] = None
    """Run directory written by `rlfleet train` (or --weights RUN_DIR; xagents' `play ALGO`
    is accepted too, the algorithm then checked against the run's)."""
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
    weights: list[Path] | None = None
    """xagents' name for the run directory: what `rlfleet train --checkpoints PATH` wrote
    (one PATH: a run holds every network of its policy)."""
    env: str | None = None
    """xagents' --env: rlfleet reads the env from the run, and checks that it is this one."""
    frame_delay: NonNegativeFloat = 0.0
    """Seconds to wait after each frame shown with --render (xagents' --frame-delay)."""
    max_steps: PositiveInt | None = None
    """Stop each episode after this many steps (default: when the episode ends)."""
    frame_frequency: PositiveInt = 1
    """With --frame-dir, write every N-th frame (videos keep every frame)."""
    action_idx: int = 0
    """xagents' index of the model output played as the action. An rlfleet policy outputs
    the action alone, so 0 (the default) is the only index there is."""

    def resolve_run_dir(self) -> Path:
        """The run to play: RUN_DIR, or --weights (with RUN_DIR naming the algorithm)."""
        check_flags(
            ("--episodes", self.episodes, 1, None),
            ("--fps", self.fps, 1, None),
            ("--frame-delay", self.frame_delay, 0, None),
            ("--max-steps", self.max_steps, 1, None),
            ("--frame-frequency", self.frame_frequency, 1, None),
        )
        if self.action_idx != 0:
            raise ConfigError(
                f"--action-idx {self.action_idx}: an rlfleet policy has one output, the action "
                "(index 0)"
            )
        if not self.weights:
            if self.run_dir is None:
                raise ConfigError(
                    "rlfleet play needs a run: rlfleet play RUN_DIR (or --weights RUN_DIR)"
                )
            return self.run_dir
        if len(self.weights) > 1:
            raise ConfigError(
                f"--weights: expected one run directory (it holds every network of the "
                f"policy), got {len(self.weights)} paths"
            )
        if self.run_dir is not None and str(self.run_dir) not in algorithm_classes():
            raise ConfigError(
                f"give the run directory once: {self.run_dir} or --weights {self.weights[0]}"
            )
        return self.weights[0]

    def check_run(self, algo: str, env_id: str) -> None:
        """The algorithm (xagents' `play ALGO`) and --env, where given, are the run's."""
        if self.weights and self.run_dir is not None and str(self.run_dir) != algo:
            raise ConfigError(f"--weights {self.weights[0]} is a {algo} run, not {self.run_dir}")
        if self.env is not None and self.env != env_id:
            raise ConfigError(f"--env {self.env}: the run was trained on {env_id}")

    def run(self) -> int:
        seed_flag(self.seed)
        from rlfleet.cli.frames import FrameWriter
        from rlfleet.collect.runner import PolicyRunner
        from rlfleet.envs.make import make_env
        from rlfleet.nn.masks import MASK_KEY
        from rlfleet.nn.obs import batch_of_one
        from rlfleet.runs.multi_agent import is_multi_agent_run, play_command
        from rlfleet.runs.run import check_env_matches, load_algorithm

        run_dir = self.resolve_run_dir()
        if is_multi_agent_run(run_dir):
            if (self.max_steps, self.frame_frequency, self.frame_delay) != (None, 1, 0.0):
                raise ConfigError(
                    "--max-steps, --frame-frequency and --frame-delay play single-agent runs; "
                    f"{run_dir} is a multi-agent run"
                )
            return play_command(
                run_dir,
                episodes=self.episodes,
                seed=self.seed,
                frame_dir=self.frame_dir,
                checkpoint=self.checkpoint,
            )
        algo, cfg = load_algorithm(run_dir, which=self.checkpoint, device=device_flag(self.device))
        self.check_run(cfg.algo, cfg.env.id)
        record = self.video_dir is not None or self.frame_dir is not None
        if record and self.render:
            raise ConfigError(
                "--render shows a window; combine it with neither --video-dir nor --frame-dir"
            )
        render_mode = "human" if self.render else ("rgb_array" if record else None)
        if render_mode == "rgb_array":
            # Off-screen rendering: keep pygame-based envs from looking for a display or audio.
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
            os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        env = make_env(
            cfg.env.id,
            render_mode=render_mode,
            atari=cfg.env.atari.for_evaluation(),
            **cfg.env.kwargs,
        )
        writer = (
            FrameWriter(self.video_dir, self.frame_dir, self.fps, self.frame_frequency)
            if record
            else None
        )
        try:
            check_env_matches(algo, env.observation_space, env.action_space, cfg.env.id)
            runner = PolicyRunner(algo, 1)
            not_done = np.zeros(1, dtype=bool)
            for episode in range(self.episodes):
                obs, info = env.reset(seed=self.seed + episode)
                runner.reset()
                total, length, done = 0.0, 0, False
                frames: list[np.ndarray] = []
                while not done and (self.max_steps is None or length < self.max_steps):
                    if writer is not None:
                        frames.append(np.asarray(env.render()))
                    infos = (
                        {MASK_KEY: np.asarray(info[MASK_KEY])[None]} if MASK_KEY in info else None
                    )
                    acted = runner.act(batch_of_one(obs), infos, not_done, deterministic=True)
                    action = algo.env_actions(acted.step.actions)[0]
                    obs, reward, terminated, truncated, info = env.step(action)
                    total += float(reward)
                    length += 1
                    done = bool(terminated or truncated)
                    if self.render and self.frame_delay:
                        time.sleep(self.frame_delay)
                if writer is not None:
                    frames.append(np.asarray(env.render()))
                    for path in writer.write(episode, frames):
                        out.print(f"wrote {path}")
                cut = "" if done else " (stopped at --max-steps)"
                out.print(f"episode {episode + 1}: return {total:.2f}, length {length}{cut}")
        finally:
            env.close()
        return 0
