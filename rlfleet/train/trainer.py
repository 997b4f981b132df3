"""The training loops.

Glossary (the vocabulary every rlfleet trainer shares, after Tianshou 2):

epoch
    A unit of progress of ``epoch_num_steps`` environment steps, ended by a test step,
    an epoch summary line, a history flush and a checkpoint.
training step
    One ``train_fn`` call, one collection step, one update step, and logging. An epoch
    holds as many training steps as fit in ``epoch_num_steps``.
collection step
    Stepping the training envs with the exploring policy. On-policy: one rollout of
    ``collection_step_num_env_steps`` steps (the algorithm's ``num_steps * num_envs`` unless
    given). Off-policy: that many steps into the replay buffer. Offline: none.
update step
    Learning from collected data. On-policy: ``algo.update(rollout)`` runs
    ``update_step_num_repetitions`` passes (the algorithm's ``num_epochs`` unless given) over
    minibatches of ``batch_size``. Off-policy: ``update_step_num_gradient_steps_per_sample``
    gradient steps per collected env step. It returns a dict of scalar metrics.
test step
    ``test_fn``, then ``test_step_num_episodes`` episodes of the greedy policy on the test
    envs, a score by ``compute_score_fn``, ``save_best_fn`` when the score is a new best,
    and the stop rules. ``test_in_training`` also runs a test step as soon as the training
    episodes' mean return satisfies ``stop_fn``, so a solved task stops without waiting for
    the end of the epoch.

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
``save_best_fn(algorithm: Algorithm) -> None``
    Called when a test score is a new best; default: save the policy to ``run_dir/best``.
``save_checkpoint_fn(epoch: int, env_step: int, gradient_step: int) -> str | None``
    Called at the end of every epoch; default: an atomic checkpoint in
    ``run_dir/checkpoints`` (returns its path).

Stop rules (xagents): ``target_reward`` (through the default ``stop_fn``), ``max_steps``,
``max_epochs``, ``early_stop_patience`` test steps without improvement; and
``plateau_reduce_patience`` test steps without improvement multiply the learning rate by
``plateau_reduce_factor``.

Metrics are namespaced: ``train/`` (episodes and algorithm statistics), ``loss/``,
``test/`` and ``time/``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv

from rlfleet import __version__
from rlfleet.algos.base import Algorithm
from rlfleet.collect.collector import Collector
from rlfleet.collect.evaluator import Evaluator
from rlfleet.config.fields import NonNegativeInt, PositiveInt
from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs.spaces import space_to_json
from rlfleet.errors import ConfigError
from rlfleet.logging.history import History
from rlfleet.logging.plots import plot_learning_curve
from rlfleet.logging.progress import ProgressReporter
from rlfleet.train.checkpoint import CheckpointManager
from rlfleet.types import CollectStats, EvalStats

TrainFn = Callable[[int, int], None]
TestFn = Callable[[int, int], None]
StopFn = Callable[[float], bool]
ComputeScoreFn = Callable[[EvalStats], float]
SaveBestFn = Callable[[Algorithm[Any]], None]
SaveCheckpointFn = Callable[[int, int, int], "str | None"]


@dataclass
class TrainerConfig:
    """Loop settings shared by every trainer (the ``trainer:`` section of a run config)."""

    max_steps: PositiveInt = 100_000
    """Budget of environment steps; schedules run from 0 to this."""
    max_epochs: PositiveInt | None = None
    """Stop after this many epochs (unlimited when unset)."""
    epoch_num_steps: PositiveInt = 10_000
    """Environment steps per epoch (one test step and one checkpoint per epoch)."""
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
    keep_checkpoints: NonNegativeInt = 3
    """Checkpoints kept in ``checkpoints/`` (0 keeps all)."""
    show_progress: bool = True
    """Show a progress bar when the output is a terminal."""
    verbose: bool = True
    """Print one summary line per epoch (false: print nothing)."""
    tensorboard: bool = False
    """Also write TensorBoard event files to ``run_dir/tensorboard``."""


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


class Trainer:
    """The training loop shared by all data regimes; subclasses define one training step.

    Args:
        algorithm: the algorithm to train.
        train_envs / test_envs: next-step-autoreset vector envs.
        config: loop settings (see :class:`TrainerConfig`).
        run_dir: where history, checkpoints, ``best/`` and plots go (none: nothing written).
        run_metadata: JSON-able description of the run stored in every checkpoint.
        seed: seeds the first reset of the train and test envs.
        The hooks are documented in the module docstring.
    """

    def __init__(
        self,
        algorithm: Algorithm[Any],
        train_envs: VectorEnv[Any, Any, Any],
        test_envs: VectorEnv[Any, Any, Any],
        config: TrainerConfig | None = None,
        *,
        run_dir: Path | None = None,
        run_metadata: dict[str, Any] | None = None,
        seed: int | None = None,
        train_fn: TrainFn | None = None,
        test_fn: TestFn | None = None,
        stop_fn: StopFn | None = None,
        compute_score_fn: ComputeScoreFn | None = None,
        save_best_fn: SaveBestFn | None = None,
        save_checkpoint_fn: SaveCheckpointFn | None = None,
        resume_from_log: bool = False,
    ) -> None:
        self.algorithm = algorithm
        self.train_envs = train_envs
        self.test_envs = test_envs
        self.config = config or TrainerConfig()
        self.run_dir = run_dir
        self.run_metadata = run_metadata or {}
        self.seed = seed
        self.train_fn = train_fn
        self.test_fn = test_fn
        target = self.config.target_reward
        self.stop_fn = stop_fn or (None if target is None else (lambda score: score >= target))
        self.compute_score_fn = compute_score_fn or (lambda stats: stats.mean)
        self.save_best_fn = save_best_fn or self._save_best
        self.save_checkpoint_fn = save_checkpoint_fn or self._save_checkpoint
        self.counters = _Counters()
        self._last_test_step = -1
        self._last_test_return: float | None = None
        self.recent_returns: deque[float] = deque(maxlen=20)
        self.collector = Collector(train_envs, algorithm, seed=seed)
        self.evaluator = Evaluator(
            test_envs, algorithm, seed=None if seed is None else seed + 10_000
        )
        self.checkpoints = (
            CheckpointManager(run_dir / "checkpoints", keep=self.config.keep_checkpoints or None)
            if run_dir
            else None
        )
        self.history = History(run_dir / "history.parquet") if run_dir else None
        if resume_from_log:
            self.resume()

    # ------------------------------------------------------------- subclasses
    def _training_step(self) -> tuple[CollectStats, dict[str, float]]:
        """One collection step and one update step."""
        raise NotImplementedError

    # ------------------------------------------------------------------- loop
    def run(self) -> TrainResult:
        """Train until a stop rule fires; returns a :class:`TrainResult`."""
        cfg = self.config
        c = self.counters
        reporter = ProgressReporter(
            cfg.max_steps,
            show_progress=cfg.show_progress,
            verbose=cfg.verbose,
            description=f"{self.algorithm.name}",
        )
        tensorboard = self._tensorboard()
        start_time = time.perf_counter() - c.wall_time_s
        start_step = c.env_step
        log_acc: dict[str, list[float]] = {}
        last_log_step = c.env_step
        stop_reason = ""
        reporter.start(c.env_step)
        try:
            while not stop_reason:
                c.epoch += 1
                epoch_start = c.env_step
                while c.env_step - epoch_start < cfg.epoch_num_steps and c.env_step < cfg.max_steps:
                    if self.train_fn is not None:
                        self.train_fn(c.epoch, c.env_step)
                    self.algorithm.set_progress(c.env_step / cfg.max_steps)
                    stats, metrics = self._training_step()
                    c.env_step += stats.env_steps
                    c.episode += stats.episodes
                    self.recent_returns.extend(stats.episode_returns)
                    for key, value in metrics.items():
                        log_acc.setdefault(key, []).append(value)
                    for r in stats.episode_returns:
                        log_acc.setdefault("train/return", []).append(r)
                    for n in stats.episode_lengths:
                        log_acc.setdefault("train/episode_length", []).append(float(n))
                    if c.env_step - last_log_step >= cfg.log_interval_steps:
                        self._log_training(log_acc, start_time, start_step, tensorboard)
                        log_acc = {}
                        last_log_step = c.env_step
                    reporter.update(
                        c.env_step,
                        mean_return=self._recent_mean(),
                        best_return=self._best_or_none(),
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
                self.save_checkpoint_fn(c.epoch, c.env_step, self.algorithm.gradient_steps)
                if self.history is not None:
                    self.history.flush()
                reporter.epoch_summary(
                    c.epoch, c.env_step, self._epoch_metrics(start_time, start_step)
                )
        finally:
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
        row = {
            "test/return_mean": stats.mean,
            "test/return_std": stats.std,
            "test/episode_length": float(np.mean(stats.lengths)),
            "test/score": score,
            "test/best_score": c.best_score,
            "time/test_s": time.perf_counter() - t0,
        }
        c.test_time_s += row["time/test_s"]
        self._last_test_return = stats.mean
        self._write_row(row, tensorboard)
        reporter.update(c.env_step, mean_return=self._recent_mean(), best_return=c.best_score)
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
        from rlfleet.logging.tensorboard import TensorBoardWriter

        return TensorBoardWriter(self.run_dir / "tensorboard")

    # ------------------------------------------------------------ persistence
    def checkpoint_state(self) -> dict[str, Any]:
        """Everything the trainer and algorithm need to continue this run."""
        return {
            "algorithm": self.algorithm.state_dict(),
            "trainer": asdict(self.counters),
            "recent_returns": list(self.recent_returns),
        }

    def checkpoint_metadata(self) -> dict[str, Any]:
        c = self.counters
        return {
            "rlfleet_version": __version__,
            "algorithm": self.algorithm.name,
            "observation_space": space_to_json(self.algorithm.observation_space),
            "action_space": space_to_json(self.algorithm.action_space),
            "config": asdict(self.algorithm.config),
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

    def _save_best(self, algorithm: Algorithm[Any]) -> None:
        if self.run_dir is None:
            return
        CheckpointManager(self.run_dir / "best", keep=1).save(
            {"algorithm": algorithm.state_dict()},
            self.checkpoint_metadata(),
            step=self.counters.env_step,
        )

    def resume(self) -> None:
        """Continue from the latest checkpoint in ``run_dir``: counters, algorithm state,
        optimiser, RNG, and the history (rows after the checkpoint are dropped)."""
        if self.checkpoints is None:
            raise ConfigError("resuming needs a run_dir")
        state, metadata = self.checkpoints.load_latest()
        if metadata.get("algorithm") != self.algorithm.name:
            raise ConfigError(
                f"checkpoint in {self.run_dir} is for {metadata.get('algorithm')!r}, "
                f"not {self.algorithm.name!r}"
            )
        self.algorithm.load_state_dict(state["algorithm"])
        self.counters = _Counters(**state["trainer"])
        self.recent_returns.extend(state["recent_returns"])
        if self.history is not None:
            self.history.truncate_after(self.counters.env_step)


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
        if algorithm.kind != "on_policy":
            raise ConfigError(
                "OnPolicyTrainer needs an on-policy algorithm, "
                f"got {algorithm.name} ({algorithm.kind})"
            )
        hp = algorithm.config
        num_envs = train_envs.num_envs
        steps = collection_step_num_env_steps or hp.num_steps * num_envs
        if steps % num_envs:
            raise ConfigError(
                f"collection_step_num_env_steps ({steps}) must be a multiple of "
                f"num_envs ({num_envs})"
            )
        # Algorithms without minibatches or epochs (A2C's default, ACER) leave these None.
        self.batch_size: int | None = batch_size or getattr(hp, "batch_size", None)
        self.update_step_num_repetitions: int | None = update_step_num_repetitions or getattr(
            hp, "num_epochs", None
        )
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
        stats = self.collector.collect_rollout(self.storage, self.collection_step_num_episodes)
        update: Callable[..., dict[str, float]] = self.algorithm.update
        metrics = update(
            self.storage,
            batch_size=self.batch_size,
            num_repetitions=self.update_step_num_repetitions,
        )
        return stats, metrics
