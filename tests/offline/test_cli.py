"""`rlfleet collect` and `rlfleet train <offline algo> --dataset` end to end, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from gymnasium import spaces

from rlfleet.algos import get_algorithm, list_algorithms
from rlfleet.cli.main import main
from rlfleet.data.dataset import OfflineDataset

PPO_TINY = [
    "--num-envs", "4", "--num-steps", "32", "--batch-size", "64", "--num-epochs", "2",
    "--max-steps", "512", "--epoch-num-steps", "256", "--num-test-envs", "2",
    "--test-step-num-episodes", "2", "--no-show-progress",
]  # fmt: skip
OFFLINE_TINY = [
    "--max-steps", "100", "--epoch-num-steps", "50", "--num-test-envs", "2",
    "--test-step-num-episodes", "2", "--no-show-progress", "--batch-size", "32",
]  # fmt: skip


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("offline-cli")
    run_dir = root / "ppo"
    assert main(["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(run_dir), *PPO_TINY]) == 0
    out = root / "data"
    args = ["collect", str(run_dir), "--steps", "600", "--epsilon", "0.2", "--out", str(out)]
    assert main(args) == 0
    return out


def test_collect_writes_a_dataset_that_names_its_source(dataset_dir: Path) -> None:
    dataset = OfflineDataset.load(dataset_dir)
    assert len(dataset) == 600
    assert dataset.source["kind"] == "collect"
    assert dataset.source["algorithm"] == "ppo"
    assert dataset.source["epsilon"] == 0.2


def test_collect_refuses_to_overwrite_without_force(
    dataset_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = dataset_dir.parent / "ppo"
    args = ["collect", str(run_dir), "--steps", "50", "--out", str(dataset_dir)]
    assert main(args) == 2
    assert "already exists" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0
    assert len(OfflineDataset.load(dataset_dir)) == 50


@pytest.fixture(scope="module")
def pendulum_dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.offline.helpers import random_dataset

    out = tmp_path_factory.mktemp("offline-cli-pendulum") / "data"
    random_dataset("Pendulum-v1", 400).save(out)
    return out


@pytest.mark.parametrize(
    "algo", [n for n in list_algorithms() if get_algorithm(n).kind == "offline"]
)
def test_train_offline_from_the_cli(
    algo: str, dataset_dir: Path, pendulum_dataset_dir: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    # Every offline algorithm: on CartPole's dataset where it takes Discrete actions.
    discrete = spaces.Discrete in get_algorithm(algo).action_spaces
    env, data = ("CartPole-v1", dataset_dir) if discrete else ("Pendulum-v1", pendulum_dataset_dir)
    run_dir = tmp_path / "run"
    args = ["train", algo, "--env", env, "--dataset", str(data)]
    assert main([*args, "--run-dir", str(run_dir), *OFFLINE_TINY]) == 0
    text = (run_dir / "config.yaml").read_text()
    assert f"dataset: {data}" in text
    assert (run_dir / "best" / "latest.json").is_file()
    # Offline runs count gradient steps, in the epoch lines and the summary alike.
    out = capsys.readouterr().out
    assert "epoch 2 | gradient step 100 |" in out
    assert "; 100 gradient steps in " in out
    assert "env steps" not in out
    assert "episodes" not in out.split("done (")[1]


def test_offline_training_without_a_dataset_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    assert main(["train", "bc", "--env", "CartPole-v1", "--run-dir", str(run_dir)]) == 2
    assert "needs a dataset directory" in capsys.readouterr().err
    assert not run_dir.exists()


def test_dataset_of_another_env_is_refused(
    dataset_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["train", "bc", "--env", "Acrobot-v1", "--dataset", str(dataset_dir)]
    assert main([*args, "--run-dir", str(tmp_path / "run"), *OFFLINE_TINY]) == 2
    err = capsys.readouterr().err
    assert "CartPole-v1" in err
    assert "Acrobot-v1" in err


def test_dataset_flag_on_an_online_algorithm_is_refused(
    dataset_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "ppo", "--env", "CartPole-v1", "--dataset", str(dataset_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unrecognized or misplaced options: --dataset")
    assert "rlfleet train bc --help" in err  # where the flag belongs
    assert len(err.strip().splitlines()) == 1
