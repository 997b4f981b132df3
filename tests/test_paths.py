"""Every path the Python API takes may be a ``str`` or a ``Path``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from rlfleet.checkpoint import (
    CheckpointManager,
    load_checkpoint,
    read_metadata,
    save_checkpoint,
)
from rlfleet.config.loader import dump_yaml, load_yaml
from rlfleet.data.dataset import OfflineDataset
from rlfleet.data.replay import ReplayBuffer
from rlfleet.envs.make import make_vec_env
from rlfleet.logging.history import History, read_history
from rlfleet.logging.plots import plot_learning_curve, plot_runs
from rlfleet.runs.config import default_run_config, load_run_config
from rlfleet.runs.run import initialize_weights, load_algorithm, make_trainer, train

PACKAGE = Path(__file__).resolve().parent.parent / "rlfleet"


def _path_only_parameters(tree: ast.Module) -> list[str]:
    """Parameters of public functions and methods typed ``Path`` without ``str``."""
    found: list[str] = []

    def visit(node: ast.AST, owner: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef) and not child.name.startswith("_"):
                visit(child, f"{owner}{child.name}.")
            elif isinstance(child, ast.FunctionDef) and (
                not child.name.startswith("_") or child.name == "__init__"
            ):
                arguments = child.args
                for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                    hint = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                    if re.search(r"\bPath\b", hint) and not re.search(r"\bstr\b", hint):
                        found.append(f"{owner}{child.name}({arg.arg}: {hint})")

    visit(tree, "")
    return found


def test_no_public_function_takes_a_path_only() -> None:
    # The command-line modules build their Paths themselves; everything else is Python API.
    offenders = [
        f"{file.relative_to(PACKAGE.parent)}: {where}"
        for file in sorted(PACKAGE.rglob("*.py"))
        if "cli" not in file.relative_to(PACKAGE).parts and file.stem != "cli"
        for where in _path_only_parameters(ast.parse(file.read_text()))
    ]
    assert not offenders, "annotate these `str | Path` and convert with Path():\n" + "\n".join(
        offenders
    )


def test_a_run_trains_loads_and_plots_from_str_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = default_run_config(
        "ppo",
        "CartPole-v1",
        {
            "env": {"num_envs": 2, "num_test_envs": 1},
            "hyperparameters": {"num_steps": 16, "batch_size": 32, "num_epochs": 1},
            "trainer": {"max_steps": 64, "epoch_num_steps": 32, "verbose": False},
        },
    )
    result = train(cfg, "runs/a")
    assert result.run_dir == Path("runs/a")
    train(cfg, "runs/a", resume=True, initialize_from="runs/a")
    train(cfg, "runs/a", force=True)
    assert load_run_config("runs/a").algo == "ppo"
    algo, _ = load_algorithm("runs/a", which="latest")
    assert initialize_weights(algo, "runs/a").is_dir()
    trainer = make_trainer(cfg, "runs/b")
    trainer.close()
    assert trainer.run_dir == Path("runs/b")

    checkpoint = str(CheckpointManager("runs/a/checkpoints", readonly=True).latest())
    assert read_metadata(checkpoint)["algorithm"] == "ppo"
    state, metadata = load_checkpoint(checkpoint)
    assert save_checkpoint("copy", state, metadata) == Path("copy")

    assert read_history("runs/a/history.parquet") == History("runs/a/history.parquet").rows
    assert plot_learning_curve("runs/a/history.parquet", "a.png") == Path("a.png")
    assert plot_runs(["runs/a", "runs/a"], "b.png") == Path("b.png")
    dump_yaml({"x": 1}, "x.yaml")
    assert load_yaml("x.yaml") == {"x": 1}


def test_replay_buffers_and_datasets_from_str_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    envs = make_vec_env("Pendulum-v1", 2, seed=0)
    buffer = ReplayBuffer(64, envs.single_observation_space, envs.single_action_space, 2)
    obs, _ = envs.reset(seed=0)
    for _ in range(8):
        actions = envs.action_space.sample()
        next_obs, rewards, terminated, truncated, _ = envs.step(actions)
        buffer.add(obs, actions, rewards, terminated, truncated, np.ones(2, dtype=bool))
        obs = next_obs
    envs.close()
    assert buffer.save("buffer.npz") == Path("buffer.npz")
    buffer.load("buffer.npz")
    dataset = OfflineDataset.from_replay_buffer("buffer.npz", env_id="Pendulum-v1")
    dataset.save("data/pendulum")
    assert len(OfflineDataset.load("data/pendulum").observations) == 14
