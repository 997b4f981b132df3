"""The Python front door: ``PPO("CartPole-v1", **hyperparameters).learn(steps)`` and
:func:`load`.

:class:`RunBackend` is what :meth:`rlfleet.algos.base.Algorithm.learn` and the env form of
an algorithm's constructor stand on (``rlfleet/__init__.py`` installs it; see
:class:`rlfleet.algos.base.TrainingBackend` for why the algorithm does not import it). It
builds the run config as ``rlfleet train ALGO --env ID`` does (as
:func:`~rlfleet.runs.config.default_run_config` does: the shipped preset, adapted to an env
the presets do not name, the keywords on top, validated once) and trains with the same
:func:`make_trainer`, so the Python API and the CLI share one path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym

from rlfleet.algos.base import (
    Algorithm,
    EnvBinding,
    EnvSource,
    EnvTarget,
    LearnResult,
    load_saved,
)
from rlfleet.checkpoint import CheckpointManager
from rlfleet.config.loader import merge
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import CheckpointError, ConfigError
from rlfleet.nn.encoders import EncoderFactory
from rlfleet.runs.adapt import still_adapted
from rlfleet.runs.config import CONFIG_FILE, RunConfig, default_run_config, load_run_config
from rlfleet.runs.run import make_trainer, train


class RunBackend:
    """Presets, run configs and trainers behind :meth:`Algorithm.learn` (see the module
    docstring)."""

    def bind(
        self,
        algorithm: type[Algorithm[Any]],
        env: EnvSource,
        hyperparameters: Mapping[str, Any],
        *,
        seed: int,
        device: str,
    ) -> EnvBinding:
        target = _target(env)
        cfg = self._run_config(
            algorithm.name,
            target,
            {"hyperparameters": dict(hyperparameters), "seed": seed, "device": device},
            f"{algorithm.__name__}({target.env_id!r}, ...)",
        )
        # The spaces the trainer's envs will have: built with the run's env settings
        # (Atari preprocessing, env kwargs).
        envs = make_vec_env(
            cfg.env.id, 1, mode="sync", env_kwargs=cfg.env.kwargs, atari=cfg.env.atari
        )
        try:
            return EnvBinding(
                target, envs.single_observation_space, envs.single_action_space, cfg.hyperparameters
            )
        finally:
            envs.close()

    def learn(
        self,
        algorithm: Algorithm[Any],
        target: EnvTarget,
        total_steps: int,
        *,
        run_dir: str | Path | None,
        dataset: str | Path | None,
    ) -> LearnResult:
        overrides: dict[str, Any] = {
            "seed": algorithm.seed,
            "device": str(algorithm.device),
            "trainer": {"max_steps": total_steps},
        }
        if dataset is not None:
            overrides["dataset"] = str(dataset)
        built = self._run_config(algorithm.name, target, overrides, f"{algorithm.name}.learn")
        cfg = replace(built, hyperparameters=algorithm.config)
        # A setting given to the constructor is the caller's, not adapted.
        cfg = replace(cfg, adapted=still_adapted(built.adapted, built, cfg))
        if run_dir is not None:
            return train(cfg, run_dir, algorithm=algorithm)
        trainer = make_trainer(cfg, None, algorithm=algorithm)
        try:
            return trainer.run()
        finally:
            trainer.close()

    @staticmethod
    def _run_config(
        algo: str, target: EnvTarget, overrides: dict[str, Any], where: str
    ) -> RunConfig:
        """The shipped preset for ``algo`` on the env (adapted to it when the presets do not
        name it), ``overrides`` on top, validated (as :func:`default_run_config` builds it,
        with errors that name ``where``)."""
        env: dict[str, Any] = {"id": target.env_id}
        if target.env_kwargs:
            env["kwargs"] = dict(target.env_kwargs)
        return default_run_config(
            algo, target.env_id, merge({"env": env}, overrides), adapt=True, where=where
        )


def _target(env: EnvSource) -> EnvTarget:
    """The env id (and constructor keywords) that rebuild ``env`` in every vector env."""
    if isinstance(env, str):
        return EnvTarget(env)
    if isinstance(env, gym.Env):
        spec = env.spec
        if spec is None:
            raise ConfigError(
                f"cannot rebuild {type(env).__name__} for training: it has no spec; pass an "
                "env id, or an env made by gymnasium.make"
            )
        return EnvTarget(spec.id, dict(spec.kwargs))
    raise ConfigError(
        f"expected an env id (str) or a gymnasium.Env, got {type(env).__name__}; to build "
        "from spaces pass observation_space, action_space"
    )


def load(
    path: str | Path,
    *,
    encoder: EncoderFactory | None = None,
    device: str | None = None,
    which: Literal["best", "latest"] = "best",
) -> Algorithm[Any]:
    """The algorithm saved at ``path``: a checkpoint directory (what ``algo.save`` writes)
    or a run directory (its ``best`` policy, falling back to the latest checkpoint; or, with
    ``which="latest"``, the latest). ``encoder``: the custom encoder factory it was trained
    with, if any (loading without it says so). ``device``: where its tensors go (default:
    ``cpu`` for a checkpoint, the run's device for a run directory). The result can
    ``predict``, ``save`` and, when it knows its env, ``learn`` on."""
    path = Path(path)
    if not (path / CONFIG_FILE).is_file():
        if not path.is_dir():
            raise CheckpointError(
                f"{path}: no such directory; expected a checkpoint directory (algo.save) or "
                "a run directory (rlfleet train)"
            )
        return load_saved(path, encoder=encoder, device=device or "cpu")
    cfg = load_run_config(path)
    order = ["best", "checkpoints"] if which == "best" else ["checkpoints"]
    for sub in order:
        checkpoint = CheckpointManager(path / sub, readonly=True).latest()
        if checkpoint is not None:
            break
    else:
        raise CheckpointError(f"{path}: no checkpoint found (train the run first)")
    algo = load_saved(checkpoint, encoder=encoder, device=device or cfg.device)
    if algo.name != cfg.algo:
        raise CheckpointError(
            f"{checkpoint}: checkpoint is for {algo.name!r} but {path}/{CONFIG_FILE} says "
            f"{cfg.algo!r}"
        )
    algo.env_target = EnvTarget(cfg.env.id, dict(cfg.env.kwargs))
    return algo
