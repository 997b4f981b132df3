"""Hyperparameter schedules against hand-computed values, clamped outside [0, 1]."""

from __future__ import annotations

import pytest

from rlfleet.schedules import linear_decay, scheduled


def test_linear_decay_schedule() -> None:
    assert linear_decay(1.0, 0.05, 0.1, 0.0) == pytest.approx(1.0)
    assert linear_decay(1.0, 0.05, 0.1, 0.05) == pytest.approx(0.525)
    assert linear_decay(1.0, 0.05, 0.1, 0.5) == pytest.approx(0.05)
    assert linear_decay(1.0, 0.05, 0.0, 0.0) == pytest.approx(0.05)
    assert linear_decay(1.0, 0.05, 0.1, -1.0) == pytest.approx(1.0)


def test_constant_and_linear_schedules() -> None:
    assert scheduled(3e-4, "constant", 0.7) == 3e-4
    assert scheduled(3e-4, "linear", 0.0) == pytest.approx(3e-4)
    assert scheduled(3e-4, "linear", 0.25) == pytest.approx(2.25e-4)
    assert scheduled(3e-4, "linear", 1.0) == 0.0
    assert scheduled(3e-4, "linear", 1.5) == 0.0  # a resumed run past its budget
    assert scheduled(3e-4, "linear", -0.5) == pytest.approx(3e-4)
