"""Training a run from its run config, and loading what it trained.

Run directory layout (``runs/<run-id>/``)::

    config.yaml        the resolved run config; `rlfleet train --config` replays it exactly
    config.N.yaml      what a resume that changed the config wrote (N = 1, 2, ...; the
                       highest is the current config: :mod:`rlfleet.config.versions`)
    .lock              while a process trains the run: its lock (`rlfleet.runs.run_dir`)
    run_options.yaml   runs started from run options only: the resolved options
                       (`rlfleet train RUN/run_options.yaml` replays them)
    history.parquet    one row per logged step (train/, loss/, test/, time/ metrics)
    checkpoints/       atomic step-numbered checkpoints and a `latest.json` pointer
    best/              the best-scoring policy
    plots/             learning_curve.png
    videos/            what `rlfleet play --video-dir` writes by default
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gymnasium.vector import VectorEnv

from rlfleet.algos.base import Algorithm
from rlfleet.algos.registry import get_algorithm
from rlfleet.checkpoint import CheckpointManager, load_checkpoint
from rlfleet.checkpoint.schema import PolicyMetadata, PolicyState, state_dict_mismatch
from rlfleet.collect.evaluator import Evaluator
from rlfleet.data.dataset import OfflineDataset
from rlfleet.distributed.trainer import DistributedTrainer
from rlfleet.envs.curriculum import EnvParameterManager
from rlfleet.envs.make import env_spec, make_vec_env
from rlfleet.envs.spaces import space_from_json, space_mismatch
from rlfleet.errors import CheckpointError, ConfigError, DatasetError, RunDirError, option
from rlfleet.logging.progress import ProgressReporter
from rlfleet.marl.agents import Agents, make_agents, shared_observation_space
from rlfleet.marl.collector import MultiAgentCollector, MultiAgentTestEpisodes, learners_of
from rlfleet.marl.envs import MultiAgentVecEnv, load_pettingzoo_factory
from rlfleet.marl.trainer import DecentralizedTrainer, MultiAgentSettings, agents_state
from rlfleet.nn.compile import use_deterministic_algorithms
from rlfleet.nn.device import resolve_device
from rlfleet.rewards.signals import RewardSignals
from rlfleet.runs.adapt import adapted_lines
from rlfleet.runs.config import (
    CONFIG_FILE,
    RunConfig,
    check_dataset_setting,
    load_run_config,
)
from rlfleet.runs.run_dir import (
    RunDirAttempt,
    ScheduleOnResume,
    default_run_dir,
    resumed_config,
    write_run_files,
)
from rlfleet.train.behavioral_cloning import BehavioralCloning
from rlfleet.train.loop import TrainingLoop, TrainResult
from rlfleet.train.threads import torch_threads
from rlfleet.train.trainer import OfflineTrainer, OffPolicyTrainer, OnPolicyTrainer, Trainer
from rlfleet.types import EvalStats


def build_algorithm(
    cfg: RunConfig,
    observation_space: Any,
    action_space: Any,
    *,
    algorithm_class: type[Algorithm[Any]] | None = None,
) -> Algorithm[Any]:
    """The algorithm ``cfg`` names (``algorithm_class``: its class, when already looked up),
    built on the torch threads ``cfg.torch_threads`` asks for: initial weights (orthogonal
    init) depend on the thread count, so a seed gives the same networks whether
    :func:`train` (``rlfleet train``) or a script's :func:`make_trainer` builds them, at
    whatever count the calling process runs."""
    algo_cls = algorithm_class or get_algorithm(cfg.algo)
    with torch_threads(cfg.torch_threads):
        algo: Algorithm[Any] = algo_cls(
            observation_space, action_space, cfg.hyperparameters, seed=cfg.seed, device=cfg.device
        )
    return algo


def given_or_built(
    cfg: RunConfig,
    algorithm: Algorithm[Any] | None,
    observation_space: Any,
    action_space: Any,
    *,
    algorithm_class: type[Algorithm[Any]] | None = None,
) -> Algorithm[Any]:
    """``algorithm`` checked against the env's spaces, or a new one built from ``cfg``."""
    if algorithm is None:
        return build_algorithm(
            cfg, observation_space, action_space, algorithm_class=algorithm_class
        )
    check_env_matches(algorithm, observation_space, action_space, cfg.env.id)
    return algorithm


def make_trainer(
    cfg: RunConfig,
    run_dir: str | Path | None,
    *,
    resume: bool = False,
    test_envs: VectorEnv[Any, Any, Any] | None = None,
    algorithm: Algorithm[Any] | None = None,
    algorithm_class: type[Algorithm[Any]] | None = None,
    agents: Agents | None = None,
    **hooks: Any,
) -> TrainingLoop[Any, Any]:
    """Build envs, algorithm and the trainer that fits the algorithm's kind, or for a
    multi-agent env the agents and their :class:`~rlfleet.marl.trainer.DecentralizedTrainer`.

    ``test_envs`` replaces the test envs built from ``cfg.env`` (e.g. a differently
    configured env to evaluate on; single-agent runs); the trainer closes them with its own.
    ``algorithm`` trains that algorithm in place instead of building one from ``cfg`` (its
    spaces must be the env's; :meth:`rlfleet.algos.base.Algorithm.learn` passes itself);
    ``algorithm_class`` is the class ``cfg.algo`` names, when the caller has looked it up.
    ``agents`` are a multi-agent run's agents when already built (see :func:`build_agents`).
    The trainer runs on ``cfg.torch_threads`` CPU threads.
    """
    hooks = {"torch_threads": cfg.torch_threads, **hooks}
    if not resume and cfg.adapted:
        notes = ProgressReporter(None, show_progress=False, verbose=cfg.trainer.verbose)
        for line in adapted_lines(cfg):
            notes.message(line)
    if cfg.deterministic:
        use_deterministic_algorithms()
    if cfg.multi_agent is not None:
        resolve_device(cfg.device)
        return DecentralizedTrainer(
            _pettingzoo_factory(cfg),
            agents or build_agents(cfg),
            cfg.trainer,
            cfg.multi_agent,
            num_envs=cfg.env.num_envs,
            num_test_envs=cfg.env.num_test_envs,
            seed=cfg.seed,
            run_dir=run_dir,
            run_metadata={"env_id": cfg.env.id, "seed": cfg.seed},
            resume_from_log=resume,
            **hooks,
        )
    metadata: dict[str, Any] = {"env_id": cfg.env.id, "seed": cfg.seed}
    algo_cls = algorithm_class or get_algorithm(cfg.algo)
    kind = algo_cls.kind
    # Check the device and read (and check) the dataset before any env is built.
    resolve_device(cfg.device)
    check_dataset_setting(algo_cls, cfg.dataset, "run config")
    dataset = OfflineDataset.load(cfg.dataset) if cfg.dataset is not None else None
    parameters = env_parameter_manager(cfg)
    if kind == "distributed" and parameters is not None:
        raise ConfigError(
            f"{cfg.algo}: environment parameters are not supported by actor-learner training yet"
        )
    if kind == "offline" and cfg.reward_signals is not None:
        raise ConfigError(
            f"{cfg.algo}: reward signals score the transitions a run collects; an offline "
            "algorithm learns from its dataset's rewards, so remove reward_signals"
        )
    # Parameters need a reset hook in every sub-env: make_vec_env then builds sync envs.
    wrappers = None if parameters is None else [parameters.wrapper()]
    if test_envs is None:
        test_envs = make_vec_env(
            cfg.env.id,
            cfg.env.num_test_envs,
            mode=cfg.env.vector_mode,
            env_kwargs=cfg.env.kwargs,
            wrappers=wrappers,
            step_timeout_s=cfg.env.step_timeout_s,
            restart_failed_envs=cfg.env.restart_failed_envs,
            atari=cfg.env.atari.for_evaluation(),
        )
    if dataset is not None:
        metadata["dataset"] = cfg.dataset
        algo = given_or_built(
            cfg,
            algorithm,
            test_envs.single_observation_space,
            test_envs.single_action_space,
            algorithm_class=algo_cls,
        )
        try:
            dataset.check_spaces(algo.observation_space, algo.action_space, cfg.env.id)
        except DatasetError:
            test_envs.close()
            raise
        return OfflineTrainer(
            algo,
            dataset,
            test_envs,
            cfg.trainer,
            run_dir=run_dir,
            run_metadata=metadata,
            seed=cfg.seed,
            resume_from_log=resume,
            **hooks,
        )
    if kind == "distributed":
        # Rollout actors build the training envs on their own nodes.
        algo = given_or_built(
            cfg,
            algorithm,
            test_envs.single_observation_space,
            test_envs.single_action_space,
            algorithm_class=algo_cls,
        )
        if cfg.reward_signals is not None:
            hooks["reward_signals"] = RewardSignals(
                cfg.reward_signals,
                algo.observation_space,
                algo.action_space,
                cfg.env.num_envs * algo.config.batch_fragments,
                seed=cfg.seed,
                device=cfg.device,
            )
        return DistributedTrainer(
            algo,
            test_envs,
            cfg.trainer,
            env_id=cfg.env.id,
            num_envs=cfg.env.num_envs,
            vector_mode=cfg.env.vector_mode,
            env_kwargs=cfg.env.kwargs,
            distributed=cfg.distributed,
            run_dir=run_dir,
            run_metadata=metadata,
            seed=cfg.seed,
            resume_from_log=resume,
            **hooks,
        )
    train_envs = make_vec_env(
        cfg.env.id,
        cfg.env.num_envs,
        seed=cfg.seed,
        mode=cfg.env.vector_mode,
        env_kwargs=cfg.env.kwargs,
        wrappers=wrappers,
        step_timeout_s=cfg.env.step_timeout_s,
        restart_failed_envs=cfg.env.restart_failed_envs,
        atari=cfg.env.atari,
    )
    if parameters is not None:
        parameters.attach(train_envs, test_envs)
    algo = given_or_built(
        cfg,
        algorithm,
        train_envs.single_observation_space,
        train_envs.single_action_space,
        algorithm_class=algo_cls,
    )
    signals = None
    if cfg.reward_signals is not None:
        signals = RewardSignals(
            cfg.reward_signals,
            train_envs.single_observation_space,
            train_envs.single_action_space,
            cfg.env.num_envs,
            seed=cfg.seed,
            device=cfg.device,
        )
    hooks = {**hooks, "reward_signals": signals, "env_parameters": parameters}
    if cfg.behavioral_cloning is not None:
        hooks["behavioral_cloning"] = BehavioralCloning(cfg.behavioral_cloning, algo, seed=cfg.seed)
    trainers: dict[str, type[OnPolicyTrainer] | type[OffPolicyTrainer]] = {
        "on_policy": OnPolicyTrainer,
        "off_policy": OffPolicyTrainer,
    }
    if algo.kind in trainers:
        return trainers[algo.kind](
            algo,
            train_envs,
            test_envs,
            cfg.trainer,
            run_dir=run_dir,
            run_metadata=metadata,
            seed=cfg.seed,
            resume_from_log=resume,
            **hooks,
        )
    raise ConfigError(f"{cfg.algo}: no trainer for algorithms of kind {algo.kind!r} yet")


def _pettingzoo_factory(cfg: RunConfig) -> Callable[..., Any]:
    """The env factory of a multi-agent run, with the config's env kwargs."""
    factory = load_pettingzoo_factory(cfg.env.id)
    kwargs = dict(cfg.env.kwargs)
    return (lambda **extra: factory(**kwargs, **extra)) if kwargs else factory


def build_agents(cfg: RunConfig, *, learning: bool = True) -> Agents:
    """The agents of a multi-agent run: the run's algorithm for every agent, one per agent or
    one shared (``multi_agent.share_parameters``); agent ``i`` seeded ``seed + i``.
    ``learning=False`` freezes them all (to evaluate or play)."""
    settings = cfg.multi_agent or MultiAgentSettings()
    factory = _pettingzoo_factory(cfg)
    if cfg.agent_behaviors:
        return _behavior_agents(cfg, factory, learning=learning)
    algorithms = make_agents(
        factory,
        lambda obs, act, seed: build_algorithm(replace(cfg, seed=seed), obs, act),
        share_parameters=settings.share_parameters,
        seed=cfg.seed,
    )
    probe = MultiAgentVecEnv(factory, 1)
    names = probe.possible_agents
    probe.close()
    if not learning:
        return Agents(names, algorithms, [False] * len(names), [False] * len(names))
    return Agents(names, algorithms, settings.learning_mask, settings.exploration_mask)


def _behavior_agents(cfg: RunConfig, factory: Callable[..., Any], *, learning: bool) -> Agents:
    """The agents of a run with several behaviors: behavior ``i`` builds one algorithm,
    seeded ``seed + i``, shared by its agents."""
    probe = MultiAgentVecEnv(factory, 1)
    try:
        names = probe.possible_agents
        algorithms: dict[str, Algorithm[Any]] = {}
        for i, (name, behavior) in enumerate(cfg.agent_behaviors.items()):
            first = behavior.agents[0]
            for agent in behavior.agents:
                for label, table in (
                    ("observation", probe.observation_spaces),
                    ("action", probe.action_spaces),
                ):
                    if table[agent] != table[first]:
                        raise ConfigError(
                            f"behaviors.{name}: its agents share one network, so expected "
                            f"{agent!r}'s {label} space to be {first!r}'s ({table[first]}), "
                            f"got {table[agent]}"
                        )
            observation_space = probe.observation_spaces[first]
            if len(behavior.agents) > 1:
                observation_space = shared_observation_space(
                    observation_space, len(behavior.agents)
                )
            algorithm = build_algorithm(
                replace(
                    cfg,
                    algo=behavior.algo,
                    hyperparameters=behavior.hyperparameters,
                    seed=cfg.seed + i,
                ),
                observation_space,
                probe.action_spaces[first],
            )
            algorithms.update(dict.fromkeys(behavior.agents, algorithm))
    finally:
        probe.close()
    flags = None if learning else [False] * len(names)
    return Agents(names, algorithms, flags, flags)


def env_parameter_manager(cfg: RunConfig) -> EnvParameterManager | None:
    """The curriculum of ``cfg``'s environment parameters (None without parameters).

    A run config trains one behavior: completion criteria may call it by any name, but all
    by the same one.
    """
    if not cfg.environment_parameters:
        return None
    named = sorted(
        {
            lesson.completion_criteria.behavior
            for settings in cfg.environment_parameters.values()
            for lesson in settings.curriculum
            if lesson.completion_criteria is not None
        }
    )
    if len(named) > 1:
        raise ConfigError(
            f"environment_parameters: completion criteria name behaviors {named}, but a "
            "run trains one"
        )
    return EnvParameterManager(cfg.environment_parameters, named or ["default"])


def train(
    cfg: RunConfig,
    run_dir: str | Path | None = None,
    *,
    resume: bool = False,
    force: bool = False,
    initialize_from: str | Path | None = None,
    files: Mapping[str, Any] | None = None,
    algorithm_class: type[Algorithm[Any]] | None = None,
    schedule_on_resume: ScheduleOnResume | None = None,
    **hooks: Any,
) -> TrainResult:
    """Train a run end to end: run directory, config.yaml, training, plots.

    ``resume`` continues the run in ``run_dir`` from its latest checkpoint (counters,
    optimiser, schedules, RNG and history continue); ``force`` replaces an existing run;
    ``initialize_from`` starts a new run from the policy weights of another run directory
    (ignored when resuming); ``files`` are more YAML files to write into the run directory
    (name -> data), such as ``run_options.yaml``; ``algorithm_class`` is the class
    ``cfg.algo`` names, when the caller has looked it up already; ``schedule_on_resume``
    (``continue`` or ``stretch``) is what a resume that changes ``max_steps`` does with the
    run's schedules (see :func:`~rlfleet.runs.run_dir.resumed_config`; needed only then).
    Torch uses ``cfg.torch_threads`` CPU threads meanwhile; the caller's count is restored
    when it returns.

    The run directory is locked for the whole call
    (:class:`~rlfleet.runs.run_dir.RunDirLock`): a second process that writes it fails at
    once. Nothing is written into it until the run is built: config checked, device found,
    env built, checkpoint loaded and matched. A run that fails to start (a device this
    machine lacks, an env that cannot be built, a checkpoint that does not match, an env
    that breaks the API on the first training step, ...) leaves no run directory behind, a
    run ``force`` was to replace is kept, and a run it was to resume is left as it was (see
    :class:`RunDirAttempt`). A resume that changes the config writes it to a new version,
    ``config.N.yaml`` (:func:`~rlfleet.runs.run_dir.write_run_files`).
    """
    # What can be checked without building the run, before its directory is touched (the
    # dataset is checked, and read, once, where the trainer is built).
    resolve_device(cfg.device)
    if cfg.multi_agent is not None:
        load_pettingzoo_factory(cfg.env.id)
        if initialize_from is not None:
            raise ConfigError(
                "initialize_from: a multi-agent run starts from fresh agents; resume it instead"
            )
    else:
        env_spec(cfg.env.id)
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(cfg)
    # Agents are built with the caller's torch threads, as a script builds them before its
    # DecentralizedTrainer: initial weights (orthogonal init) depend on the thread count, so
    # a run config and the same script give the same agents.
    agents = build_agents(cfg) if cfg.multi_agent is not None else None
    with (
        torch_threads(cfg.torch_threads),
        RunDirAttempt(run_dir, resume=resume, force=force) as attempt,
    ):
        if resume:
            cfg = resumed_config(run_dir, cfg, schedule_on_resume)
        trainer = make_trainer(
            cfg, run_dir, resume=resume, algorithm_class=algorithm_class, agents=agents, **hooks
        )
        try:
            if initialize_from is not None and not resume:
                assert isinstance(trainer, Trainer)  # refused above for multi-agent runs
                initialize_weights(trainer.algorithm, initialize_from)
            # Written once the run is built, so a resume that fails leaves the run as it was.
            write_run_files(run_dir, cfg, files or {}, resume=resume)
            trainer.after_first_step = attempt.started
            return trainer.run()
        finally:
            trainer.close()


def load_policy(
    run_dir: str | Path, *, which: str = "best", device: str | None = None
) -> tuple[Algorithm[Any] | Agents, RunConfig]:
    """The trained policy of a run: its algorithm, or the
    :class:`~rlfleet.marl.agents.Agents` of a multi-agent run (frozen and greedy); ``best``
    (the best-scoring, falling back to the latest checkpoint) or ``latest``; on ``device``,
    or the device the run trained on."""
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    if device is not None:
        cfg = replace(cfg, device=device)
    order = ["best", "checkpoints"] if which == "best" else ["checkpoints"]
    for sub in order:
        path = CheckpointManager(run_dir / sub, readonly=True).latest()
        if path is not None:
            break
    else:
        problems = [
            CheckpointManager(run_dir / sub, readonly=True).latest_problem() for sub in order
        ]
        reason = next((p for p in problems if p), "train the run first, or check the path")
        raise CheckpointError(f"{run_dir}: no checkpoint found ({reason})")
    single_agent = cfg.multi_agent is None
    state, metadata = load_checkpoint(
        path,
        state_schema=PolicyState if single_agent else None,
        metadata_schema=PolicyMetadata if single_agent else None,
    )
    algorithms = {b.algo for b in cfg.agent_behaviors.values()} or {cfg.algo}
    if set(str(metadata.get("algorithm")).split("+")) != algorithms:
        raise CheckpointError(
            f"{path}: checkpoint is for {metadata.get('algorithm')!r} but "
            f"{run_dir}/{CONFIG_FILE} says {'+'.join(sorted(algorithms))!r}"
        )
    if cfg.multi_agent is not None:
        agents = build_agents(cfg, learning=False)
        agents.load_state_dict(agents_state(state))
        return agents, cfg
    obs_space = space_from_json(metadata["observation_space"])
    action_space = space_from_json(metadata["action_space"])
    algo = build_algorithm(cfg, obs_space, action_space)
    algo.load_state_dict(state["algorithm"])
    return algo, cfg


def load_algorithm(
    run_dir: str | Path, *, which: str = "best", device: str | None = None
) -> tuple[Algorithm[Any], RunConfig]:
    """The trained algorithm of a single-agent run (see :func:`load_policy`).

    Raises:
        RunDirError: ``run_dir`` is a multi-agent run, whose policy is several agents
            (:func:`load_policy` returns them).
    """
    policy, cfg = load_policy(run_dir, which=which, device=device)
    if isinstance(policy, Agents):
        raise RunDirError(
            f"{run_dir} is a multi-agent run ({cfg.env.id}): its policy is the agents "
            f"{policy.names}, which load_policy returns; this command takes a single-agent run"
        )
    return policy, cfg


def evaluate(
    run_dir: str | Path,
    episodes: int,
    *,
    seed: int = 12345,
    deterministic: bool = True,
    which: str = "best",
    device: str | None = None,
    show_progress: bool = False,
) -> tuple[EvalStats, RunConfig]:
    """Test episodes of a run's trained policy on its env (single- or multi-agent): greedy
    unless ``deterministic`` is false; a multi-agent run's ``returns`` are
    ``[episodes, agents]``. ``show_progress`` draws a bar of the episodes ended on a
    terminal.

    Raises:
        CheckpointError: the env's spaces differ from the ones the policy was trained on.
        ConfigError: stochastic tests of a multi-agent run (its test episodes are greedy).
    """
    policy, cfg = load_policy(run_dir, which=which, device=device)
    with ProgressReporter(
        episodes,
        show_progress=show_progress,
        description="evaluating",
        unit="episodes",
        returns=False,
    ) as progress:
        progress.start()
        return _evaluate(run_dir, policy, cfg, episodes, seed, deterministic, progress.update)


def _evaluate(
    run_dir: str | Path,
    policy: Algorithm[Any] | Agents,
    cfg: RunConfig,
    episodes: int,
    seed: int,
    deterministic: bool,
    on_episode: Callable[[int], object],
) -> tuple[EvalStats, RunConfig]:
    """:func:`evaluate` once the policy is loaded, reporting each episode's end."""
    if isinstance(policy, Agents):
        if not deterministic:
            raise ConfigError(
                f"{run_dir} is a multi-agent run: its test episodes are greedy (drop "
                f"{option('stochastic')})"
            )
        envs = MultiAgentVecEnv(_pettingzoo_factory(cfg), min(cfg.env.num_test_envs, episodes))
        try:
            collector = MultiAgentCollector(
                envs,
                learners_of(
                    policy,
                    envs,
                    buffer_size=1,
                    critic_state_size=None,
                    central_critic=(cfg.multi_agent or MultiAgentSettings()).central_critic,
                ),
                collection_step_num_env_steps=1,
            )
            return MultiAgentTestEpisodes(envs, collector, seed).run(
                episodes, on_episode=on_episode
            ), cfg
        finally:
            envs.close()
    stats = evaluate_policy(
        policy, cfg, episodes, seed=seed, deterministic=deterministic, on_episode=on_episode
    )
    return stats, cfg


def evaluate_policy(
    policy: Algorithm[Any],
    cfg: RunConfig,
    episodes: int,
    *,
    seed: int | None,
    deterministic: bool = True,
    on_episode: Callable[[int], object] | None = None,
) -> EvalStats:
    """``episodes`` test episodes of a single-agent ``policy`` on the env of the run config
    ``cfg``, built as its test steps build it (at most ``num_test_envs`` copies), reset from
    ``seed``; ``on_episode`` as :meth:`Evaluator.run` takes it.

    Raises:
        CheckpointError: the env's spaces differ from the ones the policy was trained on.
    """
    vec = make_vec_env(
        cfg.env.id,
        min(cfg.env.num_test_envs, episodes),
        mode=cfg.env.vector_mode,
        env_kwargs=cfg.env.kwargs,
        atari=cfg.env.atari.for_evaluation(),
    )
    try:
        check_env_matches(policy, vec.single_observation_space, vec.single_action_space, cfg.env.id)
        return Evaluator(vec, policy, seed=seed).run(
            episodes, deterministic=deterministic, on_episode=on_episode
        )
    finally:
        vec.close()


def initialize_weights(algo: Algorithm[Any], run_dir: str | Path) -> Path:
    """Load the network weights (and normaliser statistics) of another run into ``algo``:
    its latest checkpoint, else its best. Optimiser, counters and schedules stay fresh.
    Returns the checkpoint used."""
    run_dir = Path(run_dir)
    for sub in ("checkpoints", "best"):
        path = CheckpointManager(run_dir / sub, readonly=True).latest()
        if path is not None:
            break
    else:
        raise CheckpointError(
            f"cannot initialize from {run_dir}: no checkpoint there (expected a run directory "
            "written by `rlfleet train`)"
        )
    state, metadata = load_checkpoint(
        path, state_schema=PolicyState, metadata_schema=PolicyMetadata
    )
    if metadata.get("algorithm") != algo.name:
        raise CheckpointError(
            f"cannot initialize {algo.name} from {path}: it holds a "
            f"{metadata.get('algorithm')!r} policy"
        )
    mismatch = space_mismatch(
        (algo.observation_space, algo.action_space),
        (space_from_json(metadata["observation_space"]), space_from_json(metadata["action_space"])),
    )
    if mismatch is not None:
        label, ours, theirs = mismatch
        raise CheckpointError(
            f"cannot initialize from {path}: its {label} space {theirs} differs from this "
            f"env's {ours}"
        )
    modules = state["algorithm"]["modules"]
    for key, module in algo.modules().items():
        try:
            module.load_state_dict(modules[key])
        except (KeyError, RuntimeError) as err:
            detail = (
                f"no {key!r} network in the checkpoint"
                if key not in modules
                else state_dict_mismatch(modules[key], module.state_dict(), prefix=f"{key}.")
                or " ".join(str(err).split())
            )
            raise CheckpointError(
                f"cannot initialize {algo.name} from {path}: the networks differ ({detail})"
            ) from err
    return path


def check_env_matches(
    algo: Algorithm[Any], observation_space: Any, action_space: Any, env_id: str
) -> None:
    """Refuse to run a policy on an env whose spaces differ from the ones it was trained on."""
    mismatch = space_mismatch(
        (algo.observation_space, algo.action_space), (observation_space, action_space)
    )
    if mismatch is not None:
        label, trained, found = mismatch
        raise CheckpointError(
            f"{env_id}: {label} space {found} does not match the trained policy's {trained}"
        )
