"""The actor-learner trainer: the shared training loop with Ray rollout actors collecting.

In the vocabulary of :mod:`rlfleet.train.trainer`, one training step of a
:class:`DistributedTrainer` is

collection step
    gathering ``batch_fragments x num_learners`` rollout fragments from the actors, which
    keep collecting in the background while the learner works (see
    :mod:`rlfleet.distributed.actors`);
update step
    ``algo.update(batch)`` on those fragments side by side, on the driver (one learner) or
    on the learner group with gradient averaging (:mod:`rlfleet.distributed.learner`),
    followed by one broadcast of the new, versioned weights through the object store. With
    ``reward_signals`` (one learner), the batch's rewards are first replaced by the signals'
    combined reward (:func:`~rlfleet.distributed.learner.learner_step`): reward-free
    pre-training trains on an intrinsic reward alone.

Everything else (epochs, test steps on the driver, history, progress bar, checkpoints,
``best/``, stop rules, hooks, resume) is :class:`~rlfleet.train.trainer.Trainer`'s. Extra
history columns: ``train/policy_lag`` (mean learner updates between the weights that collected
a fragment and the learner's), ``train/policy_version``, ``train/actor_restarts``,
``time/collect_s`` (an actor's seconds per fragment), ``time/wait_s`` (the driver's
seconds per update waiting for fragments) and ``time/learner_s`` (update plus broadcast).
"""

from __future__ import annotations

import time
from typing import Any

from gymnasium.vector import VectorEnv

from rlfleet.algos.base import Algorithm
from rlfleet.algos.kinds import require_kind
from rlfleet.checkpoint.schema import DistributedLoopState
from rlfleet.config.loader import validate
from rlfleet.data.rollout import RolloutStorage
from rlfleet.distributed.actors import (
    EnvFactory,
    RolloutActors,
    WorkerSpec,
    fragment_storage,
    load_policy_weights,
    policy_weights,
)
from rlfleet.distributed.cluster import connect, require_ray
from rlfleet.distributed.config import DistributedConfig
from rlfleet.distributed.learner import LearnerGroup, LearnerSpec, learner_step
from rlfleet.envs.make import VectorMode
from rlfleet.envs.spaces import describe_space, spaces_equal
from rlfleet.errors import ClusterError, ConfigError, EnvSpecError
from rlfleet.train.loop import TrainerConfig
from rlfleet.train.threads import available_cores
from rlfleet.train.trainer import Trainer
from rlfleet.types import CollectStats

START_TIMEOUT_S = 120.0
"""How long actors may take to start (build their env) before the run gives up."""


class DistributedTrainer(Trainer):
    """Trains a ``distributed``-kind algorithm (IMPALA, APPO) with Ray actors.

    Args:
        algorithm: the driver's copy: the learner itself when ``num_learners`` is 1, else
            a mirror of learner 0 used for test steps and checkpoints (learner actors with
            ``learner_num_gpus > 0`` train on their GPU whatever the driver's device).
        test_envs: vector env for the test steps, stepped on the driver.
        config: loop settings.
        env_id / num_envs / vector_mode / env_kwargs: what each actor builds
            (``num_envs`` envs per actor).
        env_factory: builds each actor's envs instead of ``env_id`` (a function Ray can
            serialise, returning an env or a vector env; see
            :func:`rlfleet.distributed.actors.env_source`).
        distributed: actors, learners, cluster (see :class:`DistributedConfig`).
        seed: seeds the actors (each its own stream) and the test envs.
        Other keyword arguments (``run_dir``, hooks, ``resume_from_log``) are
        :class:`~rlfleet.train.trainer.Trainer`'s.
    """

    state_schema = DistributedLoopState

    def __init__(
        self,
        algorithm: Algorithm[Any],
        test_envs: VectorEnv[Any, Any, Any],
        config: TrainerConfig | None = None,
        *,
        env_id: str,
        num_envs: int,
        vector_mode: VectorMode = "auto",
        env_kwargs: dict[str, Any] | None = None,
        env_factory: EnvFactory | None = None,
        distributed: DistributedConfig | None = None,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        self.actor_learner = require_kind(
            algorithm,
            "distributed",
            "DistributedTrainer needs an actor-learner algorithm (impala, appo)",
        )
        """``algorithm`` as its kind's contract: what the driver's update calls."""
        dcfg = (
            DistributedConfig()
            if distributed is None
            else validate(DistributedConfig, distributed, "DistributedConfig")
        )
        hp = self.actor_learner.config
        dcfg.check(hp.batch_fragments)
        samples = hp.num_steps * num_envs * hp.batch_fragments
        if hp.batch_size is not None and hp.batch_size > samples:
            raise ConfigError(
                f"batch_size ({hp.batch_size}) is larger than one learner's batch "
                f"(num_steps x num_envs x batch_fragments = {samples})"
            )
        signals = kwargs.get("reward_signals")
        if dcfg.num_learners > 1 and signals is not None and not signals.is_identity:
            raise ConfigError(
                f"reward signals (pre-training) need num_learners 1, got {dcfg.num_learners}: "
                "the driver's learner computes the intrinsic rewards"
            )
        self.distributed = dcfg
        self.policy_version = 0
        """Learner updates so far; the weights the actors hold carry this number."""
        self.restarts_before = 0
        """Actor restarts of this run before it was resumed."""
        ray = require_ray()
        self.ray = ray
        self.actors: RolloutActors | None = None
        self.learners: LearnerGroup | None = None
        self._owns_ray = False
        super().__init__(algorithm, None, test_envs, config, seed=seed, **kwargs)
        try:
            self._owns_ray = connect(dcfg.ray_address, local_num_cpus=dcfg.cpus_reserved)
            spec = WorkerSpec(
                env_id,
                num_envs,
                vector_mode,
                dict(env_kwargs or {}),
                algorithm.name,
                hp,
                seed,
                env_factory,
            )
            self._start_actors(spec)
            if dcfg.num_learners > 1:
                self.learners = LearnerGroup(
                    ray,
                    LearnerSpec(
                        algorithm.name,
                        hp,
                        algorithm.observation_space,
                        algorithm.action_space,
                        algorithm.seed,
                        "cuda" if dcfg.learner_num_gpus > 0 else str(algorithm.device),
                        dcfg.th_compile,
                        algorithm.nan_policy,
                    ),
                    num_learners=dcfg.num_learners,
                    num_cpus=dcfg.learner_num_cpus,
                    num_gpus=dcfg.learner_num_gpus,
                )
                self.learners.load_state(algorithm.state_dict())
            elif dcfg.th_compile:
                algorithm.compile_update()
        except BaseException:
            self.close()
            raise
        assert self.actors is not None
        self.batch: RolloutStorage = fragment_storage(
            algorithm, hp.num_steps, num_envs * hp.batch_fragments
        )
        self.weights_ref: Any = ray.put(policy_weights(algorithm, self.policy_version))
        """Object ref of the newest weights in the object store."""
        self.actors.set_weights(self.policy_version, self.weights_ref)

    def cores_for_learning(self) -> int:
        """The cores ``torch_threads: auto`` may give the driver's learner: this process's,
        less the CPUs the rollout actors and learner actors reserve (on a one-machine cluster
        they step on the same cores; at least one)."""
        return max(1, available_cores() - self.distributed.cpus_reserved)

    def _prepare_update_step(self) -> None:
        cfg = self.config
        if cfg.compile or cfg.cuda_graphs or cfg.precision != "fp32":
            raise ConfigError(
                "trainer.compile, trainer.cuda_graphs and trainer.precision do not apply to "
                "actor-learner runs (their learners compile with distributed.th_compile and "
                "train in fp32); expected compile: false, cuda_graphs: false, precision: fp32, "
                f"got compile: {str(cfg.compile).lower()}, cuda_graphs: "
                f"{str(cfg.cuda_graphs).lower()}, precision: {cfg.precision}"
            )

    def _start_actors(self, spec: WorkerSpec) -> None:
        dcfg = self.distributed
        # Assigned before they start, so that close() stops them if starting fails.
        self.actors = actors = RolloutActors(
            self.ray,
            spec,
            num_actors=dcfg.num_actors,
            requests_per_actor=dcfg.requests_per_actor,
            num_storages=dcfg.storages,
            max_restarts=dcfg.max_actor_restarts,
            num_cpus=dcfg.actor_num_cpus,
            fragment_timeout_s=dcfg.fragment_timeout_s,
        )
        obs_space, action_space = actors.start(START_TIMEOUT_S)[0]
        for label, theirs, ours in (
            ("observation", obs_space, self.algorithm.observation_space),
            ("action", action_space, self.algorithm.action_space),
        ):
            if not spaces_equal(theirs, ours):
                raise EnvSpecError(
                    f"{spec.env_id}: the actors' {label} space {describe_space(theirs)} differs "
                    f"from the test env's {describe_space(ours)}"
                )

    # ------------------------------------------------------------- one step
    def _training_step(self) -> tuple[CollectStats, dict[str, float]]:
        assert self.actors is not None
        hp = self.algorithm.config
        start = time.perf_counter()
        try:
            gathered = self.actors.gather(hp.batch_fragments * self.distributed.num_learners)
        except ClusterError as err:
            raise ClusterError(f"{err}. {self._checkpoint_note()}") from None
        gathered_at = time.perf_counter()
        stats = CollectStats()
        lags, collect_s = [], []
        for info, _ in gathered:
            stats.env_steps += info.stats.env_steps
            stats.episode_returns.extend(info.stats.episode_returns)
            stats.episode_lengths.extend(info.stats.episode_lengths)
            lags.append(self.policy_version - info.policy_version)
            collect_s.append(info.collect_s)
        refs = [ref for _, ref in gathered]
        version = self.policy_version + 1
        if self.learners is None:
            metrics = learner_step(
                self.actor_learner, self.batch, self.ray.get(refs), self.reward_signals
            )
            self.weights_ref = self.ray.put(policy_weights(self.algorithm, version))
        else:
            try:
                metrics, learner, self.weights_ref = self.learners.update(
                    version, self.algorithm.progress, refs
                )
            except ClusterError as err:
                raise ClusterError(f"{err}. {self._checkpoint_note()}") from None
            self.algorithm.gradient_steps = learner.gradient_steps
            self.algorithm.skipped_batches = learner.skipped_batches
        self.policy_version = version
        self.actors.set_weights(version, self.weights_ref)
        metrics.update(
            {
                "train/policy_lag": sum(lags) / len(lags),
                "train/policy_version": float(version),
                "train/actor_restarts": float(self.restarts_before + self.actors.restarts),
                "time/collect_s": sum(collect_s) / len(collect_s),
                "time/wait_s": gathered_at - start,
                "time/learner_s": time.perf_counter() - gathered_at,
            }
        )
        return stats, metrics

    def broadcast_weights(self) -> None:
        """Send the driver's current weights to the learners and every actor: after weights
        were loaded into :attr:`algorithm` from outside (``init_model_path``)."""
        assert self.actors is not None
        if self.learners is not None:
            self.learners.load_state(self.algorithm.state_dict())
        self.weights_ref = self.ray.put(policy_weights(self.algorithm, self.policy_version))
        self.actors.set_weights(self.policy_version, self.weights_ref, resend=True)

    def _checkpoint_note(self) -> str:
        latest = self.checkpoints.latest() if self.checkpoints is not None else None
        if latest is None:
            return "No checkpoint was written yet"
        return (
            f"The latest checkpoint is intact: {latest} (continue with "
            f"`rlfleet train {self.algorithm.name} --resume {self.run_dir}`)"
        )

    # ------------------------------------------------ driver copy and state
    def sync_from_learners(self, *, full: bool) -> None:
        """Bring the driver's copy up to date with learner 0: the weights for a test step,
        the full state (optimiser, RNG, counters) for a checkpoint."""
        if self.learners is None:
            return
        if full:
            self.algorithm.load_state_dict(self.learners.state())
        else:
            load_policy_weights(self.algorithm, self.ray.get(self.weights_ref))

    def _test_step(self, reporter: Any, tensorboard: Any, num_episodes: int | None = None) -> bool:
        self.sync_from_learners(full=False)
        return super()._test_step(reporter, tensorboard, num_episodes)

    def checkpoint_state(self) -> dict[str, Any]:
        self.sync_from_learners(full=True)
        state = super().checkpoint_state()
        restarts = self.restarts_before + (self.actors.restarts if self.actors else 0)
        state["distributed"] = {"policy_version": self.policy_version, "actor_restarts": restarts}
        return state

    def resume(self) -> dict[str, Any]:
        state = super().resume()
        self.policy_version = int(state["distributed"]["policy_version"])
        self.restarts_before = int(state["distributed"]["actor_restarts"])
        return state

    def close(self) -> None:
        """Stop the actors and learners, close the test envs, and leave the Ray cluster if
        this trainer joined it."""
        if self.actors is not None:
            self.actors.shutdown()
            self.actors = None
        if self.learners is not None:
            self.learners.shutdown()
            self.learners = None
        if self.test_envs is not None:
            self.test_envs.close()
        if self._owns_ray:
            self.ray.shutdown()
            self._owns_ray = False
