"""The training loops.

Glossary (the vocabulary every rlfleet trainer shares, after Tianshou 2):

training loop
    :class:`TrainingLoop`: epochs of training steps and test steps, hooks, stop rules,
    history, progress and checkpoints. :class:`Trainer` runs it for one algorithm on
    Gymnasium vector envs (:class:`OnPolicyTrainer`, :class:`OffPolicyTrainer`,
    :class:`OfflineTrainer`, the distributed trainer);
    :class:`rlfleet.marl.trainer.DecentralizedTrainer` for the agents of a PettingZoo game.
policy
    What a loop trains (:class:`Policy`): an algorithm, or a game's
    :class:`rlfleet.marl.agents.Agents`. ``save_best_fn`` receives it, checkpoints save it,
    :func:`rlfleet.runs.run.load_policy` loads it.
epoch
    A unit of progress of ``epoch_num_steps`` environment steps, ended by a test step (as
    the test cadence says), a history flush, then a checkpoint (every epoch, or the epoch
    that completes each ``checkpoint_interval_steps``, and the last), and an epoch summary
    line.
    :meth:`TrainingLoop.run` runs epochs until a stop rule fires;
    :meth:`TrainingLoop.execute_epoch` runs one and returns its
    :class:`~rlfleet.train.loop.EpochStats`, and ``for epoch_stat in trainer``
    yields them one by one (as in Tianshou).
session
    From :meth:`TrainingLoop.reset` (which :meth:`TrainingLoop.run` and iteration call
    first) until a stop rule fires: the clock, the progress bar and TensorBoard file. The
    counters are the run's and carry on from one session to the next.
training step
    One ``training_fn`` call, one collection step, one update step, and logging. An epoch
    holds as many training steps as fit in ``epoch_num_steps``.
collection step
    Stepping the training envs with the exploring policy. On-policy: one rollout of
    ``collection_step_num_env_steps`` steps (the algorithm's ``num_steps * num_envs`` unless
    given). Off-policy: that many steps into the replay buffer. Offline: none. Multi-agent:
    ``collection_step_num_episodes`` episodes, each agent's steps routed to its learner's
    storage (see :mod:`rlfleet.marl.trainer`, which counts agent steps as env steps).
offline step counting
    Offline training takes no env steps: its training steps advance the step counter by the
    gradient steps they make, so ``max_steps``, ``epoch_num_steps``, ``log_interval_steps``
    and ``checkpoint_interval_steps`` count gradient steps (as in Tianshou's offline trainer),
    and the history's ``env_step`` column holds them too: the history file, the progress
    bar, the epoch summary line and :class:`TrainResult` say ``gradient steps``
    (:attr:`Trainer.step_unit`).
update step
    Learning from collected data. On-policy: ``algo.update(rollout)`` runs
    ``update_step_num_repetitions`` passes (the algorithm's ``num_epochs`` unless given) over
    minibatches of ``batch_size``. Off-policy: ``algo.update(replay_buffer)`` runs
    ``update_step_num_gradient_steps_per_sample`` gradient steps per collected env step (the
    update-to-data ratio; the algorithm's ``gradient_steps / train_freq`` unless given), each
    on a fresh minibatch of ``batch_size`` sampled from the buffer. It returns a dict of
    scalar metrics. Offline: ``algo.update(dataset_buffer)`` runs
    ``update_step_num_gradient_steps`` gradient steps on minibatches of ``batch_size`` drawn
    from the dataset (:meth:`rlfleet.data.dataset.OfflineDataset.to_replay_buffer`).
    Multi-agent: each learning agent's, on-policy after the collection step, off-policy every
    ``collection_step_num_env_steps`` agent steps inside it.
dataset
    Offline: the fixed transitions learnt from (:mod:`rlfleet.data.dataset`). Its size and
    episode-return distribution are logged (``dataset/`` metrics and a message line) when a
    run starts.
replay buffer
    Off-policy: the last ``buffer_size`` transitions (:mod:`rlfleet.data.replay`). Saved in
    every checkpoint when ``save_replay_buffer`` is set, so a resumed run keeps its data.
threaded collection
    Off-policy, with ``threaded``: a collector thread steps the training envs with a copy of
    the policy while the learner takes its gradient steps; the learner writes each of the
    thread's collection steps into the replay buffer at the start of a training step. The
    copy's weights lag the learner's within a documented bound, the thread waits at the end
    of every epoch (so test steps and checkpoints see a consistent run) and stops with the
    session; an error on it is raised in the caller's thread (:mod:`rlfleet.train.threaded`).
learning starts
    Off-policy: the first ``learning_starts`` env steps take uniformly random actions and
    make no update, so the first minibatches are not all from one untrained policy.
target network
    Off-policy: a lagging copy of a network that the learning targets are computed with;
    copied every ``target_update_interval`` gradient steps or moved towards the online
    network by ``tau`` after each (Polyak averaging). Part of the algorithm, saved with it.
exploration
    Off-policy: how the collection policy departs from the greedy one: DQN's epsilon, which
    falls linearly with progress; Gaussian action noise (DDPG, TD3); SAC's own stochastic
    policy. Test steps always act greedily.
test cadence
    Which epochs end with a test step, and how many episodes it plays
    (:mod:`rlfleet.train.cadence`): every epoch, ``test_step_num_episodes`` (20 when unset),
    when test scores steer training (a stop rule or patience rule on them, ``test_fn``,
    ``test_result_fn``) and in multi-agent runs; otherwise adapted to keep test steps within
    ``test_time_share`` (10%) of the wall time, the first epoch of a session and the last of
    a run always tested. ``test_interval_steps`` and ``test_step_num_episodes``, when set,
    are kept as given.
test step
    ``test_fn``, then ``test_step_num_episodes`` episodes of the greedy policy on the test
    envs, a score by ``compute_score_fn`` (multi-agent: of the returns per agent, e.g. by
    ``reward_metric``), ``save_best_fn`` when the score is a new best,
    and the stop rules. ``test_in_training`` also runs a test step as soon as the training
    episodes' mean return satisfies ``stop_fn``, so a solved task stops without waiting for
    the end of the epoch. A loop without test envs (``test_envs=None``) plays no test
    episodes: its test steps score the last 20 training episodes instead, and that score
    drives ``stop_fn``, ``target_reward``, ``best/`` and the patience rules. Offline runs,
    which have no training episodes to plot, also run a test step before the first training
    step (as Tianshou's trainer does), so that their learning curve starts at the untrained
    policy's score; it never stops the run.

Hooks, each optional:

``training_fn(epoch: int, env_step: int) -> None``
    Called before every training step (e.g. to change exploration).
``train_fn(epoch: int, env_step: int) -> None``
    The former name of ``training_fn``: still works, and warns (DeprecationWarning).
``test_fn(epoch: int, env_step: int) -> None``
    Called before every test step that plays test episodes.
``stop_fn(score: float) -> bool``
    True to stop training; default: ``score >= target_reward`` when a target is set.
    Called after each test step with the best test score so far (Tianshou 2's
    ``stop_fn(best_score)``, so a threshold stops at the first test step that reaches it)
    and, with ``test_in_training``, with the mean return of the last 20 training episodes
    (a true answer there triggers a test step).
``compute_score_fn(stats: EvalStats) -> float``
    Turns test episodes into the score that ranks checkpoints; default: mean return.
``save_best_fn(policy) -> None``
    Called when a test score is a new best with what the loop trains (:data:`SaveBestFn`: an
    ``Algorithm``, or multi-agent ``Agents``); default: save it to ``run_dir/best``.
``save_checkpoint_fn(epoch: int, env_step: int, gradient_step: int) -> str | None``
    Called at the end of every epoch, after its test step, as Tianshou's loggers call it by
    default (of the epoch that completes each ``checkpoint_interval_steps`` when set, and of
    the last, also when a stop rule ends the run); default: an atomic checkpoint in
    ``run_dir/checkpoints`` (returns its path). A ``logger`` then gets ``save_data`` with
    that path.
``test_result_fn(epoch: int, env_step: int, score: float) -> None``
    Called after every test step with its score (e.g. to report intermediate values to a
    hyperparameter search). An exception it raises (such as ``optuna.TrialPruned``) ends
    training and propagates out of :meth:`Trainer.run`; the history logged so far is
    flushed and the latest checkpoint stays the last completed epoch's.

Reward signals, behavioral cloning and environment parameters, each optional:

``reward_signals`` (:class:`rlfleet.rewards.RewardSignals`)
    On-policy: after each collection step the rollout's rewards are replaced by the
    strength-weighted sum of the signals' rewards, and the signals learn from the rollout.
    Off-policy: the buffer keeps the env's rewards; every minibatch the algorithm samples
    gets the signals' combined rewards, and the signals learn from that minibatch
    (:mod:`rlfleet.rewards.replay`).
``behavioral_cloning`` (:class:`rlfleet.train.behavioral_cloning.BehavioralCloning`)
    On- and off-policy trainers: after each update step the policy also takes imitation
    steps on demonstrations (ML-Agents' ``behavioral_cloning``), logged as ``bc/loss`` and
    ``bc/strength``.
``env_parameters`` (:class:`rlfleet.envs.curriculum.EnvParameterManager`)
    After each training step the curriculum sees the finished episodes' returns and the
    progress through ``max_steps``, and may move lessons; the current lessons go to the
    history (``train/lesson/<parameter>``) and the progress bar.

Stop rules (xagents): ``target_reward`` (through the default ``stop_fn``), ``max_steps``,
``max_episodes``, ``max_epochs``, ``early_stop_patience`` test steps without improvement; and
``plateau_reduce_patience`` test steps without improvement multiply the learning rate by
``plateau_reduce_factor``.

Metrics are namespaced: ``train/`` (episodes and algorithm statistics), ``loss/``,
``test/`` and ``time/``. ``train/env_restarts`` (restarts of failed env workers over the
whole run, see ``restart_failed_envs``) is logged whenever it has grown.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from dataclasses import asdict
from enum import Enum
from typing import Any, Literal

import torch
from gymnasium.vector import VectorEnv

from rlfleet.algos.base import Algorithm
from rlfleet.algos.kinds import require_kind
from rlfleet.collect.collector import Collector
from rlfleet.collect.evaluator import Evaluator
from rlfleet.data.dataset import OfflineDataset
from rlfleet.data.replay import ReplayBuffer
from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs.spaces import space_to_json
from rlfleet.errors import ConfigError
from rlfleet.logging.history import GRADIENT_STEPS
from rlfleet.logging.progress import ProgressReporter
from rlfleet.nn.precision import check_precision, update_precision
from rlfleet.rewards.replay import SignalReplay
from rlfleet.train.behavioral_cloning import BehavioralCloning
from rlfleet.train.loop import TrainerConfig, TrainingLoop
from rlfleet.train.mlagents_api import MLAgentsOffPolicyAPI, MLAgentsTrainerAPI
from rlfleet.train.threaded import Chunk, ThreadedCollection, update_lag_bound
from rlfleet.types import CollectStats


class _Default(Enum):
    """An argument left out, told apart from an explicit ``None``."""

    ALGORITHM = "the algorithm's own setting"


def check_collection_step(num_env_steps: int | None, num_episodes: int | None) -> None:
    """Refuse both sizes of a collection step at once, or a number of episodes below 1.

    Raises:
        ConfigError: both are given, or ``num_episodes < 1``.
    """
    if num_episodes is None:
        return
    if num_env_steps is not None:
        raise ConfigError(
            "give collection_step_num_env_steps or collection_step_num_episodes, not both"
        )
    if num_episodes < 1:
        raise ConfigError(f"collection_step_num_episodes must be >= 1, got {num_episodes}")


class Trainer(TrainingLoop[Algorithm[Any], VectorEnv[Any, Any, Any]]):
    """The training loop of one algorithm on Gymnasium vector envs: a :class:`Collector`
    steps the training envs, an :class:`Evaluator` plays the test episodes. Subclasses
    (on-policy, off-policy, offline, actor-learner) define one training step; the arguments
    are :class:`TrainingLoop`'s, with next-step-autoreset vector envs."""

    collector: Collector | None
    evaluator: Evaluator
    behavioral_cloning: BehavioralCloning | None = None
    """Cloning of demonstrations after each update step (on- and off-policy trainers)."""

    def _prepare_update_step(self) -> None:
        """Refuse a ``precision`` the algorithm's device lacks, compile the update step when
        ``compile`` is set and capture it when ``cuda_graphs`` is (an algorithm that offers
        neither refuses it)."""
        cfg = self.config
        check_precision(cfg.precision, self.algorithm.device, "trainer.precision")
        if cfg.cuda_graphs and (cfg.compile or cfg.precision != "fp32"):
            raise ConfigError(
                "trainer.cuda_graphs captures the eager fp32 update step; expected compile: "
                f"false and precision: fp32 with it, got compile: {str(cfg.compile).lower()}, "
                f"precision: {cfg.precision}"
            )
        if cfg.compile:
            self.algorithm.compile_update()
        if cfg.cuda_graphs:
            self.algorithm.capture_update()

    def update_precision(self) -> AbstractContextManager[Any]:
        """The context every update step runs in: bf16 matrix products with ``precision:
        bf16``, nothing with fp32 (see :mod:`rlfleet.nn.precision`)."""
        return update_precision(self.config.precision)

    def _make_collector(self, train_envs: VectorEnv[Any, Any, Any], seed: int | None) -> Collector:
        return Collector(train_envs, self.algorithm, seed=seed)

    def _make_test_episodes(
        self, test_envs: VectorEnv[Any, Any, Any], seed: int | None
    ) -> Evaluator:
        return Evaluator(test_envs, self.algorithm, seed=seed)

    def policy_metadata(self) -> dict[str, Any]:
        return {
            "observation_space": space_to_json(self.algorithm.observation_space),
            "action_space": space_to_json(self.algorithm.action_space),
            "config": asdict(self.algorithm.config),
        }

    def _clone_demonstrations(self, env_step: int) -> dict[str, float]:
        """Behavioral cloning after an update step, when it is on."""
        if self.behavioral_cloning is None:
            return {}
        return self.behavioral_cloning.update(env_step)

    def checkpoint_state(self) -> dict[str, Any]:
        state = super().checkpoint_state()
        if self.behavioral_cloning is not None:
            state["behavioral_cloning"] = self.behavioral_cloning.state_dict()
        return state

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        super().load_checkpoint_state(state)
        # A run that gained behavioral cloning since the checkpoint starts it fresh.
        if self.behavioral_cloning is not None and "behavioral_cloning" in state:
            self.behavioral_cloning.load_state_dict(state["behavioral_cloning"])


class OnPolicyTrainer(MLAgentsTrainerAPI, Trainer):
    """Training steps of one rollout each, followed by ``algo.update(rollout)``.

    Extra arguments (Tianshou names; each defaults to the algorithm's own setting):
        collection_step_num_env_steps: env steps per rollout (``num_steps * num_envs``).
        collection_step_num_episodes: instead, collect until this many episodes have ended
            (at least one vector step; the rollout length varies).
        batch_size: minibatch size; ``None`` (as in Tianshou): the whole rollout is one
            minibatch, so each repetition takes one gradient step (not given: the
            algorithm's ``batch_size``).
        update_step_num_repetitions: passes over the rollout per update (``num_epochs``).
        behavioral_cloning: clone demonstrations into the policy after each update
            (:class:`~rlfleet.train.behavioral_cloning.BehavioralCloning`).

    ML-Agents' trainer methods (``advance``, ``save_model``, ...) drive the same loop: see
    :class:`~rlfleet.train.mlagents_api.MLAgentsTrainerAPI`.
    """

    def __init__(
        self,
        algorithm: Algorithm[Any],
        train_envs: VectorEnv[Any, Any, Any],
        test_envs: VectorEnv[Any, Any, Any] | None,
        config: TrainerConfig | None = None,
        *,
        collection_step_num_env_steps: int | None = None,
        collection_step_num_episodes: int | None = None,
        batch_size: int | Literal[_Default.ALGORITHM] | None = _Default.ALGORITHM,
        update_step_num_repetitions: int | None = None,
        behavioral_cloning: BehavioralCloning | None = None,
        **kwargs: Any,
    ) -> None:
        self.learner = require_kind(
            algorithm, "on_policy", "OnPolicyTrainer needs an on-policy algorithm"
        )
        self.behavioral_cloning = behavioral_cloning
        """``algorithm`` as its kind's contract: what the update step calls."""
        hp = self.learner.config
        num_envs = train_envs.num_envs
        steps = collection_step_num_env_steps or hp.num_steps * num_envs
        if steps % num_envs:
            raise ConfigError(
                f"collection_step_num_env_steps ({steps}) must be a multiple of "
                f"num_envs ({num_envs})"
            )
        self.whole_rollout = batch_size is None
        """``batch_size=None``: each update step takes the whole rollout as one minibatch."""
        # Algorithms without minibatches or epochs (A2C's default, ACER) leave these None.
        given = None if batch_size is _Default.ALGORITHM else batch_size
        self.batch_size: int | None = given or hp.batch_size
        self.update_step_num_repetitions: int | None = update_step_num_repetitions or hp.num_epochs
        check_collection_step(collection_step_num_env_steps, collection_step_num_episodes)
        if collection_step_num_episodes is not None and algorithm.needs_fixed_length_rollouts:
            raise ConfigError(
                f"{algorithm.name} learns from rollouts of num_steps vector steps each: "
                f"expected collection_step_num_episodes None, got {collection_step_num_episodes}"
            )
        self.collection_step_num_env_steps = steps
        self.collection_step_num_episodes = collection_step_num_episodes
        if (
            collection_step_num_episodes is None
            and not self.whole_rollout
            and self.batch_size is not None
            and self.batch_size > steps
        ):
            raise ConfigError(
                f"batch_size ({self.batch_size}) is larger than the rollout "
                f"(num_steps x num_envs = {steps}); lower batch_size or raise num_steps"
            )
        super().__init__(algorithm, train_envs, test_envs, config, **kwargs)
        state = algorithm.initial_state(num_envs)
        self.storage = RolloutStorage(
            steps // num_envs,
            num_envs,
            algorithm.obs_layout.shape,
            algorithm.action_shape,
            obs_dtype=algorithm.obs_layout.dtype,
            action_dtype=algorithm.action_dtype,
            state_shape=None if state is None else tuple(state.shape[1:]),
        )

    def _threaded_refusal(self) -> str | None:
        return (
            "an on-policy update needs the rollout it trains on, collected with the weights "
            "it updates, so collection cannot run ahead of it (it helps off-policy training)"
        )

    def _training_step(self) -> tuple[CollectStats, dict[str, float]]:
        assert self.collector is not None  # on-policy training always has local envs
        stats = self.collector.collect_rollout(self.storage, self.collection_step_num_episodes)
        signal_metrics: dict[str, float] = {}
        if self.reward_signals is not None and not self.reward_signals.is_identity:
            signal_metrics = self.reward_signals.process_rollout(
                self.storage,
                self.storage.next_obs,
                batch_size=self.batch_size or self.storage.num_steps * self.storage.num_envs,
                num_epochs=self.update_step_num_repetitions or 1,
            )
        batch_size = self.batch_size
        if self.whole_rollout and batch_size is not None:
            batch_size = self.storage.num_steps * self.storage.num_envs
        with self.update_precision():
            metrics = self.learner.update(
                self.storage,
                batch_size=batch_size,
                num_repetitions=self.update_step_num_repetitions,
            )
        cloning = self._clone_demonstrations(self.counters.env_step + stats.env_steps)
        return stats, {**metrics, **signal_metrics, **cloning}


class OffPolicyTrainer(MLAgentsOffPolicyAPI, Trainer):
    """Training steps of a few env steps into a replay buffer, then gradient steps.

    Each training step collects ``collection_step_num_env_steps`` env steps (rounded up to
    whole vector steps), or with ``collection_step_num_episodes`` as many vector steps as it
    takes for that many episodes to end (random actions until ``learning_starts``), then, once
    ``learning_starts`` env steps are collected, calls
    ``algo.update(buffer, batch_size=..., num_gradient_steps=...)`` with as many gradient
    steps as the update-to-data ratio owes; a fractional ratio carries its remainder to the
    next training step, so the ratio holds exactly over the run.

    Extra arguments (Tianshou names; each defaults to the algorithm's own setting):
        collection_step_num_env_steps: env steps per collection step (``train_freq``).
        collection_step_num_episodes: instead, collect until this many episodes have ended
            (at least one vector step; the number of env steps varies, and the gradient
            steps follow it).
        batch_size: minibatch size of each gradient step.
        update_step_num_gradient_steps_per_sample: gradient steps per collected env step
            (``gradient_steps / train_freq``).
        buffer: a replay buffer to use (e.g. one filled by :meth:`ReplayBuffer.load`);
            default: a new one of the algorithm's ``buffer_size``, keeping action masks
            when the env gives them (a given buffer needs the matching ``mask_size``).
        behavioral_cloning: clone demonstrations into the policy after each training step
            that took gradient steps
            (:class:`~rlfleet.train.behavioral_cloning.BehavioralCloning`).

    ML-Agents' trainer methods, ``save_replay_buffer`` and ``load_replay_buffer`` among them,
    drive the same loop: see :class:`~rlfleet.train.mlagents_api.MLAgentsOffPolicyAPI`.
    """

    def __init__(
        self,
        algorithm: Algorithm[Any],
        train_envs: VectorEnv[Any, Any, Any],
        test_envs: VectorEnv[Any, Any, Any] | None,
        config: TrainerConfig | None = None,
        *,
        collection_step_num_env_steps: int | None = None,
        collection_step_num_episodes: int | None = None,
        batch_size: int | None = None,
        update_step_num_gradient_steps_per_sample: float | None = None,
        buffer: ReplayBuffer | None = None,
        behavioral_cloning: BehavioralCloning | None = None,
        **kwargs: Any,
    ) -> None:
        self.learner = require_kind(
            algorithm, "off_policy", "OffPolicyTrainer needs an off-policy algorithm"
        )
        self.behavioral_cloning = behavioral_cloning
        """``algorithm`` as its kind's contract: what the update step calls."""
        hp = self.learner.config
        num_envs = train_envs.num_envs
        check_collection_step(collection_step_num_env_steps, collection_step_num_episodes)
        self.collection_step_num_episodes = collection_step_num_episodes
        steps = collection_step_num_env_steps or hp.train_freq
        # Whole vector steps: every env steps together, so round up to a multiple of num_envs.
        self.collection_num_vector_steps = max(math.ceil(steps / num_envs), 1)
        self.collection_step_num_env_steps = self.collection_num_vector_steps * num_envs
        self.update_step_num_gradient_steps_per_sample = (
            update_step_num_gradient_steps_per_sample
            if update_step_num_gradient_steps_per_sample is not None
            else hp.gradient_steps / hp.train_freq
        )
        if self.update_step_num_gradient_steps_per_sample < 0:
            raise ConfigError(
                "update_step_num_gradient_steps_per_sample must be >= 0, got "
                f"{self.update_step_num_gradient_steps_per_sample}"
            )
        self.batch_size = batch_size or hp.batch_size
        self.learning_starts = hp.learning_starts
        self._given_buffer = buffer
        self.buffer: ReplayBuffer
        """The replay buffer (built once the envs are reset: its masks follow theirs)."""
        self.owed_gradient_steps = 0.0
        """Fractional gradient steps carried to the next training step."""
        self.collection_thread: ThreadedCollection | None = None
        """With ``threaded``: the thread that collects (built at the first training step)."""
        self._requested_until = 0
        """With ``threaded``: the step counter once every collection step asked for is in."""
        super().__init__(algorithm, train_envs, test_envs, config, **kwargs)
        self.signal_replay: SignalReplay | None = None
        """What the algorithm samples instead of the buffer when reward signals are on."""
        if self.reward_signals is not None and not self.reward_signals.is_identity:
            if hp.n_step != 1:
                raise ConfigError(
                    f"{algorithm.name}: reward signals relabel one transition at a time and "
                    f"need n_step = 1, got n_step = {hp.n_step}"
                )
            self.signal_replay = SignalReplay(
                self.buffer, self.reward_signals, algorithm.preprocess
            )

    def _build_storage(self) -> None:
        assert self.collector is not None  # off-policy training always has local envs
        algorithm = self.algorithm
        mask_size = self.collector.mask_size()
        buffer = self._given_buffer
        if buffer is None:
            buffer = ReplayBuffer(
                self.learner.config.buffer_size,
                algorithm.observation_space,
                algorithm.action_space,
                self.collector.num_envs,
                sampler=self.learner.replay_sampler(),
                mask_size=mask_size,
            )
        else:
            self.collector.check_buffer_masks(buffer)
        if self.batch_size > buffer.capacity:
            raise ConfigError(
                f"batch_size ({self.batch_size}) is larger than the replay buffer "
                f"(buffer_size = {buffer.capacity}); lower batch_size or raise buffer_size"
            )
        self.buffer = buffer

    def _threaded_refusal(self) -> str | None:
        if self.env_parameters is not None:
            return "environment parameters change the envs between training steps"
        if self.collection_step_num_episodes is not None:
            return "collection steps of whole episodes vary in size"
        return None

    def _training_step(self) -> tuple[CollectStats, dict[str, float]]:
        env_step = self.counters.env_step
        if self.collects_on_thread:
            return self._threaded_training_step(env_step)
        assert self.collector is not None  # off-policy training always has local envs
        stats = self.collector.collect_transitions(
            self.buffer,
            self.collection_num_vector_steps,
            random_actions=env_step < self.learning_starts,
            num_episodes=self.collection_step_num_episodes,
        )
        return self._update_step(env_step, stats)

    def _update_step(
        self, env_step: int, stats: CollectStats
    ) -> tuple[CollectStats, dict[str, float]]:
        """The update step after a collection step of ``stats`` that began at ``env_step``."""
        signal_metrics: dict[str, float] = {}
        if self.signal_replay is not None:
            signal_metrics = self.signal_replay.observe_collection()
        # An empty buffer happens only after resuming without a saved one.
        if env_step + stats.env_steps < self.learning_starts or len(self.buffer) == 0:
            return stats, signal_metrics
        self.owed_gradient_steps += self.update_step_num_gradient_steps_per_sample * stats.env_steps
        num_gradient_steps = int(self.owed_gradient_steps)
        if num_gradient_steps == 0:
            return stats, signal_metrics
        self.owed_gradient_steps -= num_gradient_steps
        with self.update_precision():
            metrics = self.learner.update(
                self.buffer if self.signal_replay is None else self.signal_replay,
                batch_size=self.batch_size,
                num_gradient_steps=num_gradient_steps,
            )
        if self.signal_replay is not None:
            signal_metrics.update(self.signal_replay.take_update_metrics())
        cloning = self._clone_demonstrations(env_step + stats.env_steps)
        return stats, {**metrics, **signal_metrics, **cloning}

    # -------------------------------------------------------- threaded collection
    def _threaded_training_step(self, env_step: int) -> tuple[CollectStats, dict[str, float]]:
        """Take the thread's next collection step into the buffer, ask for more (so that
        they are collected during this update step), update, and publish the new weights."""
        thread = self._collection_thread()
        self._request_chunks(thread, at_least_one=True)
        stats = self._absorb(thread.next_chunk())
        self._request_chunks(thread, at_least_one=False)
        result = self._update_step(env_step, stats)
        thread.publish()
        return result

    def _collection_thread(self) -> ThreadedCollection:
        thread = self.collection_thread
        if thread is None:
            assert self.collector is not None  # off-policy training always has local envs
            thread = ThreadedCollection(
                self.collector,
                self.algorithm,
                mask_size=self.buffer.mask_size,
                num_vector_steps=self.collection_num_vector_steps,
                max_lead_chunks=self.threaded_max_lead_chunks,
                sync_interval=self.config.threaded_sync_interval,
            )
            self.collection_thread = thread
        if not thread.started:
            thread.start()
            self._requested_until = self.counters.env_step
        return thread

    @property
    def threaded_max_lead_chunks(self) -> int:
        """``L``: collection steps the thread may collect ahead of the learner (see
        :mod:`rlfleet.train.threaded`)."""
        lead = self.config.threaded_max_lead_steps
        return 1 if lead is None else max(1, lead // self.collection_step_num_env_steps)

    @property
    def threaded_update_lag_bound(self) -> int:
        """The staleness bound of threaded collection in gradient steps: the acting weights
        are never further behind the learner's while they collect."""
        return update_lag_bound(
            self.threaded_max_lead_chunks,
            self.collection_step_num_env_steps,
            self.update_step_num_gradient_steps_per_sample,
            self.config.threaded_sync_interval,
        )

    def _request_chunks(self, thread: ThreadedCollection, *, at_least_one: bool) -> None:
        """Keep ``L`` collection steps asked for, none past the end of the epoch under way
        (so that the thread is idle when it ends) or of ``max_steps``."""
        limit = self._epoch_end_step
        if limit is None:
            limit = self.config.max_steps
        while thread.outstanding < thread.max_lead_chunks and (
            self._requested_until < limit or (at_least_one and thread.outstanding == 0)
        ):
            thread.request(
                progress=self.progress(),
                random_actions=self._requested_until < self.learning_starts,
            )
            self._requested_until += self.collection_step_num_env_steps

    def _absorb(self, chunk: Chunk) -> CollectStats:
        """Write a collection step from the thread into the replay buffer, folding its
        observations into the learner's statistics as collecting them here would."""
        buffer = self.buffer
        algorithm = self.algorithm
        # The random warm-up's observations included, as the collector folds them.
        fold = algorithm.obs_normalizer is not None
        for row in chunk.rows:
            if row is None:
                buffer.mark_stream_break()
                continue
            buffer.add(*row)
            if fold:
                algorithm.preprocess(torch.from_numpy(row[0]), update_stats=True)
        return chunk.stats

    def _pause_collection(self) -> CollectStats:
        thread = self.collection_thread
        if thread is None or not thread.started:
            return CollectStats()
        leftover = CollectStats()
        for chunk in thread.drain():
            stats = self._absorb(chunk)
            # Their gradient steps are owed, and taken by the next update steps.
            self.owed_gradient_steps += self.update_step_num_gradient_steps_per_sample * (
                stats.env_steps
            )
            leftover.env_steps += stats.env_steps
            leftover.episode_returns.extend(stats.episode_returns)
            leftover.episode_lengths.extend(stats.episode_lengths)
        return leftover

    def _stop_collection(self) -> None:
        if self.collection_thread is not None:
            self.collection_thread.stop()

    def _clear_buffers(self) -> None:
        self.buffer.clear()

    def checkpoint_state(self) -> dict[str, Any]:
        # A checkpoint taken between epochs finds the thread idle already; one taken from
        # outside the loop (save_model) waits for it and counts what it collected.
        leftover = self._pause_collection()
        if leftover.env_steps:
            self._count_collection(leftover)
        state = super().checkpoint_state()
        state["owed_gradient_steps"] = self.owed_gradient_steps
        if self.config.save_replay_buffer:
            state["replay_buffer"] = self.buffer.state_dict()
        return state

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        super().load_checkpoint_state(state)
        self.owed_gradient_steps = float(state.get("owed_gradient_steps", 0.0))
        if "replay_buffer" in state:
            self.buffer.load_state_dict(state["replay_buffer"])


class OfflineTrainer(Trainer):
    """Training steps of gradient steps on minibatches of a fixed dataset; no env is stepped.

    Test steps run in the real env (``test_envs``) as in every trainer; hooks, stop rules,
    history and checkpoints are the same. Before training, the whole dataset passes once
    through ``algorithm.preprocess(update_stats=True)``, so observation normalisers hold the
    dataset's statistics. The step counter counts gradient steps (see
    "offline step counting" in the module docstring). The dataset's statistics are logged,
    and the untrained policy is tested, when a run starts from scratch.

    Extra arguments:
        dataset: the transitions to learn from; its spaces must equal the algorithm's.
        batch_size: minibatch size (the algorithm's ``batch_size`` unless given).
        update_step_num_gradient_steps: gradient steps per training step (default 10: few
            enough for fine-grained stop rules, enough to amortise per-step bookkeeping).
    """

    step_unit = GRADIENT_STEPS
    test_before_training = True

    def __init__(
        self,
        algorithm: Algorithm[Any],
        dataset: OfflineDataset,
        test_envs: VectorEnv[Any, Any, Any] | None,
        config: TrainerConfig | None = None,
        *,
        batch_size: int | None = None,
        update_step_num_gradient_steps: int = 10,
        **kwargs: Any,
    ) -> None:
        self.learner = require_kind(
            algorithm, "offline", "OfflineTrainer needs an offline algorithm"
        )
        """``algorithm`` as its kind's contract: what the update step calls."""
        if update_step_num_gradient_steps < 1:
            raise ConfigError(
                f"update_step_num_gradient_steps must be >= 1, got {update_step_num_gradient_steps}"
            )
        dataset.check_spaces(
            algorithm.observation_space, algorithm.action_space, f"{algorithm.name}'s env"
        )
        self.batch_size = batch_size or self.learner.config.batch_size
        self.update_step_num_gradient_steps = update_step_num_gradient_steps
        self.dataset = dataset
        self.buffer = dataset.to_replay_buffer(seed=algorithm.seed)
        # Algorithms that normalise observations take their statistics from the whole dataset
        # (a resumed run restores them from the checkpoint instead).
        algorithm.preprocess(torch.as_tensor(dataset.observations), update_stats=True)
        self._dataset_logged = False
        super().__init__(algorithm, None, test_envs, config, **kwargs)

    def _threaded_refusal(self) -> str | None:
        return "offline training steps no env"

    def _reset(self, reset_collectors: bool, reset_collector_buffers: bool) -> None:
        if self.counters.env_step == 0 and not self._dataset_logged:
            self._dataset_logged = True
            stats = self.dataset.stats()
            self._write_row(stats.as_metrics(), None)
            ProgressReporter(None, show_progress=False, verbose=self.config.verbose).message(
                stats.describe()
            )
        super()._reset(reset_collectors, reset_collector_buffers)

    def _training_step(self) -> tuple[CollectStats, dict[str, float]]:
        with self.update_precision():
            metrics = self.learner.update(
                self.buffer,
                batch_size=self.batch_size,
                num_gradient_steps=self.update_step_num_gradient_steps,
            )
        # Offline progress is counted in gradient steps; no env step is taken.
        return CollectStats(env_steps=self.update_step_num_gradient_steps), metrics

    def checkpoint_state(self) -> dict[str, Any]:
        state = super().checkpoint_state()
        state["dataset_sampler"] = self.buffer.sampler.state_dict()
        return state

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        super().load_checkpoint_state(state)
        if "dataset_sampler" in state:
            self.buffer.sampler.load_state_dict(state["dataset_sampler"])
