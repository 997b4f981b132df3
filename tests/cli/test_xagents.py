"""xagents' flag names on ``rlfleet train`` and ``rlfleet tune``: the article's command line
and an xagents tune command run as they are."""

from __future__ import annotations

from pathlib import Path

import optuna
import pyarrow.parquet as pq
import pytest

from rlfleet.cli.main import main
from rlfleet.runs.config import load_run_config
from tests.tune.envs import ENV_ID

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


# ------------------------------------------------------------------------------ tune
XAGENTS_TUNE = [
    "tune", "ppo", "--env", ENV_ID, "--study", "ppo-test", "--storage", "sqlite:///ppo-test.db",
    "--n-trials", "2", "--n-jobs", "1", "--trial-steps", "128", "--warmup-trials", "1",
    "--n-envs", "2", "--non-silent",
]  # fmt: skip
TINY_TUNE = ["--seeds", "1", "--epoch-num-steps", "64", "--test-episodes", "1"]
"""A tiny budget per trial, appended to the xagents tune command."""


def test_an_xagents_tune_command_runs_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([*XAGENTS_TUNE, *TINY_TUNE]) == 0
    out = capsys.readouterr().out
    assert "study 'ppo-test': 2 complete" in out
    study = optuna.load_study(study_name="ppo-test", storage="sqlite:///ppo-test.db")
    assert len(study.trials) == 2  # --n-trials
    runs = sorted((tmp_path / "studies" / "ppo-test").glob("trials/*/seed-*"))
    assert runs
    for run in runs:
        config = load_run_config(run)
        assert config.trainer.max_steps == 128  # --trial-steps
        assert config.env.num_envs == 2  # --n-envs


def test_tune_help_shows_the_xagents_names_as_aliases(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    text = capsys.readouterr().out
    for flag, alias_of in (("--n-trials", "--trials"), ("--n-jobs", "--jobs"),
                           ("--trial-steps", "--max-steps"),
                           ("--warmup-trials", "--prune-startup-trials"),
                           ("--non-silent", "--verbose"), ("--n-envs", "--num-envs")):  # fmt: skip
        assert flag in text
        assert f"Alias of {alias_of}" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--n-trials", "2", "--trials", "3"], "--n-trials is xagents' name for --trials"),
        (["--non-silent", "--no-verbose"], "--non-silent is xagents' name for --no-verbose"),
        (["--lr", "1e-5", "1e-2"], "give hyperparameters.learning_rate there"),
        (["--n-envs", "16", "32"], "give env.num_envs there as {choices: [...]}"),
        (["--beta1", "0.9", "0.99"], "rlfleet's Adam keeps torch's betas"),
        (["--preprocess"], "ALE ids get the Atari preprocessing"),
    ],
)
def test_xagents_tune_flags_without_an_rlfleet_flag_are_one_line_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", "ppo", "--env", "CartPole-v1", *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def _tune_alias_pairs() -> list[tuple[str, str]]:
    from rlfleet.cli.xagents import TUNE_ALIASES

    return [
        (alias, name)
        for alias, names in TUNE_ALIASES.items()
        for name in ((names,) if isinstance(names, str) else names)
    ]


def _flag_args(flag: str) -> list[str]:
    """``flag`` with a value where it takes one."""
    return [flag] if flag in ("--non-silent", "--verbose", "--no-verbose") else [flag, "2"]


@pytest.mark.parametrize(("alias", "name"), _tune_alias_pairs())
def test_every_tune_alias_given_with_its_rlfleet_flag_is_a_one_line_error(
    alias: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["tune", "ppo", "--env", "CartPole-v1", *_flag_args(alias), *_flag_args(name)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{alias} is xagents' name for {name}; give one of them" in err
    assert "Traceback" not in err


def _search_flags() -> list[tuple[str, str]]:
    from rlfleet.cli.xagents import SEARCH_FLAGS

    return sorted(SEARCH_FLAGS.items())


@pytest.mark.parametrize(("flag", "entry"), _search_flags())
def test_every_xagents_search_flag_on_tune_is_a_one_line_error_naming_what_to_write(
    flag: str, entry: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", "ppo", "--env", "CartPole-v1", flag, "1", "2"]) == 2
    err = capsys.readouterr().err
    assert f"xagents' {flag} has no tune flag in rlfleet: " in err
    if entry:
        assert f"give {entry} there" in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("algo", "env"),
    [("dqn", "CartPole-v1"), ("ddpg", "Pendulum-v1"), ("td3", "Pendulum-v1"),
     ("sac", "Pendulum-v1")],
)  # fmt: skip
def test_n_steps_is_n_step_for_every_off_policy_algorithm(algo: str, env: str) -> None:
    from rlfleet.algos import get_algorithm
    from rlfleet.cli.xagents import XAgentsFlags, apply_flags, check_alias_conflicts
    from rlfleet.errors import ConfigError
    from rlfleet.runs.config import default_run_config

    cfg = apply_flags(XAgentsFlags(n_steps=3), default_run_config(algo, env), get_algorithm(algo))
    assert cfg.hyperparameters.n_step == 3
    with pytest.raises(ConfigError, match="--n-steps is xagents' name for --n-step"):
        check_alias_conflicts(["--n-steps", "3", "--n-step=2"])


def test_a_second_checkpoints_path_is_accepted_and_noted_as_not_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    actor, critic = tmp_path / "actor.tf", tmp_path / "critic.tf"
    args = ["train", "ddpg", *TINY, "--env", "Pendulum-v1", "--learning-starts", "16"]
    assert main([*args, "--checkpoints", str(actor), str(critic)]) == 0
    assert f"{critic} is not written" in capsys.readouterr().err
    assert (actor / "config.yaml").is_file()
    assert not critic.exists()
