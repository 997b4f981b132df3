"""Bad input on the command line: every subcommand answers it with one line and exit code 2,
writes nothing, and a run that failed to start can be started again as it was typed."""

from __future__ import annotations

import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlfleet.algos.ppo import PPOConfig
from rlfleet.checkpoint import CheckpointManager
from rlfleet.cli.main import COMMANDS, main, one_line_warning
from rlfleet.logging.progress import ProgressReporter
from rlfleet.nn import precision
from rlfleet.runs.config import EnvConfig
from rlfleet.runs.run_dir import interrupted_message
from rlfleet.train.loop import TrainerConfig
from tests.config.test_loader import _float_fields
from tests.processes import python_module

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "--num-envs", "2", "--num-steps", "32", "--batch-size", "64", "--max-steps", "256",
    "--epoch-num-steps", "128", "--num-test-envs", "2", "--test-step-num-episodes", "2",
    "--no-show-progress",
]  # fmt: skip
TRAIN = ["train", "ppo", "--env", "CartPole-v1"]
MODULE_FORMS = ["tests.envs.toy_envs:rlfleet-test/FaultyEnv-v0", "tests.envs.toy_envs:FaultyEnv"]
"""One env named as ``module:EnvId`` (the module registers it) and as ``module:EnvClass``."""

LONG = "x" * 300
"""A name longer than any file system takes (``File name too long``, not just missing)."""

NONSENSE: dict[str, list[list[str]]] = {
    "train": [
        [],
        ["--bogus"],
        ["ppo", "--env", "CartPole-v1", "--bogus"],
        ["ppo", "--env", "CartPole-v1", "--num-envs", "many"],
        ["ppo", "--env", "CartPole-v1", "--device", "gpu"],
        ["ppo", "--env", "CartPole-v1", "--precision", "fp16"],
        ["ppo", "--env", "NoSuchEnv-v0"],
        ["ppo", "--resume", "no/such/run"],
        ["ppo", "--resume", LONG],
        ["ppo", "--env", "CartPole-v1", "--run-dir", LONG],
        [f"{LONG}/run_options.yaml"],
        ["ppo", "--config", "no/such/config.yaml"],
        ["no/such/options.yaml"],
        ["no-such-algo", "--env", "CartPole-v1"],
    ],
    "collect": [
        [],
        ["--bogus"],
        ["no/such/run", "--steps", "many", "--out", "dataset"],
        ["no/such/run", "--steps", "10", "--out", "dataset"],
        [LONG, "--steps", "10", "--out", "dataset"],
        ["no/such/run", "--steps", "10", "--out", "dataset", "--device", "gpu"],
    ],
    "eval": [
        [],
        ["no/such/run", "--bogus"],
        ["no/such/run", "--episodes", "many"],
        ["no/such/run"],
        [LONG],
        ["no/such/run", "--device", "gpu"],
    ],
    "play": [
        [],
        ["no/such/run", "--bogus"],
        ["no/such/run", "--episodes", "many"],
        ["no/such/run", "--video-dir", "videos"],
        [LONG],
        ["no/such/run", "--device", "gpu"],
    ],
    "export": [
        [],
        ["--bogus"],
        ["no/such/run"],
        ["no/such/run", "--format", "tflite"],
        ["no/such/run", "--checkpoint", "oldest"],
        [LONG],
    ],
    "plot": [[], ["--bogus"], ["no/such/run"], ["no/such/run", "--out"], [LONG]],
    "tune": [
        [],
        ["--bogus"],
        ["ppo", "--bogus"],
        ["ppo", "--env", "CartPole-v1", "--trials", "many"],
        ["ppo", "--env", "NoSuchEnv-v0"],
        ["no-such-algo", "--env", "CartPole-v1"],
    ],
    "check-env": [
        [],
        ["--bogus"],
        ["CartPole-v1", "--steps", "many"],
        ["NoSuchEnv-v0"],
        ["no_such_module_xyz:Env"],
    ],
}
CASES = [(command, args) for command, cases in NONSENSE.items() for args in cases]


@pytest.fixture
def empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Run in an empty directory, and check that it is still empty afterwards."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield cwd
    assert sorted(p.name for p in cwd.iterdir()) == []


def _exit_code(args: list[str]) -> int:
    try:
        return main(args)
    except SystemExit as stop:  # tyro's answer to an argument it cannot parse
        return stop.code if isinstance(stop.code, int) else 1


def test_every_subcommand_has_nonsense_cases() -> None:
    assert set(NONSENSE) == set(COMMANDS)


@pytest.mark.parametrize(
    ("command", "args"), CASES, ids=[shlex.join([command, *args]) for command, args in CASES]
)
def test_nonsense_exits_2_without_a_traceback_or_files(
    command: str, args: list[str], empty_cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _exit_code([command, *args]) == 2
    err = capsys.readouterr().err
    assert err.strip()
    assert "Traceback" not in err
    # One line, tyro's parse errors (unknown flags, values of the wrong type, missing ones)
    # included: rlfleet.cli.parse_errors turns their boxes into a line.
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ")


NAN_FLAGS = [
    f"--{name.replace('_', '-')}"
    for cls in (PPOConfig, TrainerConfig, EnvConfig)
    for name in _float_fields(cls)
]


@pytest.mark.parametrize("flag", NAN_FLAGS)
def test_no_float_flag_takes_nan(
    flag: str, empty_cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/reliability.md: no flag may be NaN (every float flag of ``rlfleet train ppo``),
    and the error names the flag."""
    assert _exit_code([*TRAIN, "--max-steps", "64", "--no-show-progress", flag, "nan"]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"error: {flag}: .*nan\)?\n", err), err


OUT_OF_BOUNDS = [
    (["eval", "no/such/run", "--episodes", "0"], "--episodes: expected a number >= 1, got 0"),
    (["play", "no/such/run", "--episodes", "-2"], "--episodes: expected a number >= 1, got -2"),
    (["play", "no/such/run", "--fps", "0"], "--fps: expected a number >= 1, got 0"),
    (
        ["collect", "no/such/run", "--steps", "0", "--out", "dataset"],
        "--steps: expected a number >= 1, got 0",
    ),
    (
        ["collect", "no/such/run", "--steps", "9", "--num-envs", "0", "--out", "dataset"],
        "--num-envs: expected a number from 1 to 65536, got 0",
    ),
    (
        ["collect", "no/such/run", "--steps", "9", "--epsilon", "2", "--out", "dataset"],
        "--epsilon: expected a number from 0 to 1, got 2",
    ),
    (["check-env", "CartPole-v1", "--steps", "0"], "--steps: expected a number >= 1, got 0"),
    (["plot", "no/such/run", "--smooth", "0"], "--smooth: expected a number >= 1, got 0"),
]


@pytest.mark.parametrize(
    ("args", "message"), OUT_OF_BOUNDS, ids=[shlex.join(args) for args, _ in OUT_OF_BOUNDS]
)
def test_a_flag_out_of_bounds_is_named_before_anything_is_read(
    args: list[str], message: str, empty_cwd: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Named, not left to play nothing and succeed (0 episodes) or to a library's own
    # argument names; checked before the run is read (none exists here).
    assert _exit_code(args) == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"


def _cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlfleet.cli.main", *args],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _env(**extra: str) -> dict[str, str]:
    """A CLI subprocess imports this checkout's rlfleet and tests package."""
    paths = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}


@pytest.mark.parametrize(
    "args",
    [["plot"], [*TRAIN, "--device", "gpu"], ["check-env", "tests.envs.toy_envs:NoSuchEnv"]],
    ids=["plot", "train-device", "check-env"],
)
def test_a_real_process_prints_one_line(args: list[str], empty_cwd: Path) -> None:
    done = _cli(*args, cwd=empty_cwd)
    assert done.returncode == 2
    assert done.stderr.startswith("error: ")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


# ------------------------------------------------------------------- devices
@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("bad-cli") / "run"
    assert main([*TRAIN, "--run-dir", str(run_dir), *TINY]) == 0
    return run_dir


@pytest.mark.parametrize(
    "args",
    [
        ["eval", "{run}"],
        ["play", "{run}"],
        ["collect", "{run}", "--steps", "10", "--out", "{tmp}/dataset"],
        [*TRAIN, "--run-dir", "{tmp}/run"],
        ["train", "ppo", "--resume", "{run}"],
    ],
    ids=["eval", "play", "collect", "train", "train-resume"],
)
@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("gpu", "--device: 'gpu' is not a torch device (expected one of: cpu"),
        ("cuda", "--device: device 'cuda' is not available"),
    ],
)
def test_every_device_flag_is_checked_before_anything_runs(
    args: list[str],
    device: str,
    message: str,
    trained: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    before = sorted(p.relative_to(trained) for p in trained.rglob("*"))
    filled = [a.format(run=trained, tmp=tmp_path) for a in args]
    assert main([*filled, "--device", device]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
    assert sorted(p.relative_to(trained) for p in trained.rglob("*")) == before


def test_bf16_on_a_cpu_without_it_is_one_line_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    run_dir = tmp_path / "run"
    assert main([*TRAIN, *TINY, "--run-dir", str(run_dir), "--precision", "bf16"]) == 2
    err = capsys.readouterr().err.strip()
    assert "error: --precision: bf16 refused on cpu" in err
    assert len(err.splitlines()) == 1
    assert not run_dir.exists()


def test_precision_in_a_config_file_is_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("algo: ppo\nenv: {id: CartPole-v1}\ntrainer: {precision: fp16}\n")
    assert main(["train", "ppo", "--config", str(config), "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "trainer.precision: input should be 'fp32' or 'bf16' (got 'fp16')" in err
    assert not (tmp_path / "r").exists()


def test_device_in_a_config_file_is_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("algo: ppo\nenv: {id: CartPole-v1}\ndevice: gpu\n")
    assert main(["train", "ppo", "--config", str(config), "--run-dir", str(tmp_path / "r")]) == 2
    assert f"{config}: device: 'gpu' is not a torch device" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------- failed starts
@pytest.mark.parametrize(
    ("bad", "good"),
    [
        (["--env", "CartPole-v1", "--device", "gpu"], ["--env", "CartPole-v1", "--device", "cpu"]),
        (["--env", "CartPol-v1"], ["--env", "CartPole-v1"]),
        (["--env", "tests.envs.toy_envs:NoSuchEnv"], ["--env", "tests.envs.toy_envs:FaultyEnv"]),
    ],
    ids=["device", "env-id", "env-module"],
)
def test_a_failed_start_can_be_retried_without_force(
    bad: list[str], good: list[str], tmp_path: Path
) -> None:
    run = ["train", "ppo", "--run-dir", str(tmp_path / "runs" / "exp"), *TINY]
    assert main([*run, *bad]) == 2
    assert list(tmp_path.iterdir()) == []
    assert main([*run, *good]) == 0


def test_an_env_constructor_that_raises_leaves_no_run_dir(tmp_path: Path) -> None:
    run = ["train", "ppo", "--run-dir", str(tmp_path / "run"), *TINY]
    with pytest.raises(RuntimeError, match="on purpose"):
        main([*run, "--env", "tests.envs.toy_envs:RaisesOnConstruction"])
    assert list(tmp_path.iterdir()) == []
    assert main([*run, "--env", "CartPole-v1"]) == 0


# ------------------------------------------------------- module:EnvId / Class
@pytest.mark.parametrize("env_id", MODULE_FORMS)
def test_module_forms_work_in_train_check_env_play_and_eval(
    env_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(tmp_path / "run")
    assert main(["check-env", env_id, "--steps", "100"]) == 0
    assert main(["train", "ppo", "--env", env_id, "--run-dir", run, *TINY]) == 0
    assert main(["eval", run, "--episodes", "2"]) == 0
    assert main(["play", run]) == 0
    out = capsys.readouterr().out
    assert f"ppo on {env_id}: mean return 5.00" in out  # 5-step episodes, reward 1 per step
    assert "episode 1: return 5.00, length 5" in out


# ----------------------------------------------------------------- Ctrl-C
def _interrupt_when(path: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Start ``rlfleet ARGS`` and send it SIGINT once ``path`` exists."""
    process = subprocess.Popen(
        python_module("rlfleet.cli.main", *args),
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not path.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        running = process.poll() is None
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:  # a failed test leaves no training process behind
            process.kill()
            process.wait()
    assert running, f"rlfleet {shlex.join(args)} ended before {path} appeared: {stderr}"
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


LONG = [
    "--num-envs", "2", "--num-steps", "32", "--batch-size", "64", "--max-steps", "10000000",
    "--target-reward", "1e9", "--no-show-progress", "--no-verbose",
]  # fmt: skip


def test_ctrl_c_names_the_command_that_resumes_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "my run"
    args = [*TRAIN, "--run-dir", str(run_dir), "--epoch-num-steps", "256", *LONG]
    done = _interrupt_when(run_dir / "checkpoints" / "latest.json", args, tmp_path)
    assert done.returncode == 130
    resume = f"rlfleet train ppo --resume {shlex.quote(str(run_dir))}"
    assert f"continue with `{resume}`" in done.stderr
    assert "Traceback" not in done.stderr
    # The command it names does resume the run.
    _, metadata = CheckpointManager(run_dir / "checkpoints", readonly=True).load_latest()
    reached = int(metadata["counters"]["env_step"])
    more = ["--max-steps", str(reached + 256), "--schedule-on-resume", "stretch"]
    assert main([*shlex.split(resume)[1:], *more, "--no-show-progress"]) == 0
    _, metadata = CheckpointManager(run_dir / "checkpoints", readonly=True).load_latest()
    assert int(metadata["counters"]["env_step"]) == reached + 256


def test_ctrl_c_before_the_first_checkpoint_says_there_is_none(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = [*TRAIN, "--run-dir", str(run_dir), "--epoch-num-steps", "10000000", *LONG]
    done = _interrupt_when(run_dir / "config.yaml", args, tmp_path)
    assert done.returncode == 130
    assert "interrupted before the first checkpoint" in done.stderr
    assert "--resume" not in done.stderr
    assert "Traceback" not in done.stderr
    # Before its first training step the run is undone; after it, its files are kept and
    # the message says that the same command needs --force.
    kept = run_dir.exists()
    assert ("start again with --force" in done.stderr) == kept
    assert ("nothing was kept" in done.stderr) == (not kept)


def test_ctrl_c_message_of_a_forced_run_before_its_first_step(tmp_path: Path) -> None:
    """Ctrl-C before a forced run's first training step puts back the run it was to replace,
    with its checkpoint: the message says so rather than offer to resume it as if it were
    the new run."""
    run_dir = tmp_path / "run"
    assert main([*TRAIN, "--run-dir", str(run_dir), *TINY]) == 0
    resume = f"rlfleet train ppo --resume {run_dir}"
    assert "continue with" in interrupted_message(run_dir, resume)
    began = time.time() + 1  # the forced run began after the old run's last checkpoint
    message = interrupted_message(run_dir, resume, new_run_since=began)
    assert message == (
        "interrupted before the first checkpoint; nothing of the new run was kept, and the run "
        f"it was to replace is back in {run_dir}"
    )


def test_ctrl_c_in_an_options_run_names_its_options_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    options = tmp_path / "cartpole.yaml"
    options.write_text(
        "env_settings: {env_id: CartPole-v1, num_envs: 2, num_test_envs: 2}\n"
        "behaviors:\n  CartPole:\n    hyperparameters: {batch_size: 64}\n"
        "    time_horizon: 32\n    max_steps: 512\n    checkpoint_interval: 128\n"
        "    trainer_settings: {test_step_num_episodes: 2, show_progress: false}\n"
    )

    def ctrl_c(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # once the first epoch's checkpoint is written

    with monkeypatch.context() as patch:
        patch.setattr(ProgressReporter, "epoch_summary", ctrl_c)
        assert main(["train", str(options), "--results-dir", str(tmp_path / "results")]) == 130
    run_dir = tmp_path / "results" / "cartpole"
    resume = f"rlfleet train {run_dir / 'run_options.yaml'} --resume"
    assert f"continue with `{resume}`" in capsys.readouterr().err
    assert main(shlex.split(resume)[1:]) == 0
    _, metadata = CheckpointManager(run_dir / "checkpoints", readonly=True).load_latest()
    assert metadata["counters"]["env_step"] == 512


# -------------------------------------------------------------- --no-verbose
def test_no_verbose_and_no_show_progress_print_nothing(tmp_path: Path) -> None:
    # TTY_COMPATIBLE=1: rich draws its progress bar as on a terminal.
    args = [*TRAIN, *TINY[:-1]]
    loud = _cli(*args, "--run-dir", "loud", cwd=tmp_path, TTY_COMPATIBLE="1")
    assert loud.returncode == 0, loud.stderr
    assert "done (max_steps)" in loud.stdout
    assert "epoch 1" in loud.stdout
    # --no-verbose drops the lines; the bar follows --show-progress alone, as in Tianshou.
    bar_only = _cli(*args, "--run-dir", "bar", "--no-verbose", cwd=tmp_path, TTY_COMPATIBLE="1")
    assert bar_only.returncode == 0, bar_only.stderr
    assert "env steps" in bar_only.stdout
    assert "epoch 1" not in bar_only.stdout
    assert "done (max_steps)" not in bar_only.stdout
    quiet = _cli(
        *args, "--run-dir", "quiet", "--no-verbose", "--no-show-progress",
        cwd=tmp_path, TTY_COMPATIBLE="1",
    )  # fmt: skip
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == ""
    assert quiet.stderr == ""
    assert (tmp_path / "quiet" / "checkpoints" / "latest.json").is_file()


# ------------------------------------------------------------ out-of-range input
LAUGHS = "algo: ppo\nenv: {id: CartPole-v1}\na: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 10)}]\n"
    for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)
FILES = {
    "binary.yaml": b"algo: ppo\n\xff\xfe\x00\x01",
    "bomb.yaml": LAUGHS.encode(),
}
OUT_OF_RANGE = [
    (["--torch-threads", "100000"], "torch_threads must be an integer from 1 to 1024"),
    (["--torch-threads", "-1"], "torch_threads must be an integer from 1 to 1024"),
    (["--seed", str(2**64)], "seed must be an integer from 0 to 4294967295"),
    (["--seed", "-5"], "seed must be an integer from 0 to 4294967295"),
    (["--device", "cuda:99"], "--device: device 'cuda:99' is not available"),
    (["--device", "cpu:x"], "--device: 'cpu:x' is not a torch device"),
    (["--device", ""], "--device: '' is not a torch device"),
    (["--device", "meta"], "rlfleet does not train on 'meta' devices"),
    (["--hidden-sizes", "100000000"], "--hidden-sizes value 1: input should be less than or equal"),
    (["--hidden-sizes", "60000", "60000", "60000"], "GiB of memory is available"),
    (["--lstm-hidden-size", "100000"], "--lstm-hidden-size: input should be less than or equal"),
    (["--num-envs", "100000000"], "--num-envs: input should be less than or equal to 65536"),
    (["--plateau-reduce-factor", "-1"], "--plateau-reduce-factor: input should be greater than 0"),
    (["--plateau-reduce-factor", "2"], "--plateau-reduce-factor: input should be less than 1"),
    (["--config", "/dev/zero"], "/dev/zero: cannot read config file (not a regular file)"),
    (["--config", "{tmp}/binary.yaml"], "not UTF-8 text: byte 0xff at offset 10"),
    (["--config", "{tmp}/bomb.yaml"], "YAML aliases expand to"),
    (["--run-dir", "{tmp}/" + "a" * 300], "File name too long"),
    (["--run-dir", "/proc/no/such/run"], "cannot create run directory /proc/no/such/run"),
]


@pytest.mark.parametrize(
    ("flags", "message"), OUT_OF_RANGE, ids=[shlex.join(flags)[:40] for flags, _ in OUT_OF_RANGE]
)
def test_out_of_range_input_is_one_line_and_writes_nothing(
    flags: list[str],
    message: str,
    tmp_path: Path,
    empty_cwd: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for name, data in FILES.items():
        (inputs / name).write_bytes(data)
    filled = [f.format(tmp=inputs) for f in flags]
    run_dir = [] if "--run-dir" in flags else ["--run-dir", str(tmp_path / "run")]
    assert _exit_code([*TRAIN, *TINY, *run_dir, *filled]) == 2
    err = capsys.readouterr().err
    assert message in err.replace("\n", " ")
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "inputs"]


@pytest.mark.parametrize(
    "args",
    [
        ["plot", "{run}", "--out", "{out}.png"],
        ["export", "{run}", "--out", "{out}.pt", "--force"],
        [*TRAIN, *TINY, "--run-dir", "{tmp}/run", "--history-checkpoint", "{out}.parquet"],
    ],
    ids=["plot", "export", "history-checkpoint"],
)
def test_an_output_that_is_a_fifo_is_refused_and_kept(
    args: list[str], trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An output path that is a FIFO (as /dev/null is a device) is not replaced by a file."""
    out = tmp_path / "pipe"
    filled = [a.format(run=trained, out=out, tmp=tmp_path) for a in args]
    fifo = Path(next(a for a in filled if a.startswith(str(out))))
    os.mkfifo(fifo)
    assert main(filled) == 2
    err = capsys.readouterr().err
    assert f"{fifo}: cannot write" in err
    assert "expected a regular file or a new path, got a FIFO" in err
    assert len(err.strip().splitlines()) == 1
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == [fifo.name]


@pytest.mark.parametrize(
    ("network", "message"),
    [
        ("{num_layers: 2000000000}", "num_layers: input should be less than or equal to 1000"),
        ("{num_layers: 900, hidden_units: 60000}", "GiB of memory is available"),
    ],
)
def test_yaml_network_sizes_out_of_range_are_refused(
    network: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = tmp_path / "layers.yaml"
    options.write_text(
        f"behaviors:\n  CartPole:\n    network_settings: {network}\n"
        "env_settings: {env_id: CartPole-v1}\n"
    )
    assert main(["train", str(options), "--results-dir", str(tmp_path / "results")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_a_yaml_alias_bomb_as_run_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(LAUGHS)
    assert main(["train", str(bomb)]) == 2
    assert "YAML aliases expand to" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("env_id", "extra", "dependency", "env_package"),
    [
        ("CarRacing-v3", "box2d", "Box2D", "gymnasium.envs.box2d"),
        ("HalfCheetah-v5", "mujoco", "mujoco", "gymnasium.envs.mujoco"),
    ],
)
def test_a_missing_env_extra_names_what_to_install(
    env_id: str,
    extra: str,
    dependency: str,
    env_package: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The extra is made missing whether or not it is installed here: its module cannot be
    # imported, and gymnasium's env modules import it again.
    monkeypatch.setitem(sys.modules, dependency, None)
    for name in [m for m in sys.modules if m == env_package or m.startswith(env_package + ".")]:
        monkeypatch.delitem(sys.modules, name)
    args = [
        "train",
        "sac",
        "--env",
        env_id,
        "--run-dir",
        str(tmp_path / "run"),
        "--max-steps",
        "64",
    ]
    assert main(args) == 2
    assert f'pip install "gymnasium[{extra}]"' in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_truncated_dataset_is_one_line_and_leaves_no_run(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = tmp_path / "dataset"
    assert main(["collect", str(trained), "--steps", "100", "--out", str(dataset)]) == 0
    data = dataset / "data.npz"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    capsys.readouterr()
    run = ["train", "bc", "--env", "CartPole-v1", "--dataset", str(dataset)]
    assert main([*run, "--max-steps", "64", "--run-dir", str(tmp_path / "run")]) == 2
    assert f"{data}: not a readable npz file" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]


@pytest.mark.parametrize("misbehaviour", ["string_reward", "wrong_shape_obs", "none_obs"])
def test_an_env_breaking_the_api_in_sync_mode_is_one_line(
    misbehaviour: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "algo: ppo\nenv:\n  id: tests.envs.toy_envs:MisbehavingEnv\n  vector_mode: sync\n"
        f"  kwargs: {{misbehaviour: {misbehaviour}}}\n"
    )
    args = ["train", "ppo", "--config", str(config), "--run-dir", str(tmp_path / "run"), *TINY]
    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    # The error, after any warnings gymnasium's env checker raised first, one line each.
    assert lines[-1].startswith("error: env index 0 (MisbehavingEnv)")
    assert all(line.startswith("warning: ") for line in lines[:-1]), lines
    assert not any("Traceback" in line or "\x1b" in line for line in lines)
    # It failed on its first training step: no run directory is left to need --force.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


def test_a_forced_run_failing_on_its_first_step_puts_the_old_run_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    assert main([*TRAIN, "--run-dir", str(run_dir), *TINY]) == 0
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    config = tmp_path / "config.yaml"
    config.write_text(
        "algo: ppo\nenv:\n  id: tests.envs.toy_envs:MisbehavingEnv\n  vector_mode: sync\n"
        "  kwargs: {misbehaviour: string_reward}\n"
    )
    args = ["train", "ppo", "--config", str(config), "--run-dir", str(run_dir), "--force"]
    assert main([*args, *TINY]) == 2
    assert "error: env index 0 (MisbehavingEnv)" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "run"]


def test_a_warning_is_one_line_without_colour_codes(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI shows warnings as ``warning: MESSAGE``: gymnasium's coloured ``WARN:``
    message loses its codes and prefix, and no source line follows."""
    one_line_warning(
        UserWarning(
            "\x1b[33mWARN: The obs returned by the `step()` method\nis not within"
            " the observation space.\x1b[0m"
        ),
        UserWarning,
        "checker.py",
        7,
        line="logger.warn(",
    )
    assert capsys.readouterr().err == (
        "warning: The obs returned by the `step()` method is not within the observation space.\n"
    )


# ------------------------------------------------------------------- fuzzing
WRONG_VALUES = [
    "", "x", "-1", "0", "-0.5", "0.5", "nan", "inf", "-inf", "1e400", "None", "true",
    "[1]", "/dev/zero", "a" * 300, "--", "\u2603", str(2**64), str(-(2**64)), "1,2",
]  # fmt: skip
"""Values of the wrong kind, sign or size for most flags, but never a large positive number
that a flag such as ``--jobs`` or ``--update-epochs`` would take as valid (and run for ever)."""
FUZZED_COMMANDS = {
    # command line before the flags, flags laid after them (the budget, last so it wins)
    "train": (["train", "ppo", "--env", "CartPole-v1", "--run-dir", "run"], TINY),
    "eval": (["eval", "{run}"], ["--episodes", "1"]),
    "play": (["play", "{run}"], ["--episodes", "1"]),
    "collect": (["collect", "{run}", "--steps", "10", "--out", "dataset"], ["--steps", "10"]),
    "export": (["export", "{run}", "--out", "model"], []),
    "plot": (["plot", "{run}", "--out", "plots"], []),
    "tune": (["tune", "ppo", "--env", "NoSuchEnv-v0"], []),
    "check-env": (["check-env", "CartPole-v1"], ["--steps", "10"]),
}
"""Every subcommand, on a real run where it takes one. ``tune`` gets an env that does not
exist, so that no valid flag starts a search: its flags are parsed and checked, then the env
is refused."""


def _flags(command: list[str]) -> list[str]:
    """The flags ``rlfleet COMMAND --help`` lists (tyro's flag table, as the user sees it)."""
    import contextlib
    import io

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert _exit_code([*command, "--help"]) == 0
    found = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text.getvalue()))
    return sorted(found - {"--help", "--version"})


FLAGS = {
    name: _flags(prefix[:2] if name in ("train", "tune") else prefix[:1])
    for name, (prefix, _) in FUZZED_COMMANDS.items()
}


@pytest.mark.parametrize("command", list(FUZZED_COMMANDS))
def test_fuzzed_flags_exit_0_or_2_without_a_traceback(
    command: str, trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix, budget = FUZZED_COMMANDS[command]
    assert FLAGS[command], f"no flags found in rlfleet {command} --help"
    flags = st.sampled_from(FLAGS[command])
    values = st.sampled_from(WRONG_VALUES) | st.integers(-(2**70), -1).map(str)
    pairs = st.lists(
        st.tuples(flags, st.lists(values, min_size=0, max_size=2)), min_size=1, max_size=3
    )

    @settings(
        max_examples=20 if command == "train" else 12,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        database=None,
    )
    @given(pairs=pairs)
    def fuzz(pairs: list[tuple[str, list[str]]]) -> None:
        work = Path(tempfile.mkdtemp(dir=tmp_path))
        fuzzed = [token for flag, vals in pairs for token in (flag, *vals)]
        args = [a.format(run=trained) for a in prefix] + fuzzed + budget
        previous = os.getcwd()
        os.chdir(work)
        try:
            code = _exit_code(args)
        finally:
            os.chdir(previous)
        out, err = capsys.readouterr()
        assert code in (0, 2), f"rlfleet {shlex.join(args)} exited {code}: {err[-2000:]}"
        assert "Traceback" not in out + err, shlex.join(args)

    fuzz()


def test_torch_threads_beyond_the_limit_is_refused_not_a_segfault(empty_cwd: Path) -> None:
    done = _cli(*TRAIN, *TINY, "--torch-threads", "100000", cwd=empty_cwd)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "torch_threads must be an integer from 1 to 1024" in done.stderr


def test_collect_refuses_more_envs_than_a_run_may_have(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A number of envs past the configs' limit is one error line, not a list of 2**64 env
    constructors built until memory runs out."""
    out = tmp_path / "dataset"
    args = ["collect", str(trained), "--steps", "10", "--out", str(out), "--num-envs", str(2**64)]
    assert _exit_code(args) == 2
    err = capsys.readouterr().err
    assert "--num-envs: expected a number from 1 to 65536, got 18446744073709551616" in err
    assert not out.exists()
