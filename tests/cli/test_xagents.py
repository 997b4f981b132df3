"""xagents' flag names on ``rlfleet train``: the article's command line runs as it is."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rlfleet.cli.main import main
from rlfleet.runs.config import load_run_config

ARTICLE = [
    "train", "ppo", "--env", "CartPole-v1", "--target-reward", "250", "--n-envs", "16",
    "--n-steps", "1024", "--checkpoints", "ppo-cartpole.tf", "--history-checkpoint",
    "ppo-cartpole.parquet", "--seed", "123",
]  # fmt: skip
QUIET = ["--max-steps", "64", "--no-show-progress", "--no-verbose"]
"""A tiny budget (one rollout), appended to the article's command."""
TINY = [
    "--env", "CartPole-v1", "--max-steps", "64", "--num-test-envs", "2",
    "--test-step-num-episodes", "2", "--no-show-progress", "--no-verbose",
]  # fmt: skip


@pytest.fixture(scope="module")
def article_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The article's command, run in a fresh directory."""
    where = tmp_path_factory.mktemp("article")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(where)
        assert main([*ARTICLE, *QUIET]) == 0
    return where


def test_the_article_command_trains_into_the_checkpoints_path(article_run: Path) -> None:
    run_dir = article_run / "ppo-cartpole.tf"
    cfg = load_run_config(run_dir)
    assert (cfg.env.num_envs, cfg.hyperparameters.num_steps, cfg.seed) == (16, 1024, 123)
    assert cfg.trainer.target_reward == 250
    assert (run_dir / "best" / "latest.json").is_file()


def test_the_history_checkpoint_is_the_runs_history(article_run: Path) -> None:
    copy = pq.read_table(article_run / "ppo-cartpole.parquet")
    assert copy.equals(pq.read_table(article_run / "ppo-cartpole.tf" / "history.parquet"))
    # One row per finished episode, as xagents' history has them.
    assert copy.column("episode/return").drop_null().to_pylist()


def test_help_shows_the_xagents_names_as_aliases(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "ppo", "--help"])
    text = capsys.readouterr().out
    for flag, alias_of in (("--n-envs", "--num-envs"), ("--n-steps", "num_steps"),
                           ("--checkpoints", "--run-dir")):  # fmt: skip
        assert flag in text
        assert f"Alias of {alias_of}" in text
    assert "--history-checkpoint" in text


def test_n_steps_is_the_n_step_return_of_an_off_policy_algorithm(tmp_path: Path) -> None:
    run_dir = tmp_path / "dqn"
    args = ["train", "dqn", *TINY, "--n-steps", "3", "--checkpoints", str(run_dir)]
    assert main([*args, "--learning-starts", "16"]) == 0
    assert load_run_config(run_dir).hyperparameters.n_step == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--n-envs", "4", "--num-envs", "2"], "--n-envs is xagents' name for --num-envs"),
        (["--n-steps=4", "--num-steps", "8"], "--n-steps is xagents' name for --num-steps"),
        (["--checkpoints", "a", "--run-dir", "b"], "--checkpoints a names the run directory"),
        (["--history-checkpoint", "h.csv"], "expected a .parquet file path, got h.csv"),
    ],
)
def test_bad_xagents_flags_are_one_line_errors(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert main(["train", "ppo", *TINY, *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "a").exists()


def test_n_steps_on_an_algorithm_without_either_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["train", "bc", *TINY, "--n-steps", "4", "--dataset", "nowhere"]) == 2
    assert "--n-steps: bc has neither" in capsys.readouterr().err


def test_an_existing_history_checkpoint_needs_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = tmp_path / "h.parquet"
    history.write_bytes(b"another run's")
    args = ["train", "ppo", *TINY, "--run-dir", str(tmp_path / "run")]
    assert main([*args, "--history-checkpoint", str(history)]) == 2
    assert "pass --force to replace it" in capsys.readouterr().err
    assert history.read_bytes() == b"another run's"
    assert main([*args, "--history-checkpoint", str(history), "--force"]) == 0
    assert pq.read_table(history).num_rows > 0


def test_a_refused_run_directory_leaves_the_history_checkpoint_alone(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert main(["train", "ppo", *TINY, "--run-dir", str(run_dir)]) == 0
    history = tmp_path / "h.parquet"
    # The run directory exists, so training is refused: nothing of that run is copied.
    args = ["train", "ppo", *TINY, "--checkpoints", str(run_dir), "--history-checkpoint"]
    assert main([*args, str(history)]) == 2
    assert not history.exists()
