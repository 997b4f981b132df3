"""A run: a typed run config, its run directory, and training or loading from it.

Run directory layout (``runs/<run-id>/``)::

    config.yaml        the resolved run config; `rlfleet train --config` replays it exactly
    history.parquet    one row per logged step (train/, loss/, test/, time/ metrics)
    checkpoints/       atomic step-numbered checkpoints and a `latest.json` pointer
    best/              the best-scoring policy
    plots/             learning_curve.png
    videos/            what `rlfleet play --video-dir` writes by default
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rlfleet.algos.base import Algorithm
from rlfleet.algos.registry import get_algorithm
from rlfleet.config.fields import PositiveInt
from rlfleet.config.loader import dump_yaml, load_yaml, merge, preset, to_dict, validate
from rlfleet.envs.atari import AtariConfig
from rlfleet.envs.make import VectorMode, make_vec_env
from rlfleet.envs.spaces import describe_space, space_from_json, spaces_equal
from rlfleet.errors import CheckpointError, ConfigError, RunDirError
from rlfleet.train.checkpoint import CheckpointManager, load_checkpoint
from rlfleet.train.trainer import OnPolicyTrainer, Trainer, TrainerConfig, TrainResult

CONFIG_FILE = "config.yaml"


@dataclass
class EnvConfig:
    """Which environment to train on and how to vectorise it."""

    id: str
    """Gymnasium env id, or ``module:EnvId``."""
    num_envs: PositiveInt = 8
    """Training envs stepped together."""
    vector_mode: VectorMode = "auto"
    """``native``, ``sync``, ``async`` or ``auto`` (native where the env has it, else sync)."""
    num_test_envs: PositiveInt = 10
    """Envs the test episodes run on."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the env constructor."""
    atari: AtariConfig = field(default_factory=AtariConfig)
    """Preprocessing of Atari (ALE) envs; ignored for other envs."""


@dataclass
class RunConfig:
    """Everything that defines a training run; ``config.yaml`` holds exactly this."""

    algo: str
    """Registered algorithm name."""
    env: EnvConfig
    hyperparameters: Any
    """The algorithm's config dataclass (e.g. :class:`rlfleet.algos.PPOConfig`)."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    seed: int = 0
    """Seeds networks, sampling and env resets."""
    device: str = "cpu"
    """Torch device."""
    torch_threads: PositiveInt | None = 1
    """CPU threads for torch (unset: torch's default, one per core). One thread is fastest
    for small networks: their kernels are too short to split, and a second thread only adds
    synchronisation (measured: 2x slower PPO on CartPole on two cores)."""


def run_config_from_dict(data: Any, where: str) -> RunConfig:
    """Validate a mapping (a parsed ``config.yaml`` or preset overlay) into a RunConfig."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where}: expected a mapping with keys algo, env, hyperparameters, trainer, seed"
        )
    allowed = {"algo", "env", "hyperparameters", "trainer", "seed", "device", "torch_threads"}
    unknown = set(data) - allowed
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)} (valid: {sorted(allowed)})")
    if "algo" not in data or "env" not in data:
        raise ConfigError(f"{where}: needs 'algo' and 'env'")
    algo_cls = get_algorithm(str(data["algo"]))
    env = validate(EnvConfig, data["env"], f"{where}: env")
    hp = validate(
        algo_cls.config_class, data.get("hyperparameters") or {}, f"{where}: hyperparameters"
    )
    trainer = validate(TrainerConfig, data.get("trainer") or {}, f"{where}: trainer")
    seed = data.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"{where}: seed must be an integer, got {seed!r}")
    threads = data.get("torch_threads", 1)
    if threads is not None and (
        not isinstance(threads, int) or isinstance(threads, bool) or threads < 1
    ):
        raise ConfigError(
            f"{where}: torch_threads must be a positive integer or null, got {threads!r}"
        )
    return RunConfig(
        algo=algo_cls.name,
        env=env,
        hyperparameters=hp,
        trainer=trainer,
        seed=seed,
        device=str(data.get("device", "cpu")),
        torch_threads=threads,
    )


def default_run_config(
    algo: str, env_id: str, overrides: dict[str, Any] | None = None
) -> RunConfig:
    """The shipped preset for ``algo`` on ``env_id`` with ``overrides`` merged on top."""
    algo_cls = get_algorithm(algo)
    data = merge(preset(algo_cls.name, env_id), {"algo": algo_cls.name, "env": {"id": env_id}})
    return run_config_from_dict(merge(data, overrides or {}), f"{algo} preset for {env_id}")


def run_config_to_dict(cfg: RunConfig) -> dict[str, Any]:
    return {
        "algo": cfg.algo,
        "seed": cfg.seed,
        "device": cfg.device,
        "torch_threads": cfg.torch_threads,
        "env": to_dict(cfg.env),
        "trainer": to_dict(cfg.trainer),
        "hyperparameters": to_dict(cfg.hyperparameters),
    }


def load_run_config(run_dir: Path) -> RunConfig:
    """The config a run directory was trained with."""
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise RunDirError(
            f"{run_dir}: no {CONFIG_FILE} — expected a run directory written by `rlfleet train`"
        )
    return run_config_from_dict(load_yaml(path), str(path))


def default_run_dir(cfg: RunConfig) -> Path:
    env = cfg.env.id.replace("/", "-").replace(":", "-")
    return Path("runs") / f"{cfg.algo}-{env}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


def prepare_run_dir(run_dir: Path, *, resume: bool, force: bool) -> None:
    """Create ``run_dir``; an existing one needs ``resume`` (continue) or ``force`` (replace)."""
    if resume:
        if not (run_dir / CONFIG_FILE).is_file():
            raise RunDirError(f"cannot resume {run_dir}: no {CONFIG_FILE} there")
        return
    if run_dir.exists() and any(run_dir.iterdir()):
        if not force:
            raise RunDirError(
                f"run directory {run_dir} already exists; pass --resume to continue it or "
                "--force to overwrite it"
            )
        if not (run_dir / CONFIG_FILE).is_file() and not (run_dir / "checkpoints").is_dir():
            raise RunDirError(
                f"refusing to --force {run_dir}: it does not look like a run directory"
            )
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)


def build_algorithm(cfg: RunConfig, observation_space: Any, action_space: Any) -> Algorithm[Any]:
    algo_cls = get_algorithm(cfg.algo)
    algo: Algorithm[Any] = algo_cls(
        observation_space, action_space, cfg.hyperparameters, seed=cfg.seed, device=cfg.device
    )
    return algo


def make_trainer(
    cfg: RunConfig, run_dir: Path | None, *, resume: bool = False, **hooks: Any
) -> Trainer:
    """Build envs, algorithm and the trainer that fits the algorithm's kind."""
    if cfg.torch_threads is not None:
        torch.set_num_threads(cfg.torch_threads)
    train_envs = make_vec_env(
        cfg.env.id,
        cfg.env.num_envs,
        seed=cfg.seed,
        mode=cfg.env.vector_mode,
        env_kwargs=cfg.env.kwargs,
        atari=cfg.env.atari,
    )
    test_envs = make_vec_env(
        cfg.env.id,
        cfg.env.num_test_envs,
        mode=cfg.env.vector_mode,
        env_kwargs=cfg.env.kwargs,
        atari=cfg.env.atari.for_evaluation(),
    )
    algo = build_algorithm(cfg, train_envs.single_observation_space, train_envs.single_action_space)
    metadata = {"env_id": cfg.env.id, "seed": cfg.seed}
    if algo.kind == "on_policy":
        return OnPolicyTrainer(
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


def train(
    cfg: RunConfig,
    run_dir: Path | None = None,
    *,
    resume: bool = False,
    force: bool = False,
    **hooks: Any,
) -> TrainResult:
    """Train a run end to end: run directory, config.yaml, training, plots.

    ``resume`` continues the run in ``run_dir`` from its latest checkpoint (counters,
    optimiser, schedules, RNG and history continue); ``force`` replaces an existing run.
    """
    run_dir = run_dir or default_run_dir(cfg)
    prepare_run_dir(run_dir, resume=resume, force=force)
    dump_yaml(run_config_to_dict(cfg), run_dir / CONFIG_FILE)
    trainer = make_trainer(cfg, run_dir, resume=resume, **hooks)
    try:
        return trainer.run()
    finally:
        trainer.train_envs.close()
        trainer.test_envs.close()


def load_algorithm(run_dir: Path, *, which: str = "best") -> tuple[Algorithm[Any], RunConfig]:
    """The trained policy of a run: ``best`` (the best-scoring, falling back to the latest
    checkpoint) or ``latest``."""
    cfg = load_run_config(run_dir)
    order = ["best", "checkpoints"] if which == "best" else ["checkpoints"]
    for sub in order:
        path = CheckpointManager(run_dir / sub, readonly=True).latest()
        if path is not None:
            break
    else:
        raise CheckpointError(
            f"{run_dir}: no checkpoint found (train the run first, or check the path)"
        )
    state, metadata = load_checkpoint(path)
    obs_space = space_from_json(metadata["observation_space"])
    action_space = space_from_json(metadata["action_space"])
    if metadata.get("algorithm") != cfg.algo:
        raise CheckpointError(
            f"{path}: checkpoint is for {metadata.get('algorithm')!r} but "
            f"{run_dir}/{CONFIG_FILE} says {cfg.algo!r}"
        )
    algo = build_algorithm(cfg, obs_space, action_space)
    algo.load_state_dict(state["algorithm"])
    return algo, cfg


def check_env_matches(
    algo: Algorithm[Any], observation_space: Any, action_space: Any, env_id: str
) -> None:
    """Refuse to run a policy on an env whose spaces differ from the ones it was trained on."""
    for label, trained, found in (
        ("observation", algo.observation_space, observation_space),
        ("action", algo.action_space, action_space),
    ):
        if not spaces_equal(trained, found):
            raise CheckpointError(
                f"{env_id}: {label} space {describe_space(found)} does not match the trained "
                f"policy's {describe_space(trained)}"
            )
