"""Console progress for a training run: a live bar on a terminal, one line per epoch.

:class:`ProgressReporter` draws a rich progress bar (env steps done/total, env steps/s,
mean and best return, elapsed time, ETA) when the console is a terminal, and prints a
one-line summary per epoch either way, so a log file piped from ``rlfleet train`` gets a
readable line per epoch instead of bar redraws. ``verbose=False`` silences everything.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from rlfleet.logging.history import ENV_STEPS

SUMMARY_KEYS = ("train/return_mean", "test/return_mean", "test/best_return")
"""Metrics an epoch summary shows, in this order, when present; the rest stay in the history
so that the summary fits on one line."""

STEPS_PER_S_KEY = "time/steps_per_s"

_PUSH_INTERVAL_S = 0.2
"""Minimum time between pushes to the bar: update() runs every training step, and rich keeps a
speed sample per push, so pushing each call would cost time and memory for no visible change."""


class ProgressReporter:
    """Progress bar and per-epoch summary lines for one training run.

    Call :meth:`start` (with the env steps already done when resuming), :meth:`update`
    every training step, :meth:`epoch_summary` once per epoch and :meth:`close` at the end;
    or use it as a context manager, which closes it on exit.
    """

    def __init__(
        self,
        total_steps: int | None,
        *,
        show_progress: bool = True,
        verbose: bool = True,
        console: Console | None = None,
        description: str = "training",
        unit: str = ENV_STEPS,
        returns: bool = True,
    ) -> None:
        """Set up the reporter; nothing is drawn until :meth:`start`.

        Args:
            total_steps: env steps the run will take; ``None`` for an open-ended run, which
                gets an indeterminate bar and no ETA.
            show_progress: draw the live bar (only ever on a terminal).
            verbose: print anything at all; ``False`` silences bar, summaries and messages.
            console: where to print; a new stdout console by default.
            description: label at the left of the bar.
            unit: what the bar counts (``env steps``; an offline run counts ``gradient steps``,
                a multi-agent run ``episodes``).
            returns: show the mean and best return (off for work that is not training).
        """
        self.total_steps = total_steps
        self.verbose = verbose
        self.console = console if console is not None else Console()
        self.description = description
        self.unit = unit
        self.returns = returns
        self.show_bar = verbose and show_progress and self.console.is_terminal
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._started = False
        self._initial_steps = 0
        self._start_time = 0.0
        self._last_push = 0.0
        self._env_step = 0
        self._mean_return: float | None = None
        self._best_return: float | None = None
        self._extra = ""

    def start(self, initial_steps: int = 0) -> None:
        """Start the clock and show the bar; `initial_steps` are env steps done before a resume.

        Raises:
            RuntimeError: the reporter was already started.
        """
        if self._started:
            raise RuntimeError("ProgressReporter.start() called twice; create a new reporter")
        self._started = True
        self._initial_steps = initial_steps
        self._env_step = initial_steps
        self._start_time = self._last_push = time.monotonic()
        if not self.show_bar:
            return
        self._progress = Progress(*self._columns(), console=self.console, refresh_per_second=5)
        self._task = self._progress.add_task(
            self.description, total=self.total_steps, completed=initial_steps
        )
        # The text columns read these task fields, so set them before the first render.
        self._push(self._start_time)
        self._progress.start()

    def update(
        self,
        env_step: int,
        *,
        mean_return: float | None = None,
        best_return: float | None = None,
        extra: str | None = None,
    ) -> None:
        """Record progress; cheap enough to call every training step.

        A ``None`` return or `extra` keeps the previous value on the bar. Starts the
        reporter with no initial steps if :meth:`start` was not called.
        """
        if not self._started:
            self.start()
        self._env_step = env_step
        if mean_return is not None:
            self._mean_return = mean_return
        if best_return is not None:
            self._best_return = best_return
        if extra is not None:
            self._extra = extra
        if self._progress is None:
            return
        now = time.monotonic()
        if now - self._last_push >= _PUSH_INTERVAL_S:
            self._push(now)

    def epoch_summary(self, epoch: int, env_step: int, metrics: Mapping[str, float]) -> None:
        """Print one line for the epoch, unless quiet.

        For example ``epoch 3 | step 24,576 | train/return_mean 187.2 | test/return_mean
        500.0 | 9,812 steps/s`` (on one line). Shows the :data:`SUMMARY_KEYS` present in
        `metrics`, then ``time/steps_per_s`` (or the reporter's own measure when absent);
        other metrics are left out to keep one line. A unit other than env steps is named:
        ``epoch 1 | gradient step 1,000 | ... | 1,490 gradient steps/s`` (offline runs).
        """
        if not self.verbose:
            return
        counter, rate = ("step", "steps/s") if self.unit == ENV_STEPS else _named(self.unit)
        parts = [f"epoch {epoch}", f"{counter} {env_step:,}"]
        parts += [f"{key} {_format_number(metrics[key])}" for key in SUMMARY_KEYS if key in metrics]
        steps_per_s = metrics.get(STEPS_PER_S_KEY)
        if steps_per_s is None and self._started:
            steps_per_s = self._steps_per_s(time.monotonic(), env_step)
        if steps_per_s is not None:
            parts.append(f"{steps_per_s:,.0f} {rate}")
        self._print(" | ".join(parts))

    def message(self, text: str) -> None:
        """Print one line of text (above the bar when one is shown), unless quiet."""
        if self.verbose:
            self._print(text)

    def close(self) -> None:
        """Draw the final state of the bar and stop it; calling again does nothing."""
        if self._progress is None:
            return
        self._push(time.monotonic())
        self._progress.stop()
        self._progress = None

    def __enter__(self) -> ProgressReporter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _columns(self) -> list[ProgressColumn]:
        columns: list[ProgressColumn] = [
            TextColumn("{task.description}", style="progress.description", markup=False),
            BarColumn(),
            _CountColumn(self.unit),
            TextColumn("{task.fields[rate]}", markup=False),
        ]
        if self.returns:
            columns += [
                TextColumn("{task.fields[mean]}", markup=False),
                TextColumn("{task.fields[best]}", markup=False),
            ]
        columns += [TimeElapsedColumn()]
        if self.total_steps is not None:
            columns.append(TimeRemainingColumn())
        columns.append(TextColumn("{task.fields[extra]}", markup=False))
        return columns

    def _push(self, now: float) -> None:
        assert self._progress is not None
        assert self._task is not None
        self._last_push = now
        self._progress.update(
            self._task,
            completed=self._env_step,
            rate=f"{self._steps_per_s(now, self._env_step):,.0f} {self._rate_unit}",
            mean=f"return {_format_optional(self._mean_return)}",
            best=f"best {_format_optional(self._best_return)}",
            extra=self._extra,
        )

    @property
    def _rate_unit(self) -> str:
        """``steps/s`` for env steps, ``episodes/s`` for episodes."""
        return f"{self.unit.split()[-1]}/s"

    def _steps_per_s(self, now: float, env_step: int) -> float:
        elapsed = now - self._start_time
        return (env_step - self._initial_steps) / elapsed if elapsed > 0 else 0.0

    def _print(self, text: str) -> None:
        # soft_wrap: a file console is 80 columns wide and would otherwise split the line.
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)


class _CountColumn(ProgressColumn):
    """``24,576/100,000 env steps``, or ``24,576 env steps`` for an open-ended run."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        done = f"{int(task.completed):,}"
        if task.total is not None:
            done += f"/{int(task.total):,}"
        return Text(f"{done} {self.unit}", style="progress.download")


def _named(unit: str) -> tuple[str, str]:
    """``("gradient step", "gradient steps/s")`` for the unit ``gradient steps``."""
    return unit.removesuffix("s"), f"{unit}/s"


def _format_number(value: float) -> str:
    """One decimal for returns in the tens and up; three significant digits below that."""
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"


def _format_optional(value: float | None) -> str:
    return "—" if value is None else _format_number(value)
