"""Run logging: the parquet training history, console progress, plots and TensorBoard.

- :class:`History` / :func:`read_history` — one row of metrics per logged step, and one
  per finished training episode, written atomically to ``history.parquet`` in the run dir
  and reloaded on resume.
- :class:`ProgressReporter` — live progress bar on a terminal, one line per epoch.
- :func:`plot_learning_curve` / :func:`plot_runs` — PNG plots of one run or several;
  :func:`compare_runs` — the seeds of each config aggregated (IQM or mean, bootstrap CI).
- :class:`TensorBoardWriter` — optional mirror of the history as TensorBoard scalars;
  :class:`WandbWriter` — optional mirror to a Weights & Biases run.
- :class:`Logger` — what a trainer's ``logger=`` takes (Tianshou's logger methods);
  :class:`HistoryLogger`, :class:`TensorBoardLogger` and :class:`WandbLogger` offer it.

Metric names follow the fixed namespace ``train/…``, ``test/…``, ``loss/…``, ``time/…``, and
``episode/…`` on the rows of finished training episodes.
"""

from rlfleet.logging.history import History, read_history
from rlfleet.logging.loggers import HistoryLogger, Logger, TensorBoardLogger, WandbLogger
from rlfleet.logging.mirrors import WandbWriter
from rlfleet.logging.plots import compare_runs, plot_learning_curve, plot_runs
from rlfleet.logging.progress import ProgressReporter
from rlfleet.logging.tensorboard import TensorBoardWriter

__all__ = [
    "History",
    "HistoryLogger",
    "Logger",
    "ProgressReporter",
    "TensorBoardLogger",
    "TensorBoardWriter",
    "WandbLogger",
    "WandbWriter",
    "compare_runs",
    "plot_learning_curve",
    "plot_runs",
    "read_history",
]
