"""A2C: learning at a fixed seed and budget, and its one-step-per-rollout update."""

from __future__ import annotations

from typing import Any

import pytest

from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer

QUIET = {"show_progress": False, "verbose": False}


def _cfg(env_id: str, **overrides: Any) -> Any:
    trainer = {**QUIET, **overrides.pop("trainer", {})}
    return default_run_config("a2c", env_id, {"trainer": trainer, **overrides})


@pytest.mark.slow
def test_a2c_solves_cartpole() -> None:
    result = make_trainer(_cfg("CartPole-v1", seed=0), None).run()
    assert result.best_score >= 475, result
    assert result.env_steps <= 100_000


def test_one_gradient_step_per_rollout_by_default() -> None:
    cfg = _cfg(
        "CartPole-v1",
        env={"num_envs": 4, "num_test_envs": 2},
        trainer={"max_steps": 200, "epoch_num_steps": 200, "test_step_num_episodes": 1},
    )
    result = make_trainer(cfg, None).run()
    assert result.gradient_steps == 10  # 200 steps / (5 steps x 4 envs)
