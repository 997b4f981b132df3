"""ProgressReporter: silent when quiet, summary lines only off a terminal, a bar on one."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from rlfleet.logging import ProgressReporter

METRICS = {
    "train/return_mean": 187.24,
    "test/return_mean": 500.0,
    "loss/policy": 0.123,
    "time/steps_per_s": 9812.4,
}


def _console(*, terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=80), out


def test_quiet_prints_nothing_even_on_a_terminal() -> None:
    console, out = _console(terminal=True)
    with ProgressReporter(1000, verbose=False, console=console) as reporter:
        reporter.start()
        for step in range(0, 1000, 100):
            reporter.update(step, mean_return=1.0, best_return=2.0)
        reporter.epoch_summary(1, 1000, METRICS)
        reporter.message("hello")
    assert out.getvalue() == ""


def test_non_terminal_prints_one_line_per_epoch_and_no_bar() -> None:
    console, out = _console(terminal=False)
    with ProgressReporter(100_000, console=console) as reporter:
        assert not reporter.show_bar
        reporter.start()
        for step in range(0, 24_577, 64):
            reporter.update(step, mean_return=187.2)
        reporter.epoch_summary(3, 24_576, METRICS)
        reporter.message("checkpoint saved")
    lines = out.getvalue().splitlines()
    assert lines == [
        "epoch 3 | step 24,576 | train/return_mean 187.2 | test/return_mean 500.0 | 9,812 steps/s",
        "checkpoint saved",
    ]
    assert "━" not in out.getvalue()


def test_summary_stays_on_one_line_on_a_narrow_console() -> None:
    console, out = _console(terminal=False)
    reporter = ProgressReporter(None, console=console)
    reporter.start()
    metrics = {**METRICS, "test/best_return": 500.0, "train/return_mean": -1234.5678}
    reporter.epoch_summary(12, 1_234_567, metrics)
    reporter.close()
    (line,) = out.getvalue().splitlines()
    assert line.startswith("epoch 12 | step 1,234,567 | train/return_mean -1,234.6 |")
    assert "test/best_return 500.0" in line
    assert "loss/policy" not in line


def test_steps_per_s_excludes_initial_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    console, out = _console(terminal=False)
    reporter = ProgressReporter(10_000, console=console)
    reporter.start(initial_steps=5_000)
    now[0] += 2.0
    reporter.epoch_summary(1, 7_000, {})
    assert out.getvalue().strip() == "epoch 1 | step 7,000 | 1,000 steps/s"


def test_terminal_shows_bar_with_steps_and_returns() -> None:
    console, out = _console(terminal=True)
    console.width = 200
    with ProgressReporter(1_000, console=console, description="ppo") as reporter:
        assert reporter.show_bar
        reporter.start()
        reporter.update(500, mean_return=42.0, best_return=99.5, extra="lr 3e-4")
    rendered = out.getvalue()
    assert "ppo" in rendered
    assert "500/1,000 env steps" in rendered
    assert "return 42.0" in rendered
    assert "best 99.5" in rendered
    assert "lr 3e-4" in rendered


def test_show_progress_false_hides_bar_on_terminal() -> None:
    console, out = _console(terminal=True)
    with ProgressReporter(1_000, show_progress=False, console=console) as reporter:
        reporter.update(500)
        reporter.epoch_summary(1, 500, {"train/return_mean": 3.0})
    assert "env steps" not in out.getvalue()
    assert "epoch 1 | step 500 | train/return_mean 3" in out.getvalue()


def test_bar_counts_other_units() -> None:
    console, out = _console(terminal=True)
    console.width = 200
    with ProgressReporter(2_000, console=console, unit="episodes") as reporter:
        reporter.update(500)
    rendered = out.getvalue()
    assert "500/2,000 episodes" in rendered
    assert "episodes/s" in rendered
    assert "env steps" not in rendered
    assert "return" in rendered

    console, out = _console(terminal=True)
    console.width = 200
    with ProgressReporter(900, console=console, unit="transitions", returns=False) as reporter:
        reporter.update(300)
    assert "300/900 transitions" in out.getvalue()
    assert "return" not in out.getvalue()


def test_summary_names_a_unit_other_than_env_steps() -> None:
    console, out = _console(terminal=False)
    with ProgressReporter(10_000, console=console, unit="gradient steps") as reporter:
        reporter.epoch_summary(1, 1_000, {"test/return_mean": 160.0, "time/steps_per_s": 1490.2})
    assert out.getvalue().strip() == (
        "epoch 1 | gradient step 1,000 | test/return_mean 160.0 | 1,490 gradient steps/s"
    )
