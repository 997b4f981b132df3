"""A failing env during training: a clear EnvWorkerError and an intact checkpoint, or
(with restart_failed_envs) restarts that are logged while training goes on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlfleet.checkpoint import CheckpointManager
from rlfleet.errors import EnvWorkerError
from rlfleet.logging.history import read_history
from rlfleet.runs.config import RunConfig, default_run_config
from rlfleet.runs.run import load_algorithm, train

FAULTY_ID = "tests.envs.toy_envs:rlfleet-test/FaultyEnv-v0"


def _cfg(mode: str, max_steps: int, **env: Any) -> RunConfig:
    return default_run_config(
        "ppo",
        FAULTY_ID,
        {
            "env": {"num_envs": 2, "num_test_envs": 1, "vector_mode": mode, **env},
            "hyperparameters": {"num_steps": 64, "num_epochs": 1, "batch_size": 64},
            "trainer": {
                "max_steps": max_steps,
                "epoch_num_steps": 512,
                "test_step_num_episodes": 2,
                "log_interval_steps": 128,
                "show_progress": False,
                "verbose": False,
            },
        },
    )


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("sync", r"env index 0 raised ValueError: .* in step number 1000 of its life"),
        ("async", r"env worker 0 \(pid \d+\) during step[\s\S]*ValueError: .* at step 1000"),
    ],
)
def test_an_env_that_raises_on_step_1000_leaves_the_last_checkpoint_intact(
    tmp_path: Path, mode: str, expected: str
) -> None:
    cfg = _cfg(mode, 8192, kwargs={"fail_at": 1000, "episode_length": 20})
    with pytest.raises(EnvWorkerError, match=expected):
        train(cfg, tmp_path / "run")
    # Life step 1000 of both train envs is vector step 1049 (20-step episodes plus a reset
    # step each), i.e. env step 2098: the checkpoint of the epoch ending at 2048 is the last.
    state, metadata = CheckpointManager(tmp_path / "run" / "checkpoints").load_latest()
    assert metadata["counters"]["env_step"] == 2048
    assert state["trainer"]["env_step"] == 2048
    algo, _ = load_algorithm(tmp_path / "run", which="latest")
    assert algo.gradient_steps == metadata["counters"]["gradient_step"]


@pytest.mark.filterwarnings("ignore:restarting env worker:RuntimeWarning")
def test_training_goes_on_through_restarts_and_logs_them(tmp_path: Path) -> None:
    cfg = _cfg(
        "auto",
        1024,
        restart_failed_envs=True,
        step_timeout_s=10.0,
        kwargs={"fail_at": 100, "episode_length": 20},
    )
    result = train(cfg, tmp_path / "run")
    assert result.env_steps == 1024
    logged = [
        (row["env_step"], row["train/env_restarts"])
        for row in read_history(tmp_path / "run" / "history.parquet")
        if row.get("train/env_restarts") is not None
    ]
    # Each worker fails on step 100 of every life: a cycle of 100 steps, 4 reset steps and
    # the reset step after the restart is 105 vector steps, so 512 vector steps hold 4
    # restarts per env.
    assert logged[-1][1] == 8
    assert [n for _, n in logged] == sorted({n for _, n in logged})
    state, _ = CheckpointManager(tmp_path / "run" / "checkpoints").load_latest()
    assert state["trainer"]["env_restarts"] == 8
    # docs/reliability.md: the count is part of the checkpoint, so it continues on resume.
    cfg.trainer.max_steps = 2048
    resumed = train(cfg, tmp_path / "run", resume=True, schedule_on_resume="stretch")
    assert resumed.env_steps == 2048
    state, _ = CheckpointManager(tmp_path / "run" / "checkpoints").load_latest()
    assert state["trainer"]["env_restarts"] == 16
    rows = read_history(tmp_path / "run" / "history.parquet")
    assert max(r.get("train/env_restarts") or 0 for r in rows) == 16


def test_test_envs_restart_uncounted_and_a_cut_test_episode_still_counts() -> None:
    """docs/reliability.md: test envs are restarted too, but not counted; a test episode cut
    short by a restart still counts as an episode. The training envs never fail here; the
    test env fails on the 30th step of each life, in the second of a test step's 20-step
    episodes."""
    from rlfleet.envs.make import make_vec_env
    from rlfleet.runs.run import make_trainer

    cfg = _cfg("sync", 1024, kwargs={"episode_length": 20})
    test_envs = make_vec_env(
        FAULTY_ID, 1, seed=0, mode="async", restart_failed_envs=True, step_timeout_s=10.0,
        env_kwargs={"fail_at": 30, "episode_length": 20},
    )  # fmt: skip
    trainer = make_trainer(cfg, None, test_envs=test_envs)
    try:
        with pytest.warns(RuntimeWarning, match="restart"):
            epochs = list(trainer)
        tests = [e.test_collect_stat for e in epochs if e.test_collect_stat is not None]
        assert tests
        for stats in tests:
            assert len(stats.returns) == 2  # the cut episode counts
            assert sorted(stats.lengths.tolist())[0] < 20  # one episode was cut short
        assert trainer.counters.env_restarts == 0
    finally:
        trainer.close()
