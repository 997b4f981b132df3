"""`rlfleet train`: the env worker fault settings reach the run config from YAML and flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rlfleet.cli import train as cli_train
from rlfleet.cli.main import main
from rlfleet.errors import EnvWorkerError


def test_fault_settings_from_a_config_file_and_flags(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(
        "algo: ppo\n"
        "env: {id: CartPole-v1, num_envs: 2, num_test_envs: 1, restart_failed_envs: true}\n"
        "hyperparameters: {num_steps: 32, batch_size: 64, num_epochs: 1}\n"
        "trainer: {max_steps: 64, epoch_num_steps: 64, test_step_num_episodes: 1,\n"
        "          show_progress: false, verbose: false}\n"
    )
    run_dir = tmp_path / "run"
    args = ["--config", str(config), "--run-dir", str(run_dir), "--step-timeout-s", "7"]
    assert main(["train", "ppo", *args]) == 0
    env = yaml.safe_load((run_dir / "config.yaml").read_text())["env"]
    assert env["restart_failed_envs"] is True
    assert env["step_timeout_s"] == 7.0


def test_an_env_worker_error_is_printed_verbatim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    message = 'env worker 1 during step; remote traceback:\n    obs = self.buffers[index]["x"]'

    def failing_train(*args: Any, **kwargs: Any) -> None:
        raise EnvWorkerError(message)

    monkeypatch.setattr(cli_train, "train_run", failing_train)
    assert main(["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(tmp_path / "r")]) == 2
    assert message in capsys.readouterr().err
