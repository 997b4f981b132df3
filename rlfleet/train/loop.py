"""The training loop every rlfleet trainer runs on: :class:`TrainingLoop`, its settings
(:class:`TrainerConfig`), result (:class:`TrainResult`) and hook types.

The loop owns epochs, training steps, test steps, hooks, stop rules, checkpoints, history and
the progress bar; what it trains (:class:`Policy`) and the collection and update steps come
from its subclasses: the single-agent trainers in :mod:`rlfleet.train.trainer` (whose module
docstring is the glossary), :class:`rlfleet.marl.trainer.DecentralizedTrainer` and
:class:`rlfleet.distributed.trainer.DistributedTrainer`.
"""

from __future__ import annotations

import math
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Set
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

import numpy as np
import torch
from pydantic import BaseModel

from rlfleet.checkpoint import CheckpointManager
from rlfleet.checkpoint.schema import LoopState
from rlfleet.config.fields import NonNegativeInt, OpenUnitFloat, PositiveInt
from rlfleet.config.loader import validate
from rlfleet.envs.curriculum import EnvParameterManager
from rlfleet.errors import CheckpointError, ConfigError, RlfleetError
from rlfleet.logging.history import ENV_STEPS, History, episode_row
from rlfleet.logging.loggers import Logger, check_logger
from rlfleet.logging.mirrors import Mirror, Mirrors, WandbWriter
from rlfleet.logging.plots import plot_learning_curve
from rlfleet.logging.progress import ProgressReporter
from rlfleet.logging.tensorboard import TensorBoardWriter
from rlfleet.nn.optim import NanPolicy
from rlfleet.nn.precision import Precision
from rlfleet.rewards.signals import RewardSignals
from rlfleet.seeding import episode_seed
from rlfleet.train.allocator import release_free_memory, retained_heap
from rlfleet.train.cadence import (
    ADAPTIVE_TEST_EPISODES,
    DEFAULT_TEST_EPISODES,
    MeasuredCost,
    adaptive_test_episodes,
    interval_reached,
)
from rlfleet.train.threads import (
    DEFAULT_TORCH_THREADS,
    ThreadSetting,
    available_cores,
    torch_threads,
)
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


_COLLECTION_KEYS = frozenset({"train/return", "train/episode_length", "train/env_restarts"})
"""Keys of a training step's accumulated metrics that come from collection, not updates."""

P = TypeVar("P", bound=Policy)
"""What a training loop trains (see :class:`Policy`)."""
E = TypeVar("E", bound=Envs)
"""The kind of envs a training loop steps (see :class:`Envs`)."""

TrainingFn = Callable[[int, int], None]
TrainFn = TrainingFn
"""The type of ``training_fn`` under its deprecated name (``train_fn``)."""
TestFn = Callable[[int, int], None]
StopFn = Callable[[float], bool]
ComputeScoreFn = Callable[[EvalStats], float]
SaveBestFn = Callable[[P], None]
"""``save_best_fn(policy)``: ``SaveBestFn[Algorithm]`` for :class:`Trainer`,
``SaveBestFn[Agents]`` for the multi-agent trainer."""
SaveCheckpointFn = Callable[[int, int, int], "str | None"]
TestResultFn = Callable[[int, int, float], None]
ReturnReduction = Callable[[np.ndarray], np.ndarray]
"""``multi_agent_return_reduction(returns[episodes, agents]) -> returns[episodes]``."""


@dataclass
class TrainerConfig:
    """Loop settings shared by every trainer (the ``trainer:`` section of a run config)."""

    max_steps: PositiveInt = 100_000
    """Budget of environment steps (offline: gradient steps); schedules run from 0 to this."""
    schedule_max_steps: PositiveInt | None = None
    """Horizon of the schedules when it is not ``max_steps`` (unset: ``max_steps``). A
    resume that changes ``max_steps`` with ``--schedule-on-resume continue`` sets it to the
    run's earlier horizon."""
    max_epochs: PositiveInt | None = None
    """Stop after this many epochs (unlimited when unset)."""
    max_episodes: PositiveInt | None = None
    """Stop after this many training episodes (unlimited when unset). With both budgets,
    the one used up first ends the run and drives the schedules. A multi-agent collection
    step asks for no more episodes than this budget has left; game copies that finish on
    the step that reaches it may add up to ``num_envs - 1`` more."""
    epoch_num_steps: PositiveInt = 10_000
    """Environment steps (offline: gradient steps) per epoch. An epoch ends with a test step
    as the test cadence says (see ``test_interval_steps``), and with a checkpoint unless
    ``checkpoint_interval_steps`` spaces them out."""
    test_step_num_episodes: PositiveInt | None = None
    """Test episodes per test step. Unset: 20; under the adaptive cadence (see
    ``test_interval_steps``) 10 for a session's first test step, then 20, or 10 when 20 would
    not fit in ``test_time_share``."""
    test_interval_steps: PositiveInt | None = None
    """Environment steps (offline: gradient steps) between test steps, rounded up to whole
    epochs; the last epoch always ends with one. Unset: every epoch when test scores steer
    training (``stop_fn``, ``target_reward`` on test episodes, the patience rules, ``test_fn``
    or ``test_result_fn``) and in multi-agent runs; otherwise adaptive: an epoch ends with a
    test step only while test steps stay within ``test_time_share`` of the wall time, the
    first epoch of a session and the last of a run always do (see
    :mod:`rlfleet.train.cadence`)."""
    test_time_share: OpenUnitFloat = 0.1
    """The adaptive cadence's budget: the largest share of the run's wall time test steps
    may take (a test step predicted under a second always runs)."""
    test_in_training: bool = True
    """Run a test step as soon as the mean return of the last ``reward_buffer_size`` (20)
    training episodes satisfies the stop rule, so that a solved task stops without waiting
    for the end of its epoch. Tianshou's default is false; ours is true because it never
    stops a run on training returns alone (only the test step it triggers can) and
    ``target_reward``, a stop rule most runs set, would otherwise overshoot by up to one
    epoch. Set it false for exactly one test step per epoch."""
    target_reward: float | None = None
    """Stop once the score ``target_reward_episodes`` names reaches this."""
    target_reward_episodes: Literal["test", "training"] = "test"
    """What ``target_reward`` judges: ``test`` (the default), each test step's score;
    ``training`` (xagents' rule), the mean return of the last ``reward_buffer_size``
    training episodes, checked after every training step."""
    reward_buffer_size: PositiveInt = 20
    """Training episodes whose mean return is the training mean: the progress bar's,
    ``test_in_training``'s, the score of a loop without test envs, and what ``target_reward``
    judges with ``target_reward_episodes: training`` (xagents' name; its default is 100)."""
    plateau_reduce_factor: OpenUnitFloat = 0.5
    """Learning-rate multiplier applied on a plateau (with ``plateau_reduce_patience``)."""
    plateau_reduce_patience: PositiveInt | None = None
    """Test steps without a new best before the learning rate is reduced (off when unset)."""
    early_stop_patience: PositiveInt | None = None
    """Test steps without a new best before training stops (off when unset)."""
    divergence_monitoring_steps: NonNegativeInt | None = None
    """Steps (as ``max_steps`` counts them) before which test steps without a new best do
    not count towards ``plateau_reduce_patience`` and ``early_stop_patience`` (xagents'
    name: the patience rules watch for a plateau only from this step on; unset: from the
    start)."""
    log_interval_steps: PositiveInt = 2048
    """Environment steps between history rows of training metrics."""
    log_episodes: bool = True
    """Also give the history one row per finished training episode (``episode/return``,
    ``episode/length``, ``episode/return_mean`` over the last ``reward_buffer_size``,
    ``episode/time_s``), as xagents' history has, besides the interval rows."""
    checkpoint_interval_steps: PositiveInt | None = None
    """Environment steps between checkpoints, rounded up to whole epochs (unset: every
    epoch). The last epoch always ends with one."""
    keep_checkpoints: NonNegativeInt = 3
    """Checkpoints kept in ``checkpoints/`` (0 keeps all)."""
    show_progress: bool = True
    """Show a progress bar when the output is a terminal (whatever ``verbose`` says)."""
    verbose: bool = True
    """Print one summary line per epoch and messages (false: none; the bar follows
    ``show_progress``)."""
    tensorboard: bool = False
    """Also write TensorBoard event files to ``run_dir/tensorboard``."""
    monitor_session: str | None = None
    """Also log the history's rows to Weights & Biases, as a run of this name, its files in
    ``run_dir/wandb`` (xagents' name; needs the ``wandb`` extra; ``WANDB_MODE=offline``
    keeps the run on this machine)."""
    nan_policy: Literal["raise", "skip_batch"] = "raise"
    """A NaN/inf loss or gradient in any optimiser step (the algorithm's or a reward
    signal's): stop with NonFiniteError, or skip that batch, count it in
    ``train/skipped_batches`` and go on. Weights never take a non-finite step."""
    save_replay_buffer: bool = True
    """Off-policy: include the replay buffer in checkpoints, so resuming keeps its data."""
    threaded: bool = False
    """Off-policy: step the training envs on a thread of their own, with a copy of the
    policy, while the learner takes its gradient steps (ML-Agents' ``threaded``). The
    acting weights lag the learner's within the bound ``threaded_max_lead_steps`` and
    ``threaded_sync_interval`` set; runs are then not bitwise reproducible. Other trainers
    note once that it has no effect on them (see :mod:`rlfleet.train.threaded`)."""
    threaded_max_lead_steps: PositiveInt | None = None
    """With ``threaded``: env steps the collector thread may collect ahead of the learner,
    rounded down to whole collection steps, at least one (unset: one collection step)."""
    threaded_sync_interval: PositiveInt = 1
    """With ``threaded``: gradient steps between copies of the learner's weights to the
    acting policy (a copy is made after an update step, once this many have passed)."""
    compile: bool = False
    """Run the update step's tensor maths through ``torch.compile`` (algorithms that offer it:
    ppo, a2c, dqn, sac; the rest refuse it). Compiled code is cached on disk (see
    :mod:`rlfleet.nn.compile`), so only a run's first compilation on a machine pays in full.
    Not bitwise equal to uncompiled training (fused kernels round differently). Off by
    default: it made no whole run faster where it was measured (``bench/compile.py``)."""
    cuda_graphs: bool = False
    """On a CUDA device, capture the gradient step (loss, gradients, gradient clip,
    non-finite check, optimiser step) as a CUDA graph and replay it: one launch a step
    instead of one a kernel (algorithms that offer it: dqn, td3, ddpg, and sac on Box actions;
    the rest refuse it, as do a device that is not CUDA and sac on Discrete actions; see
    :mod:`rlfleet.nn.cuda_graph`). Needs ``compile: false``
    and ``precision: fp32``. Off by default; ``bench/gpu.py`` times it against eager steps,
    and ``tests/nn/test_cuda_graph.py`` checks on a GPU that it trains their parameters."""
    precision: Precision = "fp32"
    """Arithmetic of the update step: ``fp32``, or ``bf16`` matrix products and convolutions
    (inputs rounded to bfloat16, accumulated in fp32, results rounded to bf16 and kept so
    through ReLU and reshapes; everything else fp32, see :mod:`rlfleet.nn.precision`),
    refused on a device without native bf16 (a CPU needs AVX-512 BF16 or AMX). Acting stays
    fp32. ``bench/precision.py`` compares its learning and speed with fp32."""


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

    @property
    def test_share(self) -> float:
        """The share of ``wall_time_s`` spent in test steps (0 when no time has passed)."""
        return self.test_time_s / self.wall_time_s if self.wall_time_s > 0 else 0.0


_BUDGET_RULES = frozenset({"", "max_steps", "max_episodes", "max_epochs", "early_stop_patience"})
"""Stop reasons that depend only on the counters and the config: checked again on resume
against the config the run resumes with (a raised ``max_steps`` continues the run)."""


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
    stop_reason: str = ""
    """Why the run stopped, once it has (``""`` before): kept in its last checkpoint."""


@dataclass(frozen=True)
class TimingStats:
    """Wall time of the training so far (Tianshou's ``TimingStats``), in seconds."""

    total_time: float
    """Since the run started (a resumed run's earlier sessions included)."""
    train_time: float
    """``total_time`` less ``test_time``."""
    test_time: float
    """Spent in test steps."""


@dataclass(frozen=True)
class InfoStats:
    """Where training stands after an epoch (Tianshou's ``InfoStats``, with rlfleet's
    counters)."""

    gradient_step: int
    """Gradient steps so far."""
    best_score: float
    """Best test score so far (``-inf`` before the first test step)."""
    best_env_step: int
    """Step counter at that best score."""
    train_step: int
    """Steps collected so far (the step counter: env steps; offline, gradient steps)."""
    train_episode: int
    """Training episodes finished so far."""
    timing: TimingStats

    def as_log_data(self) -> dict[str, float | int | None]:
        """Flat ``info/…`` metrics, as ``logger.log_info_data`` receives them."""
        return {
            "info/gradient_step": self.gradient_step,
            "info/best_score": None if self.best_score == -math.inf else self.best_score,
            "info/best_env_step": self.best_env_step,
            "info/train_step": self.train_step,
            "info/train_episode": self.train_episode,
            "info/total_time_s": self.timing.total_time,
            "info/train_time_s": self.timing.train_time,
            "info/test_time_s": self.timing.test_time,
        }


@dataclass(frozen=True)
class EpochStats:
    """What one epoch did (Tianshou's ``EpochStats``): returned by
    :meth:`TrainingLoop.execute_epoch` and yielded by iterating a trainer."""

    epoch: int
    """The epoch's number (1-based, counted over the whole run)."""
    train_collect_stat: CollectStats
    """The epoch's collection steps together: env steps, finished episodes' returns and
    lengths (offline: gradient steps, no episodes)."""
    test_collect_stat: EvalStats | None
    """The test episodes of the epoch's last test step, returns reduced by
    ``multi_agent_return_reduction``; None when the epoch played none (no test envs, or the
    test cadence skipped this epoch's test step)."""
    training_stat: dict[str, float]
    """The metrics of the epoch's last update step (empty before learning starts)."""
    info_stat: InfoStats
    """Counters, best score and timing after the epoch."""
    stop_reason: str
    """Why training stopped at the end of this epoch; empty while it goes on."""


@dataclass
class _Session:
    """A training session, from :meth:`TrainingLoop.reset` until a stop rule fires."""

    reporter: ProgressReporter
    tensorboard: Any
    start_time: float
    """``clock()`` at which the run would have started, had it never paused."""
    start_step: int
    last_log_step: int
    last_checkpoint_step: int
    last_test_step: int
    """The step counter at the session's last test step (at its start: none yet)."""
    tested: bool = False
    """A test step has run in this session."""
    last_test_cost: MeasuredCost | None = None
    """What the session's last test step cost, for the adaptive cadence."""
    log_acc: dict[str, list[float]] = field(default_factory=dict)
    """Training metrics since the last history row."""


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
            their own envs (:class:`rlfleet.distributed.DistributedTrainer`). ``test_envs``
            None means no test episodes: each test step then scores the last
            ``reward_buffer_size`` (20) training episodes (``stop_fn``, ``target_reward``,
            ``best/`` and the patience rules follow that score), and ``test_fn`` cannot be given.
        config: loop settings (see :class:`TrainerConfig`).
        run_dir: where history, checkpoints, ``best/`` and plots go (none: nothing written);
            a ``str`` or a ``Path``.
        run_metadata: JSON-able description of the run stored in every checkpoint.
        seed: seeds the first reset of the train and test envs.
        torch_threads: CPU threads torch uses while :meth:`run` trains: a number, ``auto``
            (chosen from the algorithm's work, see
            :func:`rlfleet.train.threads.auto_torch_threads`) or None (the caller's setting);
            the caller's count is restored when :meth:`run` returns. The default is
            :data:`rlfleet.train.threads.DEFAULT_TORCH_THREADS`, as for a run config.
        multi_agent_return_reduction: ``f(returns[episodes, agents]) -> returns[episodes]``,
            applied to a test step's returns before ``compute_score_fn`` and the
            ``test/return_*`` columns (Tianshou's parameter; None: returns as they are).
        logger: one more sink for the history's rows, with Tianshou's logger methods
            (``log_train_data``, ``log_test_data``, ``log_update_data``, ``save_data``):
            :class:`rlfleet.logging.HistoryLogger`, :class:`rlfleet.logging.TensorBoardLogger`
            or a Tianshou logger (see :mod:`rlfleet.logging.loggers`); ``run_dir`` keeps its
            own history either way. An object without those methods is a ConfigError.
        reward_signals / env_parameters: see the module docstring.
        The hooks are documented in the module docstring; ``train_fn`` is the deprecated
        name of ``training_fn`` and warns.
    """

    collector: TrainingCollector | None
    """Steps ``train_envs``; None when the trainer has none (distributed rollout actors)."""
    evaluator: TestEpisodes | None
    """Runs the test episodes of every test step on ``test_envs``; None without test envs,
    when each test step scores the recent training episodes instead."""
    step_unit: ClassVar[str] = ENV_STEPS
    """What the step counter counts (history, progress bar, :class:`TrainResult`)."""
    test_steps_independent: ClassVar[bool] = True
    """Test steps draw nothing that training draws from (test envs of their own, a greedy
    policy), so that skipping one leaves training as it is: the adaptive test cadence needs
    it (see :mod:`rlfleet.train.cadence`)."""
    test_before_training: ClassVar[bool] = False
    """Run a test step at step 0 of a fresh run, to start the learning curve (offline)."""
    state_schema: ClassVar[type[BaseModel]] = LoopState
    """The top-level keys of this trainer's checkpoint state, checked before it is restored
    (subclasses that keep more in it extend :class:`~rlfleet.checkpoint.schema.LoopState`)."""

    def __init__(
        self,
        algorithm: P,
        train_envs: E | None,
        test_envs: E | None,
        config: TrainerConfig | None = None,
        *,
        run_dir: str | Path | None = None,
        run_metadata: dict[str, Any] | None = None,
        seed: int | None = None,
        torch_threads: ThreadSetting = DEFAULT_TORCH_THREADS,
        training_fn: TrainingFn | None = None,
        train_fn: TrainingFn | None = None,
        test_fn: TestFn | None = None,
        stop_fn: StopFn | None = None,
        compute_score_fn: ComputeScoreFn | None = None,
        save_best_fn: SaveBestFn[P] | None = None,
        save_checkpoint_fn: SaveCheckpointFn | None = None,
        test_result_fn: TestResultFn | None = None,
        resume_from_log: bool = False,
        multi_agent_return_reduction: ReturnReduction | None = None,
        logger: Logger | None = None,
        reward_signals: RewardSignals | None = None,
        env_parameters: EnvParameterManager | None = None,
    ) -> None:
        if train_fn is not None:
            if training_fn is not None:
                raise ConfigError("give training_fn or its old name train_fn, not both")
            warnings.warn(
                "train_fn is deprecated: the hook is called training_fn (as in Tianshou 2)",
                DeprecationWarning,
                stacklevel=2,
            )
            training_fn = train_fn
        if test_envs is None and test_fn is not None:
            raise ConfigError(
                "test_fn is called before each test step, but without test_envs there are none"
            )
        self.algorithm = algorithm
        self.reward_signals = reward_signals
        self.env_parameters = env_parameters
        # A config built in Python is checked as one read from YAML is (bounds, NaN).
        config = (
            TrainerConfig() if config is None else validate(TrainerConfig, config, "TrainerConfig")
        )
        # Every learner of the run follows the trainer's nan_policy.
        algorithm.nan_policy = config.nan_policy
        if reward_signals is not None:
            reward_signals.set_nan_policy(algorithm.nan_policy)
        self.train_envs = train_envs
        self.test_envs = test_envs
        self.config = config
        self._prepare_update_step()
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.run_metadata = run_metadata or {}
        self.seed = seed
        self.torch_threads = torch_threads
        self.training_fn = training_fn
        self.test_fn = test_fn
        self.multi_agent_return_reduction = multi_agent_return_reduction
        # On training episodes, target_reward is checked after each training step instead.
        target = self.config.target_reward if self.config.target_reward_episodes == "test" else None
        self.stop_fn = stop_fn or (None if target is None else (lambda score: score >= target))
        self.compute_score_fn = compute_score_fn or (lambda stats: stats.mean)
        self.save_best_fn = save_best_fn or self._save_best
        self.save_checkpoint_fn = save_checkpoint_fn or self._save_checkpoint
        self.test_result_fn = test_result_fn
        self.logger = None if logger is None else check_logger(logger)
        self.counters = _Counters()
        self.clock: Callable[[], float] = time.perf_counter
        """The wall clock the loop times the run and its test steps with (seconds; the
        adaptive test cadence reads it too)."""
        self.after_first_step: Callable[[], None] | None = None
        """Called once, after the next training step returns (:meth:`training_step`), then
        cleared: how :func:`rlfleet.runs.run.train` learns that the run has started."""
        self._session: _Session | None = None
        self._stop_reason = ""
        self._envs_stepped = False
        """The training envs were stepped since they were last reset or restored."""
        self._epoch_test_stats: EvalStats | None = None
        self._last_test_step = -1
        # A run resumed after its stop rule fired (killed on its way out) stays stopped;
        # budget rules need no such memory, they are checked against the current config.
        self._stopped_before_resume = ""
        self._last_test_return: float | None = None
        self.recent_returns: deque[float] = deque(maxlen=self.config.reward_buffer_size)
        self.recent_lengths: deque[int] = deque(maxlen=self.config.reward_buffer_size)
        self._seen_env_restarts = 0
        self._history_flush_error: BaseException | None = None
        """The error of the epoch's history flush, which a cleanup flush does not retry."""
        self._epoch_end_step: int | None = None
        """The step counter at which the epoch under way ends (None: between epochs)."""
        # None when the training envs live elsewhere (rollout actors of a distributed run).
        self.collector = self._make_collector(train_envs, seed) if train_envs is not None else None
        # Test episodes are seeded apart from training ones and from other seeds' test
        # episodes (rlfleet.seeding.episode_seed), with a fresh seed per test step.
        self.evaluator = (
            None
            if test_envs is None
            else self._make_test_episodes(
                test_envs, None if seed is None else episode_seed(seed, "test")
            )
        )
        self.checkpoints: CheckpointManager | None = None
        """Writes the run's checkpoints; opened once a resume has loaded the latest one, so
        that a resume that fails touches nothing in the run directory."""
        self.history = (
            History(self.run_dir / "history.parquet", step_unit=self.step_unit)
            if self.run_dir
            else None
        )
        self._build_storage()
        if resume_from_log:
            self.resume()
        if self.run_dir is not None:
            self.checkpoints = CheckpointManager(
                self.run_dir / "checkpoints", keep=self.config.keep_checkpoints or None
            )
        refusal = self._threaded_refusal() if self.config.threaded else None
        if refusal is not None:
            ProgressReporter(None, show_progress=False, verbose=self.config.verbose).message(
                f"threaded: no effect on {type(self).__name__}: {refusal}"
            )

    @property
    def collects_on_thread(self) -> bool:
        """Collection runs on a thread of its own, overlapped with the update steps
        (``threaded`` set, on a trainer that supports it)."""
        return self.config.threaded and self._threaded_refusal() is None

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

    def _prepare_update_step(self) -> None:
        """Apply ``compile``, ``cuda_graphs`` and ``precision`` to what the update step
        runs; this loop offers none of them, so it refuses them when set."""
        cfg = self.config
        if cfg.compile or cfg.cuda_graphs or cfg.precision != "fp32":
            raise ConfigError(
                f"trainer.compile, trainer.cuda_graphs and trainer.precision apply to the "
                f"single-algorithm trainers (on-policy, off-policy, offline), not to "
                f"{type(self).__name__}; expected compile: false, cuda_graphs: false, "
                f"precision: fp32, got compile: {str(cfg.compile).lower()}, cuda_graphs: "
                f"{str(cfg.cuda_graphs).lower()}, precision: {cfg.precision}"
            )

    def _threaded_refusal(self) -> str | None:
        """Why ``threaded`` has no effect on this trainer (None: it collects on a thread of
        its own when ``threaded`` is set)."""
        return "only the off-policy trainer collects on a thread of its own"

    def _pause_collection(self) -> CollectStats:
        """Wait for a collection thread's steps in flight and hand over what they collected
        beyond the training steps taken (the loop counts it); the thread is then idle, so
        that the collector can be checkpointed. Nothing without a collection thread."""
        return CollectStats()

    def _stop_collection(self) -> None:
        """End a collection thread, if one runs."""

    def _test_metrics(self, stats: EvalStats) -> dict[str, float]:
        """History columns a test step adds to the common ones (none by default)."""
        return {}

    def progress(self) -> float:
        """Fraction of the training budget used: of ``max_steps`` (``schedule_max_steps``
        when set) or, when set, ``max_episodes``, whichever is further along. Drives the
        algorithm's schedules."""
        cfg = self.config
        c = self.counters
        used = c.env_step / (cfg.schedule_max_steps or cfg.max_steps)
        if cfg.max_episodes is not None:
            used = max(used, c.episode / cfg.max_episodes)
        return used

    # ------------------------------------------------------------------- loop
    def training_step(self) -> tuple[CollectStats, dict[str, float]]:
        """One training step, as :meth:`run` takes it: ``training_fn``, the schedules'
        progress, one collection step and one update step, then the step and episode
        counters, the recent training returns and the curriculum. Logging, test steps and
        checkpoints are :meth:`execute_epoch`'s. Returns the collection's stats and the update's
        metrics."""
        c = self.counters
        if self.training_fn is not None:
            self.training_fn(c.epoch, c.env_step)
        self.algorithm.set_progress(self.progress())
        stats, metrics = self._training_step()
        self._count_collection(stats)
        if self.after_first_step is not None:
            started, self.after_first_step = self.after_first_step, None
            started()
        return stats, metrics

    def _count_collection(self, stats: CollectStats) -> None:
        """Count collected steps and episodes: the step and episode counters, the recent
        training returns and the curriculum."""
        c = self.counters
        self._envs_stepped = True
        c.env_step += stats.env_steps
        c.episode += stats.episodes
        if self.env_parameters is not None:
            change = self.env_parameters.observe(stats.episode_returns, self.progress())
            if change.require_reset and self.collector is not None:
                self.collector.reset_envs()
        self._add_episodes(stats)

    def run(
        self, reset_collectors: bool = True, reset_collector_buffers: bool = False
    ) -> TrainResult:
        """Train until a stop rule fires; returns a :class:`TrainResult`.

        Starts a session with :meth:`reset` (its arguments are :meth:`reset`'s), then runs
        :meth:`execute_epoch` until an epoch ends with a stop reason. Torch uses
        ``torch_threads`` CPU threads meanwhile (see :class:`TrainingLoop`)."""
        with self._compute_settings():
            self._reset(reset_collectors, reset_collector_buffers)
            while not self._execute_epoch().stop_reason:
                pass
        return self._result

    def reset(self, reset_collectors: bool = True, reset_collector_buffers: bool = False) -> None:
        """Start a training session: the clock, the progress bar, TensorBoard, the history's
        stop reason cleared; an offline trainer's first test step (see
        ``test_before_training``). A session opened before is closed first.

        Args:
            reset_collectors: start new episodes in the training envs, unless they have not
                been stepped since they were last reset: a new trainer's envs, just reset
                with ``seed``, and a resumed trainer's, restored where the checkpoint left
                them, carry on as they are. Episodes in progress end uncounted.
            reset_collector_buffers: with ``reset_collectors``, also empty the storage
                collection steps fill: the replay buffers of off-policy learning (the
                off-policy trainer's, a multi-agent game's off-policy learners'); a rollout
                is rewritten by every collection step anyway.

        Unlike Tianshou, the counters carry on (a new trainer starts at 0, a resumed one at
        its checkpoint): they are the run's, as its checkpoints and history record them."""
        with self._compute_settings():
            self._reset(reset_collectors, reset_collector_buffers)

    def execute_epoch(self) -> EpochStats:
        """Run one epoch: training steps until ``epoch_num_steps`` (or a budget) is used,
        its test step, the stop rules, its checkpoint, a history flush and a summary line.

        Opens a session when none is open (as :meth:`reset` does, envs left as they are).
        When the returned :attr:`EpochStats.stop_reason` is set the session is over
        (progress bar and TensorBoard closed, learning curve plotted); a further call opens
        a new one."""
        with self._compute_settings():
            if self._session is None:
                self._reset(reset_collectors=False, reset_collector_buffers=False)
            return self._execute_epoch()

    def __iter__(self) -> Iterator[EpochStats]:
        """Train epoch by epoch: ``for epoch_stat in trainer:`` yields each epoch's
        :class:`EpochStats`, the last one with its ``stop_reason`` set. The loop starts
        with :meth:`reset` (defaults); leaving it early closes the session, and
        :meth:`run`, :meth:`execute_epoch` or another loop carry on from the counters."""
        self.reset()
        try:
            while True:
                stats = self.execute_epoch()
                yield stats
                if stats.stop_reason:
                    return
        finally:
            self._end_session(completed=False)

    @property
    def result(self) -> TrainResult:
        """Where training stands, as :meth:`run` returns it (its ``stop_reason`` is empty
        while no stop rule has fired)."""
        return self._result

    @contextmanager
    def _compute_settings(self) -> Iterator[None]:
        """``torch_threads`` CPU threads, subnormal floats flushed to zero, and freed memory
        kept in the heap for the next step (:func:`rlfleet.train.allocator.retained_heap`).

        Subnormal floats (Adam's second moments of tiny gradients, for one) take a slow path
        on x86 CPUs: measured 5-7x slower fused Adam steps. Flushing them to zero does not
        change learning; it is switched back off on the way out."""
        with (
            torch_threads(self.torch_threads, self.algorithm, self.cores_for_learning()),
            retained_heap(),
        ):
            torch.set_flush_denormal(True)
            try:
                yield
            finally:
                torch.set_flush_denormal(False)

    def cores_for_learning(self) -> int:
        """The cores ``torch_threads: auto`` may give the learner: every core this process may
        use, but one for the collector thread when collection runs on a thread of its own."""
        return max(1, available_cores() - (1 if self.collects_on_thread else 0))

    def _reset(self, reset_collectors: bool, reset_collector_buffers: bool) -> None:
        self._end_session(completed=False)
        leftover = self._pause_collection()
        if leftover.env_steps:
            self._count_collection(leftover)
        self._stop_collection()
        if reset_collectors:
            if self.collector is not None and self._envs_stepped:
                self.collector.reset_envs()
                self._envs_stepped = False
            if reset_collector_buffers:
                self._clear_buffers()
        cfg = self.config
        c = self.counters
        reporter = ProgressReporter(
            cfg.max_steps,
            show_progress=cfg.show_progress,
            # The bar follows show_progress alone (as in Tianshou); verbose gates the lines.
            verbose=cfg.verbose or cfg.show_progress,
            description=f"{self.algorithm.name}",
            unit=self.step_unit,
        )
        session = _Session(
            reporter=reporter,
            tensorboard=self._tensorboard(),
            start_time=self.clock() - c.wall_time_s,
            start_step=c.env_step,
            last_log_step=c.env_step,
            last_checkpoint_step=c.env_step,
            last_test_step=c.env_step,
        )
        self._session = session
        self._stop_reason = ""
        reporter.start(c.env_step)
        if self.history is not None:
            # A resumed run is running again: its old stop reason no longer holds.
            self.history.stop_reason = None
        if self.test_before_training and c.env_step == 0:
            with self._closing_on_error():
                self._test_step(reporter, session.tensorboard)

    def _clear_buffers(self) -> None:
        """Empty what collection steps fill (``reset_collector_buffers``); subclasses with a
        buffer that outlives a collection step override it."""

    @contextmanager
    def _closing_on_error(self) -> Iterator[None]:
        """On an exception, keep the history logged so far and close the session.

        A failed or pruned run keeps the rows it logged; rows past the latest checkpoint are
        dropped again if the run is resumed."""
        try:
            yield
        except BaseException as error:
            self._clean_up_after(error)
            raise

    def _clean_up_after(self, error: BaseException) -> None:
        """Flush the history (unless that flush is what failed) and close the session, on the
        way out of a failure.

        A failure of either (the disk that just filled up) is a warning: the error in flight
        is the one that propagates."""
        steps: list[tuple[str, Callable[[], None]]] = []
        if self.history is not None and error is not self._history_flush_error:
            steps.append(("save the history", self.history.flush))
        steps.append(("close the session", lambda: self._end_session(completed=False)))
        for what, step in steps:
            try:
                step()
            except Exception as cleanup_error:
                warnings.warn(
                    f"could not {what} while stopping on {type(error).__name__}: {cleanup_error}",
                    RuntimeWarning,
                    stacklevel=4,
                )

    def _end_session(self, *, completed: bool) -> None:
        """Close the open session's progress bar and TensorBoard file, and hand the heap's
        free memory back to the kernel; a completed one (a stop rule fired) also gets its
        learning curve plotted."""
        session = self._session
        if session is None:
            return
        self._session = None
        self._stop_collection()
        session.reporter.close()
        if session.tensorboard is not None:
            session.tensorboard.close()
        self.counters.wall_time_s = self.clock() - session.start_time
        release_free_memory()
        history = self.history
        if completed and self.run_dir is not None and history is not None and history.rows:
            plot_learning_curve(
                self.run_dir / "history.parquet",
                self.run_dir / "plots" / "learning_curve.png",
                title=f"{self.algorithm.name} on {self.run_metadata.get('env_id', 'env')}",
            )

    def _execute_epoch(self) -> EpochStats:
        session = self._session
        assert session is not None  # callers open one first
        with self._closing_on_error():
            stats = self._epoch(session)
        if stats.stop_reason:
            self._end_session(completed=True)
        return stats

    def _epoch(self, session: _Session) -> EpochStats:
        cfg = self.config
        c = self.counters
        reporter = session.reporter
        tensorboard = session.tensorboard
        finished = self._stopped_before_resume or self._budget_spent()
        self._stopped_before_resume = ""
        if finished:
            return self._finished_epoch(session, finished)
        stop_reason = ""
        c.epoch += 1
        epoch_start = c.env_step
        collected = CollectStats()
        update_metrics: dict[str, float] = {}
        self._epoch_test_stats = None
        self._epoch_end_step = min(epoch_start + cfg.epoch_num_steps, cfg.max_steps)
        while (
            c.env_step - epoch_start < cfg.epoch_num_steps
            and c.env_step < cfg.max_steps
            and (cfg.max_episodes is None or c.episode < cfg.max_episodes)
        ):
            stats, metrics = self.training_step()
            if metrics:
                update_metrics = metrics
            log_acc = session.log_acc
            for key, value in metrics.items():
                log_acc.setdefault(key, []).append(value)
            _accumulate(collected, log_acc, stats)
            restarts = self.collector.env_restarts if self.collector else 0
            if restarts != self._seen_env_restarts:
                c.env_restarts += restarts - self._seen_env_restarts
                self._seen_env_restarts = restarts
                log_acc["train/env_restarts"] = [float(c.env_restarts)]
            if c.env_step - session.last_log_step >= cfg.log_interval_steps:
                self._log_training(log_acc, session.start_time, session.start_step, tensorboard)
                session.log_acc = {}
                session.last_log_step = c.env_step
            reporter.update(
                c.env_step,
                mean_return=self._recent_mean(),
                best_return=self._best_or_none(),
                extra=self.env_parameters.describe() if self.env_parameters else None,
            )
            if self._training_reached_target():
                stop_reason = "stop_fn (target_reward on training episodes)"
                break
            if self._training_looks_solved() and self._test_step(reporter, tensorboard):
                stop_reason = "stop_fn (test in training)"
                break
        self._epoch_end_step = None
        # A collection thread waits at the epoch's end; what it collected past a stop rule
        # that fired mid-epoch is counted, so the checkpoint below holds all of it.
        leftover = self._pause_collection()
        if leftover.env_steps:
            self._count_collection(leftover)
            _accumulate(collected, session.log_acc, leftover)
        if session.log_acc:
            self._log_training(session.log_acc, session.start_time, session.start_step, tensorboard)
            session.log_acc = {}
            session.last_log_step = c.env_step
        # An epoch ends with a test step as the cadence says, unless one just ran at this
        # very step; the last epoch of a run always does, one stopped by its training
        # returns too.
        if self._last_test_step != c.env_step:
            episodes = self._test_episodes() if stop_reason else self._epoch_test_episodes(session)
            if episodes and self._test_step(reporter, tensorboard, episodes) and not stop_reason:
                stop_reason = "stop_fn"
        stop_reason = stop_reason or self._stop_rules()
        c.wall_time_s = self.clock() - session.start_time
        if self.history is not None:
            # Recorded so that `rlfleet plot` can tell a run that solved its task
            # from one that was cut short.
            self.history.stop_reason = stop_reason or None
            # Committed before the checkpoint: every checkpoint finds its rows on disk, and
            # rows past the latest checkpoint (a crash before it) are dropped on resume.
            try:
                self.history.flush()
            except BaseException as error:
                self._history_flush_error = error
                raise
        c.stop_reason = stop_reason
        interval = cfg.checkpoint_interval_steps
        if stop_reason or interval is None or c.env_step - session.last_checkpoint_step >= interval:
            path = self.save_checkpoint_fn(c.epoch, c.env_step, self.algorithm.gradient_steps)
            session.last_checkpoint_step = c.env_step
            if self.logger is not None:
                self.logger.save_data(
                    c.epoch, c.env_step, self.algorithm.gradient_steps, lambda *_: path
                )
        if cfg.verbose:
            reporter.epoch_summary(
                c.epoch, c.env_step, self._epoch_metrics(session.start_time, session.start_step)
            )
        self._stop_reason = stop_reason
        epoch_stats = EpochStats(
            epoch=c.epoch,
            train_collect_stat=collected,
            test_collect_stat=self._epoch_test_stats,
            training_stat=update_metrics,
            info_stat=self._info_stats(session),
            stop_reason=stop_reason,
        )
        log_info = getattr(self.logger, "log_info_data", None)
        if log_info is not None:
            log_info(epoch_stats.info_stat.as_log_data(), c.epoch)
        return epoch_stats

    def _info_stats(self, session: _Session) -> InfoStats:
        c = self.counters
        total = self.clock() - session.start_time
        return InfoStats(
            gradient_step=self.algorithm.gradient_steps,
            best_score=c.best_score,
            best_env_step=c.best_env_step,
            train_step=c.env_step,
            train_episode=c.episode,
            timing=TimingStats(
                total_time=total, train_time=total - c.test_time_s, test_time=c.test_time_s
            ),
        )

    @property
    def _result(self) -> TrainResult:
        c = self.counters
        return TrainResult(
            best_score=c.best_score,
            best_env_step=c.best_env_step,
            env_steps=c.env_step,
            gradient_steps=self.algorithm.gradient_steps,
            episodes=c.episode,
            epochs=c.epoch,
            wall_time_s=c.wall_time_s,
            test_time_s=c.test_time_s,
            stop_reason=self._stop_reason,
            run_dir=self.run_dir,
            step_unit=self.step_unit,
        )

    def _add_episodes(self, stats: CollectStats) -> None:
        """Add a training step's finished episodes to the recent ones and, with
        ``log_episodes``, one history row each (:func:`rlfleet.logging.history.episode_row`)."""
        if self.history is None or not self.config.log_episodes:
            self.recent_returns.extend(stats.episode_returns)
            self.recent_lengths.extend(stats.episode_lengths)
            return
        c = self.counters
        first = c.episode - stats.episodes + 1
        session = self._session
        elapsed = c.wall_time_s if session is None else self.clock() - session.start_time
        for i, episode_return in enumerate(stats.episode_returns):
            self.recent_returns.append(episode_return)
            length = stats.episode_lengths[i] if i < len(stats.episode_lengths) else None
            self.history.append(
                episode_row(
                    env_step=c.env_step,
                    epoch=c.epoch,
                    gradient_step=self.algorithm.gradient_steps,
                    episode=first + i,
                    episode_return=episode_return,
                    length=length,
                    return_mean=float(np.mean(self.recent_returns)),
                    time_s=elapsed,
                )
            )
        self.recent_lengths.extend(stats.episode_lengths)

    def _training_reached_target(self) -> bool:
        """``target_reward_episodes: training``: has the mean return of the last
        ``reward_buffer_size`` training episodes reached ``target_reward``?"""
        cfg = self.config
        recent = self._recent_mean()
        return (
            cfg.target_reward_episodes == "training"
            and cfg.target_reward is not None
            and recent is not None
            and recent >= cfg.target_reward
        )

    def _training_looks_solved(self) -> bool:
        """``test_in_training``: do the last ``reward_buffer_size`` training episodes
        satisfy ``stop_fn``?"""
        recent = self._recent_mean()
        return (
            self.config.test_in_training
            and self.stop_fn is not None
            and recent is not None
            and len(self.recent_returns) == self.recent_returns.maxlen
            and self._last_test_step != self.counters.env_step
            and bool(self.stop_fn(recent))
        )

    def _budget_spent(self) -> str:
        """The budget or patience rule (:data:`_BUDGET_RULES`) that holds already (``""``
        if none does)."""
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
        return ""

    def _finished_epoch(self, session: _Session, stop_reason: str) -> EpochStats:
        """End a session that has nothing left to train: a resumed run that had already
        finished, or one whose budget the resume did not raise. No epoch is counted, no test
        runs and no checkpoint is written; the history gets its stop reason back, and the
        checkpoints their rotation if the last save was cut short before it."""
        self._stop_reason = stop_reason
        if self.checkpoints is not None:
            self.checkpoints.prune()
        if self.history is not None:
            self.history.stop_reason = stop_reason
            self.history.flush()
        return EpochStats(
            epoch=self.counters.epoch,
            train_collect_stat=CollectStats(),
            test_collect_stat=None,
            training_stat={},
            info_stat=self._info_stats(session),
            stop_reason=stop_reason,
        )

    def _stop_rules(self) -> str:
        cfg = self.config
        c = self.counters
        spent = self._budget_spent()
        if spent:
            return spent
        if (
            cfg.plateau_reduce_patience is not None
            and c.tests_since_reduce >= cfg.plateau_reduce_patience
        ):
            self.algorithm.lr_scale *= cfg.plateau_reduce_factor
            c.tests_since_reduce = 0
        return ""

    @property
    def tests_steer_training(self) -> bool:
        """Whether test scores can change what training does: a stop rule on them
        (``stop_fn``, ``target_reward`` on test episodes), a patience rule, or a hook that sees
        test steps (``test_fn``, ``test_result_fn``). Such runs keep one test step per epoch
        unless ``test_interval_steps`` is set (see :mod:`rlfleet.train.cadence`)."""
        cfg = self.config
        return (
            self.stop_fn is not None
            or cfg.early_stop_patience is not None
            or cfg.plateau_reduce_patience is not None
            or self.test_fn is not None
            or self.test_result_fn is not None
        )

    def _epoch_test_episodes(self, session: _Session) -> int:
        """Test episodes for the test step the epoch that just ended closes with; 0: none
        (see :mod:`rlfleet.train.cadence`)."""
        cfg = self.config
        c = self.counters
        last_epoch = bool(self._budget_spent())
        if cfg.test_interval_steps is not None:
            due = interval_reached(c.env_step, session.last_test_step, cfg.test_interval_steps)
            return self._test_episodes() if due or last_epoch else 0
        if self.evaluator is None or self.tests_steer_training or not self.test_steps_independent:
            return self._test_episodes()
        choices = (
            ADAPTIVE_TEST_EPISODES
            if cfg.test_step_num_episodes is None
            else (cfg.test_step_num_episodes,)
        )
        return adaptive_test_episodes(
            elapsed_s=self.clock() - session.start_time,
            test_s=c.test_time_s,
            last=session.last_test_cost,
            choices=choices,
            max_share=cfg.test_time_share,
            must=last_epoch or not session.tested,
        )

    def _test_episodes(self) -> int:
        """``test_step_num_episodes``, or its default when unset."""
        episodes = self.config.test_step_num_episodes
        return DEFAULT_TEST_EPISODES if episodes is None else episodes

    def _test_step(
        self, reporter: ProgressReporter, tensorboard: Any, num_episodes: int | None = None
    ) -> bool:
        """Run ``num_episodes`` test episodes (None: ``test_step_num_episodes``, or its
        default); returns True when ``stop_fn`` says the best score so far is good enough.

        Without test envs the recent training episodes are scored instead (see
        :meth:`_score_training`)."""
        c = self.counters
        self._last_test_step = c.env_step
        session = self._session
        if session is not None:
            session.last_test_step = c.env_step
            session.tested = True
        if self.evaluator is None:
            return self._score_training(reporter, tensorboard)
        if self.test_fn is not None:
            self.test_fn(c.epoch, c.env_step)
        episodes = self._test_episodes() if num_episodes is None else num_episodes
        t0 = self.clock()
        raw = self.evaluator.run(episodes)
        stats = raw
        if self.multi_agent_return_reduction is not None:
            stats = EvalStats(
                returns=np.asarray(self.multi_agent_return_reduction(raw.returns)),
                lengths=raw.lengths,
            )
        self._epoch_test_stats = stats
        score = float(self.compute_score_fn(stats))
        self._rank(score)
        test_s = self.clock() - t0
        c.test_time_s += test_s
        if session is not None:
            session.last_test_cost = MeasuredCost(seconds=test_s, episodes=episodes)
        row = {
            "test/return_mean": stats.mean,
            "test/return_std": stats.std,
            "test/episode_length": float(np.mean(stats.lengths)),
            "test/score": score,
            "test/best_score": c.best_score,
            "time/test_s": test_s,
            "time/test_share": self._test_share(session),
            **self._test_metrics(raw),
        }
        self._last_test_return = stats.mean
        self._write_row(row, tensorboard, kind="test")
        return self._after_score(score, reporter)

    def _score_training(self, reporter: ProgressReporter, tensorboard: Any) -> bool:
        """The test step of a loop without test envs: ``compute_score_fn`` scores the last
        ``reward_buffer_size`` training episodes, the best score and ``save_best_fn`` follow
        that score, and ``stop_fn`` judges the best of them. Nothing happens before a training
        episode has ended."""
        if not self.recent_returns:
            return False
        returns = np.asarray(self.recent_returns, dtype=np.float64)
        lengths = np.asarray(self.recent_lengths, dtype=np.float64)
        if lengths.shape != returns.shape:  # a checkpoint that predates recent_lengths
            lengths = np.full(returns.shape, np.nan)
        score = float(self.compute_score_fn(EvalStats(returns=returns, lengths=lengths)))
        self._rank(score)
        self._write_row(
            {"train/score": score, "train/best_score": self.counters.best_score}, tensorboard
        )
        return self._after_score(score, reporter)

    def _rank(self, score: float) -> None:
        """Keep the best score, and call ``save_best_fn`` on a new best."""
        c = self.counters
        if score > c.best_score:
            c.best_score = score
            c.best_env_step = c.env_step
            c.tests_since_best = 0
            c.tests_since_reduce = 0
            self.save_best_fn(self.algorithm)
        elif (
            self.config.divergence_monitoring_steps is None
            or c.env_step >= self.config.divergence_monitoring_steps
        ):
            c.tests_since_best += 1
            c.tests_since_reduce += 1

    def _after_score(self, score: float, reporter: ProgressReporter) -> bool:
        c = self.counters
        reporter.update(c.env_step, mean_return=self._recent_mean(), best_return=c.best_score)
        if self.test_result_fn is not None:
            self.test_result_fn(c.epoch, c.env_step, score)
        # Tianshou 2 judges the best score so far (``stop_fn(best_score)``), not this one.
        return self.stop_fn is not None and bool(self.stop_fn(c.best_score))

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
        elapsed = self.clock() - start_time
        row["time/elapsed_s"] = elapsed
        row["time/steps_per_s"] = (self.counters.env_step - start_step) / max(elapsed, 1e-9)
        row["time/test_share"] = self._test_share(self._session)
        self._write_row(row, tensorboard, update_keys=acc.keys() - _COLLECTION_KEYS)

    def _write_row(
        self,
        metrics: Mapping[str, float | int | None],
        tensorboard: Any,
        *,
        kind: Literal["train", "test"] = "train",
        update_keys: Set[str] = frozenset(),
    ) -> None:
        """Add one row to the history, TensorBoard and ``logger``. ``kind`` and
        ``update_keys`` (the update steps' metrics among ``metrics``) tell the logger's
        methods apart (see :mod:`rlfleet.logging.loggers`)."""
        c = self.counters
        counters: dict[str, float | int | None] = {
            "env_step": c.env_step,
            "epoch": c.epoch,
            "gradient_step": self.algorithm.gradient_steps,
            "episode": c.episode,
        }
        row = {**counters, **metrics}
        if self.history is not None:
            self.history.append(row)
        if tensorboard is not None:
            tensorboard.write(metrics, c.env_step)
        if self.logger is None:
            return
        if kind == "test":
            self.logger.log_test_data(row, c.env_step)
            return
        update = {k: v for k, v in metrics.items() if k in update_keys}
        if update:
            self.logger.log_update_data({**counters, **update}, self.algorithm.gradient_steps)
        self.logger.log_train_data(
            {**counters, **{k: v for k, v in metrics.items() if k not in update_keys}},
            c.env_step,
        )

    def _test_share(self, session: _Session | None) -> float:
        """The share of the run's wall time so far spent in test steps."""
        c = self.counters
        elapsed = c.wall_time_s if session is None else self.clock() - session.start_time
        return c.test_time_s / elapsed if elapsed > 0 else 0.0

    def _epoch_metrics(self, start_time: float, start_step: int) -> dict[str, float]:
        out: dict[str, float] = {}
        recent = self._recent_mean()
        if recent is not None:
            out["train/return_mean"] = recent
        if self._last_test_return is not None:
            out["test/return_mean"] = self._last_test_return
        if self._best_or_none() is not None:
            scored = "test" if self.evaluator is not None else "train"
            out[f"{scored}/best_score"] = self.counters.best_score
        elapsed = self.clock() - start_time
        out["time/steps_per_s"] = (self.counters.env_step - start_step) / max(elapsed, 1e-9)
        return out

    def _tensorboard(self) -> Any:
        """Where the history's rows are mirrored (TensorBoard, W&B), or None."""
        mirrors: list[Mirror] = []
        if self.config.tensorboard and self.run_dir is not None:
            mirrors.append(TensorBoardWriter(self.run_dir / "tensorboard"))
        if self.config.monitor_session is not None:
            mirrors.append(
                WandbWriter(self.config.monitor_session, self.run_dir, self.run_metadata)
            )
        if not mirrors:
            return None
        return mirrors[0] if len(mirrors) == 1 else Mirrors(mirrors)

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
            "recent_lengths": [int(n) for n in self.recent_lengths],
            "evaluator": None if self.evaluator is None else self.evaluator.state_dict(),
        }

    def load_loop_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`loop_state` output; history rows after the checkpoint are dropped."""
        self.counters = _Counters(**state["trainer"])
        stopped = self.counters.stop_reason
        self._stopped_before_resume = "" if stopped in _BUDGET_RULES else stopped
        self.recent_returns.extend(state["recent_returns"])
        self.recent_lengths.extend(state.get("recent_lengths", []))
        if self.evaluator is not None and state["evaluator"] is not None:
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
        self._stop_collection()
        if self.train_envs is not None:
            self.train_envs.close()
        if self.test_envs is not None:
            self.test_envs.close()

    def resume(self) -> dict[str, Any]:
        """Continue from the latest checkpoint in ``run_dir``: counters, algorithm state,
        optimiser, RNG, and the history (rows after the checkpoint are dropped).

        Returns the checkpoint's state, for subclasses that keep more in it."""
        if self.run_dir is None:
            raise ConfigError("resuming needs a run_dir")
        state: dict[str, Any]
        # Read-only: nothing is written before the checkpoint is loaded and matched.
        reader = CheckpointManager(self.run_dir / "checkpoints", readonly=True)
        state, metadata = reader.load_latest(state_schema=self.state_schema)
        if metadata.get("algorithm") != self.algorithm.name:
            raise ConfigError(
                f"checkpoint in {self.run_dir} is for {metadata.get('algorithm')!r}, "
                f"not {self.algorithm.name!r}"
            )
        try:
            self.load_checkpoint_state(state)
        except RlfleetError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
            # Below the schema's top-level keys the state is read by each part that wrote it
            # (the algorithm, the collector, ...): what does not fit there is still a bad
            # checkpoint, not a bug to show as a traceback.
            raise CheckpointError(
                f"{reader.root}: the latest checkpoint's state.json does not fit this "
                f"{self.algorithm.name} trainer ({type(error).__name__}: {error})"
            ) from error
        return state

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`checkpoint_state` output (subclasses extend both together)."""
        self.algorithm.load_state_dict(state["algorithm"])
        if self.collector is not None and state.get("collector") is not None:
            self.collector.load_state_dict(state["collector"])
        self._envs_stepped = False
        # A run that gained signals or parameters since the checkpoint starts them fresh.
        if self.reward_signals is not None and "reward_signals" in state:
            self.reward_signals.load_state_dict(state["reward_signals"])
        if self.env_parameters is not None and "env_parameters" in state:
            self.env_parameters.load_state_dict(state["env_parameters"])
        self.load_loop_state(state)


def _accumulate(
    collected: CollectStats, log_acc: dict[str, list[float]], stats: CollectStats
) -> None:
    """Add a collection's steps and finished episodes to the epoch's and the next history
    row's."""
    collected.env_steps += stats.env_steps
    collected.episode_returns.extend(stats.episode_returns)
    collected.episode_lengths.extend(stats.episode_lengths)
    for r in stats.episode_returns:
        log_acc.setdefault("train/return", []).append(r)
    for n in stats.episode_lengths:
        log_acc.setdefault("train/episode_length", []).append(float(n))
