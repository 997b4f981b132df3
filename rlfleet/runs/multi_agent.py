"""``rlfleet play`` for a multi-agent run: greedy games, move by move as text, and every frame
as PNG.

A multi-agent run is a run like any other (:mod:`rlfleet.runs.run`): its ``config.yaml`` is a
run config whose env is ``pettingzoo:<module>`` with a ``multi_agent:`` section; ``best/`` and
``checkpoints/`` hold its :class:`~rlfleet.marl.agents.Agents`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from rich.console import Console

from rlfleet.algos.base import Algorithm
from rlfleet.errors import ConfigError
from rlfleet.marl.agents import Agents
from rlfleet.marl.envs import load_pettingzoo_factory
from rlfleet.marl.masks import masked_act
from rlfleet.runs.config import CONFIG_FILE, load_run_config
from rlfleet.runs.run import load_policy

_out = Console(highlight=False, soft_wrap=True)


def is_multi_agent_run(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a multi-agent run (its config's env is a PettingZoo game)."""
    if not (Path(run_dir) / CONFIG_FILE).is_file():
        return False
    return load_run_config(run_dir).multi_agent is not None


def play_command(
    run_dir: str | Path,
    *,
    episodes: int,
    seed: int,
    frame_dir: str | Path | None,
    checkpoint: Literal["best", "latest"],
) -> int:
    """``rlfleet play RUN_DIR`` for a multi-agent run: greedy games, move by move as text,
    and every frame as PNG with ``frame_dir``."""
    run_dir = Path(run_dir)
    frame_dir = None if frame_dir is None else Path(frame_dir)
    agents, cfg = load_policy(run_dir, which=checkpoint)
    if not isinstance(agents, Agents):
        raise ConfigError(f"{run_dir}: expected a multi-agent run, got a {cfg.algo} run")
    factory = load_pettingzoo_factory(cfg.env.id)
    if frame_dir is not None:
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        env = factory(render_mode="rgb_array", **cfg.env.kwargs)  # type: ignore[call-arg]
    else:
        env = factory(**cfg.env.kwargs)  # type: ignore[call-arg]
    if not hasattr(env, "agent_iter"):
        raise ConfigError(
            f"rlfleet play: expected an AEC (turn-based) env module, got a Parallel env from "
            f"{cfg.env.id!r}; use the module's env() entry point"
        )
    names = list(env.possible_agents)
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        returns = dict.fromkeys(names, 0.0)
        frame = 0
        for name in env.agent_iter():
            obs, reward, terminated, truncated, _ = env.last()
            returns[name] += float(reward)
            action = None
            if not (terminated or truncated):
                action = _choose(agents[name], names, name, obs, agents.shared)
                _out.print(f"episode {episode + 1}: {name} plays {action}")
            env.step(action)
            if frame_dir is not None:
                frame = _save_frame(env.render(), frame_dir / f"episode-{episode:03d}", frame)
        summary = ", ".join(f"{n} {r:+.2f}" for n, r in returns.items())
        _out.print(f"episode {episode + 1}: returns {summary}")
    env.close()
    return 0


def _choose(agent: Algorithm[Any], names: list[str], name: str, obs: Any, shared: bool) -> Any:
    mask = None
    if isinstance(obs, dict) and "action_mask" in obs:
        mask = torch.as_tensor(np.asarray(obs["action_mask"], dtype=bool))[None]
        obs = obs["observation"]
    features = np.asarray(obs, dtype=np.float32)[None]
    if shared:
        features = features.reshape(1, -1)
        one_hot = np.zeros((1, len(names)), np.float32)
        one_hot[0, names.index(name)] = 1.0
        features = np.concatenate([features, one_hot], axis=1)
    step = masked_act(agent, agent.preprocess(torch.from_numpy(features)), mask, deterministic=True)
    action = agent.env_actions(step.actions)[0]
    return action.item() if action.ndim == 0 else action


def _save_frame(image: Any, directory: Path, index: int) -> int:
    from matplotlib.image import imsave  # matplotlib loads only when frames are written

    directory.mkdir(parents=True, exist_ok=True)
    imsave(directory / f"frame-{index:05d}.png", np.asarray(image))
    return index + 1
