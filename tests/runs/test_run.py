"""Training a run from the command line: a resume that fails leaves the run as it was, a second
writer is refused, and a resume that changes max_steps asks what its schedules should do."""

from __future__ import annotations

import hashlib
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from rlfleet.cli.main import main
from rlfleet.runs.config import load_run_config
from rlfleet.runs.run_dir import LOCK_FILE
from tests.processes import python_module

TINY = [
    "--num-envs", "4", "--num-steps", "32", "--batch-size", "64", "--num-epochs", "2",
    "--max-steps", "512", "--epoch-num-steps", "256", "--num-test-envs", "2",
    "--test-step-num-episodes", "2", "--log-interval-steps", "128", "--no-show-progress",
]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("run") / "run"
    assert main(["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(run_dir), *TINY]) == 0
    return run_dir


def _copy(trained: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "run"))


def _digest(run_dir: Path) -> str:
    """Every path under ``run_dir`` and every file's bytes."""
    digest = hashlib.sha256()
    for path in sorted(run_dir.rglob("*")):
        digest.update(str(path.relative_to(run_dir)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_a_failed_resume_leaves_the_run_byte_for_byte(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    run_dir = _copy(trained, tmp_path)
    before = _digest(run_dir)
    assert main(["train", "ppo", "--resume", str(run_dir), "--hidden-sizes", "32"]) == 2
    assert "checkpoint does not match this ppo model" in _one_error_line(capsys)
    assert _digest(run_dir) == before
    # A device this machine lacks (the CLI's check, then the trainer's) writes nothing either.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["train", "ppo", "--resume", str(run_dir), "--device", "cuda"]) == 2
    assert "device 'cuda' is not available" in _one_error_line(capsys)
    assert _digest(run_dir) == before
    # The run still evaluates and resumes as it is.
    assert main(["eval", str(run_dir), "--episodes", "2"]) == 0
    assert main(["train", "ppo", "--resume", str(run_dir), "--no-show-progress"]) == 0
    assert not list(run_dir.glob("config.*.yaml"))  # the same config: no new version


def _wait_for_lock(run_dir: Path, pid: int, child: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        lock = run_dir / LOCK_FILE
        if lock.is_file() and f'"pid": {pid}' in lock.read_text():
            return
        assert child.poll() is None, child.communicate()
        time.sleep(0.1)
    pytest.fail("the first process never locked the run directory")


def test_a_second_writer_is_refused_while_the_first_trains(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _copy(trained, tmp_path)
    # No target: the preset reaches CartPole's target within seconds, and a run that stops by
    # itself before the signal would exit 0.
    command = ["train", "ppo", "--resume", str(run_dir), "--max-steps", "10000000"]
    command += ["--target-reward", "None", "--schedule-on-resume", "stretch"]
    command += ["--no-show-progress", "--no-verbose"]
    first = subprocess.Popen(
        python_module("rlfleet.cli.main", *command), stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for_lock(run_dir, first.pid, first)
        assert main(["train", "ppo", "--resume", str(run_dir)]) == 2
        err = _one_error_line(capsys)
        assert f"error: run dir {run_dir} is in use by pid {first.pid} on host " in err
        assert main(["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(run_dir),
                     "--force"]) == 2  # fmt: skip
        assert f"is in use by pid {first.pid}" in _one_error_line(capsys)
        # Readers take no lock (docs/reliability.md): eval, play, plot, export and collect.
        assert main(["eval", str(run_dir), "--episodes", "1"]) == 0
        frames = tmp_path / "frames"
        assert main(["play", str(run_dir), "--episodes", "1", "--frame-dir", str(frames)]) == 0
        assert main(["plot", str(run_dir), "--out", str(tmp_path / "curve.png")]) == 0
        assert main(["export", str(run_dir), "--out", str(tmp_path / "policy.onnx")]) == 0
        data = tmp_path / "data"
        assert main(["collect", str(run_dir), "--steps", "8", "--out", str(data)]) == 0
        first.send_signal(signal.SIGINT)
        _, first_err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 130, first_err
    assert not (run_dir / LOCK_FILE).exists()  # released on Ctrl-C
    assert main(["train", "ppo", "--resume", str(run_dir), "--max-epochs", "1",
                 "--no-show-progress"]) == 0  # fmt: skip


def _learning_rates_after(run_dir: Path, step: int) -> list[float]:
    history = pq.read_table(run_dir / "history.parquet").to_pydict()
    return [
        lr
        for s, lr in zip(history["env_step"], history["train/learning_rate"], strict=True)
        if s > step and lr is not None
    ]


def test_a_new_max_steps_asks_whether_to_continue_or_stretch_the_schedules(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    initial = load_run_config(trained).hyperparameters.learning_rate
    run_dir = _copy(trained, tmp_path)
    before = _digest(run_dir)
    resume = ["train", "ppo", "--resume", str(run_dir), "--max-steps", "1024"]
    assert main(resume) == 2
    err = _one_error_line(capsys)
    assert "its schedules follow max_steps (hyperparameters.lr_schedule: linear" in err
    assert "pass --schedule-on-resume continue" in err
    assert _digest(run_dir) == before

    stretched = Path(shutil.copytree(run_dir, tmp_path / "stretched"))
    # continue: the schedules keep their horizon of 512 steps, so a linear rate stays at 0.
    assert main([*resume, "--schedule-on-resume", "continue", "--no-show-progress"]) == 0
    rates = _learning_rates_after(run_dir, 512)
    assert rates
    assert all(lr == 0.0 for lr in rates)
    assert load_run_config(run_dir).trainer.schedule_max_steps == 512
    # stretch: the schedules run over 1024 steps; from step 512 on a linear rate is at most
    # half its initial value, and above 0.
    resume[3] = str(stretched)
    assert main([*resume, "--schedule-on-resume", "stretch", "--no-show-progress"]) == 0
    rates = _learning_rates_after(stretched, 512)
    assert rates
    assert all(0.0 < lr <= initial / 2 for lr in rates)
    assert load_run_config(stretched).trainer.schedule_max_steps is None
