"""Loggers for a trainer's ``logger=`` argument: Tianshou's logger methods, rlfleet's rows.

A trainer always keeps its own record of a run in ``run_dir`` (the parquet history, and
TensorBoard files with ``TrainerConfig.tensorboard``). ``logger=`` adds one more sink for
the same rows, for code that brings a logger object, as Tianshou's trainers take one. Any
object with the four methods of :class:`Logger` (those of Tianshou's ``BaseLogger`` that its
trainers call, with the same arguments) is accepted; rlfleet offers :class:`HistoryLogger`
(a parquet history anywhere), :class:`TensorBoardLogger` and :class:`WandbLogger`.

What the trainer passes (each ``log_data`` is one history row: the counters ``env_step``,
``epoch``, ``gradient_step``, ``episode`` and namespaced metrics):

``log_train_data(log_data, step)``
    The training episodes' and the loop's metrics (``train/…``, ``time/…``) at every
    ``log_interval_steps``, the training-return score of a test step without test envs,
    and an offline run's ``dataset/…`` statistics; ``step`` is the env step.
``log_update_data(log_data, step)``
    The update steps' metrics (``loss/…`` and each algorithm's statistics) at the same
    interval, averaged over it; ``step`` is the gradient step.
``log_test_data(log_data, step)``
    Every test step's ``test/…`` metrics; ``step`` is the env step.
``save_data(epoch, env_step, gradient_step, save_checkpoint_fn)``
    Right after each checkpoint the trainer wrote (see ``save_checkpoint_fn``);
    ``save_checkpoint_fn`` returns that checkpoint's path without writing another.
``log_info_data(log_data, step)`` (optional)
    Once per epoch, the epoch's counters and best score; ``step`` is the epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol, cast, runtime_checkable

from rlfleet.errors import ConfigError
from rlfleet.logging.history import INT_COLUMNS, STEP_KEY, History
from rlfleet.logging.mirrors import Mirror, WandbWriter
from rlfleet.logging.tensorboard import TensorBoardWriter

LogData = Mapping[str, float | int | None]
"""One row handed to a logger: counters and namespaced metrics."""
CheckpointPathFn = Callable[[int, int, int], "str | None"]
"""``save_checkpoint_fn(epoch, env_step, gradient_step) -> path`` as :meth:`Logger.save_data`
receives it."""


@runtime_checkable
class Logger(Protocol):
    """What a trainer's ``logger=`` must offer (Tianshou's ``BaseLogger`` methods)."""

    def log_train_data(self, log_data: LogData, step: int) -> None:
        """Training metrics at env step ``step``."""

    def log_test_data(self, log_data: LogData, step: int) -> None:
        """A test step's metrics at env step ``step``."""

    def log_update_data(self, log_data: LogData, step: int) -> None:
        """Update-step metrics at gradient step ``step``."""

    def save_data(
        self,
        epoch: int,
        env_step: int,
        gradient_step: int,
        save_checkpoint_fn: CheckpointPathFn | None = None,
    ) -> None:
        """A checkpoint was written at these counters."""


LOGGER_METHODS = ("log_train_data", "log_test_data", "log_update_data", "save_data")


def check_logger(logger: object) -> Logger:
    """``logger`` as a :class:`Logger`.

    Raises:
        ConfigError: it lacks one of the four methods (or one is not callable).
    """
    missing = [name for name in LOGGER_METHODS if not callable(getattr(logger, name, None))]
    if missing:
        raise ConfigError(
            "logger: expected an object with "
            f"{', '.join(LOGGER_METHODS)} (e.g. rlfleet.logging.HistoryLogger), "
            f"got {type(logger).__name__} without {', '.join(missing)}"
        )
    return cast(Logger, logger)


class HistoryLogger:
    """Writes every row it is given to a parquet history at ``path`` (see
    :class:`~rlfleet.logging.history.History`), flushed at each checkpoint and by
    :meth:`finalize`. Read it back with :func:`~rlfleet.logging.history.read_history`."""

    def __init__(self, path: str | Path) -> None:
        self.history = History(path)

    def log_train_data(self, log_data: LogData, step: int) -> None:
        self.history.append(log_data)

    def log_test_data(self, log_data: LogData, step: int) -> None:
        self.history.append(log_data)

    def log_update_data(self, log_data: LogData, step: int) -> None:
        self.history.append(log_data)

    def save_data(
        self,
        epoch: int,
        env_step: int,
        gradient_step: int,
        save_checkpoint_fn: CheckpointPathFn | None = None,
    ) -> None:
        self.history.flush()

    def finalize(self) -> None:
        """Write the rows logged since the last checkpoint."""
        self.history.flush()


class _MirrorLogger:
    """A logger that hands every row to a writer (``write(data, step)``, ``close()``), and
    records each checkpoint as ``save/epoch`` and ``save/gradient_step`` at its env step."""

    writer: Mirror

    def _write(self, log_data: LogData, step: int) -> None:
        self.writer.write(log_data, step)

    def log_train_data(self, log_data: LogData, step: int) -> None:
        self._write(log_data, step)

    def log_test_data(self, log_data: LogData, step: int) -> None:
        self._write(log_data, step)

    def log_update_data(self, log_data: LogData, step: int) -> None:
        self._write(log_data, step)

    def save_data(
        self,
        epoch: int,
        env_step: int,
        gradient_step: int,
        save_checkpoint_fn: CheckpointPathFn | None = None,
    ) -> None:
        self._write({"save/epoch": epoch, "save/gradient_step": gradient_step}, env_step)

    def finalize(self) -> None:
        """Flush and close what the writer holds open."""
        self.writer.close()


class TensorBoardLogger(_MirrorLogger):
    """Writes the metrics of every row as TensorBoard scalars in ``log_dir``: training and
    test metrics against the env step, update metrics against the gradient step (as
    Tianshou's ``TensorboardLogger`` does). Needs the ``tensorboard`` extra.

    Raises:
        MissingDependencyError: the ``tensorboard`` package is not installed.
    """

    def __init__(self, log_dir: str | Path) -> None:
        self.writer = TensorBoardWriter(log_dir)

    def _write(self, log_data: LogData, step: int) -> None:
        # The counters are the x axes already; as scalars they would only plot y = x.
        self.writer.write({k: v for k, v in log_data.items() if k not in INT_COLUMNS}, step)


class WandbLogger(_MirrorLogger):
    """Logs every row to a Weights & Biases run named ``name``, its files under ``run_dir``
    (None: W&B's default), with ``config`` as the run's config. Needs the ``wandb`` extra;
    ``WANDB_MODE=offline`` keeps the run on this machine.

    W&B steps only go forward, so every row is logged at its env step (update rows too: their
    gradient step is one of their values, ``gradient_step``), which is the x axis the
    training and test metrics share.

    Raises:
        MissingDependencyError: the ``wandb`` package is not installed.
        ConfigError: W&B could not start a run.
    """

    def __init__(
        self,
        name: str,
        run_dir: str | Path | None = None,
        config: Mapping[str, object] | None = None,
    ) -> None:
        self.writer = WandbWriter(name, run_dir, config)

    def _write(self, log_data: LogData, step: int) -> None:
        env_step = log_data.get(STEP_KEY)
        self.writer.write(log_data, int(env_step) if env_step is not None else step)
