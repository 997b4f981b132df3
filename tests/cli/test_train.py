"""``rlfleet train``: flags laid over one base run config, and the one YAML entry point
(a run's config.yaml or tune's best.yaml, or ML-Agents run options)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import tyro
import yaml

from rlfleet import errors
from rlfleet.algos.registry import get_algorithm
from rlfleet.checkpoint import CheckpointManager, read_metadata
from rlfleet.cli.main import main
from rlfleet.cli.train import base_flags, command_class, default_command, train_base
from rlfleet.runs import adapt
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


# --------------------------------------------------------------------------- a full disk

FULL_DISK_RUN = ["train", "ppo", "--env", "CartPole-v1", *TINY, "--max-steps", "1024"]


def _no_space(boundary: str, nth: int) -> Callable[[str, Path], None]:
    """A fault hook that fails the ``nth`` write at ``boundary`` (outside ``best/``) as a full
    disk does."""
    reached = 0

    def hook(name: str, path: Path) -> None:
        nonlocal reached
        if name == boundary and "best" not in path.parts:
            reached += 1
            if reached == nth:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    return hook


def _latest_step(run_dir: Path) -> int:
    latest = CheckpointManager(run_dir / "checkpoints", readonly=True).latest()
    assert latest is not None
    return int(read_metadata(latest)["counters"]["env_step"])


@pytest.mark.parametrize(
    ("boundary", "message"),
    [
        ("checkpoint.tensors_written", "checkpoints/step-000000000256: cannot save the checkpoint"),
        ("checkpoint.meta_written", "checkpoints/step-000000000256: cannot save the checkpoint"),
        ("latest.tmp_written", "checkpoints/latest.json: cannot update"),
        ("history.tmp_written", "history.parquet: cannot write"),
    ],
)
def test_a_full_disk_is_one_line_and_the_previous_checkpoint_stays(
    boundary: str,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_dir = tmp_path / "run"
    monkeypatch.setattr(errors, "FAULT_HOOK", _no_space(boundary, nth=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second failure while stopping on the first
        assert main([*FULL_DISK_RUN, "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert message in err
    assert re.search(r"No space left on device; [\d.]+ [KMGT]?i?B free on its file system", err)
    assert _latest_step(run_dir) == 128
    monkeypatch.setattr(errors, "FAULT_HOOK", None)
    assert main(["eval", str(run_dir), "--episodes", "1"]) == 0


def _mount_tmpfs(where: Path, size: int) -> None:
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")


def test_a_tiny_file_system_fills_up_into_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real full disk: a run copied onto a tmpfs with little room left cannot save its next
    checkpoint; the command says so in one line, exit code 2, and its checkpoint stays."""
    trained = tmp_path / "trained"
    assert main([*FULL_DISK_RUN, "--max-epochs", "1", "--run-dir", str(trained)]) == 0
    used = sum(path.stat().st_size for path in trained.rglob("*") if path.is_file())
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, size=used + 96 * 1024)  # less than one more checkpoint
    try:
        run_dir = disk / "run"
        shutil.copytree(trained, run_dir)
        capsys.readouterr()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert main([*FULL_DISK_RUN, "--max-epochs", "4", "--resume", str(run_dir)]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err
        assert "No space left on device" in err
        assert "free on its file system" in err
        assert _latest_step(run_dir) == 128
        assert main(["eval", str(run_dir), "--episodes", "1"]) == 0
    finally:
        subprocess.run(["umount", str(disk)], check=False)


# ------------------------------------------------------------------ test cadence
def test_the_last_line_says_the_share_of_time_spent_testing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [a for a in TINY if a != "--no-verbose"]
    run_dir = tmp_path / "run"
    assert main(["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(run_dir), *args]) == 0
    done = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("done"))
    share = re.search(r" in [0-9.]+ s \(test ([0-9]+)% of time\)$", done)
    assert share is not None, done
    assert 0 <= int(share.group(1)) <= 100
    rows = pq.read_table(run_dir / "history.parquet").to_pylist()
    shares = [r["time/test_share"] for r in rows if r.get("time/test_share") is not None]
    assert shares
    assert all(0.0 <= s < 1.0 for s in shares)


def test_an_explicit_test_cadence_is_kept(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    flags = ["--test-interval-steps", "1", "--max-steps", "512"]
    args = ["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(run_dir), *TINY, *flags]
    assert main(args) == 0
    cfg = load_run_config(run_dir).trainer
    assert (cfg.test_interval_steps, cfg.test_step_num_episodes) == (1, 2)
    rows = pq.read_table(run_dir / "history.parquet").to_pylist()
    tested = [r["env_step"] for r in rows if r.get("test/score") is not None]
    assert tested == [128, 256, 384, 512]


PENALTY = "tests.envs.test_probe:PenaltyEnv"
"""An env no preset names: a constant penalty and a badly scaled observation entry."""


def test_an_unnamed_env_trains_with_adapted_defaults_that_the_run_keeps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    args = [a for a in TINY if a != "--no-verbose"]
    run_dir = tmp_path / "run"
    assert main(["train", "ppo", "--env", PENALTY, "--run-dir", str(run_dir), *args]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "adapted to" in line]
    assert [n.split(": ")[1].split(" (")[0] for n in notes] == [
        "hyperparameters.normalize_obs = True",
        "hyperparameters.normalize_reward = True",
    ]
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["hyperparameters"]["normalize_obs"] is True
    assert set(saved["adapted"]) == {
        "hyperparameters.normalize_obs",
        "hyperparameters.normalize_reward",
    }
    # Resume and eval rebuild the run from config.yaml: nothing is probed again.
    monkeypatch.setattr(adapt, "probe_env", lambda *a, **k: pytest.fail("probed again"))
    more = ["--max-steps", "512", "--no-verbose"]
    assert main(["train", "ppo", "--resume", str(run_dir), *more]) == 0
    assert load_run_config(run_dir).adapted == saved["adapted"]
    assert main(["eval", str(run_dir), "--episodes", "1"]) == 0


def test_flags_win_over_adapted_values_and_the_switch_turns_adaptation_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ppo = get_algorithm("ppo")
    flagged = train_base(ppo, ["--env", PENALTY])
    assert flagged.config.adapted
    cfg = main_config(ppo, ["--env", PENALTY, "--no-normalize-obs", *TINY])
    assert cfg.hyperparameters.normalize_obs is False
    assert list(cfg.adapted) == ["hyperparameters.normalize_reward"]
    off = main_config(ppo, ["--env", PENALTY, "--no-adapt-defaults", *TINY])
    assert off.adapt_defaults is False
    assert off.adapted == {}
    assert off.hyperparameters.normalize_obs is False
    assert off.hyperparameters.normalize_reward is False
    assert base_flags(["--no-adapt-defaults", "--adapt-defaults"]) == {"adapt_defaults": "true"}
    # A config file is taken as it is, never probed.
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"algo": "ppo", "env": {"id": PENALTY}}))
    monkeypatch.setattr(adapt, "probe_env", lambda *a, **k: pytest.fail("probed"))
    from_file = train_base(ppo, ["--config", str(path)]).config
    assert from_file.adapted == {}
    assert from_file.hyperparameters.normalize_obs is False


def main_config(algo_cls: Any, args: list[str]) -> Any:
    """The checked run config ``rlfleet train ALGO ARGS`` would train."""
    base = train_base(algo_cls, args)
    command = tyro.cli(
        command_class(algo_cls),
        args=args,
        default=default_command(algo_cls, base.config, None),
    )
    return command.run_config()
