"""MinAtar ids: registered on first use, a one-line error naming the extra when minatar is
missing, bool grid observations, and a short PPO run through the CLI."""

from __future__ import annotations

import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.cli.main import main
from rlfleet.envs.make import env_spec, make_env, make_vec_env
from rlfleet.envs.minatar import is_minatar_id
from rlfleet.errors import EnvSpecError, MissingDependencyError

pytest.importorskip("minatar")


def _unregister_minatar(monkeypatch: pytest.MonkeyPatch) -> None:
    for env_id in [k for k in gym.registry if k.startswith("MinAtar/")]:
        monkeypatch.delitem(gym.registry, env_id)


def test_minatar_ids_are_registered_on_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    _unregister_minatar(monkeypatch)
    assert env_spec("MinAtar/Breakout-v1").id == "MinAtar/Breakout-v1"
    assert "MinAtar/SpaceInvaders-v0" in gym.registry
    env = make_env("MinAtar/Freeway-v1")
    assert env.observation_space.shape == (10, 10, 7)
    env.close()


def test_namespace_is_told_from_the_id() -> None:
    assert is_minatar_id("MinAtar/Breakout-v1")
    assert not is_minatar_id("MinAtar-v1")
    assert not is_minatar_id("ALE/Breakout-v5")


def test_an_unknown_minatar_id_suggests_close_ones() -> None:
    with pytest.raises(EnvSpecError, match=r"did you mean .*MinAtar/Breakout-v1"):
        env_spec("MinAtar/Breakot-v1")


def test_a_missing_minatar_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _unregister_minatar(monkeypatch)
    monkeypatch.setitem(sys.modules, "minatar", None)  # import minatar raises ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'rlfleet\[minatar\]'") as err:
        env_spec("MinAtar/Breakout-v1")
    assert "\n" not in str(err.value)


def test_vector_envs_give_bool_grids_channels_last() -> None:
    envs = make_vec_env("MinAtar/Breakout-v1", 2, seed=0)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (2, 10, 10, 4)
    assert obs.dtype == np.bool_
    assert envs.single_action_space == gym.spaces.Discrete(3)  # v1: the minimal action set
    envs.close()


def test_ppo_trains_on_minatar_through_the_cli(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = ["train", "ppo", "--env", "MinAtar/Breakout-v1", "--run-dir", str(run_dir)]
    tiny = ["--num-envs", "2", "--num-steps", "32", "--batch-size", "64", "--max-steps", "256"]
    tiny += ["--epoch-num-steps", "128", "--num-test-envs", "2", "--test-step-num-episodes", "2"]
    assert main([*args, *tiny, "--no-show-progress", "--no-verbose"]) == 0
    config = (run_dir / "config.yaml").read_text()
    assert "cnn: minatar" in config  # the MinAtar preset: the MinAtar paper's network
    assert (run_dir / "history.parquet").exists()


def test_a_missing_minatar_is_exit_code_2_on_the_cli(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _unregister_minatar(monkeypatch)
    monkeypatch.setitem(sys.modules, "minatar", None)
    args = ["train", "ppo", "--env", "MinAtar/Breakout-v1", "--run-dir", str(tmp_path / "r")]
    assert main(args) == 2
    assert "pip install 'rlfleet[minatar]'" in capsys.readouterr().err
