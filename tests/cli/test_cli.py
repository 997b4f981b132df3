"""`rlfleet train / eval / play / export / plot` end to end on tiny budgets, and bad input."""

from __future__ import annotations

import contextlib
import io
import re
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from rich.console import Console

import rlfleet.collect.record as record_module
import rlfleet.runs.run as run_module
from rlfleet import load
from rlfleet.algos import get_algorithm, list_algorithms
from rlfleet.algos.registry import algorithms_supporting_masks
from rlfleet.checkpoint import CheckpointManager, read_metadata
from rlfleet.cli.main import main
from rlfleet.config.loader import _preset_file, preset
from rlfleet.runs.config import EnvConfig, RunConfig
from rlfleet.train.loop import TrainerConfig

TINY = [
    "--num-envs", "4", "--num-steps", "32", "--batch-size", "64", "--num-epochs", "2",
    "--max-steps", "512", "--epoch-num-steps", "256", "--num-test-envs", "2",
    "--test-step-num-episodes", "2", "--no-show-progress",
]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    assert main(["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(run_dir), *TINY]) == 0
    return run_dir


def test_train_writes_a_complete_run_directory(trained: Path) -> None:
    for name in ("config.yaml", "history.parquet", "plots/learning_curve.png", "best/latest.json",
                 "checkpoints/latest.json"):  # fmt: skip
        assert (trained / name).exists(), name


def test_train_flags_reach_the_config(trained: Path) -> None:
    text = (trained / "config.yaml").read_text()
    assert "num_steps: 32" in text
    assert "batch_size: 64" in text
    assert "max_steps: 512" in text


def test_eval_reports_the_mean_return(trained: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(trained), "--episodes", "3"]) == 0
    assert "mean return" in capsys.readouterr().out


@pytest.mark.parametrize("shown", [True, False])
@pytest.mark.parametrize(
    ("module", "command", "drawn_when_shown"),
    [
        (run_module, ["eval", "{run}", "--episodes", "3"], ["evaluating", "3/3 episodes"]),
        (
            record_module,
            ["collect", "{run}", "--steps", "12", "--num-envs", "2", "--out", "{tmp}/data"],
            ["recording", "12/12 transitions"],
        ),
    ],
    ids=["eval", "collect"],
)
def test_eval_and_collect_draw_a_bar_on_a_terminal_unless_told_not_to(
    trained: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    module: Any,
    command: list[str],
    drawn_when_shown: list[str],
    shown: bool,
) -> None:
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=100)
    bar = partial(module.ProgressReporter, console=terminal)
    monkeypatch.setattr(module, "ProgressReporter", bar)
    argv = [arg.format(run=trained, tmp=tmp_path) for arg in command]
    assert main([*argv, *([] if shown else ["--no-show-progress"])]) == 0
    drawn = screen.getvalue()
    for text in drawn_when_shown:
        assert (text in drawn) is shown, text


def test_play_writes_videos_and_frames(trained: Path, tmp_path: Path) -> None:
    videos, frames = tmp_path / "videos", tmp_path / "frames"
    assert main(["play", str(trained), "--video-dir", str(videos), "--frame-dir", str(frames)]) == 0
    video = videos / "episode-000.mp4"
    assert video.is_file()
    assert video.stat().st_size > 1000
    assert len(list((frames / "episode-000").glob("frame-*.png"))) > 5


def test_export_writes_an_onnx_policy_that_plays_like_the_run(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "policy.onnx"
    args = ["export", str(trained), "--out", str(path), "--checkpoint", "latest"]
    assert main(args) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    algo = load(trained, which="latest")
    obs = np.random.default_rng(0).normal(scale=0.5, size=(64, 4)).astype(np.float32)
    (actions,) = ort.InferenceSession(str(path)).run(["actions"], {"obs": obs})
    np.testing.assert_array_equal(actions, algo.predict(obs))
    assert main(args) == 2  # an existing file is kept without --force
    assert "--force" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0


def test_plot_overlays_runs(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "compare.png"
    assert main(["plot", str(trained), str(trained), "--out", str(out)]) == 0
    assert out.stat().st_size > 1000
    smoothed = tmp_path / "smoothed.png"
    args = ["plot", str(trained), str(trained), "--statistic", "mean", "--smooth", "3"]
    assert main([*args, "--out", str(smoothed)]) == 0
    assert smoothed.stat().st_size > 1000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "rlfleet plot needs one or more run directories: rlfleet plot RUN_DIR"),
        (["{tmp}"], "no history.parquet — expected a run directory"),
        (["{tmp}/nope", "{tmp}/nope2"], "nope: no such directory — expected a run directory"),
        (["{run}", "{run}", "--smooth", "0"], "--smooth: expected a number >= 1, got 0"),
    ],
)
def test_plot_bad_input_gets_one_line_error(
    args: list[str],
    message: str,
    trained: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [arg.format(tmp=tmp_path, run=trained) for arg in args]
    assert main(["plot", *args, "--out", str(tmp_path / "out.png")]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_resume_from_the_cli_continues_the_run(trained: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(trained, copy)
    resume = ["--resume", str(copy), "--schedule-on-resume", "stretch"]
    assert main(["train", "ppo", *resume, "--max-steps", "768", "--no-show-progress"]) == 0
    # The changed config is a new version; the one the run started with stays.
    assert "max_steps: 512" in (copy / "config.yaml").read_text()
    assert "max_steps: 768" in (copy / "config.1.yaml").read_text()
    # The raised budget is trained: a run that ended at its budget goes on.
    latest = CheckpointManager(copy / "checkpoints", readonly=True).latest()
    assert latest is not None
    assert read_metadata(latest)["counters"]["env_step"] >= 768


def test_help_lists_every_hyperparameter(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "ppo", "--env", "CartPole-v1", "--help"])
    out = capsys.readouterr().out
    for flag in ("--num-envs", "--num-steps", "--batch-size", "--num-epochs", "--learning-rate",
                 "--gamma", "--gae-lambda", "--clip-range", "--ent-coef", "--target-reward",
                 "--max-steps", "--seed", "--run-dir"):  # fmt: skip
        assert flag in out, flag


def _train_help(
    name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> str:
    """What ``rlfleet train NAME --help`` prints, on a terminal wide enough for one flag a
    line."""
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        main(["train", name, "--help"])
    return capsys.readouterr().out


@pytest.mark.parametrize("name", list_algorithms())
def test_every_config_field_is_a_flag_in_help(
    name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every hyperparameter and every trainer setting is a flag under its field name."""
    out = _train_help(name, capsys, monkeypatch)
    names = [f.name for f in fields(get_algorithm(name).config_class)]
    names += [f.name for f in fields(TrainerConfig)]
    missing = [n for n in names if f"--{n.replace('_', '-')}" not in out]
    assert not missing, missing


RUN_FLAGS = {
    "--run-dir", "--resume", "--schedule-on-resume", "--force", "--no-force", "--config", "--help"
}  # fmt: skip
"""The run's own flags (docs/cli.md): where to run and what to start from, not settings."""
XAGENTS_ALIASES = {"--n-envs", "--n-steps", "--checkpoints", "--history-checkpoint"}


@pytest.mark.parametrize("name", ["ppo", "dqn"])
def test_every_other_flag_in_help_is_a_config_field(
    name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _train_help(name, capsys, monkeypatch)
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", out))
    settings = {
        f.name
        for cls in (RunConfig, EnvConfig, TrainerConfig, get_algorithm(name).config_class)
        for f in fields(cls)
    }
    others = {
        flag
        for flag in flags - RUN_FLAGS - XAGENTS_ALIASES
        if flag.removeprefix("--").removeprefix("no-").replace("-", "_") not in settings
    }
    assert not others


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "ppo", "--env", "CartPol-v1"], "did you mean CartPole-v1"),
        (["train", "ppg", "--env", "CartPole-v1"], "unknown algorithm 'ppg'; did you mean ppo"),
        (["train", "ppo", "--env", "CartPole-v1", "--learning-rate", "-1"], "--learning-rate:"),
        (["train", "ppo", "--env", "CartPole-v1", "--num-steps", "8", "--num-envs", "2"],
         "batch_size (256) is larger than the rollout"),
        (["train", "ppo"], "--env is required"),
        (["frobnicate"], "unknown command"),
    ],
)  # fmt: skip
def test_bad_input_gets_one_line_error(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    if args[0] == "train" and len(args) > 2:
        args = [*args, "--run-dir", str(tmp_path / "run")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_existing_run_dir_is_not_overwritten(
    trained: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (trained / "history.parquet").read_bytes()
    assert main(["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(trained)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (trained / "history.parquet").read_bytes() == before


def test_eval_and_play_without_a_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", str(tmp_path)]) == 2
    assert "no config.yaml" in capsys.readouterr().err
    empty_run = tmp_path / "run"
    empty_run.mkdir()
    (empty_run / "config.yaml").write_text("algo: ppo\nenv: {id: CartPole-v1}\n")
    assert main(["play", str(empty_run)]) == 2
    assert "no checkpoint found" in capsys.readouterr().err


def test_tampered_checkpoint_is_refused(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    copy = tmp_path / "tampered"
    shutil.copytree(trained, copy)
    for tensors in copy.glob("*/step-*/tensors.safetensors"):
        data = bytearray(tensors.read_bytes())
        data[-1] ^= 0xFF
        tensors.write_bytes(bytes(data))
    assert main(["eval", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "checkpoint" in err
    assert "Traceback" not in err


def test_recurrent_policy_trains_and_plays_from_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "lstm"
    args = ["train", "ppo", "--env", "rlfleet.envs.pomdp:CartPoleNoVelocity-v1"]
    args += ["--lstm-hidden-size", "16", "--max-steps", "512", "--epoch-num-steps", "512"]
    args += ["--num-envs", "4", "--num-test-envs", "2", "--test-step-num-episodes", "2"]
    assert main([*args, "--run-dir", str(run)]) == 0
    assert main(["play", str(run), "--episodes", "2"]) == 0
    assert "episode 2: return" in capsys.readouterr().out


@pytest.mark.parametrize("algo", algorithms_supporting_masks())
def test_play_takes_legal_actions_only(
    algo: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The env raises on an illegal action: an untrained policy that ignored its mask would
    # pick one within a few of the 40 steps.
    run = tmp_path / algo
    args = ["train", algo, "--env", "tests.toy_envs:StrictMaskedPick", "--max-steps", "64"]
    args += ["--epoch-num-steps", "64", "--num-envs", "2", "--num-test-envs", "2"]
    args += ["--test-step-num-episodes", "2", "--no-adapt-defaults"]
    assert main([*args, "--run-dir", str(run)]) == 0
    assert main(["play", str(run), "--episodes", "8"]) == 0
    assert "episode 8: return" in capsys.readouterr().out


def test_plot_takes_labels_and_a_history_interval(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one, two = tmp_path / "one.png", tmp_path / "two.png"
    args = ["--history-interval", "2", "--metric", "episode/return_mean"]
    assert (
        main(["plot", str(trained), str(trained), "--labels", "a", "b", *args, "--out", str(two)])
        == 0
    )
    assert main(["plot", str(trained), "--labels", "mine", "--out", str(one)]) == 0
    assert one.is_file()
    assert two.is_file()
    capsys.readouterr()
    assert main(["plot", str(trained), "--labels", "a", "b"]) == 2
    assert "--labels: expected one per run directory (1), got 2" in capsys.readouterr().err
    assert main(["plot", str(trained), "--history-interval", "0"]) == 2
    assert "--history-interval: expected a number >= 1, got 0" in capsys.readouterr().err


def _shown_defaults(help_text: str) -> dict[str, str]:
    """Each flag of a one-column ``--help`` and the default it shows (``--use-sde, --no-use-sde``
    gives both names the same)."""
    shown: dict[str, str] = {}
    names: list[str] = []
    text: list[str] = []

    def close() -> None:
        found = re.findall(r"\(default: ?([^)]*)\)", " ".join(text))
        for name in names:
            shown[name] = found[-1].strip() if found else ""

    for raw in help_text.splitlines():
        line = raw.strip().strip("│").strip()
        if line.startswith("--") or not line or line.startswith(("╭", "╰")):
            close()
            names = [word.rstrip(",") for word in line.split() if re.match("--[a-z]", word)]
            text = []
        else:
            text.append(line)
    close()
    return shown


def _as_shown(value: object) -> str:
    """A preset value as ``--help`` shows it as the default (a number as its field's type
    holds it: ``475`` of a float field is ``475.0``)."""
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return str(value)


def _same(shown: str | None, value: str) -> bool:
    with contextlib.suppress(TypeError, ValueError):
        return float(shown) == float(value)  # type: ignore[arg-type]
    return shown == value


GLOB_EXAMPLES = {"ALE/*": "ALE/Pong-v5", "*NoFrameskip-v4": "PongNoFrameskip-v4",
                 "MinAtar/*": "MinAtar/Breakout-v1"}  # fmt: skip
"""An env id each glob section of the presets matches."""


def _named_sections() -> list[tuple[str, str]]:
    """Every algorithm and env id a section of its presets names (a glob section: an id it
    matches)."""
    return [
        (name, GLOB_EXAMPLES.get(key, key))
        for name in list_algorithms()
        for key in _preset_file(name)
        if key != "default"
    ]


@pytest.mark.parametrize(("name", "env_id"), _named_sections())
def test_help_shows_every_preset_value_as_the_default(
    name: str, env_id: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/cli.md: ``rlfleet train ALGO --env ENV --help`` shows every flag with its value in
    the preset for that env: every setting of the preset (its ``default`` section overlaid
    by the env's and the glob sections that match it), each under its own flag."""
    assert not any(c in env_id for c in "*?["), f"add an example id of {env_id} to GLOB_EXAMPLES"
    monkeypatch.setenv("COLUMNS", "90")
    with pytest.raises(SystemExit):
        main(["train", name, "--env", env_id, "--help"])
    shown = _shown_defaults(capsys.readouterr().out)
    expected = {
        f"--{key.replace('_', '-')}": _as_shown(value)
        for part in preset(name, env_id).values()
        for key, value in part.items()
    }
    assert expected
    wrong = {flag: (shown.get(flag), value) for flag, value in expected.items()
             if not _same(shown.get(flag), value)}  # fmt: skip
    assert not wrong, wrong


def test_every_reader_takes_the_current_config(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/reliability.md: the current config is the highest-numbered ``config.N.yaml``, and
    eval, play, plot, export, collect and ``rlfleet.load`` all read that one. Here
    ``config.2.yaml`` ends CartPole's episodes after 7 steps (``config.1.yaml`` after 9):
    every reader's episodes are that short."""
    import shutil

    from rlfleet.config.loader import dump_yaml
    from rlfleet.data.dataset import OfflineDataset
    from rlfleet.logging.plots import _read_config
    from rlfleet.runs.config import load_run_config, run_config_to_dict

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    for version, steps in ((1, 9), (2, 7)):
        config = run_config_to_dict(load_run_config(trained))
        config["env"]["kwargs"] = {"max_episode_steps": steps}
        dump_yaml(config, run / f"config.{version}.yaml")
    capsys.readouterr()

    assert main(["eval", str(run), "--episodes", "4"]) == 0
    assert "mean return 7.00 ± 0.00 over 4 episodes" in capsys.readouterr().out
    assert main(["play", str(run), "--episodes", "2", "--frame-dir", str(tmp_path / "f")]) == 0
    assert "episode 2: return 7" in capsys.readouterr().out
    out = tmp_path / "data"
    assert main(["collect", str(run), "--steps", "21", "--num-envs", "1", "--out", str(out)]) == 0
    lengths = np.diff(np.concatenate([[-1], OfflineDataset.load(out).episode_ends()]))
    assert set(lengths.tolist()) == {7}
    target = load(run).env_target  # what a later learn() or predict on the env builds
    assert target is not None
    assert target.env_kwargs == {"max_episode_steps": 7}
    assert main(["export", str(run), "--out", str(tmp_path / "p.onnx")]) == 0
    current: Any = _read_config(run)  # what plot groups and names runs by
    assert current["env"]["kwargs"] == {"max_episode_steps": 7}
