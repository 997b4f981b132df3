"""Training from run options: ``rlfleet train OPTIONS.yaml``.

Run directory: ``<results_dir>/<run_id>/``, holding what every rlfleet run holds
(``config.yaml``, ``history.parquet``, ``checkpoints/``, ``best/``, ``plots/``) plus
``run_options.yaml``, the resolved options: ``run_id`` filled in, a ``seed`` of -1
replaced by the seed drawn, ``resume`` and ``force`` cleared (they are what one command
did, not part of the run). ``rlfleet train RUN_DIR/run_options.yaml --run-id again``
replays the run exactly.

``resume``, ``force`` and ``initialize_from`` follow ML-Agents:

- a run directory that exists needs ``resume`` (continue it from its latest checkpoint)
  or ``force`` (delete it and start over); one that does not exist cannot be resumed;
- ``initialize_from`` starts a new run from another run's weights (its latest checkpoint,
  else its best) with counters, optimiser and schedules from zero; a resumed run ignores it.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gymnasium import spaces

from rlfleet.algos.registry import get_algorithm
from rlfleet.envs.make import make_env
from rlfleet.errors import ConfigError, RunDirError, option
from rlfleet.marl.envs import MultiAgentVecEnv, load_pettingzoo_factory
from rlfleet.marl.trainer import MultiAgentSettings
from rlfleet.nn.device import resolve_device
from rlfleet.nn.obs import is_image_space
from rlfleet.runs.config import (
    AgentBehavior,
    EnvConfig,
    RunConfig,
    check_network_memory,
    is_multi_agent_env,
    load_run_config,
)
from rlfleet.runs.run import train
from rlfleet.runs.run_options import (
    VIS_ENCODERS,
    BehaviorSettings,
    RunOptions,
    run_options_to_dict,
)
from rlfleet.train.loop import TrainResult

RUN_OPTIONS_FILE = "run_options.yaml"


def resolve_run_options(options: RunOptions, source: str | Path | None = None) -> RunOptions:
    """The options as the run directory records them (see the module docstring)."""
    checkpoint = options.checkpoint_settings
    run_id = checkpoint.run_id or (Path(source).stem if source is not None else "run")
    env = options.env_settings
    seed = secrets.randbelow(2**31) if env.seed == -1 else env.seed
    return dataclasses.replace(
        options,
        env_settings=dataclasses.replace(env, seed=seed),
        checkpoint_settings=dataclasses.replace(
            checkpoint, run_id=run_id, resume=False, force=False
        ),
    )


def run_dir_of(options: RunOptions) -> Path:
    """``results_dir / run_id`` (``run_id`` must be resolved)."""
    checkpoint = options.checkpoint_settings
    if checkpoint.run_id is None:
        raise ConfigError("checkpoint_settings.run_id is unset: resolve the options first")
    return Path(checkpoint.results_dir) / checkpoint.run_id


def the_behavior(options: RunOptions) -> tuple[str, BehaviorSettings]:
    """The one behavior of a Gymnasium run (of a PettingZoo run: the first)."""
    if len(options.behaviors) != 1 and not (
        options.behaviors and is_multi_agent_env(options.env_settings.env_id)
    ):
        raise ConfigError(
            f"a Gymnasium env has one behavior; the options have {len(options.behaviors)} "
            f"({', '.join(options.behaviors) or 'none'})"
        )
    return next(iter(options.behaviors.items()))


def behavior_agents(options: RunOptions, agents: Sequence[str]) -> dict[str, list[str]]:
    """Which of a PettingZoo game's ``agents`` each behavior plays (each list in the env's
    order).

    A behavior with an ``agents`` list plays those; one without plays the agents whose name
    is the behavior's name or starts with it followed by ``_`` (behavior ``player``: agents
    ``player``, ``player_0``, ``player_1``, not ``players_0``); a file with one behavior and
    no list plays every agent.

    Raises:
        ConfigError: an ``agents`` list names an agent the game lacks; a behavior plays no
            agent; an agent is played by no behavior, or by two.
    """
    behaviors = options.behaviors
    if len(behaviors) == 1:
        ((name, behavior),) = behaviors.items()
        if behavior.agents is None:
            return {name: list(agents)}
    mapping: dict[str, list[str]] = {}
    for name, behavior in behaviors.items():
        if behavior.agents is not None:
            unknown = [a for a in behavior.agents if a not in agents]
            if unknown:
                raise ConfigError(
                    f"behaviors.{name}.agents: the game has no agent(s) {unknown}; its agents "
                    f"are {list(agents)}"
                )
            chosen = [a for a in agents if a in behavior.agents]
        else:
            chosen = [a for a in agents if a == name or a.startswith(f"{name}_")]
        if not chosen:
            raise ConfigError(
                f"behaviors.{name}: plays none of the game's agents {list(agents)} (no agent "
                f"is named {name!r} or starts with '{name}_'); give it an agents list"
            )
        mapping[name] = chosen
    for agent in agents:
        owners = [name for name, chosen in mapping.items() if agent in chosen]
        if len(owners) != 1:
            problem = "no behavior plays it" if not owners else f"behaviors {owners} all play it"
            raise ConfigError(
                f"behaviors: agent {agent!r}: {problem}; expected exactly one (a behavior plays "
                "the agents its agents list names, else those named after it: see "
                "docs/coming-from-ml-agents.md)"
            )
    return mapping


def game_agents(options: RunOptions) -> list[str]:
    """The agents of a run's PettingZoo game (one copy is built to read them)."""
    env = options.env_settings
    factory = load_pettingzoo_factory(env.env_id)
    kwargs = dict(env.env_kwargs)
    probe = MultiAgentVecEnv(lambda **extra: factory(**kwargs, **extra), 1)
    try:
        return list(probe.possible_agents)
    finally:
        probe.close()


def _hyperparameters(name: str, behavior: BehaviorSettings) -> Any:
    """A behavior's algorithm config with the fields its behavior keys own filled in."""
    algo_cls = get_algorithm(behavior.trainer_type)
    hp = behavior.hyperparameters
    if not isinstance(hp, algo_cls.config_class):
        raise ConfigError(
            f"behaviors.{name}.hyperparameters: expected a {algo_cls.config_class.__name__} "
            f"for trainer_type {algo_cls.name!r}, got {type(hp).__name__}"
        )
    network = behavior.network_settings
    hp_fields = {f.name for f in dataclasses.fields(hp)}
    owned: dict[str, Any] = {
        "num_steps": behavior.time_horizon,
        "hidden_sizes": (network.hidden_units,) * network.num_layers,
        "normalize_obs": network.normalize,
        "gamma": behavior.reward_signals.discount(),
    }
    if network.memory is not None and "lstm_hidden_size" not in hp_fields:
        raise ConfigError(
            f"behaviors.{name}.network_settings.memory: {algo_cls.name} has no recurrent "
            "policy in rlfleet (ppo and a2c have one)"
        )
    return dataclasses.replace(hp, **{k: v for k, v in owned.items() if k in hp_fields})


def run_config_from_options(options: RunOptions) -> RunConfig:
    """Map run options onto rlfleet's :class:`RunConfig` (the table in
    :mod:`rlfleet.runs.run_options`). A PettingZoo game's behaviors play the agents
    :func:`behavior_agents` gives them; with several, the loop's settings (``max_steps``,
    ``summary_freq``, ``checkpoint_interval``, ``keep_checkpoints``, ``trainer_settings``) are
    the first behavior's."""
    name, behavior = the_behavior(options)
    hp = _hyperparameters(name, behavior)
    algo_cls = get_algorithm(behavior.trainer_type)
    multi_agent, behaviors = _multi_agent(options)
    checkpoint_interval = (
        max(1, behavior.max_steps // behavior.keep_checkpoints)
        if behavior.even_checkpoints and behavior.keep_checkpoints
        else behavior.checkpoint_interval
    )
    trainer = dataclasses.replace(
        behavior.trainer_settings,
        max_steps=behavior.max_steps,
        log_interval_steps=behavior.summary_freq,
        epoch_num_steps=checkpoint_interval,
        keep_checkpoints=behavior.keep_checkpoints,
        threaded=behavior.threaded or behavior.trainer_settings.threaded,
    )
    check_network_memory(f"behaviors.{name}", hp, behavior.reward_signals)
    env = options.env_settings
    torch_settings = options.torch_settings
    resolve_device(torch_settings.device, "torch_settings.device")
    return RunConfig(
        algo=algo_cls.name,
        env=EnvConfig(
            id=env.env_id,
            num_envs=env.num_envs,
            vector_mode=env.vector_mode,
            num_test_envs=env.num_test_envs,
            kwargs=dict(env.env_kwargs),
        ),
        hyperparameters=hp,
        trainer=trainer,
        seed=env.seed,
        device=torch_settings.device,
        torch_threads=torch_settings.num_threads,
        deterministic=torch_settings.deterministic,
        reward_signals=behavior.reward_signals,
        behavioral_cloning=behavior.behavioral_cloning,
        environment_parameters=dict(options.environment_parameters),
        multi_agent=multi_agent,
        agent_behaviors=behaviors,
    )


def _multi_agent(
    options: RunOptions,
) -> tuple[MultiAgentSettings | None, dict[str, AgentBehavior]]:
    """A PettingZoo run's multi-agent settings and, with several behaviors, the behaviors
    (see :func:`behavior_agents`); (None, {}) for a Gymnasium run."""
    if not is_multi_agent_env(options.env_settings.env_id):
        return None, {}
    mapping = behavior_agents(options, game_agents(options))
    self_play = {
        "+".join(mapping[name]): b.self_play.config()
        for name, b in options.behaviors.items()
        if b.self_play is not None
    }
    if len(mapping) == 1:
        # One behavior: ML-Agents' symmetric game, its agents sharing one network, when it
        # plays self-play; else one network per agent, as a run config trains by default.
        return MultiAgentSettings(
            share_parameters=bool(self_play), self_play=self_play or None, batch_size=None
        ), {}
    behaviors = {
        name: AgentBehavior(
            mapping[name], get_algorithm(b.trainer_type).name, _hyperparameters(name, b)
        )
        for name, b in options.behaviors.items()
    }
    # batch_size None: each learner updates on its behavior's own hyperparameters.batch_size.
    return MultiAgentSettings(self_play=self_play or None, batch_size=None), behaviors


def check_encoder(options: RunOptions) -> None:
    """Refuse an ML-Agents image encoder rlfleet lacks when the env has image observations
    (without images the encoder is never built, so any name is fine)."""
    if is_multi_agent_env(options.env_settings.env_id):
        return  # a PettingZoo game's observations are checked when its agents are built
    name, behavior = the_behavior(options)
    encoder = behavior.network_settings.vis_encode_type
    if encoder is None or encoder in VIS_ENCODERS:
        return
    env_settings = options.env_settings
    env = make_env(env_settings.env_id, **env_settings.env_kwargs)
    try:
        space = env.observation_space
    finally:
        env.close()
    parts = list(space.spaces.values()) if isinstance(space, spaces.Dict) else [space]
    if any(is_image_space(part) for part in parts):
        raise ConfigError(
            f"behaviors.{name}.network_settings.vis_encode_type: rlfleet has no {encoder!r} "
            f"encoder, and {env_settings.env_id} has image observations; use nature_cnn or "
            "resnet"
        )


def initialize_from_dir(options: RunOptions) -> Path | None:
    """The run directory ``initialize_from`` names: a run id under ``results_dir``, or a
    path to a run directory."""
    checkpoint = options.checkpoint_settings
    source = checkpoint.initialize_from or the_behavior(options)[1].init_path
    if source is None:
        return None
    candidates = [Path(checkpoint.results_dir) / source]
    candidates.append(Path(source))
    for path in candidates:
        if path.is_dir():
            return path
    raise RunDirError(
        f"cannot initialize from {source!r}: neither "
        f"{candidates[0]} nor {candidates[1]} is a run directory"
    )


def train_from_options(
    options: RunOptions, source: str | Path | None = None, **hooks: Any
) -> TrainResult:
    """Train the run the options describe (see the module docstring for the run
    directory and for resume / force / initialize-from). ``hooks`` go to the trainer."""
    checkpoint = options.checkpoint_settings
    resolved = resolve_run_options(options, source)
    run_dir = run_dir_of(resolved)
    if checkpoint.resume:
        if not run_dir.is_dir():
            raise RunDirError(
                f"cannot resume {run_dir}: it does not exist (drop "
                f"{option('checkpoint_settings.resume', flag='--resume')} to start a new run)"
            )
        if options.env_settings.seed == -1:
            # The seed drawn when the run started, not a new one.
            seed = load_run_config(run_dir).seed
            resolved = dataclasses.replace(
                resolved, env_settings=dataclasses.replace(resolved.env_settings, seed=seed)
            )
    check_encoder(resolved)
    init = None if checkpoint.resume else initialize_from_dir(resolved)
    return train(
        run_config_from_options(resolved),
        run_dir,
        resume=checkpoint.resume,
        force=checkpoint.force,
        initialize_from=init,
        files={RUN_OPTIONS_FILE: run_options_to_dict(resolved)},
        **hooks,
    )
