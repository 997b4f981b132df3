"""``rlfleet play RUN_DIR``: play a trained policy on screen, to videos or to PNG frames.

The imports of training-side modules are inside :meth:`PlayCommand.run`: the ``rlfleet``
command builds every subcommand's flags at start-up, and only the command that runs should
pay for what it imports.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import tyro

from rlfleet.cli.common import device_flag, out, seed_flag
from rlfleet.errors import ConfigError


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

    def run(self) -> int:
        seed_flag(self.seed)
        from rlfleet.cli.frames import FrameWriter
        from rlfleet.collect.runner import PolicyRunner
        from rlfleet.envs.make import make_env
        from rlfleet.nn.masks import MASK_KEY
        from rlfleet.nn.obs import batch_of_one
        from rlfleet.runs.multi_agent import is_multi_agent_run, play_command
        from rlfleet.runs.run import check_env_matches, load_algorithm

        if is_multi_agent_run(self.run_dir):
            return play_command(
                self.run_dir,
                episodes=self.episodes,
                seed=self.seed,
                frame_dir=self.frame_dir,
                checkpoint=self.checkpoint,
            )
        algo, cfg = load_algorithm(
            self.run_dir, which=self.checkpoint, device=device_flag(self.device)
        )
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
        writer = FrameWriter(self.video_dir, self.frame_dir, self.fps) if record else None
        try:
            check_env_matches(algo, env.observation_space, env.action_space, cfg.env.id)
            runner = PolicyRunner(algo, 1)
            not_done = np.zeros(1, dtype=bool)
            for episode in range(self.episodes):
                obs, info = env.reset(seed=self.seed + episode)
                runner.reset()
                total, length, done = 0.0, 0, False
                frames: list[np.ndarray] = []
                while not done:
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
                if writer is not None:
                    frames.append(np.asarray(env.render()))
                    for path in writer.write(episode, frames):
                        out.print(f"wrote {path}")
                out.print(f"episode {episode + 1}: return {total:.2f}, length {length}")
        finally:
            env.close()
        return 0
