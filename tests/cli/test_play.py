"""``rlfleet play`` with xagents' flags: --weights, --frame-delay, --max-steps,
--frame-frequency and --action-idx."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rlfleet.cli.main import main

TINY = [
    "--num-envs", "2", "--num-steps", "32", "--batch-size", "64", "--max-steps", "64",
    "--num-test-envs", "2", "--test-step-num-episodes", "2", "--no-show-progress",
    "--no-verbose",
]  # fmt: skip


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run trained with xagents' --checkpoints."""
    path = tmp_path_factory.mktemp("play") / "ppo-cartpole.tf"
    args = ["train", "ppo", "--env", "CartPole-v1", "--checkpoints", str(path), *TINY]
    assert main(args) == 0
    return path


def test_the_xagents_play_command_line_plays_the_run(
    weights: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["play", "ppo", "--env", "CartPole-v1", "--weights", str(weights), "--max-steps", "7"]
    assert main(args) == 0
    assert "episode 1: return 7.00, length 7 (stopped at --max-steps)" in capsys.readouterr().out


def test_max_steps_stops_every_episode(weights: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["play", str(weights), "--episodes", "2", "--max-steps", "3"]) == 0
    assert capsys.readouterr().out.count("length 3 (stopped at --max-steps)") == 2


def test_frame_frequency_writes_every_nth_frame(weights: Path, tmp_path: Path) -> None:
    frames = tmp_path / "frames"
    args = ["play", str(weights), "--max-steps", "10", "--frame-dir", str(frames)]
    assert main([*args, "--frame-frequency", "4"]) == 0
    written = sorted(path.name for path in (frames / "episode-000").iterdir())
    # 11 frames (the first observation and one per step), numbered by their place.
    assert written == ["frame-00000.png", "frame-00004.png", "frame-00008.png"]


def test_frame_delay_waits_after_each_rendered_frame(
    weights: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []
    monkeypatch.setattr(time, "sleep", waits.append)
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    args = ["play", str(weights), "--render", "--max-steps", "5", "--frame-delay", "0.25"]
    assert main(args) == 0
    assert waits == [0.25] * 5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--action-idx", "1"], "--action-idx 1: an rlfleet policy has one output"),
        (["--frame-frequency", "0"], "--frame-frequency: expected a number >= 1, got 0"),
        (["--max-steps", "0"], "--max-steps: expected a number >= 1, got 0"),
        (["--frame-delay", "-1"], "--frame-delay: expected a number >= 0, got -1"),
        (["--env", "Pendulum-v1"], "--env Pendulum-v1: the run was trained on CartPole-v1"),
    ],
)
def test_bad_play_flags_are_one_line_errors(
    weights: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["play", "--weights", str(weights), *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_the_algorithm_xagents_names_must_be_the_runs(
    weights: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["play", "dqn", "--weights", str(weights)]) == 2
    assert f"--weights {weights} is a ppo run, not dqn" in capsys.readouterr().err


def test_a_run_given_twice_is_refused(weights: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["play", str(weights), "--weights", str(weights)]) == 2
    assert "give the run directory once" in capsys.readouterr().err
    assert main(["play"]) == 2
    assert "rlfleet play needs a run" in capsys.readouterr().err
