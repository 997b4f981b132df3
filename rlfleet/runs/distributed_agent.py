"""``DistributedAgent``: the actor-learner front door, shaped like RLLTE's.

::

    from rlfleet import DistributedAgent

    agent = DistributedAgent("CartPole-v1", num_actors=4, num_steps=32)
    agent.train(num_train_steps=200_000, eval_interval=20_000)
    print(agent.eval(num_eval_episodes=20).mean)

It is a thin layer over the run API: the constructor turns its arguments into a
:class:`~rlfleet.runs.config.RunConfig` (the algorithm's shipped preset for the env, overlaid by
the arguments), :meth:`DistributedAgent.train` writes the run directory and runs a
:class:`~rlfleet.distributed.DistributedTrainer`, so the run directory, history, checkpoints,
``best/`` and progress bar are those of every other rlfleet run, and ``rlfleet eval``,
``rlfleet play`` and ``rlfleet train impala --resume`` work on it.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from rlfleet.algos.base import Algorithm
from rlfleet.checkpoint import CheckpointManager, load_checkpoint
from rlfleet.checkpoint.schema import PolicyMetadata, PolicyState
from rlfleet.collect.evaluator import Evaluator
from rlfleet.distributed.actors import PolicyWeights, load_policy_weights
from rlfleet.distributed.trainer import DistributedTrainer
from rlfleet.envs.make import make_vec_env
from rlfleet.envs.spaces import space_from_json
from rlfleet.errors import CheckpointError, ConfigError
from rlfleet.runs.config import CONFIG_FILE, RunConfig, default_run_config
from rlfleet.runs.run import build_algorithm, check_env_matches, make_trainer
from rlfleet.runs.run_dir import RunDirAttempt, ScheduleOnResume, resumed_config, write_run_files
from rlfleet.train.loop import TrainResult
from rlfleet.types import EvalStats


class DistributedAgent:
    """Actor-learner training of IMPALA (default) or APPO on Ray.

    Args:
        env: Gymnasium env id each rollout actor builds (``num_envs`` copies per actor).
        eval_env: env id of the test episodes (default: ``env``), stepped on the driver.
        tag: names the run directory ``runs/<tag>-<time>`` (default: ``<algo>-<env>-s<seed>``).
        seed: seeds the networks, the actors (one stream each) and the test envs.
        device: torch device of the learner(s).
        num_steps: steps per env in one rollout fragment.
        num_actors: rollout actors.
        num_learners: learners; more than one average gradients (see ``docs/distributed.md``).
        num_storages: most fragments in existence at once (default ``2 x num_actors``).
        algo: ``impala`` or ``appo``.
        num_envs: envs per actor (default: the preset's).
        ray_address: cluster to join (``auto``, ``ray://HOST:PORT``, ``HOST:PORT``); unset
            starts a local cluster.
        run_dir: use this run directory instead of one named by ``tag``.
        resume: continue the run in ``run_dir`` from its latest checkpoint.
        **algo_kwargs: hyperparameters of the algorithm's config (e.g. ``learning_rate``).

    Bad settings (``num_actors < 1``, ``num_storages < num_actors``, unknown keyword) raise a
    :class:`~rlfleet.errors.ConfigError` here, before anything starts.
    """

    def __init__(
        self,
        env: str,
        eval_env: str | None = None,
        tag: str | None = None,
        seed: int = 1,
        device: str = "cpu",
        num_steps: int | None = None,
        num_actors: int = 2,
        num_learners: int = 1,
        num_storages: int | None = None,
        *,
        algo: str = "impala",
        num_envs: int | None = None,
        ray_address: str | None = None,
        run_dir: str | Path | None = None,
        resume: bool = False,
        **algo_kwargs: Any,
    ) -> None:
        hyperparameters = dict(algo_kwargs)
        if num_steps is not None:
            hyperparameters["num_steps"] = num_steps
        overrides: dict[str, Any] = {
            "seed": seed,
            "device": device,
            "hyperparameters": hyperparameters,
            "distributed": {
                "num_actors": num_actors,
                "num_learners": num_learners,
                "num_storages": num_storages,
                "ray_address": ray_address,
            },
        }
        if num_envs is not None:
            overrides["env"] = {"num_envs": num_envs}
        self.config: RunConfig = default_run_config(algo, env, overrides)
        if self.config.distributed is None:
            raise ConfigError(
                f"DistributedAgent trains actor-learner algorithms (impala, appo), not {algo!r}"
            )
        self.config.distributed.check(self.config.hyperparameters.batch_fragments)
        self.eval_env = eval_env or env
        if run_dir is not None:
            self.run_dir = Path(run_dir)
        else:
            name = tag or f"{algo}-{env.replace('/', '-').replace(':', '-')}-s{seed}"
            self.run_dir = Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.resume = resume
        self.algorithm: Algorithm[Any] | None = None

    def train(
        self,
        num_train_steps: int,
        init_model_path: str | Path | None = None,
        log_interval: int = 2048,
        eval_interval: int = 10_000,
        save_interval: int = 10_000,
        num_eval_episodes: int = 10,
        th_compile: bool = False,
        *,
        target_reward: float | None = None,
        schedule_on_resume: ScheduleOnResume | None = None,
    ) -> TrainResult:
        """Train for ``num_train_steps`` environment steps (all actors together).

        Args:
            num_train_steps: budget of environment steps.
            init_model_path: start from the weights of this run directory (its best policy)
                or checkpoint directory; counters and optimiser start fresh.
            log_interval: environment steps between history rows of training metrics.
            eval_interval: environment steps between test steps (one epoch).
            save_interval: environment steps between checkpoints (whole epochs).
            num_eval_episodes: episodes per test step.
            th_compile: run the learner's loss through ``torch.compile``.
            target_reward: stop once a test step's mean return reaches this.
            schedule_on_resume: a later call with another ``num_train_steps`` continues the
                run: ``continue`` keeps its schedules' horizon, ``stretch`` runs them over
                the new budget (needed when the algorithm has a linear schedule).
        """
        assert self.config.distributed is not None
        trainer_cfg = dataclasses.replace(
            self.config.trainer,
            max_steps=num_train_steps,
            epoch_num_steps=eval_interval,
            log_interval_steps=log_interval,
            checkpoint_interval_steps=save_interval,
            test_step_num_episodes=num_eval_episodes,
            target_reward=target_reward,
        )
        distributed = dataclasses.replace(self.config.distributed, th_compile=th_compile)
        cfg = dataclasses.replace(self.config, trainer=trainer_cfg, distributed=distributed)
        with RunDirAttempt(self.run_dir, resume=self.resume, force=False) as attempt:
            if self.resume:
                cfg = resumed_config(self.run_dir, cfg, schedule_on_resume)
            test_envs = make_vec_env(self.eval_env, cfg.env.num_test_envs, mode=cfg.env.vector_mode)
            trainer = make_trainer(cfg, self.run_dir, resume=self.resume, test_envs=test_envs)
            assert isinstance(trainer, DistributedTrainer)
            try:
                if init_model_path is not None:
                    _load_weights(trainer.algorithm, Path(init_model_path), self.eval_env)
                    trainer.broadcast_weights()
                write_run_files(self.run_dir, cfg, {}, resume=self.resume)
                attempt.started()
                result = trainer.run()
            finally:
                trainer.close()
        self.algorithm = trainer.algorithm
        # A second train() call continues this run instead of refusing its directory.
        self.resume = True
        return result

    def eval(self, num_eval_episodes: int = 10) -> EvalStats:
        """Test episodes of the greedy policy on ``eval_env`` (the untrained one before
        :meth:`train`)."""
        cfg = self.config
        envs = make_vec_env(
            self.eval_env, min(cfg.env.num_test_envs, num_eval_episodes), mode=cfg.env.vector_mode
        )
        try:
            if self.algorithm is None:
                self.algorithm = build_algorithm(
                    cfg, envs.single_observation_space, envs.single_action_space
                )
            return Evaluator(envs, self.algorithm, seed=cfg.seed + 20_000).run(num_eval_episodes)
        finally:
            envs.close()


def _load_weights(algorithm: Algorithm[Any], path: Path, env_id: str) -> None:
    """Load the module weights of a run directory's best policy, or of a checkpoint."""
    if (path / CONFIG_FILE).is_file():
        found = None
        for sub in ("best", "checkpoints"):
            found = CheckpointManager(path / sub, readonly=True).latest()
            if found is not None:
                break
        if found is None:
            raise CheckpointError(f"init_model_path {path}: the run has no checkpoint yet")
        path = found
    state, metadata = load_checkpoint(
        path, state_schema=PolicyState, metadata_schema=PolicyMetadata
    )
    if metadata.get("algorithm") != algorithm.name:
        raise CheckpointError(
            f"init_model_path {path} holds a {metadata.get('algorithm')!r} model, "
            f"not {algorithm.name!r}"
        )
    check_env_matches(
        algorithm,
        space_from_json(metadata["observation_space"]),
        space_from_json(metadata["action_space"]),
        env_id,
    )
    load_policy_weights(algorithm, PolicyWeights(0, state["algorithm"]["modules"]))
