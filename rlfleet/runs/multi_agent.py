"""``rlfleet train ALGO --env pettingzoo:<module>`` and ``rlfleet play`` for multi-agent runs.

A multi-agent run directory holds ``config.yaml`` (with ``multi_agent: true``),
``history.parquet``, ``plots/metric.png``, each distinct agent's weights in
``best/<agent>`` and ``last/<agent>``, and the checkpoints ``--resume`` continues from.
"""

from __future__ import annotations

import argparse
import os
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, TypeVar

import numpy as np
import torch
import tyro
from rich.console import Console

from rlfleet.algos.base import Algorithm
from rlfleet.checkpoint import CheckpointManager, load_checkpoint
from rlfleet.config.loader import dump_yaml, load_yaml, to_dict, validate
from rlfleet.errors import CheckpointError, ConfigError
from rlfleet.marl.envs import MultiAgentVecEnv, load_pettingzoo_factory
from rlfleet.marl.masks import masked_act
from rlfleet.marl.trainer import DecentralizedTrainer, DecentralizedTrainerConfig, make_agents
from rlfleet.runs.run import CONFIG_FILE, RunDirAttempt, interrupted_message
from rlfleet.train.threads import DEFAULT_TORCH_THREADS

HP = TypeVar("HP")
_out = Console(highlight=False, soft_wrap=True)
_err = Console(stderr=True, highlight=False, soft_wrap=True)


@dataclass
class MultiAgentTrainCommand(Generic[HP]):
    """Train every agent of a PettingZoo game with one algorithm."""

    env: str
    """``pettingzoo:<module>`` (e.g. pettingzoo:pettingzoo.classic.tictactoe_v3)."""
    hyperparameters: Annotated[HP, tyro.conf.OmitArgPrefixes]
    trainer: DecentralizedTrainerConfig = field(default_factory=DecentralizedTrainerConfig)
    """Budget and schedule (``--trainer.max-episodes``: the algorithm's ``batch_size`` and the
    trainer's share a name, so trainer flags keep their prefix)."""
    share_parameters: bool = False
    """One network for all agents (with an agent-id feature) instead of one per agent."""
    torch_threads: int = DEFAULT_TORCH_THREADS
    """CPU threads for torch (1 is fastest for small networks)."""
    force: bool = False
    """Overwrite an existing run directory."""
    resume: Path | None = None
    """Continue the multi-agent run in this directory from its latest checkpoint (flags
    default to its config.yaml)."""


def is_multi_agent_run(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` was written by a multi-agent ``rlfleet train``."""
    path = Path(run_dir) / CONFIG_FILE
    return path.is_file() and bool(load_yaml(path).get("multi_agent", False))


def train_command(algo_cls: type[Algorithm[Any]], args: list[str]) -> int:
    """``rlfleet train ALGO --env pettingzoo:...``: train, then print where the run went."""
    command_type: Any = MultiAgentTrainCommand[algo_cls.config_class]  # type: ignore[name-defined]
    default = _defaults(algo_cls, args)
    cmd = tyro.cli(command_type, default=default, args=args, prog=f"rlfleet train {algo_cls.name}")
    hyperparameters = validate(algo_cls.config_class, cmd.hyperparameters, "hyperparameters")
    trainer_cfg = validate(DecentralizedTrainerConfig, cmd.trainer, "trainer")
    run_dir = (
        cmd.resume
        or trainer_cfg.run_dir
        or Path("runs")
        / (f"{algo_cls.name}-{cmd.env.split('.')[-1].replace(':', '-')}-s{trainer_cfg.seed}")
    )
    trainer_cfg = replace(trainer_cfg, run_dir=run_dir)
    # A bad env name fails here, before a run directory is created for it.
    factory = load_pettingzoo_factory(cmd.env)
    config = {
        "multi_agent": True,
        "algo": algo_cls.name,
        "env": cmd.env,
        "share_parameters": cmd.share_parameters,
        "hyperparameters": to_dict(hyperparameters),
        "trainer": {k: v for k, v in to_dict(trainer_cfg).items() if k != "run_dir"},
    }
    resume = cmd.resume is not None
    try:
        with RunDirAttempt(run_dir, resume=resume, force=cmd.force) as attempt:
            agents = make_agents(
                factory,
                lambda obs, act, seed: algo_cls(obs, act, hyperparameters, seed=seed),
                share_parameters=cmd.share_parameters,
                seed=trainer_cfg.seed,
            )
            trainer = DecentralizedTrainer(factory, trainer_cfg, torch_threads=cmd.torch_threads)
            try:
                dump_yaml(config, run_dir / CONFIG_FILE)
                attempt.started()
                result = trainer.train(agents, [True] * len(agents), resume=resume)
            finally:
                trainer.close()
    except KeyboardInterrupt:
        resume_command = f"rlfleet train {algo_cls.name} --resume {shlex.quote(str(run_dir))}"
        _err.print(interrupted_message(run_dir, resume_command))
        return 130
    if not trainer_cfg.verbose:
        return 0
    _out.print(
        f"done ({result.stop_reason}): best test score {result.best_score:.3f}; "
        f"{result.env_steps:,} agent steps, {result.episodes:,} episodes in "
        f"{result.duration_s:.1f} s\nrun directory: {run_dir}\nmetric plot: "
        f"{run_dir}/plots/metric.png"
    )
    return 0


def _defaults(algo_cls: type[Algorithm[Any]], args: list[str]) -> MultiAgentTrainCommand[Any]:
    """The flags' defaults: the algorithm's and trainer's, or with ``--resume RUN_DIR`` the
    settings that run was started with."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--resume", type=Path)
    run_dir = pre.parse_known_args(args)[0].resume
    if run_dir is None:
        return MultiAgentTrainCommand(env="", hyperparameters=algo_cls.config_class())
    if not is_multi_agent_run(run_dir):
        raise ConfigError(
            f"--resume {run_dir}: expected a multi-agent run directory (its {CONFIG_FILE} "
            "says multi_agent: true)"
        )
    config = load_yaml(run_dir / CONFIG_FILE)
    if config["algo"] != algo_cls.name:
        raise ConfigError(f"--resume {run_dir}: it is a {config['algo']} run, not {algo_cls.name}")
    return MultiAgentTrainCommand(
        env=config["env"],
        hyperparameters=validate(
            algo_cls.config_class, config["hyperparameters"], f"{run_dir}/{CONFIG_FILE}"
        ),
        trainer=validate(
            DecentralizedTrainerConfig,
            {**config["trainer"], "run_dir": run_dir},
            f"{run_dir}/{CONFIG_FILE}",
        ),
        share_parameters=bool(config["share_parameters"]),
        resume=run_dir,
    )


def load_agents(
    run_dir: str | Path, which: Literal["best", "last"] = "best"
) -> tuple[list[Algorithm[Any]], dict[str, Any]]:
    """The trained agents of a multi-agent run (one per env agent, shared ones repeated)."""
    from rlfleet.algos.registry import get_algorithm

    run_dir = Path(run_dir)
    config = load_yaml(run_dir / CONFIG_FILE)
    algo_cls = get_algorithm(config["algo"])
    hyperparameters = validate(algo_cls.config_class, config["hyperparameters"], "hyperparameters")
    factory = load_pettingzoo_factory(config["env"])
    agents = make_agents(
        factory,
        lambda obs, act, seed: algo_cls(obs, act, hyperparameters, seed=seed),
        share_parameters=bool(config["share_parameters"]),
    )
    names = MultiAgentVecEnv(factory, 1).possible_agents
    loaded: set[int] = set()
    for name, agent in zip(names, agents, strict=True):
        if id(agent) in loaded:
            continue
        path = CheckpointManager(run_dir / which / name, readonly=True).latest()
        if path is None:
            raise CheckpointError(
                f"{run_dir}: expected weights of agent {name!r} in {which}/{name}, found none"
            )
        state, _ = load_checkpoint(path)
        agent.load_state_dict(state["algorithm"])
        loaded.add(id(agent))
    return agents, config


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
    agents, config = load_agents(run_dir, "best" if checkpoint == "best" else "last")
    factory = load_pettingzoo_factory(config["env"])
    if frame_dir is not None:
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        env = factory(render_mode="rgb_array")  # type: ignore[call-arg]
    else:
        env = factory()
    if not hasattr(env, "agent_iter"):
        raise ConfigError(
            f"rlfleet play: expected an AEC (turn-based) env module, got a Parallel env from "
            f"{config['env']!r}; use the module's env() entry point"
        )
    names = list(env.possible_agents)
    trained = dict(zip(names, agents, strict=True))
    shared = len({id(a) for a in agents}) < len(agents)
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        returns = dict.fromkeys(names, 0.0)
        frame = 0
        for name in env.agent_iter():
            obs, reward, terminated, truncated, _ = env.last()
            returns[name] += float(reward)
            action = None
            if not (terminated or truncated):
                action = _choose(trained[name], names, name, obs, shared)
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
    from matplotlib.image import imsave

    directory.mkdir(parents=True, exist_ok=True)
    imsave(directory / f"frame-{index:05d}.png", np.asarray(image))
    return index + 1
