"""`rlfleet train ALGO --env pettingzoo:...` takes the single-agent command's flags, and
`rlfleet eval`, `play` and `plot` work on the multi-agent run directory it writes."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pettingzoo")

from rlfleet.cli.main import main
from rlfleet.cli.train import MULTI_AGENT_FLAGS, MultiAgentTrainCommand
from rlfleet.errors import ConfigError, RunDirError
from rlfleet.marl.agents import Agents
from rlfleet.marl.trainer import MultiAgentSettings
from rlfleet.runs.config import default_run_config, load_run_config
from rlfleet.runs.run import load_algorithm, load_policy

TICTACTOE = "pettingzoo:pettingzoo.classic.tictactoe_v3"
FLAGS = ["--max-steps", "600", "--epoch-num-steps", "300", "--test-step-num-episodes", "4"]
FLAGS += ["--num-envs", "2", "--num-test-envs", "2", "--num-epochs", "1", "--seed", "3"]
FLAGS += ["--no-show-progress", "--no-verbose"]


def _train(run_dir: Path, tmp_path: Path, share: str) -> None:
    args = ["train", "ppo", "--env", TICTACTOE, "--run-dir", str(run_dir), *FLAGS]
    if share == "flag":
        args += ["--share-parameters"]
    if share == "config":
        config = tmp_path / "shared.yaml"
        config.write_text(
            f"algo: ppo\nenv: {{id: '{TICTACTOE}'}}\nmulti_agent: {{share_parameters: true}}\n"
        )
        args += ["--config", str(config)]
    assert main(args) == 0


@pytest.mark.parametrize("share", ["flag", "config", "independent"])
def test_train_then_eval_play_and_plot(
    tmp_path: Path, share: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Shared parameters from --share-parameters or from a --config file's multi_agent
    section, or one network per agent."""
    run_dir = tmp_path / "run"
    _train(run_dir, tmp_path, share)
    cfg = load_run_config(run_dir)
    assert cfg.multi_agent is not None
    assert cfg.multi_agent.share_parameters is (share != "independent")
    assert cfg.trainer.max_steps == 600
    assert (run_dir / "history.parquet").is_file()
    assert (run_dir / "plots" / "learning_curve.png").is_file()
    agents, _ = load_policy(run_dir)
    assert isinstance(agents, Agents)
    assert len(agents.groups) == (2 if share == "independent" else 1)
    capsys.readouterr()

    assert main(["eval", str(run_dir), "--episodes", "4"]) == 0
    assert (
        "ppo on pettingzoo:pettingzoo.classic.tictactoe_v3: mean return" in capsys.readouterr().out
    )
    assert main(["eval", str(run_dir), "--episodes", "4", "--checkpoint", "latest"]) == 0
    assert main(["play", str(run_dir), "--frame-dir", str(tmp_path / "frames")]) == 0
    out = capsys.readouterr().out
    assert "player_1 plays" in out
    assert "returns player_1" in out
    assert any((tmp_path / "frames").rglob("*.png"))
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "curve.png")]) == 0
    assert (tmp_path / "curve.png").is_file()


def test_single_agent_commands_name_a_multi_agent_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    _train(run_dir, tmp_path, share="independent")
    with pytest.raises(RunDirError, match="is a multi-agent run"):
        load_algorithm(run_dir)
    assert main(["eval", str(run_dir), "--stochastic"]) == 2
    # docs/export.md: export takes a single-agent run and refuses a multi-agent one.
    capsys.readouterr()
    assert main(["export", str(run_dir)]) == 2
    assert "is a multi-agent run" in capsys.readouterr().err
    assert not (run_dir / "export").exists()


def test_unknown_pettingzoo_module_is_a_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "ppo", "--env", "pettingzoo:pettingzoo.classic.nope_v0"]) == 2
    assert "pettingzoo.classic.nope_v0" in capsys.readouterr().err


def test_multi_agent_settings_belong_to_multi_agent_envs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("algo: ppo\nenv: {id: CartPole-v1}\nmulti_agent: {share_parameters: true}\n")
    assert main(["train", "ppo", "--config", str(config)]) == 2
    assert "'multi_agent' settings apply to multi-agent envs" in capsys.readouterr().err
    assert main(["train", "bc", "--env", TICTACTOE]) == 2
    assert "trains on- or off-policy algorithms, not bc" in capsys.readouterr().err


def test_multi_agent_flags_are_settings_fields_with_their_defaults() -> None:
    command = {f.name: f for f in fields(MultiAgentTrainCommand)}
    settings = MultiAgentSettings()
    for name in MULTI_AGENT_FLAGS:
        assert command[name].default == getattr(settings, name), name


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"reward_signals": {"curiosity": {}}}, "expected none or extrinsic at strength 1, got"),
        (
            {"reward_signals": {"extrinsic": {"strength": 0.5}}},
            r"got extrinsic \(strength 0.5\)",
        ),
        (
            {"environment_parameters": {"size": 3.0}},
            "environment_parameters apply to single-agent runs",
        ),
    ],
)
def test_settings_a_multi_agent_run_would_ignore_are_refused(
    section: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        default_run_config("ppo", TICTACTOE, section)
    # The env's own reward, as ML-Agents' default reward_signals give it, is accepted.
    default_run_config("ppo", TICTACTOE, {"reward_signals": {"extrinsic": {"strength": 1.0}}})
