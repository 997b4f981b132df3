"""``rlfleet train``: flags laid over one base run config, and the one YAML entry point
(a run's config.yaml or tune's best.yaml, or ML-Agents run options)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlfleet.algos.registry import get_algorithm
from rlfleet.cli.main import main
from rlfleet.cli.train import base_flags, train_base
from rlfleet.runs.config import load_run_config

TINY = [
    "--num-envs", "2", "--num-steps", "32", "--batch-size", "64", "--max-steps", "256",
    "--epoch-num-steps", "128", "--num-test-envs", "2", "--test-step-num-episodes", "2",
    "--no-show-progress", "--no-verbose",
]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("train") / "run"
    assert main(["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(run_dir), *TINY]) == 0
    return run_dir


def test_a_runs_config_yaml_trains_as_it_is(trained: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    assert main(["train", str(trained / "config.yaml"), "--run-dir", str(again)]) == 0
    assert load_run_config(again) == load_run_config(trained)


def test_flags_are_laid_over_a_config_file(trained: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    args = ["train", str(trained / "config.yaml"), "--run-dir", str(again), "--seed", "7"]
    assert main([*args, "--learning-rate", "0.001"]) == 0
    cfg = load_run_config(again)
    assert (cfg.seed, cfg.hyperparameters.learning_rate) == (7, 0.001)
    assert cfg.hyperparameters.batch_size == 64  # from the file (the preset's is 256)
    assert cfg.env.num_envs == 2


def test_a_tune_best_yaml_trains(tmp_path: Path) -> None:
    # What rlfleet tune writes: a run config, headed by a comment.
    best = tmp_path / "best.yaml"
    best.write_text(
        "# best trial 3 of study 'ppo-CartPole-v1'\n"
        + yaml.safe_dump(
            {
                "algo": "ppo",
                "seed": 0,
                "env": {"id": "CartPole-v1", "num_envs": 2, "num_test_envs": 2},
                "trainer": {
                    "max_steps": 256,
                    "epoch_num_steps": 128,
                    "show_progress": False,
                    "verbose": False,
                    "test_step_num_episodes": 2,
                },
                "hyperparameters": {"learning_rate": 3e-4, "num_steps": 32, "batch_size": 64},
            }
        )
    )
    assert main(["train", str(best), "--run-dir", str(tmp_path / "run")]) == 0
    assert load_run_config(tmp_path / "run").hyperparameters.learning_rate == 3e-4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("algo: ppo\nenv: {id: CartPole-v1}\ntrainer: {max_stepz: 5}\n",
         "read as a run config: {path}: trainer: unknown key 'max_stepz'"),
        ("algo: ppo\nenv: {id: CartPole-v1}\nbehavior: {}\n",
         "read as a run config: {path}: unknown key(s) ['behavior']"),
        ("env_settings: {env_id: CartPole-v1}\nbehaviors: {CartPole: {max_stepz: 5}}\n",
         "read as ML-Agents run options: {path} line 2: behaviors.CartPole.max_stepz"),
        ("learning_rate: 3e-4\n",
         "{path}: expected a run config (keys algo, env, hyperparameters"),
    ],
)  # fmt: skip
def test_a_bad_file_is_one_line_naming_the_format_it_was_read_as(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert message.format(path=path) in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flag", ["--config", "--resume"])
def test_a_config_file_takes_no_second_base(
    flag: str, trained: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", str(trained / "config.yaml"), flag, str(trained)]) == 2
    assert f"drop {flag}" in capsys.readouterr().err


def test_the_base_is_the_resumed_run_then_the_config_file_then_the_preset(
    trained: Path,
) -> None:
    ppo = get_algorithm("ppo")
    config = str(trained / "config.yaml")
    assert train_base(ppo, ["--env", "Pendulum-v1"]).config.env.id == "Pendulum-v1"
    from_file = train_base(ppo, ["--env", "Pendulum-v1", "--config", config])
    assert from_file.config.env.num_envs == 2
    resumed = train_base(ppo, ["--config", "nope.yaml", f"--resume={trained}"])
    assert resumed.resume == trained
    assert resumed.config == load_run_config(trained)


def test_base_flags_take_both_spellings_and_the_last_one() -> None:
    args = ["--env", "A", "--num-envs", "2", "--env=B", "--config=c.yaml", "--resume"]
    assert base_flags(args) == {"env": "B", "config": "c.yaml"}


def test_help_defaults_to_the_preset_of_the_env(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        main(["train", "ppo", "--env", "Pendulum-v1", "--help"])
    pendulum = capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["train", "ppo", "--help"])
    cartpole = capsys.readouterr().out
    assert "(default: 1024)" in pendulum  # num_steps of the Pendulum-v1 preset
    assert "(default: 1024)" not in cartpole
    assert "(default: Pendulum-v1)" in pendulum
    assert "(default: CartPole-v1)" in cartpole
