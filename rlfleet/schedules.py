"""Hyperparameter schedules as functions of training progress (0 at start, 1 at the end).

A schedule's value is derived from the progress counter, never stored, so a resumed run
continues the schedule exactly where it stopped.
"""

from __future__ import annotations

from typing import Literal

ScheduleKind = Literal["constant", "linear"]


def scheduled(initial: float, kind: ScheduleKind, progress: float) -> float:
    """``initial`` for ``constant``; ``initial * (1 - progress)`` for ``linear`` (0 at the end)."""
    if kind == "constant":
        return initial
    return initial * (1.0 - min(max(progress, 0.0), 1.0))


def linear_decay(start: float, end: float, fraction: float, progress: float) -> float:
    """Linear from ``start`` to ``end`` over the first ``fraction`` of training, then ``end``.

    DQN's exploration rate: epsilon falls from ``exploration_initial_eps`` to
    ``exploration_final_eps`` over ``exploration_fraction`` of the budget.
    """
    if fraction <= 0.0:
        return end
    return start + (end - start) * min(max(progress, 0.0) / fraction, 1.0)
