"""Bad input around runs and checkpoints: each a typed error naming what is wrong."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from rlfleet.cli.main import main
from rlfleet.errors import CheckpointError, ConfigError
from rlfleet.train.checkpoint import CheckpointManager
from rlfleet.train.run import default_run_config, load_algorithm, make_trainer, train

QUIET = {
    "show_progress": False,
    "verbose": False,
    "target_reward": None,
    "test_step_num_episodes": 2,
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bad-input") / "run"
    cfg = default_run_config(
        "ppo",
        "CartPole-v1",
        {
            "env": {"num_envs": 4, "num_test_envs": 2},
            "hyperparameters": {"num_steps": 16, "batch_size": 64},
            "trainer": {**QUIET, "max_steps": 256, "epoch_num_steps": 128},
        },
    )
    train(cfg, path)
    return path


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    return copy


def test_checkpoint_from_another_algorithm_is_refused_on_resume(
    run_dir: Path, tmp_path: Path
) -> None:
    copy = _copy(run_dir, tmp_path)
    state, metadata = CheckpointManager(copy / "checkpoints").load_latest()
    CheckpointManager(copy / "checkpoints").save(
        state, {**metadata, "algorithm": "dqn"}, step=10**6
    )
    with pytest.raises(ConfigError, match="is for 'dqn', not 'ppo'"):
        make_trainer(
            default_run_config("ppo", "CartPole-v1", {"trainer": QUIET}), copy, resume=True
        )


def test_mismatched_observation_space_is_refused(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = _copy(run_dir, tmp_path)
    config = yaml.safe_load((copy / "config.yaml").read_text())
    config["env"]["id"] = "Acrobot-v1"  # 6-dim observations, 3 actions
    (copy / "config.yaml").write_text(yaml.safe_dump(config))
    assert main(["eval", str(copy), "--episodes", "2"]) == 2
    err = capsys.readouterr().err
    assert "observation space Box(shape=(6,), float32) does not match" in err


def test_checkpoint_with_a_directory_in_place_of_a_file(run_dir: Path, tmp_path: Path) -> None:
    copy = _copy(run_dir, tmp_path)
    for tensors in (copy / "best").glob("step-*/tensors.safetensors"):
        tensors.unlink()
        tensors.mkdir()
    for tensors in (copy / "checkpoints").glob("step-*/tensors.safetensors"):
        tensors.unlink()
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        load_algorithm(copy)


def test_config_path_that_is_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "ppo", "--config", str(tmp_path)]) == 2
    assert "cannot read config file" in capsys.readouterr().err


def test_config_with_unknown_keys_and_wrong_types(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("algo: ppo\nenv: {id: CartPole-v1}\nhyperparameters: {gama: 0.9}\n")
    assert main(["train", "ppo", "--config", str(bad)]) == 2
    assert "unknown key 'gama'; did you mean 'gamma'?" in capsys.readouterr().err
    bad.write_text("algo: ppo\nenv: {id: CartPole-v1, num_envs: many}\n")
    assert main(["train", "ppo", "--config", str(bad)]) == 2
    assert "num_envs" in capsys.readouterr().err
    bad.write_text("algo: ppo\nenv: {id: [oops}\nseed: 1\n")
    assert main(["train", "ppo", "--config", str(bad)]) == 2
    assert "line 2" in capsys.readouterr().err
