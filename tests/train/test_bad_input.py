"""Bad input around runs and checkpoints: each a typed error naming what is wrong, and a run
that fails to start leaves nothing behind."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from rlfleet.checkpoint import CheckpointManager
from rlfleet.cli.main import main
from rlfleet.errors import CheckpointError, ConfigError, DatasetError, EnvSpecError
from rlfleet.runs.config import RunConfig, default_run_config
from rlfleet.runs.run import load_algorithm, make_trainer, train

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


# ------------------------------------------------------------ failed starts
def _tiny_cfg() -> RunConfig:
    return default_run_config(
        "ppo",
        "CartPole-v1",
        {
            "env": {"num_envs": 2, "num_test_envs": 2},
            "hyperparameters": {"num_steps": 32, "batch_size": 64},
            "trainer": {**QUIET, "max_steps": 128, "epoch_num_steps": 128},
        },
    )


def _with_env(cfg: RunConfig, env_id: str) -> RunConfig:
    return replace(cfg, env=replace(cfg.env, id=env_id))


@pytest.mark.parametrize(
    ("spoil", "error", "message"),
    [
        (lambda cfg: replace(cfg, device="cuda"), ConfigError, "device 'cuda' is not available"),
        (lambda cfg: replace(cfg, device="gpu"), ConfigError, "'gpu' is not a torch device"),
        (lambda cfg: _with_env(cfg, "NoSuchEnv-v0"), EnvSpecError, "unknown environment id"),
        (
            lambda cfg: _with_env(cfg, "tests.envs.toy_envs:RaisesOnConstruction"),
            RuntimeError,
            "cannot be built, on purpose",
        ),
        (
            lambda cfg: replace(
                cfg, hyperparameters=replace(cfg.hyperparameters, batch_size=100_000)
            ),
            ConfigError,
            "is larger than the rollout",
        ),
    ],
    ids=[
        "unavailable-device", "unknown-device", "unknown-env", "env-constructor-raises",
        "batch-larger-than-rollout",
    ],
)  # fmt: skip
def test_a_failed_start_leaves_nothing_and_the_same_call_then_works(
    spoil: Callable[[RunConfig], RunConfig],
    error: type[Exception],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    run_dir = tmp_path / "new" / "run"
    with pytest.raises(error, match=message):
        train(spoil(_tiny_cfg()), run_dir)
    assert list(tmp_path.iterdir()) == []  # "new/" too: this attempt created it
    assert train(_tiny_cfg(), run_dir).env_steps == 128


def test_an_unloadable_dataset_leaves_nothing(tmp_path: Path) -> None:
    not_a_dataset = tmp_path / "dataset"
    not_a_dataset.mkdir()
    cfg = default_run_config("bc", "CartPole-v1", {"dataset": str(not_a_dataset)})
    with pytest.raises(DatasetError):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_failed_start_in_an_existing_empty_directory_keeps_the_directory(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(RuntimeError):
        train(_with_env(_tiny_cfg(), "tests.envs.toy_envs:RaisesOnConstruction"), run_dir)
    assert run_dir.is_dir()
    assert list(run_dir.iterdir()) == []


def test_force_keeps_the_old_run_when_the_new_one_fails_to_start(
    run_dir: Path, tmp_path: Path
) -> None:
    copy = _copy(run_dir, tmp_path)
    before = {path: path.read_bytes() for path in copy.rglob("*") if path.is_file()}
    with pytest.raises(RuntimeError):
        train(_with_env(_tiny_cfg(), "tests.envs.toy_envs:RaisesOnConstruction"), copy, force=True)
    assert {path: path.read_bytes() for path in copy.rglob("*") if path.is_file()} == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["copy"]
    train(_tiny_cfg(), copy, force=True)
    assert not (copy / "checkpoints" / "step-000000000256").exists()  # the old run's is gone
    assert sorted(path.name for path in tmp_path.iterdir()) == ["copy"]


def test_a_resume_that_fails_leaves_the_config_as_it_was(run_dir: Path, tmp_path: Path) -> None:
    copy = _copy(run_dir, tmp_path)
    state, metadata = CheckpointManager(copy / "checkpoints").load_latest()
    CheckpointManager(copy / "checkpoints").save(
        state, {**metadata, "algorithm": "dqn"}, step=10**6
    )
    before = (copy / "config.yaml").read_bytes()
    longer = replace(_tiny_cfg(), trainer=replace(_tiny_cfg().trainer, max_steps=512))
    with pytest.raises(ConfigError, match="is for 'dqn', not 'ppo'"):
        train(longer, copy, resume=True, schedule_on_resume="stretch")
    assert (copy / "config.yaml").read_bytes() == before


def test_acer_refuses_rollouts_collected_by_episode_count() -> None:
    from rlfleet.algos.acer import ACER
    from rlfleet.envs.make import make_vec_env
    from rlfleet.train.trainer import OnPolicyTrainer

    envs = make_vec_env("CartPole-v1", 2, seed=0)
    acer = ACER(envs.single_observation_space, envs.single_action_space)
    with pytest.raises(ConfigError, match="expected collection_step_num_episodes None, got 2"):
        OnPolicyTrainer(acer, envs, None, collection_step_num_episodes=2)
    envs.close()
