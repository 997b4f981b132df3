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
    A unit of progress of ``epoch_num_steps`` environment steps, ended by a test step,
    an epoch summary line, a history flush and a checkpoint (every epoch, or the epoch that
    completes each ``checkpoint_interval_steps``, and the last).
training step
    One ``train_fn`` call, one collection step, one update step, and logging. An epoch
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
test step
    ``test_fn``, then ``test_step_num_episodes`` episodes of the greedy policy on the test
    envs, a score by ``compute_score_fn`` (multi-agent: of the returns per agent, e.g. by
    ``reward_metric``), ``save_best_fn`` when the score is a new best,
    and the stop rules. ``test_in_training`` also runs a test step as soon as the training
    episodes' mean return satisfies ``stop_fn``, so a solved task stops without waiting for
    the end of the epoch. Offline runs, which have no training episodes to plot, also run
    a test step before the first training step (as Tianshou's trainer does), so that their
    learning curve starts at the untrained policy's score; it never stops the run.

Hooks, each optional:

``train_fn(epoch: int, env_step: int) -> None``
    Called before every training step (e.g. to change exploration).
``test_fn(epoch: int, env_step: int) -> None``
    Called before every test step.
``stop_fn(score: float) -> bool``
    True to stop training; default: ``score >= target_reward`` when a target is set.
    Called with each test score and, with ``test_in_training``, with the mean return of
    the last 20 training episodes (a true answer there triggers a test step).
``compute_score_fn(stats: EvalStats) -> float``
    Turns test episodes into the score that ranks checkpoints; default: mean return.
``save_best_fn(policy) -> None``
    Called when a test score is a new best with what the loop trains (:data:`SaveBestFn`: an
    ``Algorithm``, or multi-agent ``Agents``); default: save it to ``run_dir/best``.
``save_checkpoint_fn(epoch: int, env_step: int, gradient_step: int) -> str | None``
    Called at the end of every epoch (of the epoch that completes each
    ``checkpoint_interval_steps`` when set, and of the last); default: an atomic checkpoint in
    ``run_dir/checkpoints`` (returns its path).
``test_result_fn(epoch: int, env_step: int, score: float) -> None``
    Called after every test step with its score (e.g. to report intermediate values to a
    hyperparameter search). An exception it raises (such as ``optuna.TrialPruned``) ends
    training and propagates out of :meth:`Trainer.run`; the history logged so far is
    flushed and the latest checkpoint stays the last completed epoch's.

Reward signals and environment parameters, each optional:

``reward_signals`` (:class:`rlfleet.rewards.RewardSignals`)
    On-policy: after each collection step the rollout's rewards are replaced by the
    strength-weighted sum of the signals' rewards, and the signals learn from the rollout.
    Off-policy: the buffer keeps the env's rewards; every minibatch the algorithm samples
    gets the signals' combined rewards, and the signals learn from that minibatch
    (:mod:`rlfleet.rewards.replay`).
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
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

import numpy as np
import torch
from gymnasium.vector import VectorEnv

from rlfleet.algos.base import Algorithm
from rlfleet.algos.kinds import require_kind
from rlfleet.checkpoint import CheckpointManager
from rlfleet.collect.collector import Collector
from rlfleet.collect.evaluator import Evaluator
from rlfleet.config.fields import NonNegativeInt, PositiveInt
from rlfleet.data.dataset import OfflineDataset
from rlfleet.data.replay import ReplayBuffer
from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs.curriculum import EnvParameterManager
from rlfleet.envs.spaces import space_to_json
from rlfleet.errors import ConfigError
from rlfleet.logging.history import ENV_STEPS, GRADIENT_STEPS, History
from rlfleet.logging.plots import plot_learning_curve
from rlfleet.logging.progress import ProgressReporter
from rlfleet.logging.tensorboard import TensorBoardWriter
from rlfleet.nn.optim import NanPolicy
from rlfleet.rewards.replay import SignalReplay
from rlfleet.rewards.signals import RewardSignals
from rlfleet.train.threads import DEFAULT_TORCH_THREADS, torch_threads
from rlfleet.types import CollectStats, EvalStats
from rlfleet.version import __version__


class Policy(Protocol):
    """What a training loop trains: one :class:`~rlfleet.algos.base.Algorithm`
    (:class:`Trainer`), or the agents of a multi-agent game
    (:class:`rlfleet.marl.agents.Agents`, :class:`rlfleet.marl.trainer.DecentralizedTrainer`).
    ``save_best_fn`` receives it; a checkpoint saves its :meth:`state_dict`."""

    @property
    def name(self) -> str:
        """What it is, as checkpoints and the progress bar name it (``ppo``)."""

    @property
    def gradient_steps(self) -> int:
        """Gradient steps taken so far."""

    @property
    def skipped_batches(self) -> int:
        """Optimiser steps skipped under ``nan_policy: skip_batch``."""

    lr_scale: float
    """Multiplier on the scheduled learning rate (reduce-on-plateau lowers it)."""
    nan_policy: NanPolicy
    """What a non-finite loss or gradient does (set from ``TrainerConfig.nan_policy``)."""

    def set_progress(self, progress: float) -> None:
        """The fraction of the training budget used, for schedules."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training it."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""


class Envs(Protocol):
    """Training or test envs: a Gymnasium vector env, or multi-agent env copies."""

    def close(self) -> None:
        """Release the envs."""


class TrainingCollector(Protocol):
    """What the loop needs of the collector that steps the training envs."""

    @property
    def env_restarts(self) -> int:
        """Restarts of failed env workers so far."""

    def reset_envs(self) -> None:
        """Start new episodes in every training env (an env parameter changed)."""

    def state_dict(self) -> dict[str, Any]:
        """Where collection stands, for checkpoints."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""


class TestEpisodes(Protocol):
    """What the test step needs: greedy test episodes on the test envs."""

    def run(self, num_episodes: int) -> EvalStats:
        """Play ``num_episodes`` greedy test episodes."""

    def state_dict(self) -> dict[str, Any]:
        """What makes the next test episodes repeatable, for checkpoints."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""


P = TypeVar("P", bound=Policy)
"""What a training loop trains (see :class:`Policy`)."""
E = TypeVar("E", bound=Envs)
"""The kind of envs a training loop steps (see :class:`Envs`)."""

TrainFn = Callable[[int, int], None]
TestFn = Callable[[int, int], None]
StopFn = Callable[[float], bool]
ComputeScoreFn = Callable[[EvalStats], float]
SaveBestFn = Callable[[P], None]
"""``save_best_fn(policy)``: ``SaveBestFn[Algorithm]`` for :class:`Trainer`,
``SaveBestFn[Agents]`` for the multi-agent trainer."""
SaveCheckpointFn = Callable[[int, int, int], "str | None"]
TestResultFn = Callable[[int, int, float], None]


@dataclass
class TrainerConfig:
    """Loop settings shared by every trainer (the ``trainer:`` section of a run config)."""

    max_steps: PositiveInt = 100_000
    """Budget of environment steps (offline: gradient steps); schedules run from 0 to this."""
    max_epochs: PositiveInt | None = None
    """Stop after this many epochs (unlimited when unset)."""
    max_episodes: PositiveInt | None = None
    """Stop after this many training episodes (unlimited when unset). With both budgets,
    the one used up first ends the run and drives the schedules. A multi-agent collection
    step plays no more episodes than this budget has left."""
    epoch_num_steps: PositiveInt = 10_000
    """Environment steps (offline: gradient steps) per epoch; one test step per epoch, and
    one checkpoint unless ``checkpoint_interval_steps`` spaces them out."""
    test_step_num_episodes: PositiveInt = 20
    """Test episodes per test step."""
    test_in_training: bool = True
    """Run a test step as soon as training returns satisfy the stop rule."""
    target_reward: float | None = None
    """Stop once the test score reaches this."""
    plateau_reduce_factor: float = 0.5
    """Learning-rate multiplier applied on a plateau (with ``plateau_reduce_patience``)."""
    plateau_reduce_patience: PositiveInt | None = None
    """Test steps without a new best before the learning rate is reduced (off when unset)."""
    early_stop_patience: PositiveInt | None = None
    """Test steps without a new best before training stops (off when unset)."""
    log_interval_steps: PositiveInt = 2048
    """Environment steps between history rows of training metrics."""
    checkpoint_interval_steps: PositiveInt | None = None
    """Environment steps between checkpoints, rounded up to whole epochs (unset: every
    epoch). The last epoch always ends with one."""
    keep_checkpoints: NonNegativeInt = 3
    """Checkpoints kept in ``checkpoints/`` (0 keeps all)."""
    show_progress: bool = True
    """Show a progress bar when the output is a terminal."""
    verbose: bool = True
    """Print one summary line per epoch (false: print nothing)."""
    tensorboard: bool = False
    """Also write TensorBoard event files to ``run_dir/tensorboard``."""
    nan_policy: Literal["raise", "skip_batch"] = "raise"
    """A NaN/inf loss or gradient in any optimiser step (the algorithm's or a reward
    signal's): stop with NonFiniteError, or skip that batch, count it in
    ``train/skipped_batches`` and go on. Weights never take a non-finite step."""
    save_replay_buffer: bool = True
    """Off-policy: include the replay buffer in checkpoints, so resuming keeps its data."""


@dataclass(frozen=True)
class TrainResult:
    """What :meth:`Trainer.run` returns."""

    best_score: float
    best_env_step: int
    env_steps: int
    gradient_steps: int
    episodes: int
    epochs: int
    wall_time_s: float
    """Wall time of the whole run, test steps included."""
    test_time_s: float
    """Part of ``wall_time_s`` spent in test steps."""
    stop_reason: str
    run_dir: Path | None
    step_unit: str = ENV_STEPS
    """What ``env_steps`` and ``best_env_step`` count: env steps, or for an offline run
    (which takes none) ``"gradient steps"``."""


@dataclass
class _Counters:
    epoch: int = 0
    env_step: int = 0
    episode: int = 0
    best_score: float = -math.inf
    best_env_step: int = 0
    tests_since_best: int = 0
    tests_since_reduce: int = 0
    wall_time_s: float = 0.0
    test_time_s: float = 0.0
    env_restarts: int = 0


class TrainingLoop(Generic[P, E]):
    """The training loop shared by every trainer; subclasses define one training step.

    Generic over what it trains (``P``, see :class:`Policy`) and the envs it steps (``E``):
    :class:`Trainer` trains one algorithm on Gymnasium vector envs,
    :class:`rlfleet.marl.trainer.DecentralizedTrainer` the agents of a PettingZoo game.
    Subclasses build the collector of the training envs and the test episodes' runner
    (:meth:`_make_collector`, :meth:`_make_test_episodes`) and say what a checkpoint records
    of the policy (:meth:`policy_metadata`).

    Args:
        algorithm: what to train: an algorithm, or several agents.
        train_envs / test_envs: the envs. ``train_envs`` is None when remote workers step
            their own envs (:class:`rlfleet.distributed.DistributedTrainer`).
        config: loop settings (see :class:`TrainerConfig`).
        run_dir: where history, checkpoints, ``best/`` and plots go (none: nothing written);
            a ``str`` or a ``Path``.
        run_metadata: JSON-able description of the run stored in every checkpoint.
        seed: seeds the first reset of the train and test envs.
        torch_threads: CPU threads torch uses while :meth:`run` trains (None: the caller's
            setting); the caller's count is restored when :meth:`run` returns. The default is
            :data:`rlfleet.train.threads.DEFAULT_TORCH_THREADS`, as for a run config.
        reward_signals / env_parameters: see the module docstring.
        The hooks are documented in the module docstring.
    """

    collector: TrainingCollector | None
    """Steps ``train_envs``; None when the trainer has none (distributed rollout actors)."""
    evaluator: TestEpisodes
    """Runs the test episodes of every test step on ``test_envs``."""
    step_unit: ClassVar[str] = ENV_STEPS
    """What the step counter counts (history, progress bar, :class:`TrainResult`)."""
    test_before_training: ClassVar[bool] = False
    """Run a test step at step 0 of a fresh run, to start the learning curve (offline)."""

    def __init__(
        self,
        algorithm: P,
        train_envs: E | None,
        test_envs: E,
        config: TrainerConfig | None = None,
        *,
        run_dir: str | Path | None = None,
        run_metadata: dict[str, Any] | None = None,
        seed: int | None = None,
        torch_threads: int | None = DEFAULT_TORCH_THREADS,
        train_fn: TrainFn | None = None,
        test_fn: TestFn | None = None,
        stop_fn: StopFn | None = None,
        compute_score_fn: ComputeScoreFn | None = None,
        save_best_fn: SaveBestFn[P] | None = None,
        save_checkpoint_fn: SaveCheckpointFn | None = None,
        test_result_fn: TestResultFn | None = None,
        resume_from_log: bool = False,
        reward_signals: RewardSignals | None = None,
        env_parameters: EnvParameterManager | None = None,
    ) -> None:
        self.algorithm = algorithm
        self.reward_signals = reward_signals
        self.env_parameters = env_parameters
        # Every learner of the run follows the trainer's nan_policy.
        algorithm.nan_policy = (config or TrainerConfig()).nan_policy
        if reward_signals is not None:
            reward_signals.set_nan_policy(algorithm.nan_policy)
        self.train_envs = train_envs
        self.test_envs = test_envs
        self.config = config or TrainerConfig()
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.run_metadata = run_metadata or {}
        self.seed = seed
        self.torch_threads = torch_threads
        self.train_fn = train_fn
        self.test_fn = test_fn
        target = self.config.target_reward
        self.stop_fn = stop_fn or (None if target is None else (lambda score: score >= target))
        self.compute_score_fn = compute_score_fn or (lambda stats: stats.mean)
        self.save_best_fn = save_best_fn or self._save_best
        self.save_checkpoint_fn = save_checkpoint_fn or self._save_checkpoint
        self.test_result_fn = test_result_fn
        self.counters = _Counters()
        self._last_test_step = -1
        self._last_test_return: float | None = None
        self.recent_returns: deque[float] = deque(maxlen=20)
        self._seen_env_restarts = 0
        # None when the training envs live elsewhere (rollout actors of a distributed run).
        self.collector = self._make_collector(train_envs, seed) if train_envs is not None else None
        # Test episodes are seeded apart from training ones: a fresh seed per test step.
        self.evaluator = self._make_test_episodes(
            test_envs, None if seed is None else seed + 10_000
        )
        self.checkpoints = (
            CheckpointManager(
                self.run_dir / "checkpoints", keep=self.config.keep_checkpoints or None
            )
            if self.run_dir
            else None
        )
        self.history = (
            History(self.run_dir / "history.parquet", step_unit=self.step_unit)
            if self.run_dir
            else None
        )
        self._build_storage()
        if resume_from_log:
            self.resume()

    def _build_storage(self) -> None:
        """Allocate what training steps collect into, for subclasses whose storage follows
        what the training envs give (action masks): runs once the envs are reset, before a
        resume restores the storage."""

    @property
    def test_seconds(self) -> float:
        """Wall time spent in test steps so far (benchmarks subtract it from training time)."""
        return self.counters.test_time_s

    # ------------------------------------------------------------- subclasses
    def _make_collector(self, train_envs: E, seed: int | None) -> TrainingCollector:
        """The collector that steps ``train_envs`` (first reset seeded with ``seed``)."""
        raise NotImplementedError

    def _make_test_episodes(self, test_envs: E, seed: int | None) -> TestEpisodes:
        """What plays the test episodes on ``test_envs`` (seeded from ``seed``)."""
        raise NotImplementedError

    def policy_metadata(self) -> dict[str, Any]:
        """What checkpoints record about the policy besides its state (spaces, config), so
        that it can be rebuilt to load them."""
        raise NotImplementedError

    def _training_step(self) -> tuple[CollectStats, dict[str, float]]:
        """One collection step and one update step."""
        raise NotImplementedError

    def _test_metrics(self, stats: EvalStats) -> dict[str, float]:
        """History columns a test step adds to the common ones (none by default)."""
        return {}

    def progress(self) -> float:
        """Fraction of the training budget used: of ``max_steps`` or, when set,
        ``max_episodes``, whichever is further along. Drives the algorithm's schedules."""
        cfg = self.config
        c = self.counters
        used = c.env_step / cfg.max_steps
        if cfg.max_episodes is not None:
            used = max(used, c.episode / cfg.max_episodes)
        return used

    # ------------------------------------------------------------------- loop
    def run(self) -> TrainResult:
        """Train until a stop rule fires; returns a :class:`TrainResult`.

        Torch uses ``torch_threads`` CPU threads meanwhile (see :class:`Trainer`)."""
        with torch_threads(self.torch_threads):
            return self._train_loop()

    def _train_loop(self) -> TrainResult:
        cfg = self.config
        c = self.counters
        reporter = ProgressReporter(
            cfg.max_steps,
            show_progress=cfg.show_progress,
            verbose=cfg.verbose,
            description=f"{self.algorithm.name}",
            unit=self.step_unit,
        )
        tensorboard = self._tensorboard()
        start_time = time.perf_counter() - c.wall_time_s
        start_step = c.env_step
        log_acc: dict[str, list[float]] = {}
        last_log_step = c.env_step
        last_checkpoint_step = c.env_step
        stop_reason = ""
        reporter.start(c.env_step)
        if self.history is not None:
            # A resumed run is running again: its old stop reason no longer holds.
            self.history.stop_reason = None
        # Subnormal floats (Adam's second moments of tiny gradients, for one) take a slow
        # path on x86 CPUs: measured 5-7x slower fused Adam steps. Flushing them to zero does
        # not change learning; it is switched back off when the run ends.
        torch.set_flush_denormal(True)
        try:
            if self.test_before_training and c.env_step == 0:
                self._test_step(reporter, tensorboard)
            while not stop_reason:
                c.epoch += 1
                epoch_start = c.env_step
                while (
                    c.env_step - epoch_start < cfg.epoch_num_steps
                    and c.env_step < cfg.max_steps
                    and (cfg.max_episodes is None or c.episode < cfg.max_episodes)
                ):
                    if self.train_fn is not None:
                        self.train_fn(c.epoch, c.env_step)
                    self.algorithm.set_progress(self.progress())
                    stats, metrics = self._training_step()
                    c.env_step += stats.env_steps
                    c.episode += stats.episodes
                    if self.env_parameters is not None:
                        change = self.env_parameters.observe(stats.episode_returns, self.progress())
                        if change.require_reset and self.collector is not None:
                            self.collector.reset_envs()
                    self.recent_returns.extend(stats.episode_returns)
                    for key, value in metrics.items():
                        log_acc.setdefault(key, []).append(value)
                    for r in stats.episode_returns:
                        log_acc.setdefault("train/return", []).append(r)
                    for n in stats.episode_lengths:
                        log_acc.setdefault("train/episode_length", []).append(float(n))
                    restarts = self.collector.env_restarts if self.collector else 0
                    if restarts != self._seen_env_restarts:
                        c.env_restarts += restarts - self._seen_env_restarts
                        self._seen_env_restarts = restarts
                        log_acc["train/env_restarts"] = [float(c.env_restarts)]
                    if c.env_step - last_log_step >= cfg.log_interval_steps:
                        self._log_training(log_acc, start_time, start_step, tensorboard)
                        log_acc = {}
                        last_log_step = c.env_step
                    reporter.update(
                        c.env_step,
                        mean_return=self._recent_mean(),
                        best_return=self._best_or_none(),
                        extra=self.env_parameters.describe() if self.env_parameters else None,
                    )
                    if self._training_looks_solved() and self._test_step(reporter, tensorboard):
                        stop_reason = "stop_fn (test in training)"
                        break
                if log_acc:
                    self._log_training(log_acc, start_time, start_step, tensorboard)
                    log_acc = {}
                    last_log_step = c.env_step
                # Every epoch ends with a test step, unless one just ran at this very step.
                if (
                    not stop_reason
                    and self._last_test_step != c.env_step
                    and self._test_step(reporter, tensorboard)
                ):
                    stop_reason = "stop_fn"
                stop_reason = stop_reason or self._stop_rules()
                c.wall_time_s = time.perf_counter() - start_time
                interval = cfg.checkpoint_interval_steps
                if stop_reason or interval is None or c.env_step - last_checkpoint_step >= interval:
                    self.save_checkpoint_fn(c.epoch, c.env_step, self.algorithm.gradient_steps)
                    last_checkpoint_step = c.env_step
                if self.history is not None:
                    # Recorded so that `rlfleet plot` can tell a run that solved its task
                    # from one that was cut short.
                    self.history.stop_reason = stop_reason or None
                    self.history.flush()
                reporter.epoch_summary(
                    c.epoch, c.env_step, self._epoch_metrics(start_time, start_step)
                )
        except BaseException:
            # A failed or pruned run keeps the rows it logged; rows past the latest
            # checkpoint are dropped again if the run is resumed.
            if self.history is not None:
                self.history.flush()
            raise
        finally:
            torch.set_flush_denormal(False)
            reporter.close()
            if tensorboard is not None:
                tensorboard.close()
        c.wall_time_s = time.perf_counter() - start_time
        if self.run_dir is not None and self.history is not None and self.history.rows:
            plot_learning_curve(
                self.run_dir / "history.parquet",
                self.run_dir / "plots" / "learning_curve.png",
                title=f"{self.algorithm.name} on {self.run_metadata.get('env_id', 'env')}",
            )
        return TrainResult(
            best_score=c.best_score,
            best_env_step=c.best_env_step,
            env_steps=c.env_step,
            gradient_steps=self.algorithm.gradient_steps,
            episodes=c.episode,
            epochs=c.epoch,
            wall_time_s=c.wall_time_s,
            test_time_s=c.test_time_s,
            stop_reason=stop_reason,
            run_dir=self.run_dir,
            step_unit=self.step_unit,
        )

    def _training_looks_solved(self) -> bool:
        """``test_in_training``: do the last 20 training episodes satisfy ``stop_fn``?"""
        recent = self._recent_mean()
        return (
            self.config.test_in_training
            and self.stop_fn is not None
            and recent is not None
            and len(self.recent_returns) == self.recent_returns.maxlen
            and self._last_test_step != self.counters.env_step
            and bool(self.stop_fn(recent))
        )

    def _stop_rules(self) -> str:
        cfg = self.config
        c = self.counters
        if c.env_step >= cfg.max_steps:
            return "max_steps"
        if cfg.max_episodes is not None and c.episode >= cfg.max_episodes:
            return "max_episodes"
        if cfg.max_epochs is not None and c.epoch >= cfg.max_epochs:
            return "max_epochs"
        if cfg.early_stop_patience is not None and c.tests_since_best >= cfg.early_stop_patience:
            return "early_stop_patience"
        if (
            cfg.plateau_reduce_patience is not None
            and c.tests_since_reduce >= cfg.plateau_reduce_patience
        ):
            self.algorithm.lr_scale *= cfg.plateau_reduce_factor
            c.tests_since_reduce = 0
        return ""

    def _test_step(self, reporter: ProgressReporter, tensorboard: Any) -> bool:
        """Run test episodes; returns True when ``stop_fn`` says the score is good enough."""
        c = self.counters
        self._last_test_step = c.env_step
        if self.test_fn is not None:
            self.test_fn(c.epoch, c.env_step)
        t0 = time.perf_counter()
        stats = self.evaluator.run(self.config.test_step_num_episodes)
        score = float(self.compute_score_fn(stats))
        if score > c.best_score:
            c.best_score = score
            c.best_env_step = c.env_step
            c.tests_since_best = 0
            c.tests_since_reduce = 0
            self.save_best_fn(self.algorithm)
        else:
            c.tests_since_best += 1
            c.tests_since_reduce += 1
        test_s = time.perf_counter() - t0
        c.test_time_s += test_s
        row = {
            "test/return_mean": stats.mean,
            "test/return_std": stats.std,
            "test/episode_length": float(np.mean(stats.lengths)),
            "test/score": score,
            "test/best_score": c.best_score,
            "time/test_s": test_s,
            **self._test_metrics(stats),
        }
        self._last_test_return = stats.mean
        self._write_row(row, tensorboard)
        reporter.update(c.env_step, mean_return=self._recent_mean(), best_return=c.best_score)
        if self.test_result_fn is not None:
            self.test_result_fn(c.epoch, c.env_step, score)
        return self.stop_fn is not None and bool(self.stop_fn(score))

    # ---------------------------------------------------------------- logging
    def _recent_mean(self) -> float | None:
        return float(np.mean(self.recent_returns)) if self.recent_returns else None

    def _best_or_none(self) -> float | None:
        return None if self.counters.best_score == -math.inf else self.counters.best_score

    def _log_training(
        self, acc: dict[str, list[float]], start_time: float, start_step: int, tensorboard: Any
    ) -> None:
        row: dict[str, float | int | None] = {}
        for key, values in acc.items():
            if key == "train/return":
                row["train/return_mean"] = float(np.mean(values))
                row["train/return_max"] = float(np.max(values))
            else:
                row[key] = float(np.mean(values))
        skipped = self.algorithm.skipped_batches
        if self.reward_signals is not None:
            skipped += self.reward_signals.skipped_batches
        if skipped:
            row["train/skipped_batches"] = skipped
        if self.env_parameters is not None:
            row.update(self.env_parameters.metrics())
        elapsed = time.perf_counter() - start_time
        row["time/elapsed_s"] = elapsed
        row["time/steps_per_s"] = (self.counters.env_step - start_step) / max(elapsed, 1e-9)
        self._write_row(row, tensorboard)

    def _write_row(self, metrics: Mapping[str, float | int | None], tensorboard: Any) -> None:
        c = self.counters
        row: dict[str, float | int | None] = {
            "env_step": c.env_step,
            "epoch": c.epoch,
            "gradient_step": self.algorithm.gradient_steps,
            "episode": c.episode,
            **metrics,
        }
        if self.history is not None:
            self.history.append(row)
        if tensorboard is not None:
            tensorboard.write(metrics, c.env_step)

    def _epoch_metrics(self, start_time: float, start_step: int) -> dict[str, float]:
        out: dict[str, float] = {}
        recent = self._recent_mean()
        if recent is not None:
            out["train/return_mean"] = recent
        if self._last_test_return is not None:
            out["test/return_mean"] = self._last_test_return
        if self._best_or_none() is not None:
            out["test/best_score"] = self.counters.best_score
        elapsed = time.perf_counter() - start_time
        out["time/steps_per_s"] = (self.counters.env_step - start_step) / max(elapsed, 1e-9)
        return out

    def _tensorboard(self) -> Any:
        if not self.config.tensorboard or self.run_dir is None:
            return None
        return TensorBoardWriter(self.run_dir / "tensorboard")

    # ------------------------------------------------------------ persistence
    def checkpoint_state(self) -> dict[str, Any]:
        """Everything the trainer and algorithm need to continue this run."""
        state = {
            "algorithm": self.algorithm.state_dict(),
            **self.loop_state(),
            "collector": self.collector.state_dict() if self.collector else None,
        }
        if self.reward_signals is not None:
            state["reward_signals"] = self.reward_signals.state_dict()
        if self.env_parameters is not None:
            state["env_parameters"] = self.env_parameters.state_dict()
        return state

    def loop_state(self) -> dict[str, Any]:
        """The loop's own part of a checkpoint: counters, recent training returns, and where
        the test episodes' seeds stand."""
        return {
            "trainer": asdict(self.counters),
            "recent_returns": list(self.recent_returns),
            "evaluator": self.evaluator.state_dict(),
        }

    def load_loop_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`loop_state` output; history rows after the checkpoint are dropped."""
        self.counters = _Counters(**state["trainer"])
        self.recent_returns.extend(state["recent_returns"])
        self.evaluator.load_state_dict(state["evaluator"])
        if self.history is not None:
            self.history.truncate_after(self.counters.env_step)

    def checkpoint_metadata(self) -> dict[str, Any]:
        c = self.counters
        return {
            "rlfleet_version": __version__,
            "algorithm": self.algorithm.name,
            **self.policy_metadata(),
            "run": self.run_metadata,
            "counters": {
                "epoch": c.epoch,
                "env_step": c.env_step,
                "episode": c.episode,
                "gradient_step": self.algorithm.gradient_steps,
            },
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }

    def _save_checkpoint(self, epoch: int, env_step: int, gradient_step: int) -> str | None:
        if self.checkpoints is None:
            return None
        return str(
            self.checkpoints.save(
                self.checkpoint_state(), self.checkpoint_metadata(), step=env_step
            )
        )

    def _save_best(self, algorithm: P) -> None:
        if self.run_dir is None:
            return
        CheckpointManager(self.run_dir / "best", keep=1).save(
            {"algorithm": algorithm.state_dict()},
            self.checkpoint_metadata(),
            step=self.counters.env_step,
        )

    def close(self) -> None:
        """Release what the trainer holds: its envs (subclasses add remote workers)."""
        if self.train_envs is not None:
            self.train_envs.close()
        self.test_envs.close()

    def resume(self) -> dict[str, Any]:
        """Continue from the latest checkpoint in ``run_dir``: counters, algorithm state,
        optimiser, RNG, and the history (rows after the checkpoint are dropped).

        Returns the checkpoint's state, for subclasses that keep more in it."""
        if self.checkpoints is None:
            raise ConfigError("resuming needs a run_dir")
        state: dict[str, Any]
        state, metadata = self.checkpoints.load_latest()
        if metadata.get("algorithm") != self.algorithm.name:
            raise ConfigError(
                f"checkpoint in {self.run_dir} is for {metadata.get('algorithm')!r}, "
                f"not {self.algorithm.name!r}"
            )
        self.load_checkpoint_state(state)
        return state

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`checkpoint_state` output (subclasses extend both together)."""
        self.algorithm.load_state_dict(state["algorithm"])
        if self.collector is not None and state.get("collector") is not None:
            self.collector.load_state_dict(state["collector"])
        # A run that gained signals or parameters since the checkpoint starts them fresh.
        if self.reward_signals is not None and "reward_signals" in state:
            self.reward_signals.load_state_dict(state["reward_signals"])
        if self.env_parameters is not None and "env_parameters" in state:
            self.env_parameters.load_state_dict(state["env_parameters"])
        self.load_loop_state(state)


class Trainer(TrainingLoop[Algorithm[Any], VectorEnv[Any, Any, Any]]):
    """The training loop of one algorithm on Gymnasium vector envs: a :class:`Collector`
    steps the training envs, an :class:`Evaluator` plays the test episodes. Subclasses
    (on-policy, off-policy, offline, actor-learner) define one training step; the arguments
    are :class:`TrainingLoop`'s, with next-step-autoreset vector envs."""

    collector: Collector | None
    evaluator: Evaluator

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


class OnPolicyTrainer(Trainer):
    """Training steps of one rollout each, followed by ``algo.update(rollout)``.

    Extra arguments (Tianshou names; each defaults to the algorithm's own setting):
        collection_step_num_env_steps: env steps per rollout (``num_steps * num_envs``).
        collection_step_num_episodes: instead, collect until this many episodes have ended
            (at least one vector step; the rollout length varies).
        batch_size: minibatch size.
        update_step_num_repetitions: passes over the rollout per update (``num_epochs``).
    """

    def __init__(
        self,
        algorithm: Algorithm[Any],
        train_envs: VectorEnv[Any, Any, Any],
        test_envs: VectorEnv[Any, Any, Any],
        config: TrainerConfig | None = None,
        *,
        collection_step_num_env_steps: int | None = None,
        collection_step_num_episodes: int | None = None,
        batch_size: int | None = None,
        update_step_num_repetitions: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.learner = require_kind(
            algorithm, "on_policy", "OnPolicyTrainer needs an on-policy algorithm"
        )
        """``algorithm`` as its kind's contract: what the update step calls."""
        hp = self.learner.config
        num_envs = train_envs.num_envs
        steps = collection_step_num_env_steps or hp.num_steps * num_envs
        if steps % num_envs:
            raise ConfigError(
                f"collection_step_num_env_steps ({steps}) must be a multiple of "
                f"num_envs ({num_envs})"
            )
        # Algorithms without minibatches or epochs (A2C's default, ACER) leave these None.
        self.batch_size: int | None = batch_size or hp.batch_size
        self.update_step_num_repetitions: int | None = update_step_num_repetitions or hp.num_epochs
        if collection_step_num_episodes is not None:
            if collection_step_num_env_steps is not None:
                raise ConfigError(
                    "give collection_step_num_env_steps or collection_step_num_episodes, not both"
                )
            if collection_step_num_episodes < 1:
                raise ConfigError(
                    f"collection_step_num_episodes must be >= 1, got {collection_step_num_episodes}"
                )
        self.collection_step_num_env_steps = steps
        self.collection_step_num_episodes = collection_step_num_episodes
        if (
            collection_step_num_episodes is None
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
        metrics = self.learner.update(
            self.storage,
            batch_size=self.batch_size,
            num_repetitions=self.update_step_num_repetitions,
        )
        return stats, {**metrics, **signal_metrics}


class OffPolicyTrainer(Trainer):
    """Training steps of a few env steps into a replay buffer, then gradient steps.

    Each training step collects ``collection_step_num_env_steps`` env steps (rounded up to
    whole vector steps; random actions until ``learning_starts``), then, once
    ``learning_starts`` env steps are collected, calls
    ``algo.update(buffer, batch_size=..., num_gradient_steps=...)`` with as many gradient
    steps as the update-to-data ratio owes; a fractional ratio carries its remainder to the
    next training step, so the ratio holds exactly over the run.

    Extra arguments (Tianshou names; each defaults to the algorithm's own setting):
        collection_step_num_env_steps: env steps per collection step (``train_freq``).
        batch_size: minibatch size of each gradient step.
        update_step_num_gradient_steps_per_sample: gradient steps per collected env step
            (``gradient_steps / train_freq``).
        buffer: a replay buffer to use (e.g. one filled by :meth:`ReplayBuffer.load`);
            default: a new one of the algorithm's ``buffer_size``, keeping action masks
            when the env gives them (a given buffer needs the matching ``mask_size``).
    """

    def __init__(
        self,
        algorithm: Algorithm[Any],
        train_envs: VectorEnv[Any, Any, Any],
        test_envs: VectorEnv[Any, Any, Any],
        config: TrainerConfig | None = None,
        *,
        collection_step_num_env_steps: int | None = None,
        batch_size: int | None = None,
        update_step_num_gradient_steps_per_sample: float | None = None,
        buffer: ReplayBuffer | None = None,
        **kwargs: Any,
    ) -> None:
        self.learner = require_kind(
            algorithm, "off_policy", "OffPolicyTrainer needs an off-policy algorithm"
        )
        """``algorithm`` as its kind's contract: what the update step calls."""
        hp = self.learner.config
        num_envs = train_envs.num_envs
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

    def _training_step(self) -> tuple[CollectStats, dict[str, float]]:
        env_step = self.counters.env_step
        assert self.collector is not None  # off-policy training always has local envs
        stats = self.collector.collect_transitions(
            self.buffer,
            self.collection_num_vector_steps,
            random_actions=env_step < self.learning_starts,
        )
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
        metrics = self.learner.update(
            self.buffer if self.signal_replay is None else self.signal_replay,
            batch_size=self.batch_size,
            num_gradient_steps=num_gradient_steps,
        )
        if self.signal_replay is not None:
            signal_metrics.update(self.signal_replay.take_update_metrics())
        return stats, {**metrics, **signal_metrics}

    def checkpoint_state(self) -> dict[str, Any]:
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
        test_envs: VectorEnv[Any, Any, Any],
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
        super().__init__(algorithm, None, test_envs, config, **kwargs)

    def run(self) -> TrainResult:
        if self.counters.env_step == 0:
            stats = self.dataset.stats()
            self._write_row(stats.as_metrics(), None)
            ProgressReporter(None, show_progress=False, verbose=self.config.verbose).message(
                stats.describe()
            )
        return super().run()

    def _training_step(self) -> tuple[CollectStats, dict[str, float]]:
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
