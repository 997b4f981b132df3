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
``rlfleet play`` and ``rlfleet train impala --resume`` work on it (for an env given by id or
by a registered spec; a factory's env is rebuilt by the agent alone).

RLLTE's names keep their meaning (``docs/coming-from-rllte.md`` has the table):
``batch_size`` is the number of rollouts (fragments) in one learner batch, IMPALA's and APPO's
``batch_fragments``; ``hidden_dim`` is the width of the hidden layers, ``hidden_sizes =
(hidden_dim, hidden_dim)``; ``pretraining`` trains on an intrinsic reward alone (RND by
default); :meth:`DistributedAgent.run` is one actor's sampling loop and
:meth:`DistributedAgent.update` one learner step, both in this process, on the same
:class:`~rlfleet.distributed.actors.RolloutWorker` and
:func:`~rlfleet.distributed.learner.learner_step` as the Ray actors and the trainer.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Literal

from rlfleet.algos.base import Algorithm
from rlfleet.algos.kinds import require_kind
from rlfleet.checkpoint import CheckpointManager, load_checkpoint
from rlfleet.checkpoint.schema import PolicyMetadata, PolicyState
from rlfleet.collect.evaluator import Evaluator
from rlfleet.data.rollout import RolloutStorage
from rlfleet.distributed.actors import (
    EnvSource,
    FragmentInfo,
    PolicyWeights,
    RolloutWorker,
    WorkerSpec,
    build_vec_env,
    env_source,
    fragment_storage,
    load_policy_weights,
    policy_weights,
)
from rlfleet.distributed.config import fitted_defaults
from rlfleet.distributed.learner import learner_step
from rlfleet.distributed.trainer import DistributedTrainer
from rlfleet.envs.spaces import describe_space, space_from_json, spaces_equal
from rlfleet.errors import CheckpointError, ConfigError, EnvSpecError
from rlfleet.rewards.signals import RewardSignals
from rlfleet.runs.config import CONFIG_FILE, RunConfig, default_run_config, load_run_config
from rlfleet.runs.run import build_algorithm, check_env_matches, make_trainer
from rlfleet.runs.run_dir import (
    RunDirAttempt,
    ScheduleOnResume,
    resumed_config,
    run_name,
    timestamped_run_dir,
    write_run_files,
)
from rlfleet.seeding import episode_seed
from rlfleet.train.loop import TrainResult
from rlfleet.types import EvalStats

IntrinsicReward = Literal["rnd", "curiosity"]


class DistributedAgent:
    """Actor-learner training of IMPALA (default) or APPO on Ray.

    Args:
        env: what each rollout actor builds: a Gymnasium env id, a vector env (e.g.
            ``gym.make_vec(...)``, ``SyncVectorEnv([...])``) of envs built with ``gym.make``,
            or a function returning an env or a vector env that Ray can serialise. Actors
            rebuild it in their own processes (see ``docs/distributed.md``, "Which envs
            travel"); one that cannot travel is refused here with an EnvSpecError. A vector
            env fixes ``num_envs`` (envs per actor) to its own count.
        eval_env: env of the test episodes, in the same forms (default: ``env``); it is
            built on the driver, so any factory will do.
        tag: names the run directory ``runs/<tag>-<time>`` (default: ``<algo>-<env>-s<seed>``).
        seed: seeds the networks, the actors (one stream each) and the test envs.
        device: torch device of the learner(s).
        num_steps: steps per env in one rollout fragment (default: the preset's).
        num_actors: rollout actors (default: RLLTE's 45, fewer when the CPUs do not hold
            them; see :func:`~rlfleet.distributed.config.fitted_defaults`).
        num_learners: learners; more than one average gradients (default: RLLTE's 4, or 1
            when the CPUs do not hold them or with ``pretraining``/``intrinsic_reward``).
        num_storages: most fragments in existence at once (default: RLLTE's 60, or more when
            the actors or learners need more).
        pretraining: reward-free pre-training: the learner maximises the intrinsic reward
            ``intrinsic_reward`` alone, never the env's (fine-tune afterwards with a new agent
            and ``train(init_model_path=<this run>)``).
        intrinsic_reward: ``rnd`` (Random Network Distillation) or ``curiosity`` (ICM); with
            ``pretraining`` (default ``rnd``) the only reward, without it added to the env's.
        batch_size: rollouts (fragments) per learner batch: ``batch_fragments``.
        hidden_dim: width of the actor's and critic's hidden layers: ``hidden_sizes =
            (hidden_dim, hidden_dim)``.
        use_lstm: a recurrent policy: ``lstm_hidden_size = hidden_dim`` (64 without
            ``hidden_dim``).
        minibatch_size: APPO's minibatch size in samples (APPO's own ``batch_size``).
        algo: ``impala`` or ``appo``.
        num_envs: envs per actor (default: the preset's, or a vector env's count).
        ray_address: cluster to join (``auto``, ``ray://HOST:PORT``, ``HOST:PORT``); unset
            joins ``RAY_ADDRESS`` if that is set, else starts a local cluster.
        run_dir: use this run directory instead of one named by ``tag``.
        resume: continue the run in ``run_dir`` from its latest checkpoint.
        **algo_kwargs: hyperparameters of the algorithm's config (e.g. ``learning_rate``).

    Bad settings (``num_actors < 1``, ``num_storages < num_actors``, unknown keyword, an env
    that cannot travel) raise a :class:`~rlfleet.errors.ConfigError` or
    :class:`~rlfleet.errors.EnvSpecError` here, before anything starts.
    """

    def __init__(
        self,
        env: Any,
        eval_env: Any = None,
        tag: str | None = None,
        seed: int = 1,
        device: str = "cpu",
        num_steps: int | None = None,
        num_actors: int | None = None,
        num_learners: int | None = None,
        num_storages: int | None = None,
        *,
        pretraining: bool = False,
        intrinsic_reward: IntrinsicReward | None = None,
        batch_size: int | None = None,
        hidden_dim: int | None = None,
        use_lstm: bool = False,
        minibatch_size: int | None = None,
        algo: str = "impala",
        num_envs: int | None = None,
        ray_address: str | None = None,
        run_dir: str | Path | None = None,
        resume: bool = False,
        **algo_kwargs: Any,
    ) -> None:
        self.env_source: EnvSource = env_source(env, "env")
        """What the actors build, as it travels to them."""
        self.eval_source: EnvSource = (
            self.env_source if eval_env is None else env_source(eval_env, "eval_env", travels=False)
        )
        """What the test episodes run on, built on the driver."""
        self.pretraining = pretraining
        overrides: dict[str, Any] = {
            "seed": seed,
            "device": device,
            "hyperparameters": _hyperparameters(
                algo_kwargs, num_steps, batch_size, hidden_dim, minibatch_size, use_lstm
            ),
            "env": {"kwargs": dict(self.env_source.env_kwargs)},
        }
        fixed = self.env_source.num_envs
        if fixed is not None and num_envs is not None and num_envs != fixed:
            raise ConfigError(
                f"num_envs ({num_envs}) differs from the {fixed} envs of the given vector env "
                "(each actor builds one like it)"
            )
        if fixed is not None or num_envs is not None:
            overrides["env"]["num_envs"] = fixed or num_envs
        signals = _reward_signals(pretraining, intrinsic_reward)
        if signals is not None:
            overrides["reward_signals"] = signals
            # The driver's learner computes the intrinsic rewards: one learner.
            num_learners = 1 if num_learners is None else num_learners
        label = self.env_source.env_id
        base = default_run_config(algo, label, overrides)
        if base.distributed is None:
            raise ConfigError(
                f"DistributedAgent trains actor-learner algorithms (impala, appo), not {algo!r}"
            )
        actors, learners, storages = fitted_defaults(
            num_actors,
            num_learners,
            num_storages,
            _available_cpus(ray_address),
            batch_fragments=base.hyperparameters.batch_fragments,
        )
        overrides["distributed"] = {
            "num_actors": actors,
            "num_learners": learners,
            "num_storages": storages,
            "ray_address": ray_address,
        }
        self.config: RunConfig = default_run_config(algo, label, overrides)
        assert self.config.distributed is not None
        self.config.distributed.check(self.config.hyperparameters.batch_fragments)
        if signals is not None and learners > 1:
            raise ConfigError(
                f"pretraining and intrinsic_reward need num_learners 1, got {learners}: the "
                "driver's learner computes the intrinsic rewards"
            )
        if run_dir is not None:
            self.run_dir = Path(run_dir)
        else:
            self.run_dir = timestamped_run_dir(tag or run_name(algo, label, seed))
        self.resume = resume
        self.algorithm: Algorithm[Any] | None = None
        self.reward_signals: RewardSignals | None = None
        """The learner's reward signals (pretraining or ``intrinsic_reward``), once built."""
        self.storages: list[tuple[FragmentInfo, RolloutStorage]] = []
        """Full storages :meth:`run` filled and :meth:`update` has not consumed yet."""
        self.policy_version = 0
        """Learner steps of :meth:`update` so far (the version :meth:`run` collects with)."""

    # ------------------------------------------------------------- training
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
            init_model_path: start from the weights of this run directory (its best policy;
                for a pre-training run, its latest checkpoint, since test returns do not rank
                reward-free policies) or checkpoint directory; counters and optimiser start
                fresh.
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
            test_interval_steps=eval_interval,
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
            test_envs = build_vec_env(
                self.eval_source, cfg.env.num_test_envs, mode=cfg.env.vector_mode
            )
            trainer = make_trainer(
                cfg,
                self.run_dir,
                resume=self.resume,
                test_envs=test_envs,
                env_factory=self.env_source.factory,
            )
            assert isinstance(trainer, DistributedTrainer)
            try:
                if init_model_path is not None:
                    _load_weights(trainer.algorithm, Path(init_model_path), self.eval_source.env_id)
                    trainer.broadcast_weights()
                write_run_files(self.run_dir, cfg, {}, resume=self.resume)
                trainer.after_first_step = attempt.started
                result = trainer.run()
            finally:
                trainer.close()
        self.algorithm = trainer.algorithm
        self.reward_signals = trainer.reward_signals
        # A second train() call continues this run instead of refusing its directory.
        self.resume = True
        return result

    def eval(self, num_eval_episodes: int = 10) -> EvalStats:
        """Test episodes of the greedy policy on ``eval_env`` (the untrained one before
        :meth:`train`)."""
        cfg = self.config
        envs = build_vec_env(
            self.eval_source,
            min(cfg.env.num_test_envs, num_eval_episodes),
            mode=cfg.env.vector_mode,
        )
        try:
            algorithm = self._algorithm(envs.single_observation_space, envs.single_action_space)
            return Evaluator(envs, algorithm, seed=episode_seed(cfg.seed, "evaluation")).run(
                num_eval_episodes
            )
        finally:
            envs.close()

    # ------------------------------------------------ actor and learner steps
    def run(
        self, env: Any, actor_idx: int, *, num_fragments: int | None = None
    ) -> list[FragmentInfo]:
        """One rollout actor's sampling loop, in this process (for debugging and tests).

        Actor ``actor_idx`` builds ``env`` (any form the constructor takes) as a Ray actor
        would, with that actor's seed, loads the agent's current weights, and fills free
        storages with fragments until none is free (``num_storages`` hold fragments at once)
        or ``num_fragments`` are collected; :meth:`update` consumes them. Returns what it
        collected. It runs the :class:`~rlfleet.distributed.actors.RolloutWorker` a Ray
        actor runs.
        """
        assert self.config.distributed is not None
        source = env_source(env, "run(env)", travels=False)
        free = self.config.distributed.storages - len(self.storages)
        count = free if num_fragments is None else min(num_fragments, free)
        return self._collect(source, actor_idx, count)

    def update(self) -> dict[str, float]:
        """One learner step, in this process: ``batch_size`` (``batch_fragments``) full
        storages side by side, their rewards replaced by the intrinsic reward when
        pre-training, one ``algo.update``; returns its metrics. Storages that :meth:`run` has
        not filled yet are filled first by actor 0 on ``env``. It is the step the trainer
        runs with one learner (:func:`~rlfleet.distributed.learner.learner_step`)."""
        cfg = self.config
        needed = cfg.hyperparameters.batch_fragments
        if len(self.storages) < needed:
            self._collect(self.env_source, 0, needed - len(self.storages))
        taken, self.storages = self.storages[:needed], self.storages[needed:]
        fragments = [storage for _, storage in taken]
        algorithm = self._algorithm(None, None)
        first = fragments[0]
        batch = fragment_storage(algorithm, first.num_steps, first.num_envs * needed)
        if self.reward_signals is None and cfg.reward_signals is not None:
            self.reward_signals = RewardSignals(
                cfg.reward_signals,
                algorithm.observation_space,
                algorithm.action_space,
                batch.num_envs,
                seed=cfg.seed,
                device=cfg.device,
            )
        learner = require_kind(algorithm, "distributed", "update() needs an actor-learner")
        metrics = learner_step(learner, batch, fragments, self.reward_signals)
        self.policy_version += 1
        return metrics

    def _collect(self, source: EnvSource, actor_idx: int, count: int) -> list[FragmentInfo]:
        cfg = self.config
        if source.num_envs is not None and source.num_envs != cfg.env.num_envs:
            raise EnvSpecError(
                f"run(env): the vector env has {source.num_envs} envs, the agent's actors "
                f"{cfg.env.num_envs}"
            )
        spec = WorkerSpec(
            source.env_id,
            cfg.env.num_envs,
            cfg.env.vector_mode,
            dict(source.env_kwargs),
            cfg.algo,
            cfg.hyperparameters,
            cfg.seed,
            source.factory,
        )
        worker = RolloutWorker(actor_idx, spec)
        obs_space, action_space = worker.start()
        algorithm = self._algorithm(obs_space, action_space)
        for label, theirs, ours in (
            ("observation", obs_space, algorithm.observation_space),
            ("action", action_space, algorithm.action_space),
        ):
            if not spaces_equal(theirs, ours):
                raise EnvSpecError(
                    f"run(env): the env's {label} space {describe_space(theirs)} differs from "
                    f"the agent's {describe_space(ours)}"
                )
        weights: PolicyWeights | None = policy_weights(algorithm, self.policy_version)
        infos = []
        try:
            for _ in range(count):
                info, storage = worker.collect(weights)
                weights = None
                # The worker refills its one storage in place: keep a copy.
                self.storages.append((info, copy.deepcopy(storage)))
                infos.append(info)
        finally:
            assert worker.running is not None
            worker.running[0].envs.close()
        return infos

    def _algorithm(self, obs_space: Any, action_space: Any) -> Algorithm[Any]:
        """The driver's algorithm (built on first use, with the eval env's spaces)."""
        if self.algorithm is None:
            if obs_space is None:
                probe = build_vec_env(self.eval_source, 1)
                obs_space, action_space = probe.single_observation_space, probe.single_action_space
                probe.close()
            self.algorithm = build_algorithm(self.config, obs_space, action_space)
        return self.algorithm


DEFAULT_LSTM_HIDDEN_SIZE = 64
"""``lstm_hidden_size`` of ``use_lstm=True`` without ``hidden_dim`` (the presets' width)."""


def _hyperparameters(
    algo_kwargs: dict[str, Any],
    num_steps: int | None,
    batch_size: int | None,
    hidden_dim: int | None,
    minibatch_size: int | None,
    use_lstm: bool = False,
) -> dict[str, Any]:
    """The algorithm's hyperparameters from RLLTE's names (see the module docstring)."""
    hyperparameters = dict(algo_kwargs)
    for rllte, ours, value in (
        ("batch_size", "batch_fragments", batch_size),
        ("hidden_dim", "hidden_sizes", hidden_dim),
        ("use_lstm", "lstm_hidden_size", use_lstm or None),
    ):
        if value is not None and ours in hyperparameters:
            raise ConfigError(f"{rllte} and {ours} both given; {rllte} sets {ours}")
    if num_steps is not None:
        hyperparameters["num_steps"] = num_steps
    if batch_size is not None:
        hyperparameters["batch_fragments"] = batch_size
    if hidden_dim is not None:
        hyperparameters["hidden_sizes"] = [hidden_dim, hidden_dim]
    if minibatch_size is not None:
        hyperparameters["batch_size"] = minibatch_size
    if use_lstm:
        # As in TorchBeast and RLLTE, the LSTM core is as wide as the hidden layers.
        hyperparameters["lstm_hidden_size"] = hidden_dim or DEFAULT_LSTM_HIDDEN_SIZE
    return hyperparameters


def _reward_signals(
    pretraining: bool, intrinsic_reward: IntrinsicReward | None
) -> dict[str, Any] | None:
    """The ``reward_signals`` section: pre-training maximises the intrinsic reward alone."""
    if intrinsic_reward is not None and intrinsic_reward not in ("rnd", "curiosity"):
        raise ConfigError(
            f"intrinsic_reward must be 'rnd' or 'curiosity', got {intrinsic_reward!r}"
        )
    if pretraining:
        return {intrinsic_reward or "rnd": {}}
    if intrinsic_reward is not None:
        return {"extrinsic": {}, intrinsic_reward: {}}
    return None


def _available_cpus(ray_address: str | None) -> int | None:
    """CPUs the run can use: the joined Ray cluster's, this machine's when a local cluster
    will start, None when a cluster at ``ray_address`` is yet to be joined."""
    ray = sys.modules.get("ray")  # only when the caller already imported it: Ray is optional
    if ray is not None and ray.is_initialized():
        cpus = int(ray.cluster_resources().get("CPU", 0))
        return cpus or None
    if ray_address is not None:
        return None
    return os.cpu_count()


def _load_weights(algorithm: Algorithm[Any], path: Path, env_id: str) -> None:
    """Load the module weights of a run directory's best policy (a pre-training run's latest
    checkpoint), or of a checkpoint."""
    if (path / CONFIG_FILE).is_file():
        found = None
        signals = load_run_config(path).reward_signals
        reward_free = signals is not None and signals.extrinsic is None
        for sub in ("checkpoints", "best") if reward_free else ("best", "checkpoints"):
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
