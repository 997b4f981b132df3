"""`rlfleet train OPTIONS.yaml`: run directory, exact replay, resume / force /
initialize-from with ML-Agents' semantics, keep_checkpoints rotation."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from rlfleet.checkpoint import read_metadata
from rlfleet.cli.main import main
from rlfleet.errors import CheckpointError
from rlfleet.runs.config import load_run_config
from rlfleet.runs.from_options import run_config_from_options
from rlfleet.runs.options_parser import load_run_options
from rlfleet.runs.run import build_algorithm, initialize_weights, load_algorithm

OPTIONS = """\
env_settings: {env_id: CartPole-v1, num_envs: 4, num_test_envs: 2, seed: 1}
behaviors:
  CartPole:
    hyperparameters: {batch_size: 64, num_epochs: 1, learning_rate: 1e-3}
    network_settings: {hidden_units: 32}
    time_horizon: 16
    max_steps: 512
    summary_freq: 128
    checkpoint_interval: 128
    keep_checkpoints: 2
    reward_signals:
      extrinsic: {gamma: 0.98}
      rnd: {strength: 0.01, gamma: 0.98}
    trainer_settings: {test_step_num_episodes: 2, show_progress: false, verbose: false}
environment_parameters:
  length: {sampler_type: uniform, sampler_parameters: {min_value: 0.4, max_value: 0.6}}
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("options")
    (root / "cartpole.yaml").write_text(OPTIONS)
    assert main(["train", str(root / "cartpole.yaml"), "--results-dir", str(root)]) == 0
    return root


def _steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*"))


def test_the_run_directory_is_named_after_the_file_and_complete(results: Path) -> None:
    run = results / "cartpole"
    for name in ("run_options.yaml", "config.yaml", "history.parquet", "best/latest.json",
                 "plots/learning_curve.png"):  # fmt: skip
        assert (run / name).exists(), name
    assert _steps(run) == [384, 512]  # keep_checkpoints: 2 of the 4 are left
    history = pq.read_table(run / "history.parquet").to_pydict()
    assert any(v is not None for v in history["train/intrinsic_rnd_reward"])


def test_the_resolved_options_replay_exactly(results: Path) -> None:
    run = results / "cartpole"
    assert main(["train", str(run / "run_options.yaml"), "--run-id", "replay"]) == 0
    original = load_run_options(run / "run_options.yaml")
    replayed = load_run_options(results / "replay" / "run_options.yaml")
    assert replayed.checkpoint_settings.run_id == "replay"
    replayed.checkpoint_settings.run_id = "cartpole"
    assert replayed == original
    assert load_run_config(results / "replay") == load_run_config(run)
    assert run_config_from_options(original) == load_run_config(run)
    # Same options, same seed, same machine: the same policy.
    a, _ = load_algorithm(run, which="latest")
    b, _ = load_algorithm(results / "replay", which="latest")
    assert torch.equal(a.parameters_vector(), b.parameters_vector())


def test_an_existing_run_needs_resume_or_force(
    results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = str(results / "cartpole.yaml")
    assert main(["train", options, "--results-dir", str(results)]) == 2
    assert "--resume to continue it or --force" in capsys.readouterr().err
    assert main(["train", options, "--results-dir", str(results), "--run-id", "nothing",
                 "--resume"]) == 2  # fmt: skip
    assert "cannot resume" in capsys.readouterr().err
    assert main(["train", options, "--results-dir", str(results), "--resume", "--force"]) == 2
    assert "resume and force contradict" in capsys.readouterr().err


def test_resume_continues_and_force_starts_over(results: Path) -> None:
    import shutil

    options = str(results / "cartpole.yaml")
    shutil.copytree(results / "cartpole", results / "again")
    args = ["train", options, "--results-dir", str(results), "--run-id", "again"]
    resume = ["--resume", "--schedule-on-resume", "stretch"]
    assert main([*args, *resume, "--set", "behaviors.CartPole.max_steps=768"]) == 0
    assert _steps(results / "again") == [640, 768]
    history = pq.read_table(results / "again" / "history.parquet").to_pydict()
    assert history["env_step"][-1] == 768
    # The rows of the first run are kept: its first interval row (episode rows come before it).
    logged = [
        s for s, e in zip(history["env_step"], history["episode/return"], strict=True) if e is None
    ]
    assert logged[0] == 128
    assert main([*args, "--force"]) == 0
    assert _steps(results / "again") == [384, 512]


def test_the_algo_command_resumes_an_options_run_with_its_signals(results: Path) -> None:
    import shutil

    shutil.copytree(results / "cartpole", results / "by-algo")
    run = results / "by-algo"
    resume = ["--resume", str(run), "--schedule-on-resume", "stretch"]
    assert main(["train", "ppo", *resume, "--max-steps", "640"]) == 0
    cfg = load_run_config(run)
    assert cfg.reward_signals is not None
    assert cfg.reward_signals.rnd is not None
    assert set(cfg.environment_parameters) == {"length"}
    history = pq.read_table(run / "history.parquet").to_pydict()
    assert history["env_step"][-1] == 640
    assert history["train/intrinsic_rnd_reward"][-2] is not None


def test_initialize_from_copies_weights_and_starts_counters_at_zero(results: Path) -> None:
    options = str(results / "cartpole.yaml")
    args = ["train", options, "--results-dir", str(results), "--run-id", "warm",
            "--initialize-from", "cartpole",
            "--set", "behaviors.CartPole.max_steps=128"]  # fmt: skip
    assert main(args) == 0
    meta = read_metadata(results / "warm" / "checkpoints" / "step-000000000128")
    assert meta["counters"]["env_step"] == 128  # a new run, not a continuation
    # The weights it started from are the other run's latest.
    cfg = load_run_config(results / "warm")
    source, _ = load_algorithm(results / "cartpole", which="latest")
    fresh = build_algorithm(cfg, source.observation_space, source.action_space)
    assert not torch.equal(fresh.parameters_vector(), source.parameters_vector())
    initialize_weights(fresh, results / "cartpole")
    assert torch.equal(fresh.parameters_vector(), source.parameters_vector())
    assert fresh.gradient_steps == 0


def test_initialize_from_a_different_env_or_nowhere_is_refused(
    results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = load_run_config(results / "cartpole")
    from gymnasium import spaces

    other = build_algorithm(cfg, spaces.Box(-1, 1, (6,)), spaces.Discrete(3))
    with pytest.raises(CheckpointError, match="observation space"):
        initialize_weights(other, results / "cartpole")
    options = str(results / "cartpole.yaml")
    assert main(["train", options, "--results-dir", str(tmp_path),
                 "--initialize-from", "missing-run"]) == 2  # fmt: skip
    assert "cannot initialize from 'missing-run'" in capsys.readouterr().err


def test_bad_options_fail_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(OPTIONS.replace("time_horizon: 16", "time_horizn: 16"))
    assert main(["train", str(bad), "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{bad} line 6: behaviors.CartPole.time_horizn: unknown key" in err
    assert "did you mean 'time_horizon'" in err
    assert not (tmp_path / "bad").exists()


def test_an_unknown_device_fails_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "gpu.yaml"
    bad.write_text(OPTIONS + "torch_settings: {device: gpu}\n")
    assert main(["train", str(bad), "--results-dir", str(tmp_path)]) == 2
    assert "torch_settings.device: 'gpu' is not a torch device" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu.yaml"]


def test_verbose_false_prints_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    options = tmp_path / "quiet.yaml"
    options.write_text(OPTIONS)  # trainer_settings: verbose: false
    assert main(["train", str(options), "--results-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""
