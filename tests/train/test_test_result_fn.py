"""The ``test_result_fn`` hook: called after every test step, and free to stop training."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rlfleet.checkpoint import CheckpointManager
from rlfleet.runs.config import RunConfig, default_run_config
from rlfleet.runs.run import train

QUIET = {"show_progress": False, "verbose": False, "target_reward": None}


def _config(max_steps: int = 1024) -> RunConfig:
    return default_run_config(
        "ppo",
        "CartPole-v1",
        {
            "env": {"num_envs": 4, "num_test_envs": 2},
            "hyperparameters": {"num_steps": 16, "num_epochs": 1, "batch_size": 64},
            "trainer": {
                **QUIET,
                "max_steps": max_steps,
                "epoch_num_steps": 256,
                "test_step_num_episodes": 2,
            },
        },
    )


def test_called_after_every_test_step_with_its_score(tmp_path: Path) -> None:
    calls: list[tuple[int, int, float]] = []
    train(_config(), tmp_path / "run", test_result_fn=lambda *args: calls.append(args))
    assert [(epoch, step) for epoch, step, _ in calls] == [(1, 256), (2, 512), (3, 768), (4, 1024)]
    rows = pq.read_table(tmp_path / "run" / "history.parquet").to_pylist()
    scores = [row["test/score"] for row in rows if row["test/score"] is not None]
    assert [score for _, _, score in calls] == scores


class _Stop(Exception):
    pass


def test_an_exception_it_raises_ends_training_and_keeps_the_run_consistent(
    tmp_path: Path,
) -> None:
    def stop_at_second_test(epoch: int, env_step: int, score: float) -> None:
        if epoch == 2:
            raise _Stop

    with pytest.raises(_Stop):
        train(_config(), tmp_path / "run", test_result_fn=stop_at_second_test)
    # The history keeps every row up to the test step that raised ...
    rows = pq.read_table(tmp_path / "run" / "history.parquet").to_pylist()
    assert max(row["env_step"] for row in rows if row["test/score"] is not None) == 512
    # ... and the latest checkpoint is the last completed epoch's, ready to resume.
    latest = CheckpointManager(tmp_path / "run" / "checkpoints", readonly=True).latest()
    assert latest is not None
    assert latest.name == "step-000000000256"
    result = train(_config(), tmp_path / "run", resume=True)
    assert result.env_steps == 1024
