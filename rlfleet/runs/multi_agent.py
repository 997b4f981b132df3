"""``rlfleet play`` for a multi-agent run: greedy games, move by move as text, and every frame
as PNG.

A multi-agent run is a run like any other (:mod:`rlfleet.runs.run`): its ``config.yaml`` is a
run config whose env is ``pettingzoo:<module>`` with a ``multi_agent:`` section; ``best/`` and
``checkpoints/`` hold its :class:`~rlfleet.marl.agents.Agents`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
                action = choose_action(agents, name, obs)
                _out.print(f"episode {episode + 1}: {name} plays {action}")
            env.step(action)
            if frame_dir is not None:
                frame = _save_frame(env.render(), frame_dir / f"episode-{episode:03d}", frame)
        summary = ", ".join(f"{n} {r:+.2f}" for n, r in returns.items())
        _out.print(f"episode {episode + 1}: returns {summary}")
    env.close()
    return 0


def choose_action(agents: Agents, name: str, obs: Any, *, deterministic: bool = True) -> Any:
    """The action ``agents`` take for agent ``name`` on its AEC observation ``obs`` (greedy
    unless ``deterministic`` is false; an algorithm shared by several agents sees the agent's
    one-hot among them)."""
    group = next(g for g in agents.groups if name in g.agents)
    agent = group.algorithm
    mask = None
    if isinstance(obs, dict) and "action_mask" in obs:
        mask = torch.as_tensor(np.asarray(obs["action_mask"], dtype=bool))[None]
        obs = obs["observation"]
    features = np.asarray(obs, dtype=np.float32)[None]
    if len(group.agents) > 1:
        features = features.reshape(1, -1)
        one_hot = np.zeros((1, len(group.agents)), np.float32)
        one_hot[0, group.agents.index(name)] = 1.0
        features = np.concatenate([features, one_hot], axis=1)
    obs_tensor = agent.preprocess(torch.from_numpy(features))
    step = masked_act(agent, obs_tensor, mask, deterministic=deterministic)
    action = agent.env_actions(step.actions)[0]
    return action.item() if action.ndim == 0 else action


@dataclass
class SeatRecord:
    """Games of one seat against an opponent: the shares won, drawn and lost."""

    games: int
    won: float
    drawn: float
    lost: float


def play_against(
    agents: Agents,
    env: Callable[[], Any],
    opponent: Algorithm[Any],
    *,
    episodes: int,
    seats: Sequence[str] | None = None,
    seed: int = 0,
) -> dict[str, SeatRecord]:
    """Greedy games of ``agents`` against ``opponent`` in a turn-based (AEC) game built by
    ``env()``: for each seat in ``seats`` (default: every agent), ``episodes`` games in which
    ``agents`` play that seat and ``opponent`` every other (reset with ``seed``, ``seed + 1``,
    ...). A game is won when the seat's return is positive, lost when negative.

    A frozen baseline such as :class:`~rlfleet.marl.agents.RandomAgent` measures what a
    self-play rating cannot: how well the policy plays an outside opponent.
    """
    game = env()
    names = list(game.possible_agents)
    records: dict[str, SeatRecord] = {}
    for seat in seats or names:
        outcomes = []
        for episode in range(episodes):
            game.reset(seed=seed + episode)
            total = 0.0
            for name in game.agent_iter():
                obs, reward, terminated, truncated, _ = game.last()
                if name == seat:
                    total += float(reward)
                action = None
                if not (terminated or truncated):
                    if name == seat:
                        action = choose_action(agents, name, obs)
                    else:
                        action = choose_action(
                            Agents([name], [opponent]), name, obs, deterministic=False
                        )
                game.step(action)
            outcomes.append(np.sign(total))
        signs = np.asarray(outcomes)
        records[seat] = SeatRecord(
            episodes,
            float((signs > 0).mean()),
            float((signs == 0).mean()),
            float((signs < 0).mean()),
        )
    game.close()
    return records


def _save_frame(image: Any, directory: Path, index: int) -> int:
    from matplotlib.image import imsave  # matplotlib loads only when frames are written

    directory.mkdir(parents=True, exist_ok=True)
    imsave(directory / f"frame-{index:05d}.png", np.asarray(image))
    return index + 1
