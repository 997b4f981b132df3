"""Mirrors of the history: W&B runs (in W&B's offline mode, on this machine), and several
mirrors written as one."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

from rlfleet.errors import ConfigError, MissingDependencyError
from rlfleet.logging.mirrors import Mirrors, WandbWriter
from tests.logging.recorder import Recorder
from tests.wandb_runs import offline_run_records, use_offline_wandb


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    use_offline_wandb(monkeypatch)


@pytest.mark.usefixtures("offline")
def test_an_offline_wandb_run_holds_the_rows_in_the_run_directory(tmp_path: Path) -> None:
    writer = WandbWriter("cartpole-session", tmp_path, {"algo": "ppo"})
    assert writer.directory.is_relative_to(tmp_path / "wandb")
    writer.write({"env_step": 128, "train/return_mean": 21.5, "test/score": None}, 128)
    writer.write({"test/return_mean": 200.0, "loss/value": math.nan}, 256)
    writer.close()
    records = offline_run_records(
        tmp_path, [b"cartpole-session", b"train/return_mean", b"test/return_mean"]
    )
    assert b"cartpole-session" in records
    assert b"train/return_mean" in records
    assert b"test/return_mean" in records
    # Nothing that is not a finite metric value is logged.
    assert b"loss/value" not in records
    assert b"test/score" not in records


@pytest.mark.usefixtures("offline")
def test_monitor_session_mirrors_a_training_run_to_wandb(tmp_path: Path) -> None:
    from rlfleet.cli.main import main

    run_dir = tmp_path / "run"
    args = ["train", "ppo", "--env", "CartPole-v1", "--max-steps", "256", "--num-envs", "2",
            "--num-steps", "64", "--batch-size", "64", "--epoch-num-steps", "128",
            "--num-test-envs", "2", "--test-step-num-episodes", "2", "--no-show-progress",
            "--no-verbose", "--run-dir", str(run_dir),
            "--monitor-session", "xagents-style"]  # fmt: skip
    assert main(args) == 0
    records = offline_run_records(run_dir, [b"xagents-style", b"test/return_mean"])
    assert b"xagents-style" in records
    assert b"test/return_mean" in records


def test_without_wandb_installed_the_extra_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'rlfleet\[wandb\]'"):
        WandbWriter("session", tmp_path)


def test_a_run_wandb_cannot_start_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wandb = pytest.importorskip("wandb")

    def refuse(**kwargs: Any) -> None:
        raise wandb.errors.UsageError("api_key not configured (no-tty)")

    monkeypatch.setattr(wandb, "init", refuse)
    with pytest.raises(ConfigError, match=r"W&B could not start a run .*WANDB_MODE=offline"):
        WandbWriter("session", tmp_path)


def test_mirrors_write_to_each_and_close_each_even_when_one_fails() -> None:
    first, second = Recorder(fail=True), Recorder()
    mirrors = Mirrors([first, second])
    mirrors.write({"train/return_mean": 1.0}, 7)
    assert first.rows == second.rows == [({"train/return_mean": 1.0}, 7)]
    with pytest.raises(OSError, match="disk full"):
        mirrors.close()
    assert first.closed
    assert second.closed
